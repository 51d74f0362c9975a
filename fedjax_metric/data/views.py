"""SimCLR-style two-view augmentation (jittable, per example).

SimCLR-style per-example augmentation for the federated unsupervised methods
(SSD: Fang et al., 'Soft Separation and Distillation: Toward Global
Uniformity in Federated Unsupervised Learning', ICCV 2025; FedU2: Liao et
al., 'Rethinking the Representation in Federated Unsupervised Learning with
Non-IID Data', CVPR 2024), both of which follow Chen et al., 'A Simple
Framework for Contrastive Learning of Visual Representations', ICML 2020.
Each public function maps one image [H, W, C] and a key to a float32 image
on the 0..1 scale; vmap them over a batch. Unlike `make_preprocess` there
is no mean/std normalisation: the authors' released code
(github.com/hc-fang/ssd, mains/train_fedalignuniform.py) feeds ToTensor()
output straight to the torchvision transforms and then to the model.

Each op is written as a function of uniforms (`_*_from_uniforms`), and each
public function makes one `jax.random.uniform` draw: every PRNG call adds a
threefry block that costs ~0.3 s of XLA compile time on a CPU, which at
CIFAR sizes is more than the augmentation itself. `make_two_view_augment`
makes one draw for a whole batch of both views.
"""

import math

import jax
import jax.numpy as jnp

from fedjax_metric.data.color_jitter import (  # re-exported: views.color_jitter etc.
  _JITTER_UNIFORMS,
  _jitter_from_uniforms,
  _jitter_ranges,
)
from fedjax_metric.data.color_jitter import (
  LUMA_WEIGHTS as LUMA_WEIGHTS,
)
from fedjax_metric.data.color_jitter import (
  adjust_brightness as adjust_brightness,
)
from fedjax_metric.data.color_jitter import (
  adjust_contrast as adjust_contrast,
)
from fedjax_metric.data.color_jitter import (
  adjust_hue as adjust_hue,
)
from fedjax_metric.data.color_jitter import (
  adjust_saturation as adjust_saturation,
)
from fedjax_metric.data.color_jitter import (
  color_jitter as color_jitter,
)
from fedjax_metric.data.color_jitter import (
  rgb_to_grayscale as rgb_to_grayscale,
)
from fedjax_metric.data.color_jitter import (
  to_unit_float as to_unit_float,
)

VIEW_ORDERS = ('ssd', 'fedu2')
_CROP_ATTEMPTS = 10
_CROP_UNIFORMS = 2 * _CROP_ATTEMPTS + 2  # area, log-ratio, top, left
_VIEW_UNIFORMS = _CROP_UNIFORMS + 1 + _JITTER_UNIFORMS + 1

# ------------------------------------------------------------------- crop ----


def _center_crop_size(height: int, width: int, ratio):
  """torchvision RandomResizedCrop's fallback box size (h, w), host ints."""
  in_ratio = width / height
  if in_ratio < min(ratio):
    w = width
    h = int(round(w / min(ratio)))
  elif in_ratio > max(ratio):
    h = height
    w = int(round(h * max(ratio)))
  else:
    h, w = height, width
  return h, w


