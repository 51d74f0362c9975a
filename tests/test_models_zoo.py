"""The paper models: FedQuad CNN, MOON SimpleCNN, FedRCL ResNet-18.

Shapes on the three image sizes, parameter counts against hand arithmetic
(full-size models only through jax.eval_shape, so no FLOPs are spent), the
FedRCL pre-ReLU taps, MOON's classifier-on-z layout and masked BatchNorm.
"""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

# ModelFns.apply runs as one jitted program a call (models/__init__.py).
from fedjax_metric import models

SHAPES = [(32, 32, 3), (28, 28, 1), (8, 8, 1)]


def _init(model, x, seed=0):
  return models.split_variables(model.init(jax.random.key(seed), x))


def _shapes_of_a_training_pass(model, x):
  """(params, model state, outputs, new state) as shapes only
  (jax.eval_shape: traced, neither compiled nor run)."""

  def init_and_apply(x):
    params, state = _init(model, x)
    out, new_state = model.apply(
      params, state, x, train=True, mask=jnp.ones(len(x), bool)
    )
    return params, state, out, new_state

  return jax.eval_shape(init_and_apply, x)


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


# --------------------------------------------------------------------------- shapes


@pytest.mark.parametrize('shape', SHAPES)
@pytest.mark.parametrize('norm', ['batch', 'group', 'none'])
def test_fedquad_cnn_output_shapes(shape, norm):
  model = models.build(
    'fedquad_cnn', 10, widths=(4, 8, 16), embedding_dim=8, norm=norm
  )
  x = jnp.ones((3,) + shape)
  _, state, out, new_state = _shapes_of_a_training_pass(model, x)
  assert set(state) == ({'batch_stats'} if norm == 'batch' else set())
  assert out['logits'].shape == (3, 10)
  assert out['embedding'].shape == (3, 8)
  assert [f.shape for f in out['features']] == [(3, 4), (3, 8), (3, 16)]
  assert jax.tree.structure(new_state) == jax.tree.structure(state)


@pytest.mark.parametrize(
  'shape, flat',
  [
    ((32, 32, 3), 16 * 5 * 5),
    ((28, 28, 1), 16 * 4 * 4),
    ((8, 8, 1), 16 * 2 * 2),
  ],
)
def test_moon_cnn_output_shapes_and_flatten_size(shape, flat):
  model = models.build('moon_cnn', 10)
  x = jnp.ones((2,) + shape)
  params, state, out, _ = _shapes_of_a_training_pass(model, x)
  assert state == {}
  assert out['logits'].shape == (2, 10)
  assert out['embedding'].shape == (2, 256)
  assert [f.shape for f in out['features']] == [(2, 84)]
  # 32 and 28 px: VALID convs as in MOON; 8 px: SAME (else the map collapses).
  assert params['Dense_0']['kernel'].shape == (flat, 120)


@pytest.mark.parametrize('shape', SHAPES)
@pytest.mark.parametrize('norm', ['group', 'batch'])
def test_resnet18_output_shapes(shape, norm):
  w = 4
  model = models.build('resnet18', 10, width=w, norm=norm)
  x = jax.random.normal(jax.random.key(1), (2,) + shape)
  _, state, out, new_state = _shapes_of_a_training_pass(model, x)
  assert set(state) == ({'batch_stats'} if norm == 'batch' else set())
  assert out['logits'].shape == (2, 10)
  assert out['embedding'].shape == (2, 8 * w)
  assert [f.shape for f in out['features']] == [
    (2, w),
    (2, w),
    (2, 2 * w),
    (2, 4 * w),
    (2, 8 * w),
  ]
  assert jax.tree.structure(new_state) == jax.tree.structure(state)


def test_unknown_field_is_a_clear_error():
  with pytest.raises(TypeError, match='no field'):
    models.build('resnet18', 10, depth=34)


# --------------------------------------------------------------------------- param counts


def _resnet18_counts(w, num_classes):
  """Hand count of CIFAR ResNet-18: (#params, #norm channels).

  Convs have no bias; every norm (GroupNorm or BatchNorm) has a scale and a
  bias per channel, so both norms give the same parameter count.
  """
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
  params += 2 * norm_channels + _dense(8 * w, num_classes)
  return params, norm_channels


def test_resnet18_param_count_matches_hand_count():
  params, norm_channels = _resnet18_counts(64, 10)
  assert params == 11_173_962  # The usual CIFAR ResNet-18 figure.
  assert norm_channels == 4_800
  assert _abstract_counts(models.build('resnet18', 10), (32, 32, 3)) == {
    'params': 11_173_962
  }
  # BatchNorm: same params, plus mean and var per norm channel.
  assert _abstract_counts(
    models.build('resnet18', 10, norm='batch'), (32, 32, 3)
  ) == {'params': 11_173_962, 'batch_stats': 2 * 4_800}
  # Tiny width, CIFAR-100 head: the formula is not tuned to one config.
  assert _abstract_counts(
    models.build('resnet18', 100, width=8), (32, 32, 3)
  ) == {'params': _resnet18_counts(8, 100)[0]}


