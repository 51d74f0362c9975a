"""Encoder + projector models of the federated SSL methods (SSD / FedU2).

Shapes, parameter counts against hand arithmetic (the full ResNet-18 only
through jax.eval_shape), the projector's layout recomputed in NumPy, the
encoder being the ResNet-18 trunk, masked BatchNorm and finite gradients.
"""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

# ModelFns.apply runs as one jitted program a call (models/__init__.py).
from fedjax_metric import models

TINY = {
  'ssl_resnet18': {'width': 4, 'projector_hidden': 16, 'projection_dim': 8},
  'ssl_cnn': {
    'width': 4,
    'embedding_dim': 8,
    'projector_hidden': 16,
    'projection_dim': 6,
  },
}


def _init(model, x, seed=0):
  return models.split_variables(model.init(jax.random.key(seed), x))


def _abstract_counts(model, shape):
  """{collection: #scalars} of the model's variables, without running it."""
  variables = jax.eval_shape(
    model.init, jax.random.key(0), jnp.zeros((1,) + shape)
  )
  return {
    k: sum(math.prod(x.shape) for x in jax.tree.leaves(v))
    for k, v in variables.items()
  }


def _conv(k, c_in, c_out, bias):
  return k * k * c_in * c_out + (c_out if bias else 0)


def _dense(d_in, d_out):
  return d_in * d_out + d_out


def _projector_counts(d_in, hidden, out):
  """(#params, #BatchNorm channels) of Linear -> BN -> ReLU -> Linear."""
  return _dense(d_in, hidden) + 2 * hidden + _dense(hidden, out), hidden


def _resnet18_encoder_counts(w):
  """(#params, #norm channels) of the CIFAR ResNet-18 trunk, no classifier."""
  params = _conv(3, 3, w, bias=False)
  norm_channels = w
  c_in = w
  for stage, stride in enumerate((1, 2, 2, 2)):
    c = w * 2**stage
    for block in range(2):
      params += _conv(3, c_in, c, False) + _conv(3, c, c, False)
      norm_channels += 2 * c
      if block == 0 and (stride != 1 or c_in != c):
        params += _conv(1, c_in, c, False)
        norm_channels += c
      c_in = c
  return params + 2 * norm_channels, norm_channels


# --------------------------------------------------------------------- shapes


@pytest.mark.parametrize(
  'name, shape, emb',
  [
    ('ssl_resnet18', (8, 8, 1), 32),
    ('ssl_cnn', (28, 28, 1), 8),
    ('ssl_cnn', (8, 8, 3), 8),
  ],
)
def test_output_shapes_and_batch_stats(name, shape, emb):
  model = models.build(name, 10, **TINY[name])
  x = jax.random.uniform(jax.random.key(1), (3,) + shape)
  params, state = _init(model, x)
  assert set(params) == {'encoder', 'projector'}
  assert set(state) == {'batch_stats'}
  assert set(state['batch_stats']) == {'encoder', 'projector'}
  out, new_state = model.apply(
    params, state, x, train=True, mask=jnp.ones(3, bool)
  )
  assert set(out) == {'embedding', 'projection', 'features'}
  assert out['embedding'].shape == (3, emb)
  assert out['projection'].shape == (3, TINY[name]['projection_dim'])
  assert out['features'] == []
  assert (out['embedding'] >= 0).all()  # Post-ReLU representation.
  assert (out['projection'] < 0).any()  # Linear output: no ReLU.
  assert jax.tree.structure(new_state) == jax.tree.structure(state)
  assert not all(
    np.allclose(a, b)
    for a, b in zip(
      jax.tree.leaves(new_state), jax.tree.leaves(state), strict=True
    )
  )


@pytest.mark.parametrize('norm', ['none', 'group'])
def test_other_norms_have_no_batch_stats(norm):
  model = models.build('ssl_cnn', 10, norm=norm, **TINY['ssl_cnn'])
  x = jnp.ones((2, 8, 8, 1))
  params, state = _init(model, x)
  assert state == {}
  out, _ = model.apply(params, state, x, train=True)
  assert out['projection'].shape == (2, 6)


