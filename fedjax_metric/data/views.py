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
import numpy as np

# ITU-R 601-2 luma, as PIL's convert('L'); torchvision's tensor path uses
# 0.2989 for red, a difference below 1e-4 on the 0..1 scale.
LUMA_WEIGHTS = (0.299, 0.587, 0.114)
VIEW_ORDERS = ('ssd', 'fedu2')
_CROP_ATTEMPTS = 10
_CROP_UNIFORMS = 2 * _CROP_ATTEMPTS + 2  # area, log-ratio, top, left
_JITTER_UNIFORMS = 9  # apply, 4 factors, 4 order keys
_VIEW_UNIFORMS = _CROP_UNIFORMS + 1 + _JITTER_UNIFORMS + 1

# k / 255 as IEEE division, as torchvision's ToTensor computes it; XLA turns a
# division by a constant into a multiplication by its reciprocal, which is 1 ulp
# off for some k, so uint8 images are converted through this table.
_UINT8_TO_UNIT = np.arange(256, dtype=np.float32) / np.float32(255.0)


def to_unit_float(image):
  """uint8 [..., C] -> float32 k / 255; any float input is taken as 0..1."""
  if image.dtype == jnp.uint8:
    return jnp.asarray(_UINT8_TO_UNIT)[image]
  return image.astype(jnp.float32)


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


def rgb_to_grayscale(x):
  """Luma Y = 0.299 R + 0.587 G + 0.114 B of float [..., 3] -> [..., 1]."""
  r, g, b = LUMA_WEIGHTS
  return r * x[..., 0:1] + g * x[..., 1:2] + b * x[..., 2:3]


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


# ----------------------------------------------------------------- jitter ----


def adjust_brightness(x, factor):
  """clip(f x, 0, 1) (torchvision adjust_brightness) of float x [H, W, C]."""
  return jnp.clip(factor * x, 0.0, 1.0)


def adjust_contrast(x, factor):
  """clip(f x + (1 - f) m, 0, 1) with m the image's mean luma.

  torchvision adjust_contrast: m is the mean of `rgb_to_grayscale` over all
  pixels for 3 channels, the plain mean for 1 channel.

  Args:
    x: float [H, W, C], C in {1, 3}, on 0..1.
    factor: f >= 0 (0 gives a flat grey image, 1 the input).

  Returns:
    float [H, W, C].
  """
  gray = rgb_to_grayscale(x) if x.shape[-1] == 3 else x
  return jnp.clip(factor * x + (1.0 - factor) * jnp.mean(gray), 0.0, 1.0)


def adjust_saturation(x, factor):
  """clip(f x + (1 - f) Y(x), 0, 1), per pixel (torchvision); C == 1: x."""
  if x.shape[-1] == 1:
    return x
  return jnp.clip(factor * x + (1.0 - factor) * rgb_to_grayscale(x), 0.0, 1.0)


def _rgb_to_hsv(x):
  """float [..., 3] RGB -> HSV, all on 0..1 (torchvision's _rgb2hsv)."""
  r, g, b = x[..., 0], x[..., 1], x[..., 2]
  maxc = jnp.max(x, axis=-1)
  minc = jnp.min(x, axis=-1)
  equal = maxc == minc
  chroma = maxc - minc
  # Grey pixels (max == min) have s = 0 and h = 0; the guards keep 0/0 away.
  s = chroma / jnp.where(equal, 1.0, maxc)
  divisor = jnp.where(equal, 1.0, chroma)
  rc = (maxc - r) / divisor
  gc = (maxc - g) / divisor
  bc = (maxc - b) / divisor
  is_r = maxc == r
  is_g = (maxc == g) & ~is_r
  is_b = ~is_g & ~is_r
  h = is_r * (bc - gc) + is_g * (2.0 + rc - bc) + is_b * (4.0 + gc - rc)
  h = jnp.mod(h / 6.0 + 1.0, 1.0)
  return jnp.stack([h, s, maxc], axis=-1)


def _hsv_to_rgb(hsv):
  """float [..., 3] HSV -> RGB on 0..1 (torchvision's _hsv2rgb)."""
  h, s, v = hsv[..., 0], hsv[..., 1], hsv[..., 2]
  sector = jnp.floor(h * 6.0)
  f = h * 6.0 - sector
  sector = sector.astype(jnp.int32) % 6
  p = jnp.clip(v * (1.0 - s), 0.0, 1.0)
  q = jnp.clip(v * (1.0 - s * f), 0.0, 1.0)
  t = jnp.clip(v * (1.0 - s * (1.0 - f)), 0.0, 1.0)
  cases = [sector == k for k in range(6)]
  r = jnp.select(cases, [v, q, p, p, t, v])
  g = jnp.select(cases, [t, v, v, q, p, p])
  b = jnp.select(cases, [p, p, t, v, v, q])
  return jnp.stack([r, g, b], axis=-1)


def adjust_hue(x, shift):
  """Rotates hue by `shift` turns: HSV (h, s, v) -> ((h + shift) mod 1, s, v).

  torchvision adjust_hue on float images; C == 1 images are returned as is.

  Args:
    x: float [H, W, C] on 0..1.
    shift: hue shift in [-0.5, 0.5] (fraction of the colour wheel).

  Returns:
    float [H, W, C].
  """
  if x.shape[-1] == 1:
    return x
  hsv = _rgb_to_hsv(x)
  hsv = hsv.at[..., 0].set(jnp.mod(hsv[..., 0] + shift, 1.0))
  return _hsv_to_rgb(hsv)


