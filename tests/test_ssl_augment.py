"""SimCLR two-view augmentation (SSD / FedU2): crop, flip, jitter, grayscale.

References are independent: torchvision's RandomResizedCrop sampling loop
re-written in NumPy, a float64 bilinear resize with explicit loops, the
colour adjustments as NumPy formulas and Python's colorsys for hue, and
binomial rates for the random choices.
"""

import colorsys
import math

import jax
import jax.numpy as jnp
import jitted
import numpy as np
import pytest

from fedjax_metric.data import views as library_views

# The array functions as one jitted program a call (tests/jitted.py).
views = jitted.jitted_module(
  library_views,
  names=(
    'adjust_brightness',
    'adjust_contrast',
    'adjust_hue',
    'adjust_saturation',
    'color_jitter',
    'horizontal_flip',
    'random_grayscale',
  ),
)

LUMA = (0.299, 0.587, 0.114)


def _image(seed, shape=(8, 8, 3)):
  return np.random.RandomState(seed).randint(0, 256, shape).astype(np.uint8)


def _binomial_ok(count, n, p, sigmas=5.0):
  return abs(count - n * p) <= sigmas * math.sqrt(n * p * (1 - p)) + 1


# ------------------------------------------------------------------ crop box


_boxes = jax.jit(
  jax.vmap(views.sample_crop_box, in_axes=(0, None, None, None, None)),
  static_argnums=(1, 2, 3, 4),
)


def _torchvision_box(rng, height, width, scale, ratio):
  """RandomResizedCrop.get_params, as a Python loop."""
  area = height * width
  for _ in range(10):
    target = area * rng.uniform(*scale)
    aspect = math.exp(rng.uniform(math.log(ratio[0]), math.log(ratio[1])))
    w = int(round(math.sqrt(target * aspect)))
    h = int(round(math.sqrt(target / aspect)))
    if 0 < w <= width and 0 < h <= height:
      return rng.randint(0, height - h + 1), rng.randint(0, width - w + 1), h, w
  return None


@pytest.mark.parametrize('height, width', [(32, 32), (24, 40)])
def test_crop_boxes_lie_in_the_scale_and_ratio_ranges(height, width):
  scale, ratio = (0.08, 1.0), (3 / 4, 4 / 3)
  keys = jax.random.split(jax.random.key(0), 3000)
  top, left, h, w = (
    np.asarray(a) for a in _boxes(keys, height, width, scale, ratio)
  )
  assert (h >= 1).all() and (w >= 1).all()
  assert (top >= 0).all() and (top + h <= height).all()
  assert (left >= 0).all() and (left + w <= width).all()
  # h, w are sqrt(s H W / r), sqrt(s H W r) rounded: bounds with +-1/2.
  area = height * width
  assert ((h + 0.5) * (w + 0.5) >= scale[0] * area).all()
  assert ((h - 0.5) * (w - 0.5) <= scale[1] * area).all()
  assert ((w + 0.5) / (h - 0.5) >= ratio[0]).all()
  assert ((w - 0.5) / (h + 0.5) <= ratio[1]).all()
  # The offset is uniform over all valid positions: both extremes occur.
  assert (top == 0).any() and (top + h == height).any()
  assert (left == 0).any() and (left + w == width).any()


def test_crop_box_distribution_matches_torchvision_loop():
  height = width = 200  # Large enough that rounding barely moves the box.
  scale, ratio = (0.08, 1.0), (3 / 4, 4 / 3)
  n = 4000
  keys = jax.random.split(jax.random.key(1), n)
  _, _, h, w = (
    np.asarray(a, np.float64) for a in _boxes(keys, height, width, scale, ratio)
  )
  rng = np.random.RandomState(0)
  ref = np.array(
    [_torchvision_box(rng, height, width, scale, ratio) for _ in range(n)],
    np.float64,
  )
  ref_h, ref_w = ref[:, 2], ref[:, 3]
  area, ref_area = h * w / (height * width), ref_h * ref_w / (height * width)
  # Valid candidates need s r <= 1 and s / r <= 1, so large areas are rarer
  # than under U[0.08, 1]: the mean sits below 0.54.
  assert ref_area.mean() < 0.52
  quantiles = [0.1, 0.25, 0.5, 0.75, 0.9]
  np.testing.assert_allclose(
    np.quantile(area, quantiles), np.quantile(ref_area, quantiles), atol=0.03
  )
  log_r, ref_log_r = np.log(w / h), np.log(ref_w / ref_h)
  np.testing.assert_allclose(
    np.quantile(log_r, quantiles), np.quantile(ref_log_r, quantiles), atol=0.03
  )


