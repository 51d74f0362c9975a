"""A small CNN for 8x8 / 28x28 grayscale and 32x32 colour images.

Two 3x3 convolutions and two dense layers. Downsampling defaults to stride-2
convolutions because that is the form XLA runs fastest on CPU: the backward
pass of max-pool (select-and-scatter) is ~12x slower there
(../shared/notes/cpu-performance.md). ``pool='max'`` gives the textbook form.
"""

from typing import Optional

import flax.linen as nn
import jax.numpy as jnp


def make_norm(kind: str, groups: int = 2):
  """Returns ``norm(x, train, mask)`` for 'none' | 'batch' | 'group'."""
  if kind == 'none':
    return lambda x, train, mask: x
  if kind == 'batch':
    def batch_norm(x, train, mask):
      # BN stats over the real examples only, so padded examples change nothing.
      bn_mask = None if mask is None else mask[:, None, None, None]
      if bn_mask is not None and x.ndim == 2:
        bn_mask = mask[:, None]
      return nn.BatchNorm(use_running_average=not train, momentum=0.9)(
          x, mask=None if bn_mask is None else jnp.broadcast_to(bn_mask, x.shape))
    return batch_norm
  if kind == 'group':
    return lambda x, train, mask: nn.GroupNorm(num_groups=groups)(x)
  raise ValueError(f"Unknown norm {kind!r}; use 'none', 'batch' or 'group'.")


class SmallCNN(nn.Module):
  """conv3x3(w) -> down -> conv3x3(2w) -> down -> dense(D) -> dense(classes).

  Attributes:
    num_classes: output classes.
    width: channels of the first conv (second has 2 * width).
    embedding_dim: D, the width of the penultimate layer ('embedding').
    pool: 'stride' (stride-2 convs), 'avg' or 'max' (2x2 pooling).
    norm: 'none', 'batch' or 'group' after each conv.
  """
  num_classes: int
  width: int = 32
  embedding_dim: int = 128
  pool: str = 'stride'
  norm: str = 'none'

  @nn.compact
  def __call__(self, images, *, train: bool, mask: Optional[jnp.ndarray] = None):
    """images [B,H,W,C] float -> {'logits' [B,K], 'embedding' [B,D], 'features'}."""
    if self.pool not in ('stride', 'avg', 'max'):
      raise ValueError(f"pool must be 'stride', 'avg' or 'max', got {self.pool!r}")
    norm = make_norm(self.norm)
    x = images
    features = []
    for channels in (self.width, 2 * self.width):
      strides = 2 if self.pool == 'stride' else 1
      x = nn.Conv(channels, (3, 3), strides=strides)(x)
      x = nn.relu(norm(x, train, mask))
      if self.pool == 'avg':
        x = nn.avg_pool(x, (2, 2), strides=(2, 2))
      elif self.pool == 'max':
        x = nn.max_pool(x, (2, 2), strides=(2, 2))
      features.append(jnp.mean(x, axis=(1, 2)))
    x = x.reshape(x.shape[0], -1)
    embedding = nn.relu(nn.Dense(self.embedding_dim)(x))
    logits = nn.Dense(self.num_classes)(embedding)
    return {'logits': logits, 'embedding': embedding, 'features': features}
