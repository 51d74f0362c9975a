"""On-device, jittable preprocessing and per-example augmentation.

Images stay uint8 on the device; each step converts its batch to float,
normalises it with per-channel statistics and, for training, augments it.
The SimCLR-style two-view augmentation of the federated unsupervised methods,
which does not normalise, is views.py.
"""

import jax
import jax.numpy as jnp
import numpy as np

AUGMENTATIONS = ('none', 'flip', 'crop_flip')


def channel_stats(images: np.ndarray):
  """Per-channel mean and std of uint8 images [N,H,W,C], on the 0..1 scale."""
  x = images.astype(np.float64) / 255.0
  return (
    x.mean(axis=(0, 1, 2)).astype(np.float32),
    np.maximum(x.std(axis=(0, 1, 2)), 1e-6).astype(np.float32),
  )


def random_crop(images, key, padding: int):
  """Zero-pad by ``padding`` and crop back at a random offset, per example.

  ``make_preprocess`` calls it on normalised images, so the zeros are the
  dataset's mean colour, not black as torchvision's RandomCrop before
  Normalize gives (docs/methods.md, FedRCL: a known difference).
  """
  b, h, w, _ = images.shape
  padded = jnp.pad(
    images, ((0, 0), (padding, padding), (padding, padding), (0, 0))
  )
  offsets = jax.random.randint(key, (b, 2), 0, 2 * padding + 1)
  crop = lambda img, off: jax.lax.dynamic_slice(
    img, (off[0], off[1], 0), (h, w, img.shape[-1])
  )
  return jax.vmap(crop)(padded, offsets)


def random_flip(images, key):
  """Horizontal flip of each example with probability 1/2."""
  flip = jax.random.bernoulli(key, 0.5, (images.shape[0], 1, 1, 1))
  return jnp.where(flip, images[:, :, ::-1, :], images)


def make_preprocess(
  mean, std, augmentation: str = 'none', crop_padding: int = 4
):
  """Returns ``(uint8 images [B,H,W,C], key) -> normalised float32 images``."""
  if augmentation not in AUGMENTATIONS:
    raise ValueError(
      f'Unknown augmentation {augmentation!r}; use one of {AUGMENTATIONS}.'
    )
  mean = jnp.asarray(mean, jnp.float32)
  std = jnp.asarray(std, jnp.float32)

  def preprocess(images, key):
    x = (images.astype(jnp.float32) / 255.0 - mean) / std
    if augmentation == 'none':
      return x
    crop_key, flip_key = jax.random.split(key)
    if augmentation == 'crop_flip':
      x = random_crop(x, crop_key, crop_padding)
    return random_flip(x, flip_key)

  return preprocess