@pytest.mark.parametrize(
  'height, width, expected',
  [
    (16, 16, (0, 0, 16, 16)),  # Ratio 1 is in range: the whole image.
    (10, 40, (0, 13, 10, 13)),  # Too wide: h = 10, w = round(10 * 4/3).
    (40, 10, (13, 0, 13, 10)),  # Too tall: w = 10, h = round(10 / (3/4)).
  ],
)
def test_crop_box_falls_back_to_a_centre_crop(height, width, expected):
  # Area fractions >= 2 never fit, so all 10 candidates fail.
  box = views.sample_crop_box(
    jax.random.key(2), height, width, (2.0, 3.0), (3 / 4, 4 / 3)
  )
  assert tuple(int(v) for v in box) == expected


# ------------------------------------------------------------- bilinear resize


def _numpy_resized_crop(image, top, left, h, w, out_h, out_w):
  """Half-pixel bilinear resize of the crop, float64 loops (torch's
  interpolate(mode='bilinear', align_corners=False))."""
  crop = image[top : top + h, left : left + w].astype(np.float64)
  out = np.zeros((out_h, out_w, image.shape[2]))

  def taps(o, n_in, n_out):
    src = max((o + 0.5) * n_in / n_out - 0.5, 0.0)
    i0 = min(int(math.floor(src)), n_in - 1)
    i1 = min(i0 + 1, n_in - 1)
    return i0, i1, min(src - i0, 1.0)

  for i in range(out_h):
    y0, y1, fy = taps(i, h, out_h)
    for j in range(out_w):
      x0, x1, fx = taps(j, w, out_w)
      out[i, j] = (1 - fy) * (
        (1 - fx) * crop[y0, x0] + fx * crop[y0, x1]
      ) + fy * ((1 - fx) * crop[y1, x0] + fx * crop[y1, x1])
  return out


def test_numpy_bilinear_reference_agrees_with_jax_image_resize():
  # Upsampling a whole image: jax.image.resize's triangle filter is the same
  # half-pixel bilinear, so this checks the reference used below.
  image = np.random.RandomState(3).rand(5, 7, 2)
  ref = _numpy_resized_crop(image, 0, 0, 5, 7, 13, 10)
  with jax.default_matmul_precision('highest'):
    other = jax.image.resize(
      jnp.asarray(image, jnp.float32), (13, 10, 2), 'linear', antialias=False
    )
  np.testing.assert_allclose(other, ref, atol=1e-5)


@pytest.mark.parametrize(
  'box, out_size',
  [
    ((2, 3, 5, 7), (13, 10)),  # Up-sample a crop: edges must not leak.
    ((0, 0, 9, 11), (9, 11)),  # Identity.
    ((1, 2, 8, 9), (4, 3)),  # Down-sample.
    ((4, 6, 1, 1), (3, 3)),  # A single pixel.
  ],
)
def test_resized_crop_matches_numpy_bilinear(box, out_size):
  image = _image(4, (9, 11, 3))
  ref = _numpy_resized_crop(image / 255.0, *box, *out_size)
  with jax.default_matmul_precision('highest'):
    out = jax.jit(views.resized_crop, static_argnums=5)(
      jnp.asarray(image), *box, out_size
    )
  assert out.dtype == jnp.float32 and out.shape == out_size + (3,)
  np.testing.assert_allclose(out, ref, atol=1e-6)


def test_random_resized_crop_is_resized_crop_of_the_sampled_box():
  image = _image(5, (12, 12, 3))
  keys = jax.random.split(jax.random.key(6), 4)
  boxes = np.stack(_boxes(keys, 12, 12, (0.08, 1.0), (3 / 4, 4 / 3)), axis=1)
  crops = jax.jit(jax.vmap(views.random_resized_crop, in_axes=(None, 0)))(
    jnp.asarray(image), keys
  )
  for box, crop in zip(boxes, crops, strict=True):
    ref = _numpy_resized_crop(image / 255.0, *box, 12, 12)
    np.testing.assert_allclose(crop, ref, atol=1e-6)


# ------------------------------------------------------------- flip, grayscale


