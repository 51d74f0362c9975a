"""Models (shapes, masked BatchNorm, 2x2 pooling); the optimizers' tests
are tests/test_optimizers.py."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fedjax_metric import models


@pytest.mark.parametrize('shape', [(8, 8, 1), (28, 28, 1), (32, 32, 3)])
@pytest.mark.parametrize('pool', ['stride', 'avg', 'max'])
@pytest.mark.parametrize('norm', ['none', 'batch', 'group'])
def test_small_cnn_output_shapes(shape, pool, norm):
  model = models.build(
    'small_cnn', 10, width=4, embedding_dim=16, pool=pool, norm=norm
  )
  x = jnp.ones((3,) + shape)

  def init_and_apply(x):
    variables = model.init(jax.random.key(0), x)
    params, state = models.split_variables(variables)
    out, new_state = model.apply(
      params, state, x, train=True, mask=jnp.ones(3, bool)
    )
    return variables, state, out, new_state

  # Shapes only: traced by jax.eval_shape, neither compiled nor run.
  variables, state, out, new_state = jax.eval_shape(init_and_apply, x)
  assert set(variables) == (
    {'params', 'batch_stats'} if norm == 'batch' else {'params'}
  )
  assert out['logits'].shape == (3, 10)
  assert out['embedding'].shape == (3, 16)
  assert [f.shape for f in out['features']] == [(3, 4), (3, 8)]
  assert jax.tree.structure(new_state) == jax.tree.structure(state)


def test_batchnorm_statistics_ignore_masked_examples():
  model = models.build('small_cnn', 3, width=4, embedding_dim=8, norm='batch')
  x = jax.random.normal(jax.random.key(1), (6, 8, 8, 1))
  params, state = models.split_variables(model.init(jax.random.key(0), x))
  mask = jnp.array([True, True, True, True, False, False])
  junk = x.at[4:].set(100.0)
  out_a, state_a = model.apply(params, state, x, train=True, mask=mask)
  out_b, state_b = model.apply(params, state, junk, train=True, mask=mask)
  np.testing.assert_allclose(
    out_a['logits'][:4], out_b['logits'][:4], atol=1e-5
  )
  for a, b in zip(jax.tree.leaves(state_a), jax.tree.leaves(state_b)):
    np.testing.assert_allclose(a, b, atol=1e-5)


def test_unknown_model_is_a_clear_error():
  with pytest.raises(ValueError, match='known models'):
    models.build('resnet1000', 10)


@pytest.mark.parametrize('shape', [(2, 28, 28, 3), (2, 7, 7, 1), (1, 8, 9, 2)])
def test_reshape_pooling_matches_flax_values_and_gradients(shape):
  import flax.linen as nn

  from fedjax_metric.models.layers import pool_2x2

  x = jax.random.normal(jax.random.key(0), shape)
  reference = {
    'max': lambda x: nn.max_pool(x, (2, 2), strides=(2, 2)),
    'avg': lambda x: nn.avg_pool(x, (2, 2), strides=(2, 2)),
  }
  for kind, ref in reference.items():
    np.testing.assert_allclose(pool_2x2(x, kind), ref(x), atol=1e-6)
    grad = lambda f: jax.grad(lambda x: jnp.sum(f(x) ** 2))(x)
    np.testing.assert_allclose(
      grad(lambda x: pool_2x2(x, kind)), grad(ref), atol=1e-5
    )


def test_max_pooling_gradient_goes_to_the_first_maximum_of_a_window():
  """As PyTorch: ties send the whole gradient to the first (row-major)
  maximal tap, chosen in the forward pass (jnp.max's gradient would split
  it, by comparing the input with the maximum again)."""
  from fedjax_metric.models.layers import pool_2x2

  x = np.zeros((1, 4, 4, 2), np.float32)
  x[0, 2:, 2:, 1] = [[1.0, 3.0], [3.0, 2.0]]  # a tie at 3 in one window
  grad = jax.grad(lambda x: jnp.sum(pool_2x2(x, 'max') * 2.0))(jnp.asarray(x))
  want = np.zeros_like(x)
  want[0, 0, 0, :] = 2.0  # all-zero windows: the first tap
  want[0, 0, 2, :] = 2.0
  want[0, 2, 0, :] = 2.0
  want[0, 2, 2, 0] = 2.0
  want[0, 2, 3, 1] = 2.0  # the first 3 (row-major), not the second
  np.testing.assert_array_equal(grad, want)
  np.testing.assert_array_equal(
    pool_2x2(jnp.asarray(x), 'max')[0, 1, 1], [0.0, 3.0]
  )
