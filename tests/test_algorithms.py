"""FedProx and server optimizers inside a real round, vs NumPy re-derivations."""

import jax.numpy as jnp
import numpy as np
import pytest

from fedjax_metric import algorithms, engine, optimizers
from fedjax_metric.algorithms import fedavg
import fl_fixtures as fx


def softmax_regression_grad(w, b, x, y):
  z = x @ w + b
  p = np.exp(z - z.max(-1, keepdims=True))
  err = p / p.sum(-1, keepdims=True) - y
  return x.T @ err / len(x), err.mean(0)


def one_client_round(alg, server_optimizer, *, steps, lr):
  images, labels = fx.make_data(40)
  model = fx.linear()
  variables = fx.init_variables(model, images)
  parts = [np.arange(8), np.arange(8, 40)]
  data = engine.DeviceData(jnp.asarray(images), jnp.asarray(labels))
  c = fx.cohort(parts, [0], num_slots=1, batch_size=8, steps=steps)
  state, table = engine.init_state(alg(model), variables, 2, server_optimizer)
  round_fn = engine.make_round_fn(fx.make_spec(alg(model), lr=lr), data,
                                  executor='vmap')
  state, _, _ = round_fn(state, table, c)
  x = images[:8].reshape(8, -1).astype(np.float64) / 255.0
  y = np.eye(fx.NUM_CLASSES)[labels[:8]]
  p = variables['params']['Dense_0']
  return state, np.asarray(p['kernel'], np.float64), np.asarray(p['bias'], np.float64), x, y


def test_fedprox_two_full_batch_steps_match_numpy():
  mu, lr = 0.7, 0.4
  server = optimizers.make_server_optimizer('sgd')
  make = lambda model: algorithms.REGISTRY['fedprox'](
      model, server_optimizer=server, mu=mu)
  state, w0, b0, x, y = one_client_round(make, server, steps=2, lr=lr)
  w, b = w0, b0
  for _ in range(2):  # Full batch each step: the order does not matter.
    gw, gb = softmax_regression_grad(w, b, x, y)
    w, b = w - lr * (gw + mu * (w - w0)), b - lr * (gb + mu * (b - b0))
  got = state.variables['params']['Dense_0']
  np.testing.assert_allclose(got['kernel'], w, atol=1e-5)
  np.testing.assert_allclose(got['bias'], b, atol=1e-5)
  # And it differs from FedAvg's two steps (the term is active).
  w_avg = w0
  b_avg = b0
  for _ in range(2):
    gw, gb = softmax_regression_grad(w_avg, b_avg, x, y)
    w_avg, b_avg = w_avg - lr * gw, b_avg - lr * gb
  assert np.abs(w_avg - w).max() > 1e-4


def test_fedadam_round_matches_numpy():
  """Server Adam on the pseudo-gradient -delta (Reddi et al. 2021, Alg. 2)."""
  server = optimizers.make_server_optimizer('adam', learning_rate=0.05, eps=1e-3)
  make = lambda model: fedavg.make(model, server_optimizer=server)
  state, w0, b0, x, y = one_client_round(make, server, steps=1, lr=0.3)
  gw, _ = softmax_regression_grad(w0, b0, x, y)
  delta = -0.3 * gw
  expected = w0 - 0.05 * (-delta) / (np.abs(delta) + 1e-3)
  np.testing.assert_allclose(state.variables['params']['Dense_0']['kernel'],
                             expected, atol=1e-5)
  assert int(state.round) == 1


def test_registry_and_bad_hyperparameters():
  assert {'fedavg', 'fedprox'} <= set(algorithms.REGISTRY)
  server = optimizers.make_server_optimizer('sgd')
  with pytest.raises(ValueError, match='mu'):
    algorithms.REGISTRY['fedprox'](fx.linear(), server_optimizer=server, mu=-1)
  with pytest.raises(ValueError, match='weighting'):
    fedavg.make(fx.linear(), server_optimizer=server, weighting='by_loss')