def _jitter_range(value, center: float, name: str, bound=None):
  """torchvision ColorJitter._check_input: a float v -> [max(0, c - v), c + v]
  (hue: [-v, v]); a pair is taken as (min, max). None when the range is the
  single point `center`, i.e. the op is skipped."""
  if isinstance(value, (int, float)):
    if value < 0:
      raise ValueError(f'{name} must be >= 0, got {value}')
    lo, hi = center - value, center + value
    if name != 'hue':
      lo = max(lo, 0.0)
  else:
    lo, hi = (float(v) for v in value)
  bound = bound or (0.0, math.inf)
  if not bound[0] <= lo <= hi <= bound[1]:
    raise ValueError(
      f'{name} range must satisfy {bound[0]} <= min <= max '
      f'<= {bound[1]}, got {(lo, hi)}'
    )
  if lo == hi == center:
    return None
  return lo, hi


def _jitter_ranges(brightness, contrast, saturation, hue):
  return [
    _jitter_range(brightness, 1.0, 'brightness'),
    _jitter_range(contrast, 1.0, 'contrast'),
    _jitter_range(saturation, 1.0, 'saturation'),
    _jitter_range(hue, 0.0, 'hue', (-0.5, 0.5)),
  ]


def _jitter_from_uniforms(x, u, ranges, p):
  """`color_jitter` of float x driven by u, [_JITTER_UNIFORMS] uniforms."""
  color = x.shape[-1] == 3
  active = [slot for slot, r in enumerate(ranges) if r is not None]
  if not active:
    return x
  factors = {
    slot: ranges[slot][0] + (ranges[slot][1] - ranges[slot][0]) * u[1 + slot]
    for slot in active
  }
  one, zero = jnp.float32(1.0), jnp.float32(0.0)
  rows = {
    0: lambda f: (f, zero, zero),
    1: lambda f: (f, 1.0 - f, zero),
    2: lambda f: (f, zero, 1.0 - f) if color else (one, zero, zero),
    3: lambda f: (one, zero, zero),
  }  # Hue is not a blend.
  coefficients = jnp.stack(
    [jnp.stack(rows[slot](factors[slot])) for slot in active]
  )  # [n, 3]
  # Op i runs at step rank(keys[i]): the ranks of i.i.d. uniforms are a
  # uniformly random permutation (ties, of probability ~1e-7, go by index).
  n = len(active)
  keys = u[5 : 5 + n]
  index = jnp.arange(n)
  earlier = (keys[None, :] < keys[:, None]) | (
    (keys[None, :] == keys[:, None]) & (index[None, :] < index[:, None])
  )
  position = jnp.sum(earlier, axis=1)  # [n]
  rotate_hue = active[-1] == 3 and color
  hue_step = position[-1] if rotate_hue else n

  def blends(y, take_step):
    # A loop, not unrolled: the body compiles once.
    def blend(step, y):
      at_step = (position == step).astype(jnp.float32)
      a, b, c = jnp.where(
        take_step(step),
        jnp.sum(at_step[:, None] * coefficients, axis=0),
        jnp.array([1.0, 0.0, 0.0], jnp.float32),
      )
      gray = rgb_to_grayscale(y) if color else y
      return jnp.clip(a * y + b * jnp.mean(gray) + c * gray, 0.0, 1.0)

    return jax.lax.fori_loop(0, n, blend, y)

  jittered = blends(x, lambda step: step < hue_step)
  if rotate_hue:
    jittered = adjust_hue(jittered, factors[3])
    jittered = blends(jittered, lambda step: step > hue_step)
  return jnp.where(u[0] < p, jittered, x)


def color_jitter(
  image,
  key,
  *,
  brightness=0.8,
  contrast=0.8,
  saturation=0.8,
  hue=0.2,
  p: float = 0.8,
):
  """RandomApply(ColorJitter(brightness, contrast, saturation, hue), p).

  Chen et al., 'A Simple Framework for Contrastive Learning of Visual
  Representations', ICML 2020, Appendix A (strength s = 1 gives 0.8, 0.8,
  0.8, 0.2), with torchvision's ColorJitter semantics: factors
  b, c, s ~ U[max(0, 1 - v), 1 + v], hue shift ~ U[-h, h], and the four ops
  (`adjust_brightness`, `adjust_contrast`, `adjust_saturation`, `adjust_hue`,
  each clipping to [0, 1]) applied in a uniformly random order per example.
  A strength of 0 (or a (1, 1) / (0, 0) pair) skips that op. As torchvision,
  1-channel images still get brightness and contrast; saturation and hue
  leave them unchanged.

  The three blends share one form, y -> clip(a y + b mean(Y(y)) + c Y(y),
  0, 1) with Y the luma: (a, b, c) = (f, 0, 0) for brightness,
  (f, 1 - f, 0) for contrast, (f, 0, 1 - f) for saturation. So the random
  order runs as one blend per step with that step's coefficients (the
  identity (1, 0, 0) on steps not taken), and the hue rotation once, between
  the blends before and after its position. The result is the same as
  switching between the four ops at every step, which under vmap evaluates
  all four (four hue rotations) per step and compiles several times slower.

  Args:
    image: [H, W, C], C in {1, 3}; uint8 or float on 0..1.
    key: PRNG key.
    brightness, contrast, saturation: strength v >= 0 or a (min, max) factor
      range.
    hue: strength in [0, 0.5] or a (min, max) shift range in [-0.5, 0.5].
    p: probability of jittering at all.

  Returns:
    float32 [H, W, C] on 0..1.
  """
  ranges = _jitter_ranges(brightness, contrast, saturation, hue)
  u = jax.random.uniform(key, (_JITTER_UNIFORMS,))
  return _jitter_from_uniforms(to_unit_float(image), u, ranges, p)


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
