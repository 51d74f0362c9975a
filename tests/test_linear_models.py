"""LogisticRegression and MLP (models/linear.py): contract and training."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from fedjax_metric import models
from fedjax_metric.data import synthetic


def test_output_contract_and_shapes():
  x = jnp.asarray(np.random.default_rng(0).normal(size=(5, 60)), jnp.float32)
  lr = models.build('logistic_regression', 10, (60,))
  variables = lr.init(jax.random.key(0))  # from input_shape, no inputs
  assert set(variables) == {'params'}
  assert models.count_params(variables['params']) == 60 * 10 + 10
  out, state = lr.apply(variables['params'], {}, x, train=True)
  assert state == {}
  assert out['logits'].shape == (5, 10)
  assert out['embedding'].shape == (5, 60)
  assert out['features'] == []

  mlp = models.build('mlp', 10, (60,), hidden=(32, 16))
  params = mlp.init(jax.random.key(0))['params']
  assert (
    models.count_params(params) == 60 * 32 + 32 + 32 * 16 + 16 + 16 * 10 + 10
  )
  out, _ = mlp.apply(params, {}, x, train=False, mask=jnp.ones(5, bool))
  assert out['logits'].shape == (5, 10)
  assert out['embedding'].shape == (5, 16)
  assert [f.shape for f in out['features']] == [(5, 32), (5, 16)]
  # The embedding is the last hidden level after ReLU.
  np.testing.assert_allclose(out['embedding'], jax.nn.relu(out['features'][1]))
  # [B, ...] inputs are flattened: [5, 6, 10] is the same as [5, 60].
  folded, _ = mlp.apply(params, {}, x.reshape(5, 6, 10), train=False)
  np.testing.assert_array_equal(folded['logits'], out['logits'])


def test_default_fields_and_errors():
  mlp = models.build('mlp', 10, (60,))
  params = mlp.init(jax.random.key(0))['params']
  assert params['Dense_0']['kernel'].shape == (60, 200)  # hidden=(200,)
  with pytest.raises(TypeError, match='hidden'):
    models.build('logistic_regression', 10, (60,), hidden=(8,))
  with pytest.raises(ValueError, match='hidden'):
    models.build('mlp', 10, (60,), hidden=()).init(jax.random.key(0))


@pytest.mark.parametrize(
  'name, kwargs', [('logistic_regression', {}), ('mlp', {'hidden': (32,)})]
)
def test_sgd_reduces_the_loss_on_synthetic_data(name, kwargs):
  spec = synthetic.SyntheticSpec(alpha=0.5, beta=0.5)
  ids = np.repeat(np.arange(4), 128)  # four clients' first 128 examples
  x, y = synthetic.client_examples(spec, 0, ids, np.tile(np.arange(128), 4))
  model = models.build(name, 10, (60,), **kwargs)
  params = model.init(jax.random.key(1))['params']

  def loss_fn(params):
    logits = model.apply(params, {}, x, train=True)[0]['logits']
    return optax.softmax_cross_entropy_with_integer_labels(logits, y).mean()

  @jax.jit
  def step(params):
    loss, grads = jax.value_and_grad(loss_fn)(params)
    return jax.tree.map(lambda p, g: p - 0.05 * g, params, grads), loss

  first = None
  for _ in range(100):
    params, loss = step(params)
    first = loss if first is None else first
  final = loss_fn(params)
  # From ~chance (x has entries of scale |B_k| + 1, so the initial logits
  # are not small) to well below it.
  assert final < 0.5 * first, (first, final)
  accuracy = jnp.mean(
    jnp.argmax(model.apply(params, {}, x, train=False)[0]['logits'], -1) == y
  )
  assert accuracy > 0.7