@pytest.mark.parametrize(
  'shape, expected', [((32, 32, 3), 92_626), ((28, 28, 1), 75_046)]
)
def test_moon_cnn_param_count_matches_hand_count(shape, expected):
  h, w, c = shape
  side = ((h - 4) // 2 - 4) // 2  # two 5x5 VALID convs, each then a 2x2 pool
  assert side == (w - 4) // 2 // 2 - 2
  hand = (
    _conv(5, c, 6, True)
    + _conv(5, 6, 16, True)
    + _dense(16 * side * side, 120)
    + _dense(120, 84)  # header -> h (84)
    + _dense(84, 84)
    + _dense(84, 256)  # l1, l2 -> z (256)
    + _dense(256, 10)
  )  # l3 on z
  assert hand == expected
  assert _abstract_counts(models.build('moon_cnn', 10), shape) == {
    'params': expected
  }


def test_fedquad_cnn_param_count_matches_hand_count():
  hand = (
    _conv(3, 3, 64, True)
    + _conv(3, 64, 128, True)
    + _conv(3, 128, 256, True)
    + 2 * (64 + 128 + 256)  # BatchNorm scale + bias
    + _dense(256, 128)
    + _dense(128, 10)
  )
  assert hand == 405_898
  assert _abstract_counts(models.build('fedquad_cnn', 10), (32, 32, 3)) == {
    'params': 405_898,
    'batch_stats': 2 * (64 + 128 + 256),
  }


# --------------------------------------------------------------------------- semantics


@pytest.mark.parametrize('norm', ['group', 'batch'])
def test_resnet18_taps_are_pre_relu_and_logits_path_is_plain(norm):
  model = models.build('resnet18', 10, width=4, norm=norm)
  x = jax.random.normal(jax.random.key(2), (4, 16, 16, 3))
  params, state = _init(model, x)
  out, _ = model.apply(params, state, x, train=True, mask=None)
  # Levels 1-4: the tap is the spatial mean of the last block's output before
  # its ReLU, which has negative entries.
  variables = models.merge_variables(params, state)
  _, captured = model.module.apply(
    variables,
    x,
    train=True,
    mask=None,
    capture_intermediates=True,
    mutable=['intermediates', 'batch_stats'],
  )
  for level in range(1, 5):
    (block_out,) = captured['intermediates'][f'layer{level}_1']['__call__']
    assert (block_out < 0).any()
    np.testing.assert_allclose(
      out['features'][level], block_out.mean(axis=(1, 2)), rtol=1e-5, atol=1e-6
    )
  # Level 0 is the normalised stem (zero-mean groups), so it goes negative even
  # pooled. Levels 1-4 add a non-negative identity shortcut and may pool to
  # all-positive values; push the last blocks' second-norm bias far negative:
  # the pre-ReLU taps must follow it below zero, while the post-ReLU embedding
  # can only drop to zero.
  assert (out['features'][0] < 0).any(), 'level 0 looks post-ReLU'
  norm_name = {'group': 'GroupNorm_1', 'batch': 'BatchNorm_1'}[norm]
  shifted = jax.tree.map(lambda a: a, params)
  for level in range(1, 5):
    bias = shifted[f'layer{level}_1'][norm_name]['bias']
    shifted[f'layer{level}_1'][norm_name]['bias'] = bias - 100.0
  out_shifted, _ = model.apply(shifted, state, x, train=True, mask=None)
  for level in range(1, 5):
    assert (out_shifted['features'][level] < 0).all(), (
      f'level {level} looks post-ReLU'
    )
  np.testing.assert_array_equal(out_shifted['embedding'], 0.0)
  emb = out['embedding']
  assert (emb >= 0).all()
  # Pooled ReLU(layer4) >= ReLU(pooled pre-ReLU layer4) (Jensen), and differs:
  # the embedding is taken after the ReLU, the tap before it.
  last = out['features'][4]
  assert (emb >= jax.nn.relu(last) - 1e-5).all()
  assert not np.allclose(emb, jax.nn.relu(last), atol=1e-4)
  fc = params['fc']
  np.testing.assert_allclose(
    out['logits'], emb @ fc['kernel'] + fc['bias'], rtol=1e-5, atol=1e-5
  )


def test_moon_classifier_sits_on_projection():
  model = models.build('moon_cnn', 10)
  x = jax.random.normal(jax.random.key(3), (3, 32, 32, 3))
  params, state = _init(model, x)
  out, _ = model.apply(params, state, x, train=False)
  assert params['l1']['kernel'].shape == (84, 84)
  assert params['l2']['kernel'].shape == (84, 256)
  assert params['l3']['kernel'].shape == (256, 10)
  z = out['embedding']
  np.testing.assert_allclose(
    out['logits'],
    z @ params['l3']['kernel'] + params['l3']['bias'],
    rtol=1e-5,
    atol=1e-5,
  )
  h = out['features'][0]
  assert (h >= 0).all()  # h ends with a ReLU; z is linear.
  np.testing.assert_allclose(
    z,
    jax.nn.relu(h @ params['l1']['kernel'] + params['l1']['bias'])
    @ params['l2']['kernel']
    + params['l2']['bias'],
    rtol=1e-4,
    atol=1e-5,
  )


def test_fedquad_embedding_is_unnormalised_128d_and_feeds_classifier_directly():
  model = models.build('fedquad_cnn', 10)
  x = jax.random.normal(jax.random.key(4), (2, 8, 8, 3))
  params, state = _init(model, x)
  out, _ = model.apply(params, state, x, train=False)
  emb = out['embedding']
  assert emb.shape == (2, 128)
  assert (emb < 0).any()  # No ReLU on the embedding.
  assert not np.allclose(jnp.linalg.norm(emb, axis=1), 1.0, atol=1e-2)
  assert out['features'][2].shape == (2, 256)  # The flattened 1x1 GAP.
  cls = params['Dense_1']
  np.testing.assert_allclose(
    out['logits'], emb @ cls['kernel'] + cls['bias'], rtol=1e-5, atol=1e-5
  )


@pytest.mark.parametrize(
  'name, kwargs',
  [
    ('fedquad_cnn', dict(widths=(4, 8, 16), embedding_dim=8)),
    ('resnet18', dict(width=4, norm='batch')),
  ],
)
def test_masked_batchnorm_ignores_padded_examples(name, kwargs):
  model = models.build(name, 10, **kwargs)
  x = jax.random.normal(jax.random.key(5), (4, 8, 8, 3))
  params, state = _init(model, x)
  assert 'batch_stats' in state
  mask = jnp.array([True, True, False, False])
  junk_a = x.at[2:].set(100.0)
  junk_b = x.at[2:].set(
    -7.0 * jax.random.normal(jax.random.key(6), (2, 8, 8, 3))
  )
  out_a, state_a = model.apply(params, state, junk_a, train=True, mask=mask)
  out_b, state_b = model.apply(params, state, junk_b, train=True, mask=mask)
  # Reference: the real examples alone, no padding at all.
  out_r, state_r = model.apply(params, state, x[:2], train=True, mask=None)
  # The 2- and 4-example batches round differently (a GPU picks convolution
  # algorithms by batch size; XLA's CPU kernels block by it), and BatchNorm
  # over two examples at ResNet-18's 1x1 deepest stage amplifies that: up to
  # 5e-4 relative on an H100, 2.4e-3 absolute in one feature on an AVX2-only
  # EPYC (and 1.5e-4 in the running statistics). Leaked padding (values of
  # 100) moves the features by ~5 and the logits by ~3 there.
  deep = dict(atol=1e-2, rtol=1e-2)
  tol = (
    dict(atol=1e-4, rtol=1e-4)
    if jax.default_backend() == 'cpu'
    else dict(atol=1e-3, rtol=1e-3)
  )
  for out in (out_a, out_b):
    np.testing.assert_allclose(out['logits'][:2], out_r['logits'], **tol)
    for f, f_r in zip(out['features'], out_r['features']):
      np.testing.assert_allclose(f[:2], f_r, **deep)
  for s in (state_a, state_b):
    for a, r in zip(jax.tree.leaves(s), jax.tree.leaves(state_r)):
      np.testing.assert_allclose(a, r, **deep)
  # And the statistics did move (train mode really used the batch).
  assert not all(
    np.allclose(a, b)
    for a, b in zip(jax.tree.leaves(state_r), jax.tree.leaves(state))
  )


def test_a_downsampling_block_pads_like_the_pytorch_resnet_it_ports():
  """PyTorch's conv3x3 has padding=1 at every stride; flax's 'SAME' at
  stride 2 pads (0, 1) instead, shifting the main path one pixel from the
  1x1 shortcut. The block equals convolutions written out with (1, 1)."""
  from fedjax_metric.models import resnet

  block = resnet.BasicBlock(channels=4, strides=2, norm='none')
  x = jax.random.normal(jax.random.key(0), (2, 8, 8, 3))
  variables = block.init(jax.random.key(1), x, False, None)
  params = variables['params']

  def conv(inputs, name, stride, pad):
    return jax.lax.conv_general_dilated(
      inputs,
      params[name]['kernel'],
      (stride, stride),
      pad,
      dimension_numbers=('NHWC', 'HWIO', 'NHWC'),
      precision=jax.lax.Precision.HIGHEST,
    )

  one = ((1, 1), (1, 1))
  main = conv(jax.nn.relu(conv(x, 'Conv_0', 2, one)), 'Conv_1', 1, one)
  expected = main + conv(x, 'Conv_2', 2, ((0, 0), (0, 0)))
  got = block.apply(variables, x, False, None)
  np.testing.assert_allclose(got, expected, atol=1e-5)