@pytest.mark.parametrize('p', [0.5, 0.2])
def test_flip_rate_and_values(p):
  image = _image(6, (4, 5, 3))
  n = 2000
  keys = jax.random.split(jax.random.key(7), n)
  out = np.asarray(
    jax.jit(
      jax.vmap(lambda k: views.horizontal_flip(jnp.asarray(image), k, p=p))
    )(keys)
  )
  x = image.astype(np.float32) / np.float32(255.0)
  flipped = (out == x[:, ::-1]).all(axis=(1, 2, 3))
  kept = (out == x).all(axis=(1, 2, 3))
  assert (flipped ^ kept).all()  # Every output is one or the other, exactly.
  assert _binomial_ok(flipped.sum(), n, p)


@pytest.mark.parametrize('p', [0.2, 0.7])
def test_grayscale_rate_and_luma(p):
  image = _image(8, (3, 4, 3))
  n = 2000
  keys = jax.random.split(jax.random.key(9), n)
  with jax.default_matmul_precision('highest'):
    out = np.asarray(
      jax.jit(
        jax.vmap(lambda k: views.random_grayscale(jnp.asarray(image), k, p=p))
      )(keys)
    )
  x = image.astype(np.float64) / 255.0
  luma = sum(w * x[..., c] for c, w in enumerate(LUMA))
  converted = np.array(
    [np.allclose(o, luma[..., None], atol=1e-6) for o in out]
  )
  kept = (out == image.astype(np.float32) / np.float32(255.0)).all(
    axis=(1, 2, 3)
  )
  assert (converted ^ kept).all()
  assert _binomial_ok(converted.sum(), n, p)


def test_grayscale_is_a_no_op_for_one_channel_images():
  image = _image(10, (5, 5, 1))
  out = views.random_grayscale(jnp.asarray(image), jax.random.key(0), p=1.0)
  np.testing.assert_array_equal(out, image / np.float32(255.0))


# ------------------------------------------------------------------ jitter


def _float_image(seed, shape=(6, 7, 3), low=0.0, high=1.0):
  return np.random.RandomState(seed).uniform(low, high, shape)


def test_brightness_contrast_saturation_match_formulas():
  x = _float_image(11)
  # Some grey and saturated pixels.
  x[0, 0] = 0.5
  x[0, 1] = (1.0, 0.0, 0.0)
  xj = jnp.asarray(x, jnp.float32)
  luma = sum(w * x[..., c] for c, w in enumerate(LUMA))
  for f in (0.0, 0.3, 1.0, 1.7):
    np.testing.assert_allclose(
      views.adjust_brightness(xj, f), np.clip(f * x, 0, 1), atol=1e-6
    )
    np.testing.assert_allclose(
      views.adjust_contrast(xj, f),
      np.clip(f * x + (1 - f) * luma.mean(), 0, 1),
      atol=1e-6,
    )
    np.testing.assert_allclose(
      views.adjust_saturation(xj, f),
      np.clip(f * x + (1 - f) * luma[..., None], 0, 1),
      atol=1e-6,
    )
  # 1 channel: contrast blends with the plain mean, saturation does nothing.
  g = x[..., :1]
  np.testing.assert_allclose(
    views.adjust_contrast(jnp.asarray(g), 0.4),
    np.clip(0.4 * g + 0.6 * g.mean(), 0, 1),
    atol=1e-6,
  )
  np.testing.assert_allclose(
    views.adjust_saturation(jnp.asarray(g), 0.4), g, atol=1e-7
  )


@pytest.mark.parametrize('shift', [0.0, 0.1, -0.2, 0.5, -0.5, 0.37])
def test_hue_matches_colorsys(shift):
  x = _float_image(12, (5, 6, 3))
  x[0, 0] = (0.3, 0.3, 0.3)  # Grey: hue undefined, must stay grey.
  x[0, 1] = (1.0, 0.0, 0.0)
  x[0, 2] = (0.2, 0.9, 0.9)  # Ties between max channels.
  x[0, 3] = (0.0, 0.0, 0.0)
  ref = np.zeros_like(x)
  for i in range(x.shape[0]):
    for j in range(x.shape[1]):
      h, s, v = colorsys.rgb_to_hsv(*x[i, j])
      ref[i, j] = colorsys.hsv_to_rgb((h + shift) % 1.0, s, v)
  out = views.adjust_hue(jnp.asarray(x, jnp.float32), shift)
  np.testing.assert_allclose(out, ref, atol=2e-6)


