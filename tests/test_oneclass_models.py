"""Embedding networks of the one-class family: Deep SVDD LeNet, ResNet-32.

Shapes, parameter counts against hand arithmetic over the layer shapes
(full-size models only through jax.eval_shape), the embedding_dim field, jit,
no batch_stats under GroupNorm, and the bias-free property of Deep SVDD nets.
"""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

# ModelFns.apply runs as one jitted program a call (models/__init__.py).
from fedjax_metric import models


def _abstract_counts(model, shape):
  """{collection: #scalars} of the model's variables, without running it."""
  variables = jax.eval_shape(
    model.init, jax.random.key(0), jnp.zeros((1,) + shape)
  )
  return {
    k: sum(math.prod(x.shape) for x in jax.tree.leaves(v))
    for k, v in variables.items()
  }


def _conv(k, c_in, c_out, bias=False):
  return k * k * c_in * c_out + (c_out if bias else 0)


def _dense(d_in, d_out, bias=False):
  return d_in * d_out + (d_out if bias else 0)


def _count(params):
  return sum(math.prod(x.shape) for x in jax.tree.leaves(params))


def _leaf_names(params):
  return {
    path[-1].key for path, _ in jax.tree_util.tree_leaves_with_path(params)
  }


def _random_variables(model, x, seed=0):
  """Variables of the right shapes filled from NumPy.

  Skips flax's initialisers, which compile once per parameter shape when
  run eagerly (~15 s for ResNet-32 on a loaded CPU); the forward pass does
  not care where the values came from.
  """
  shapes = jax.eval_shape(model.init, jax.random.key(0), x)
  rng = np.random.default_rng(seed)
  return jax.tree.map(
    lambda s: jnp.asarray(0.1 * rng.normal(size=s.shape), s.dtype), shapes
  )


# --------------------------------------------------------------- LeNet


@pytest.mark.parametrize(
  'shape, flat', [((28, 28, 1), 4 * 7 * 7), ((32, 32, 3), 4 * 8 * 8)]
)
def test_lenet_shapes_and_hand_count(shape, flat):
  model = models.build('lenet', 10)
  x = jnp.asarray(
    np.random.default_rng(0).normal(size=(3,) + shape), jnp.float32
  )
  params, state = models.split_variables(_random_variables(model, x))
  assert state == {}  # GroupNorm: no batch_stats.
  out, new_state = model.apply(params, state, x, train=True)
  assert set(out) == {'embedding', 'features'}
  assert out['embedding'].shape == (3, 32)
  assert [f.shape for f in out['features']] == [(3, 8), (3, 4)]
  assert new_state == {}
  c_in = shape[-1]
  # Deep SVDD LeNet: no biases, non-affine norms, so convs + dense only.
  hand = _conv(5, c_in, 8) + _conv(5, 8, 4) + _dense(flat, 32)
  assert models.count_params(params) == hand
  assert _leaf_names(params) == {'kernel'}


def test_lenet_mnist_count_is_7272():
  # 5*5*1*8 + 5*5*8*4 + 196*32: the 28x28 count spelled out.
  counts = _abstract_counts(models.build('lenet', 10), (28, 28, 1))
  assert counts == {'params': 200 + 800 + 6272}


def test_lenet_fields_embedding_dim_bias_and_affine():
  model = models.build(
    'lenet', 10, embedding_dim=16, use_bias=True, norm_affine=True
  )
  counts = _abstract_counts(model, (28, 28, 1))
  hand = (
    _conv(5, 1, 8, True)
    + _conv(5, 8, 4, True)
    + _dense(196, 16, True)
    + 2 * (8 + 4)
  )  # GroupNorm scale + offset per channel.
  assert counts == {'params': hand}
  x = jnp.ones((2, 28, 28, 1))
  params, state = models.split_variables(_random_variables(model, x))
  out, _ = model.apply(params, state, x, train=False)
  assert out['embedding'].shape == (2, 16)