# --------------------------------------------------------------- param counts


def test_ssl_resnet18_param_count_matches_hand_count():
  encoder, encoder_norms = _resnet18_encoder_counts(64)
  projector, projector_norms = _projector_counts(512, 2048, 512)
  # The CIFAR ResNet-18 is 11,173,962 with its 10-way fc (512 * 10 + 10).
  assert encoder == 11_173_962 - _dense(512, 10) == 11_168_832
  assert projector == 2_103_808
  assert _abstract_counts(models.build('ssl_resnet18', 10), (32, 32, 3)) == {
    'params': encoder + projector,
    'batch_stats': 2 * (encoder_norms + projector_norms),
  }
  assert encoder + projector == 13_272_640
  # Another width and projector: the formula is not tuned to one config.
  encoder, encoder_norms = _resnet18_encoder_counts(8)
  projector, projector_norms = _projector_counts(64, 96, 32)
  model = models.build(
    'ssl_resnet18', 100, width=8, projector_hidden=96, projection_dim=32
  )
  assert _abstract_counts(model, (32, 32, 3)) == {
    'params': encoder + projector,
    'batch_stats': 2 * (encoder_norms + projector_norms),
  }


@pytest.mark.parametrize('shape', [(28, 28, 1), (32, 32, 3)])
def test_ssl_cnn_param_count_matches_hand_count(shape):
  h, w, c = shape
  side_h, side_w = -(-h // 4), -(-w // 4)  # Two stride-2 SAME convs.
  encoder = (
    _conv(3, c, 32, False)
    + _conv(3, 32, 64, False)
    + 2 * (32 + 64)
    + _dense(64 * side_h * side_w, 128)
  )
  projector, projector_norms = _projector_counts(128, 512, 128)
  if shape == (28, 28, 1):
    assert encoder + projector == 553_184
  assert _abstract_counts(models.build('ssl_cnn', 10), shape) == {
    'params': encoder + projector,
    'batch_stats': 2 * (32 + 64 + projector_norms),
  }
  # Without a norm the convs get biases back.
  no_norm = (
    _conv(3, c, 32, True)
    + _conv(3, 32, 64, True)
    + _dense(64 * side_h * side_w, 128)
    + _dense(128, 512)
    + _dense(512, 128)
  )
  assert _abstract_counts(models.build('ssl_cnn', 10, norm='none'), shape) == {
    'params': no_norm
  }


# ------------------------------------------------------------------ semantics


def test_projection_is_the_projector_of_the_embedding():
  # Both models share `ssl.Projector`; the small CNN compiles fastest.
  shape = (8, 8, 1)
  model = models.build('ssl_cnn', 10, **TINY['ssl_cnn'])
  x = jax.random.uniform(jax.random.key(2), (4,) + shape)
  params, state = _init(model, x)
  # Move the running statistics away from (0, 1) so eval-mode BN matters.
  stats = state['batch_stats']['projector']['BatchNorm_0']
  stats['mean'] = stats['mean'] + 0.3
  stats['var'] = stats['var'] * 2.5
  with jax.default_matmul_precision('highest'):
    out, _ = model.apply(params, state, x, train=False)
  proj = jax.tree.map(lambda a: np.asarray(a, np.float64), params['projector'])
  mean = np.asarray(stats['mean'], np.float64)
  var = np.asarray(stats['var'], np.float64)
  h = np.asarray(out['embedding'], np.float64)
  hidden = h @ proj['fc1']['kernel'] + proj['fc1']['bias']
  hidden = (hidden - mean) / np.sqrt(var + 1e-5) * proj['BatchNorm_0'][
    'scale'
  ] + proj['BatchNorm_0']['bias']
  z = np.maximum(hidden, 0.0) @ proj['fc2']['kernel'] + proj['fc2']['bias']
  np.testing.assert_allclose(out['projection'], z, rtol=1e-4, atol=1e-5)


def _eager_embedding(model, params, model_state, x, train):
  """The flax module run op by op (ModelFns.apply is one jitted program)."""
  variables = {'params': params, **model_state}
  if train:
    outputs, _ = model.module.apply(
      variables, x, train=True, mutable=list(model_state)
    )
  else:
    outputs = model.module.apply(variables, x, train=False)
  return outputs['embedding']


def test_ssl_resnet18_encoder_is_the_resnet18_trunk():
  # The encoder's parameters, with any classifier added, run in the
  # classification ResNet-18 give the same embedding. Eager, so both run
  # the same ops: two compiled programs fuse differently, 1.5e-5 apart in
  # train mode.
  ssl_model = models.build('ssl_resnet18', 10, **TINY['ssl_resnet18'])
  ref_model = models.build('resnet18', 10, width=4, norm='batch')
  x = jax.random.uniform(jax.random.key(3), (3, 8, 8, 3))
  params, state = _init(ssl_model, x)
  ref_params, _ = _init(ref_model, x)
  ref_params = {**params['encoder'], 'fc': ref_params['fc']}
  ref_state = {'batch_stats': state['batch_stats']['encoder']}
  with jax.default_matmul_precision('highest'):
    for train in (False, True):
      np.testing.assert_allclose(
        _eager_embedding(ssl_model, params, state, x, train),
        _eager_embedding(ref_model, ref_params, ref_state, x, train),
        rtol=1e-5,
        atol=1e-6,
      )


def test_masked_batchnorm_ignores_padded_examples():
  # The ResNet-18 blocks' masked BatchNorm is tested with the classification
  # ResNet (test_models_zoo); here the projector's BatchNorm1d, shared by both
  # SSL models, behind the small CNN's.
  shape = (8, 8, 1)
  model = models.build('ssl_cnn', 10, **TINY['ssl_cnn'])
  real = 4
  x = jax.random.normal(jax.random.key(5), (real + 2,) + shape)
  params, state = _init(model, x)
  mask = jnp.arange(real + 2) < real
  junk_a = x.at[real:].set(100.0)
  junk_b = x.at[real:].set(
    -7.0 * jax.random.normal(jax.random.key(6), (2,) + shape)
  )
  apply = model.apply
  with jax.default_matmul_precision('highest'):
    out_a, state_a = apply(params, state, junk_a, train=True, mask=mask)
    out_b, state_b = apply(params, state, junk_b, train=True, mask=mask)
    # Reference: the real examples alone, no padding at all.
    out_r, state_r = apply(params, state, x[:real], train=True, mask=None)
  for out in (out_a, out_b):
    for key in ('embedding', 'projection'):
      np.testing.assert_allclose(
        out[key][:real], out_r[key], rtol=1e-4, atol=1e-4
      )
  for s in (state_a, state_b):
    for a, r in zip(jax.tree.leaves(s), jax.tree.leaves(state_r), strict=True):
      np.testing.assert_allclose(a, r, rtol=1e-4, atol=1e-4)
  # The projector's statistics moved too (BN1d also honours the mask).
  moved = state_r['batch_stats']['projector']['BatchNorm_0']['mean']
  assert not np.allclose(
    moved, state['batch_stats']['projector']['BatchNorm_0']['mean']
  )


def test_gradients_are_finite_at_degenerate_batches():
  # The small CNN: its BatchNorm layers are the ResNet's (layers.make_norm).
  shape = (8, 8, 1)
  model = models.build('ssl_cnn', 10, **TINY['ssl_cnn'])
  params, state = _init(model, jnp.zeros((1,) + shape))

  def loss(p, x, mask):
    out, _ = model.apply(p, state, x, train=True, mask=mask)
    return jnp.sum(out['projection'] ** 2) + jnp.sum(out['embedding'])

  grad = jax.jit(jax.grad(loss))
  cases = [
    (jnp.zeros((3,) + shape), jnp.ones(3, bool)),  # All-zero images.
    (jnp.ones((3,) + shape), jnp.ones(3, bool)),  # Coincident images.
    # One real example: zero batch variance; padding is garbage.
    (jnp.full((3,) + shape, 5.0), jnp.array([True, False, False])),
  ]
  for x, mask in cases:
    grads = grad(params, x, mask)
    assert all(np.isfinite(g).all() for g in jax.tree.leaves(grads))