@pytest.mark.parametrize(
  'kwargs',
  [
    {'brightness': 0, 'contrast': 0, 'saturation': 0, 'hue': 0, 'p': 1.0},
    {
      'brightness': (1, 1),
      'contrast': (1, 1),
      'saturation': (1, 1),
      'hue': (0, 0),
      'p': 1.0,
    },
    {'p': 0.0},
  ],
)
def test_jitter_is_the_identity_at_zero_strength_or_probability(kwargs):
  image = _image(13)
  expected = image.astype(np.float32) / np.float32(255.0)
  keys = jax.random.split(jax.random.key(14), 8)
  out = jax.jit(
    jax.vmap(lambda k: views.color_jitter(jnp.asarray(image), k, **kwargs))
  )(keys)
  for o in out:
    np.testing.assert_array_equal(o, expected)


def test_jitter_factor_range_and_apply_rate():
  # Values <= 0.5, so brightness factors <= 1.8 never clip.
  x = _float_image(14, (4, 4, 3), 0.05, 0.5)
  n = 1000
  keys = jax.random.split(jax.random.key(15), n)
  jitter = jax.jit(
    jax.vmap(
      lambda k: views.color_jitter(
        jnp.asarray(x, jnp.float32),
        k,
        brightness=0.8,
        contrast=0,
        saturation=0,
        hue=0,
        p=0.8,
      )
    )
  )
  out = np.asarray(jitter(keys), np.float64)
  factors = (out / x).reshape(n, -1)
  # One factor per image.
  np.testing.assert_allclose(
    factors, np.broadcast_to(factors[:, :1], factors.shape), rtol=1e-5
  )
  f = factors[:, 0]
  applied = ~np.isclose(f, 1.0, atol=1e-6)
  assert _binomial_ok(applied.sum(), n, 0.8)
  assert f.min() >= 0.2 - 1e-6 and f.max() <= 1.8 + 1e-6
  # Uniform on [0.2, 1.8]: quartiles at 0.6, 1.0, 1.4.
  np.testing.assert_allclose(
    np.quantile(f[applied], [0.25, 0.5, 0.75]), [0.6, 1.0, 1.4], atol=0.08
  )


def test_jitter_order_is_random_per_example():
  # Contrast and hue do not commute: the contrast mean is the luma mean,
  # which a hue rotation changes. With both factors fixed, every output is
  # one of the two compositions, and both occur.
  x = jnp.asarray(_float_image(16, (4, 4, 3)), jnp.float32)
  c, h = 0.5, 0.25
  hue_then_contrast = np.asarray(
    views.adjust_contrast(views.adjust_hue(x, h), c)
  )
  contrast_then_hue = np.asarray(
    views.adjust_hue(views.adjust_contrast(x, c), h)
  )
  assert not np.allclose(hue_then_contrast, contrast_then_hue, atol=1e-3)
  keys = jax.random.split(jax.random.key(17), 200)
  out = np.asarray(
    jax.jit(
      jax.vmap(
        lambda k: views.color_jitter(
          x, k, brightness=0, contrast=(c, c), saturation=0, hue=(h, h), p=1.0
        )
      )
    )(keys)
  )
  first = np.array([np.allclose(o, hue_then_contrast, atol=1e-5) for o in out])
  second = np.array([np.allclose(o, contrast_then_hue, atol=1e-5) for o in out])
  assert (first ^ second).all()
  assert _binomial_ok(first.sum(), 200, 0.5)


def test_jitter_rejects_bad_strengths():
  x = jnp.zeros((2, 2, 3))
  with pytest.raises(ValueError, match='hue'):
    views.color_jitter(x, jax.random.key(0), hue=0.7)
  with pytest.raises(ValueError, match='brightness'):
    views.color_jitter(x, jax.random.key(0), brightness=-0.1)


# ------------------------------------------------------------------ pipeline


@pytest.mark.parametrize('order, channels', [('ssd', 3), ('fedu2', 1)])
def test_pipeline_is_the_identity_without_randomness(order, channels):
  images = np.stack([_image(s, (8, 8, channels)) for s in range(3)])
  augment_fn = jax.jit(
    views.make_two_view_augment(
      crop_scale=(1.0, 1.0),
      crop_ratio=(1.0, 1.0),
      jitter_p=0.0,
      grayscale_p=0.0,
      flip_p=0.0,
      order=order,
    )
  )
  view1, view2 = augment_fn(jnp.asarray(images), jax.random.key(0))
  expected = images.astype(np.float32) / np.float32(255.0)
  assert view1.dtype == jnp.float32
  np.testing.assert_array_equal(view1, expected)
  np.testing.assert_array_equal(view2, expected)