def test_lenet_l2_normalize_puts_embeddings_on_the_unit_sphere():
  x = jax.random.normal(jax.random.key(0), (5, 28, 28, 1))
  plain = models.build('lenet', 10, (28, 28, 1))
  unit = models.build('lenet', 10, (28, 28, 1), l2_normalize=True)
  variables = plain.init(jax.random.key(1), x)
  params, state = models.split_variables(variables)
  raw, _ = plain.apply(params, state, x, train=False)
  out, _ = unit.apply(params, state, x, train=False)
  raw = np.asarray(raw['embedding'], np.float64)
  np.testing.assert_allclose(
    out['embedding'],
    raw / np.linalg.norm(raw, axis=1, keepdims=True),
    rtol=1e-5,
  )
  assert np.abs(np.linalg.norm(raw, axis=1) - 1).max() > 0.1  # not already


def test_lenet_batch_norm_keeps_batch_stats_without_affine():
  model = models.build('lenet', 10, norm='batch')
  counts = _abstract_counts(model, (28, 28, 1))
  # Running mean and variance per channel, no scale / offset.
  assert counts == {'params': 7272, 'batch_stats': 2 * (8 + 4)}
  with pytest.raises(ValueError, match='norm'):
    models.build('lenet', 10, norm='layer').init(
      jax.random.key(0), jnp.ones((1, 28, 28, 1))
    )


def test_lenet_batch_norm_ignores_masked_rows():
  model = models.build('lenet', 10, norm='batch')
  rng = np.random.default_rng(4)
  real = jnp.asarray(rng.normal(size=(3, 28, 28, 1)), jnp.float32)
  padded = jnp.concatenate([real, 50.0 * jnp.ones((2, 28, 28, 1))])
  params, state = models.split_variables(_random_variables(model, real))
  state = jax.tree.map(jnp.ones_like, state)  # Valid running variances.
  out_real, stats_real = model.apply(params, state, real, train=True)
  out_pad, stats_pad = model.apply(
    params, state, padded, train=True, mask=jnp.arange(5) < 3
  )
  np.testing.assert_allclose(
    np.asarray(out_pad['embedding'][:3]),
    np.asarray(out_real['embedding']),
    rtol=1e-4,
    atol=1e-5,
  )
  jax.tree.map(
    lambda a, b: np.testing.assert_allclose(
      np.asarray(a), np.asarray(b), rtol=1e-4, atol=1e-6
    ),
    stats_pad,
    stats_real,
  )


def test_lenet_bias_free_nets_are_homogeneous():
  """No bias + leaky ReLU + max-pool + linear: f(a x) = a f(x) for a > 0.

  Without norms that is degree-1 homogeneity; non-affine GroupNorm makes the
  net scale-invariant instead. Either fails as soon as any bias exists.
  """
  x = jnp.asarray(
    np.random.default_rng(2).normal(size=(2, 28, 28, 1)), jnp.float32
  )
  plain = models.build('lenet', 10, norm='none')
  p, s = models.split_variables(_random_variables(plain, x))
  f = lambda v: plain.apply(p, s, v, train=False)[0]['embedding']
  np.testing.assert_allclose(
    np.asarray(f(3.0 * x)), 3.0 * np.asarray(f(x)), rtol=1e-4, atol=1e-5
  )
  grouped = models.build('lenet', 10)
  p, s = models.split_variables(_random_variables(grouped, x))
  g = lambda v: grouped.apply(p, s, v, train=False)[0]['embedding']
  np.testing.assert_allclose(
    np.asarray(g(3.0 * x)), np.asarray(g(x)), rtol=1e-3, atol=1e-4
  )
  biased = models.build('lenet', 10, norm='none', use_bias=True)
  p, s = models.split_variables(_random_variables(biased, x))
  h = lambda v: biased.apply(p, s, v, train=False)[0]['embedding']
  assert not np.allclose(
    np.asarray(h(3.0 * x)), 3.0 * np.asarray(h(x)), rtol=1e-3
  )


