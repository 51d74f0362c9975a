"""Colour ops of the two-view augmentation: uint8 -> 0..1 floats, grayscale,
and colour jitter (brightness, contrast, saturation, hue in a random order)
as torchvision's ColorJitter computes them.

Each op maps a float32 image [H, W, C] on the 0..1 scale; `color_jitter`
makes one `jax.random.uniform` draw (`_jitter_from_uniforms` takes the
uniforms, so views.py can draw a whole batch's at once). Grayscale images
(C = 1) skip saturation and hue, as torchvision does.
"""

import math

import jax
import jax.numpy as jnp
import numpy as np

_JITTER_UNIFORMS = 9  # apply, 4 factors, 4 order keys
# ITU-R 601-2 luma, as PIL's convert('L'); torchvision's tensor path uses
# 0.2989 for red, a difference below 1e-4 on the 0..1 scale.
LUMA_WEIGHTS = (0.299, 0.587, 0.114)

# k / 255 as IEEE division, as torchvision's ToTensor computes it; XLA turns a
# division by a constant into a multiplication by its reciprocal, which is 1 ulp
# off for some k, so uint8 images are converted through this table.
_UINT8_TO_UNIT = np.arange(256, dtype=np.float32) / np.float32(255.0)


def to_unit_float(image):
  """uint8 [..., C] -> float32 k / 255; any float input is taken as 0..1."""
  if image.dtype == jnp.uint8:
    return jnp.asarray(_UINT8_TO_UNIT)[image]
  return image.astype(jnp.float32)


def rgb_to_grayscale(x):
  """Luma Y = 0.299 R + 0.587 G + 0.114 B of float [..., 3] -> [..., 1]."""
  r, g, b = LUMA_WEIGHTS
  return r * x[..., 0:1] + g * x[..., 1:2] + b * x[..., 2:3]


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
  """`color_jitter` of float x driven by u, [_JITTER_UNIFORMS] uniforms.

  Computed in float32 whatever the inputs' precision: with jax_enable_x64
  on, uniforms drawn without a dtype are float64, and the blend loop's carry
  (float32 x) would change type.
  """
  x = jnp.asarray(x, jnp.float32)
  u = jnp.asarray(u, jnp.float32)
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
  # float32 always: the same draws with jax_enable_x64 on as off.
  u = jax.random.uniform(key, (_JITTER_UNIFORMS,), jnp.float32)
  return _jitter_from_uniforms(to_unit_float(image), u, ranges, p)