@pytest.mark.parametrize('order', ['ssd', 'fedu2'])
def test_pipeline_applies_flip_and_grayscale_probabilities(order):
  images = np.stack([_image(s, (6, 7, 3)) for s in range(2)])
  augment_fn = jax.jit(
    views.make_two_view_augment(
      crop_scale=(1.0, 1.0),
      crop_ratio=(7 / 6, 7 / 6),
      jitter=(0, 0, 0, 0),
      grayscale_p=1.0,
      flip_p=1.0,
      order=order,
    )
  )
  view1, view2 = augment_fn(jnp.asarray(images), jax.random.key(0))
  x = images.astype(np.float64)[:, :, ::-1] / 255.0
  luma = sum(w * x[..., c] for c, w in enumerate(LUMA))[..., None]
  expected = np.broadcast_to(luma, x.shape)
  np.testing.assert_allclose(view1, expected, atol=1e-6)
  np.testing.assert_allclose(view2, expected, atol=1e-6)


@pytest.mark.parametrize('channels', [3, 1])
def test_views_are_deterministic_in_the_key_and_independent(channels):
  image = _image(20, (8, 8, channels))
  images = jnp.asarray(np.stack([image] * 4))  # One image, four times.
  augment_fn = jax.jit(views.make_two_view_augment())
  a1, a2 = augment_fn(images, jax.random.key(1))
  b1, b2 = augment_fn(images, jax.random.key(1))
  c1, _ = augment_fn(images, jax.random.key(2))
  np.testing.assert_array_equal(a1, b1)
  np.testing.assert_array_equal(a2, b2)
  assert not np.allclose(a1, c1)
  assert not np.allclose(a1, a2)
  # Each example has its own key: identical inputs give different views.
  assert len({np.asarray(v).tobytes() for v in a1}) == 4
  for v in (a1, a2, c1):
    assert v.shape == (4, 8, 8, channels)
    assert np.isfinite(v).all() and v.min() >= 0.0 and v.max() <= 1.0


def test_fedu2_order_defaults_to_its_crop_scale():
  images = jnp.asarray(np.stack([_image(s, (8, 8, 3)) for s in range(4)]))
  key = jax.random.key(3)
  no_jitter = (0, 0, 0, 0)  # Skipped at trace time: a small program.
  default = jax.jit(
    views.make_two_view_augment(order='fedu2', jitter=no_jitter)
  )(images, key)
  explicit = jax.jit(
    views.make_two_view_augment(
      order='fedu2', jitter=no_jitter, crop_scale=(0.2, 1.0)
    )
  )(images, key)
  np.testing.assert_array_equal(default[0], explicit[0])
  np.testing.assert_array_equal(default[1], explicit[1])
  with pytest.raises(ValueError, match='order'):
    views.make_two_view_augment(order='simclr')


def test_out_size_and_vmap_over_keys():
  images = jnp.asarray(np.stack([_image(s, (8, 8, 3)) for s in range(2)]))
  view1, view2 = jax.jit(
    views.make_two_view_augment(out_size=(6, 10), jitter=(0, 0, 0, 0))
  )(images, jax.random.key(4))
  assert view1.shape == view2.shape == (2, 6, 10, 3)
  # The per-example op vmaps over keys as well as images.
  crops = jax.jit(jax.vmap(views.random_resized_crop, in_axes=(None, 0)))(
    images[0], jax.random.split(jax.random.key(5), 3)
  )
  assert crops.shape == (3, 8, 8, 3)


def _x64():
  """`jax.enable_x64()` (``jax.experimental.enable_x64`` before it)."""
  if hasattr(jax, 'enable_x64'):
    return jax.enable_x64()
  from jax.experimental import enable_x64  # pylint: disable=g-import-not-at-top

  return enable_x64()


@pytest.mark.parametrize('channels', [1, 3])
def test_jitter_and_views_under_x64_match_float32(channels):
  """With jax_enable_x64 on (as numerical users run), the jitter's loop
  failed on a float32 carry becoming float64. Its output is float32 either
  way, and the same numbers (its uniforms are drawn as float32)."""
  image = (
    np.random.default_rng(0).integers(0, 256, (8, 8, channels)).astype(np.uint8)
  )
  key = jax.random.key(3)
  expected = np.asarray(views.color_jitter(jnp.asarray(image), key, p=1.0))
  with _x64():
    got = views.color_jitter(jnp.asarray(image), key, p=1.0)
    assert got.dtype == jnp.float32
    np.testing.assert_allclose(np.asarray(got), expected, atol=1e-6)
    augment = library_views.make_two_view_augment(out_size=6)
    one, two = jax.jit(augment)(jnp.asarray(image[None]), key)
    assert one.shape == two.shape == (1, 6, 6, channels)
    assert np.all(np.isfinite(np.asarray(one)))