def test_lenet_jit():
  model = models.build('lenet', 10, input_shape=(28, 28, 1))
  # init(key) without images works through input_shape (abstractly here).
  shapes = jax.eval_shape(model.init, jax.random.key(0))
  assert _count(shapes['params']) == 7272
  x = jnp.asarray(
    np.random.default_rng(1).normal(size=(4, 28, 28, 1)), jnp.float32
  )
  params, state = models.split_variables(_random_variables(model, x))
  run = jax.jit(lambda p, v: model.apply(p, state, v, train=True)[0])
  np.testing.assert_allclose(
    np.asarray(run(params, x)['embedding']),
    np.asarray(model.apply(params, state, x, train=True)[0]['embedding']),
    rtol=1e-5,
    atol=1e-5,
  )


# --------------------------------------------------------------- ResNet-32


def _resnet32_count(w, embedding_dim, c_in=3, bias=True):
  """Hand count: (#params). Bias-free convs, norm scale+offset per channel."""
  params = _conv(3, c_in, w)
  norm_channels = w
  prev = w
  for stage, stride in enumerate((1, 2, 2)):
    c = w * 2**stage
    for block in range(5):
      params += _conv(3, prev, c) + _conv(3, c, c)
      norm_channels += 2 * c
      if block == 0 and (stride != 1 or prev != c):
        params += _conv(1, prev, c)
        norm_channels += c
      prev = c
  params += 2 * norm_channels
  if embedding_dim != 4 * w:
    params += _dense(4 * w, embedding_dim, bias)
  return params


def test_resnet32_full_size_hand_count():
  counts = _abstract_counts(models.build('resnet32', 10), (32, 32, 3))
  hand = _resnet32_count(16, 64)
  assert counts == {'params': hand}  # GroupNorm: no batch_stats.
  # He et al.'s ResNet-32 has 0.46M parameters with zero-padded shortcuts;
  # the 1x1 projections add 2,560 conv and 192 norm parameters.
  conv_weights = (
    432
    + 5 * 2 * 2304
    + (4608 + 9216 + 512)
    + 4 * 2 * 9216
    + (18432 + 36864 + 2048)
    + 4 * 2 * 36864
  )
  assert conv_weights == hand - 2 * (16 + 10 * 16 + 11 * 32 + 11 * 64)
  assert 0.46e6 < hand < 0.47e6


def test_resnet32_small_forward_under_jit():
  model = models.build('resnet32', 10, width=8, groups=4, embedding_dim=16)
  x = jnp.asarray(
    np.random.default_rng(1).normal(size=(2, 8, 8, 3)), jnp.float32
  )
  params, state = models.split_variables(_random_variables(model, x))
  assert state == {}  # GroupNorm: no batch_stats.
  out = jax.jit(lambda p, v: model.apply(p, state, v, train=True)[0])(params, x)
  assert set(out) == {'embedding', 'features'}
  assert out['embedding'].shape == (2, 16)
  assert [f.shape for f in out['features']] == [
    (2, 8),
    (2, 8),
    (2, 16),
    (2, 32),
  ]
  assert np.isfinite(np.asarray(out['embedding'])).all()
  # GroupNorm(4) in the blocks: a scale and an offset per channel.
  assert params['layer3_0']['GroupNorm_0']['scale'].shape == (32,)


@pytest.mark.parametrize('embedding_dim', [16, 32, 48])
def test_resnet32_embedding_dim_and_projection(embedding_dim):
  # width 8: the last stage has 32 channels, so 32 needs no projection.
  model = models.build(
    'resnet32', 10, width=8, groups=4, embedding_dim=embedding_dim
  )
  x = jnp.zeros((3, 8, 8, 3))
  variables = jax.eval_shape(model.init, jax.random.key(0), x)
  params, state = models.split_variables(variables)
  assert _count(params) == _resnet32_count(8, embedding_dim)
  assert ('projection' in params) == (embedding_dim != 32)
  out = jax.eval_shape(
    lambda p: model.apply(p, state, x, train=False)[0], params
  )
  assert out['embedding'].shape == (3, embedding_dim)


def test_resnet32_batch_norm_has_batch_stats():
  counts = _abstract_counts(
    models.build('resnet32', 10, width=4, norm='batch'), (8, 8, 3)
  )
  assert 'batch_stats' in counts and counts['params'] == _resnet32_count(4, 64)