def _crop_box_from_uniforms(u, height: int, width: int, scale, ratio):
  """`sample_crop_box` driven by u, [_CROP_UNIFORMS] uniforms on [0, 1)."""
  area = height * width
  target_area = area * (scale[0] + (scale[1] - scale[0]) * u[:_CROP_ATTEMPTS])
  log_lo, log_hi = math.log(ratio[0]), math.log(ratio[1])
  aspect = jnp.exp(
    log_lo + (log_hi - log_lo) * u[_CROP_ATTEMPTS : 2 * _CROP_ATTEMPTS]
  )
  # jnp.round rounds half to even, as Python's round() in torchvision.
  ws = jnp.round(jnp.sqrt(target_area * aspect)).astype(jnp.int32)
  hs = jnp.round(jnp.sqrt(target_area / aspect)).astype(jnp.int32)
  valid = (ws > 0) & (ws <= width) & (hs > 0) & (hs <= height)
  first = jnp.argmax(valid)
  found = valid.any()
  fallback_h, fallback_w = _center_crop_size(height, width, ratio)
  h = jnp.where(found, hs[first], fallback_h)
  w = jnp.where(found, ws[first], fallback_w)

  def offset(u_offset, room):
    """Uniform integer in [0, room]."""
    return jnp.minimum(jnp.floor(u_offset * (room + 1)).astype(jnp.int32), room)

  top = jnp.where(found, offset(u[-2], height - h), (height - fallback_h) // 2)
  left = jnp.where(found, offset(u[-1], width - w), (width - fallback_w) // 2)
  return tuple(v.astype(jnp.int32) for v in (top, left, h, w))


def sample_crop_box(
  key, height: int, width: int, scale=(0.08, 1.0), ratio=(3 / 4, 4 / 3)
):
  """Samples a RandomResizedCrop box (torchvision semantics), vectorised.

  Chen et al., 'A Simple Framework for Contrastive Learning of Visual
  Representations', ICML 2020, Appendix A: a crop of random area fraction
  s ~ U[scale] and aspect ratio r (log r ~ U[log ratio]) of the image, i.e.
  w = round(sqrt(s H W r)), h = round(sqrt(s H W / r)). As torchvision
  (github.com/pytorch/vision, torchvision/transforms/transforms.py,
  RandomResizedCrop.get_params) up to 10 candidates are tried and the first
  with 0 < w <= W and 0 < h <= H is kept, at a uniformly random offset; if
  none fits, the fallback is a centred crop of the whole image clamped to the
  ratio range. Here the 10 candidates are drawn at once and the first valid
  one is selected, which has the same distribution as the sequential loop.

  Args:
    key: PRNG key.
    height, width: the image size H, W (Python ints).
    scale: (min, max) area fraction.
    ratio: (min, max) aspect ratio w / h.

  Returns:
    (top, left, h, w), int32 scalars; the box is
    rows top..top+h-1 and columns left..left+w-1.
  """
  u = jax.random.uniform(key, (_CROP_UNIFORMS,))
  return _crop_box_from_uniforms(u, height, width, scale, ratio)


def _bilinear_taps(start, length, out_len: int):
  """Source rows (lo, hi) and weight of hi for one axis of a crop resize.

  Half-pixel centres (PyTorch's align_corners=False): output pixel o samples
  the crop at x = (o + 1/2) * length / out_len - 1/2, clamped to
  [0, length - 1] so only pixels inside the crop contribute.
  """
  length_f = length.astype(jnp.float32)
  src = (jnp.arange(out_len, dtype=jnp.float32) + 0.5) * (
    length_f / out_len
  ) - 0.5
  src = jnp.clip(src, 0.0, length_f - 1.0)
  lo = jnp.floor(src)
  frac = src - lo
  lo = lo.astype(jnp.int32)
  hi = jnp.minimum(lo + 1, length - 1)
  return start + lo, start + hi, frac


def resized_crop(image, top, left, h, w, out_size):
  """Crops the box (top, left, h, w) and resizes it bilinearly to out_size.

  Bilinear interpolation with half-pixel centres, sampling only inside the
  crop (torchvision's crop-then-resize, interpolation BILINEAR): output
  pixel (i, j) reads the crop at y = (i + 1/2) h / H' - 1/2 and
  x = (j + 1/2) w / W' - 1/2, each clamped to the crop, and blends the four
  neighbours with weights (1 - fy)(1 - fx), (1 - fy) fx, fy (1 - fx), fy fx.
  No antialiasing: SimCLR crops are resized up (or kept), where torchvision's
  antialiased and plain bilinear filters agree. Values are not re-quantised
  to 8 bits.

  Args:
    image: [H, W, C], uint8 (scaled to 0..1) or float.
    top, left, h, w: int scalars (may be traced); the box must lie inside.
    out_size: (H', W') Python ints.

  Returns:
    float32 [H', W', C].
  """
  x = to_unit_float(image)
  top, left, h, w = (jnp.asarray(v, jnp.int32) for v in (top, left, h, w))
  y0, y1, fy = _bilinear_taps(top, h, out_size[0])
  x0, x1, fx = _bilinear_taps(left, w, out_size[1])
  fy = fy[:, None, None]
  rows = x[y0] * (1.0 - fy) + x[y1] * fy
  fx = fx[None, :, None]
  return rows[:, x0] * (1.0 - fx) + rows[:, x1] * fx


def _out_size(image, out_size):
  if out_size is None:
    return tuple(image.shape[:2])
  if isinstance(out_size, int):
    return (out_size, out_size)
  return tuple(out_size)


def random_resized_crop(
  image, key, *, scale=(0.08, 1.0), ratio=(3 / 4, 4 / 3), out_size=None
):
  """torchvision RandomResizedCrop of one image: `sample_crop_box` then
  `resized_crop` (Chen et al., ICML 2020, Appendix A).

  Args:
    image: [H, W, C], uint8 or float on 0..1.
    key: PRNG key (the same key gives the box of `sample_crop_box(key, ...)`).
    scale, ratio: as in `sample_crop_box`.
    out_size: int or (H', W'); default the input size (H, W).

  Returns:
    float32 [H', W', C] on 0..1.
  """
  height, width = image.shape[:2]
  box = sample_crop_box(key, height, width, scale, ratio)
  return resized_crop(image, *box, _out_size(image, out_size))


# ------------------------------------------------------- flip, grayscale ----


def _flip_from_uniform(x, u, p):
  return jnp.where(u < p, x[:, ::-1], x)


def horizontal_flip(image, key, *, p: float = 0.5):
  """Mirrors the image left-right with probability p (torchvision
  RandomHorizontalFlip; Chen et al., ICML 2020, Appendix A).

  Args:
    image: [H, W, C], uint8 or float on 0..1.
    key: PRNG key.
    p: flip probability.

  Returns:
    float32 [H, W, C].
  """
  return _flip_from_uniform(to_unit_float(image), jax.random.uniform(key), p)


def _grayscale_from_uniform(x, u, p):
  if x.shape[-1] == 1:
    return x
  gray = jnp.broadcast_to(rgb_to_grayscale(x), x.shape)
  return jnp.where(u < p, gray, x)


def random_grayscale(image, key, *, p: float = 0.2):
  """RandomGrayscale(p): with probability p every channel becomes the luma.

  Y = 0.299 R + 0.587 G + 0.114 B (ITU-R 601-2), replicated to 3 channels
  (Chen et al., ICML 2020, Appendix A; torchvision RandomGrayscale).
  1-channel images are returned unchanged.

  Args:
    image: [H, W, C], uint8 or float on 0..1.
    key: PRNG key.
    p: probability of converting.

  Returns:
    float32 [H, W, C].
  """
  return _grayscale_from_uniform(
    to_unit_float(image), jax.random.uniform(key), p
  )


# --------------------------------------------------------------- two views ----


def make_two_view_augment(
  *,
  crop_scale=None,
  crop_ratio=(3 / 4, 4 / 3),
  jitter=(0.8, 0.8, 0.8, 0.2),
  jitter_p: float = 0.8,
  grayscale_p: float = 0.2,
  flip_p: float = 0.5,
  order: str = 'ssd',
  out_size=None,
):
  """Returns ``(uint8 images [B,H,W,C], key) -> (view1, view2)``.

  Two independent SimCLR views per image (Chen et al., ICML 2020, Sec. 2.1
  and Appendix A), each float32 [B, H', W', C] on 0..1, no normalisation.
  The ops are those of `random_resized_crop`, `horizontal_flip`,
  `color_jitter` and `random_grayscale`, in one of two orders:

    'ssd': crop -> flip -> jitter -> grayscale, crop scale (0.08, 1) by
      default (Fang et al., 'Soft Separation and Distillation: Toward Global
      Uniformity in Federated Unsupervised Learning', ICCV 2025; the authors'
      released code, github.com/hc-fang/ssd, mains/train_fedalignuniform.py).
    'fedu2': crop -> jitter -> grayscale -> flip, crop scale (0.2, 1) by
      default (Liao et al., 'Rethinking the Representation in Federated
      Unsupervised Learning with Non-IID Data', CVPR 2024; the authors'
      released code, github.com/XeniaLLL/FedU2).

  The randomness is one draw of [2, B, 33] uniforms from `key`, a row per
  (view, example), so every example and view is independent (one draw
  rather than a key per example keeps the compiled program small).

  Args:
    crop_scale: RandomResizedCrop area range; None: the order's default.
    crop_ratio: RandomResizedCrop aspect-ratio range.
    jitter: (brightness, contrast, saturation, hue) strengths.
    jitter_p: probability of colour jitter.
    grayscale_p: probability of grayscale.
    flip_p: probability of a horizontal flip.
    order: 'ssd' or 'fedu2'.
    out_size: int or (H', W') of the views; default the input size.

  Returns:
    The augmentation function (pure; jit it at the call site).
  """
  if order not in VIEW_ORDERS:
    raise ValueError(f'Unknown order {order!r}; use one of {VIEW_ORDERS}.')
  if crop_scale is None:
    crop_scale = (0.08, 1.0) if order == 'ssd' else (0.2, 1.0)
  ranges = _jitter_ranges(*jitter)

  def one_view(image, u):
    crop_u, rest = u[:_CROP_UNIFORMS], u[_CROP_UNIFORMS:]
    flip_u, jitter_u, gray_u = rest[0], rest[1:-1], rest[-1]
    height, width = image.shape[:2]
    box = _crop_box_from_uniforms(crop_u, height, width, crop_scale, crop_ratio)
    x = resized_crop(image, *box, _out_size(image, out_size))
    if order == 'ssd':
      x = _flip_from_uniform(x, flip_u, flip_p)
    x = _jitter_from_uniforms(x, jitter_u, ranges, jitter_p)
    x = _grayscale_from_uniform(x, gray_u, grayscale_p)
    if order == 'fedu2':
      x = _flip_from_uniform(x, flip_u, flip_p)
    return x

  views = jax.vmap(jax.vmap(one_view), in_axes=(None, 0))

  def augment(images, key):
    u = jax.random.uniform(key, (2, images.shape[0], _VIEW_UNIFORMS))
    both = views(images, u)
    return both[0], both[1]

  return augment
