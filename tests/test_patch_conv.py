"""`layers.PatchConv` (im2col + matmul) equals `nn.Conv`, also vmapped over
per-client weights, forward and backward; and against a NumPy loop."""

import flax.linen as nn
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest

from fedjax_metric.models import layers


def numpy_conv(x, kernel, bias, stride, padding):
  """Cross-correlation as loops over output pixels (float64)."""
  x, kernel = np.asarray(x, np.float64), np.asarray(kernel, np.float64)
  b, h, w, _ = x.shape
  kh, kw, _, out = kernel.shape
  if padding == 'SAME':
    oh, ow = -(-h // stride), -(-w // stride)
    ph = max((oh - 1) * stride + kh - h, 0)
    pw = max((ow - 1) * stride + kw - w, 0)
    x = np.pad(
      x, ((0, 0), (ph // 2, ph - ph // 2), (pw // 2, pw - pw // 2), (0, 0))
    )
  else:
    oh, ow = (h - kh) // stride + 1, (w - kw) // stride + 1
  y = np.zeros((b, oh, ow, out))
  for i in range(oh):
    for j in range(ow):
      window = x[
        :, i * stride : i * stride + kh, j * stride : j * stride + kw, :
      ]
      y[:, i, j, :] = np.tensordot(window, kernel, axes=3)
  return y + np.asarray(bias, np.float64)


@pytest.mark.parametrize(
  'stride,padding', [(1, 'SAME'), (2, 'SAME'), (1, 'VALID'), (2, 'VALID')]
)
def test_patch_conv_equals_xla_conv_and_numpy(stride, padding):
  x = jax.random.normal(jax.random.key(0), (2, 7, 6, 3))
  conv = nn.Conv(5, (3, 3), strides=stride, padding=padding)
  patch = layers.PatchConv(5, (3, 3), strides=stride, padding=padding)
  variables = conv.init(jax.random.key(1), x)
  # Same parameter tree: a checkpoint of one loads into the other.
  assert jax.tree.map(
    jnp.shape, patch.init(jax.random.key(1), x)
  ) == jax.tree.map(jnp.shape, variables)
  expected = numpy_conv(
    x,
    variables['params']['kernel'],
    variables['params']['bias'],
    stride,
    padding,
  )
  np.testing.assert_allclose(patch.apply(variables, x), expected, atol=1e-5)
  np.testing.assert_allclose(conv.apply(variables, x), expected, atol=1e-5)


def test_vmapped_over_client_weights_forward_and_gradients_match():
  """4 clients, each its own kernel and batch: the case where nn.Conv turns
  into a grouped convolution."""
  x = jax.random.normal(jax.random.key(0), (4, 2, 8, 8, 3))
  conv = nn.Conv(6, (3, 3), strides=2)
  patch = layers.PatchConv(6, (3, 3), strides=2)
  keys = jax.random.split(jax.random.key(1), 4)
  variables = jax.vmap(lambda k: conv.init(k, x[0]))(keys)

  def loss(module, v, xs):
    return jnp.sum(jnp.tanh(module.apply(v, xs)))

  for fn in (
    lambda m, v, xs: m.apply(v, xs),
    lambda m, v, xs: jax.grad(loss, argnums=1)(m, v, xs),
  ):
    a = jax.vmap(lambda v, xs, f=fn: f(conv, v, xs))(variables, x)
    b = jax.vmap(lambda v, xs, f=fn: f(patch, v, xs))(variables, x)
    for u, w in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
      np.testing.assert_allclose(u, w, atol=2e-5)


def test_unknown_conv_impl_is_an_error():
  assert layers.make_conv('xla') is nn.Conv
  with pytest.raises(ValueError, match='conv_impl'):
    layers.make_conv('winograd')


@pytest.mark.parametrize(
  'name,kwargs',
  [
    ('small_cnn', dict(width=4, embedding_dim=8, norm='batch')),
    ('fedquad_cnn', dict(widths=(4, 8, 8), embedding_dim=8)),
    ('lenet', dict(embedding_dim=8, widths=(4, 2))),
  ],
)
def test_models_give_the_same_outputs_with_either_conv(name, kwargs):
  from fedjax_metric import models  # pylint: disable=g-import-not-at-top

  x = jax.random.normal(jax.random.key(0), (3, 12, 12, 1))
  xla = models.build(name, 3, (12, 12, 1), **kwargs)
  patches = models.build(name, 3, (12, 12, 1), conv_impl='patches', **kwargs)
  variables = xla.init(jax.random.key(1), x)
  params, state = models.split_variables(variables)
  a, _ = xla.apply(params, state, x, train=True, mask=jnp.ones(3, bool))
  b, _ = patches.apply(params, state, x, train=True, mask=jnp.ones(3, bool))
  head = 'logits' if 'logits' in a else 'embedding'  # LeNet: no classifier
  np.testing.assert_allclose(a[head], b[head], atol=1e-5)
  assert np.abs(np.asarray(a[head])).max() > 1e-3


def test_auto_conv_impl_is_patches_except_in_the_host_loop():
  from fedjax_metric import assemble, executors
  from fedjax_metric.models import fedquad_cnn

  choose = executors.choose_executor
  one_program = executors.round_is_one_program
  for name in ('vmap', 'chunked', 'sequential'):
    assert one_program(choose(name)), name
  assert not one_program(choose('host'))
  resolve = executors.resolve_conv_impl
  assert [resolve('auto', True), resolve('auto', False)] == ['patches', 'xla']
  assert [resolve('xla', True), resolve('patches', False)] == ['xla', 'patches']
  with pytest.raises(ValueError, match='conv_impl'):
    resolve('im2col', True)
  # assemble.build_model resolves the config's 'auto' the same way.
  block = ml_collections.ConfigDict(
    dict(name='fedquad_cnn', widths=(4, 8, 8), conv_impl='auto')
  )
  for flag, expected in ((True, 'patches'), (False, 'xla')):
    model = assemble.build_model(block, 10, (8, 8, 1), one_program=flag)
    assert isinstance(model.module, fedquad_cnn.FedQuadCNN)
    assert model.module.conv_impl == expected
