"""FedProx and server optimizers inside a real round, vs NumPy re-derivations."""

import fl_fixtures as fx
import jax.numpy as jnp
import numpy as np
import pytest

from fedjax_metric import algorithms, engine, executors, optimizers
from fedjax_metric.algorithms import fedavg


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
  state, table = engine.init_state(alg(model), variables, 2)
  round_fn = executors.make_round_fn(
    fx.make_spec(alg(model), lr=lr), data, executor='vmap'
  )
  state, _, _ = round_fn(state, table, c)
  x = images[:8].reshape(8, -1).astype(np.float64) / 255.0
  y = np.eye(fx.NUM_CLASSES)[labels[:8]]
  p = variables['params']['Dense_0']
  return (
    state,
    np.asarray(p['kernel'], np.float64),
    np.asarray(p['bias'], np.float64),
    x,
    y,
  )


def test_fedprox_two_full_batch_steps_match_numpy():
  mu, lr = 0.7, 0.4
  server = optimizers.make_server_optimizer('sgd')
  make = lambda model: algorithms.REGISTRY['fedprox'](
    model, server_optimizer=server, mu=mu
  )
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
  server = optimizers.make_server_optimizer(
    'adam', learning_rate=0.05, eps=1e-3
  )
  make = lambda model: fedavg.build(model, server_optimizer=server)
  state, w0, b0, x, y = one_client_round(make, server, steps=1, lr=0.3)
  gw, _ = softmax_regression_grad(w0, b0, x, y)
  delta = -0.3 * gw
  expected = w0 - 0.05 * (-delta) / (np.abs(delta) + 1e-3)
  np.testing.assert_allclose(
    state.variables['params']['Dense_0']['kernel'], expected, atol=1e-5
  )
  assert int(state.round) == 1


def test_registry_and_bad_hyperparameters():
  assert {'fedavg', 'fedprox'} <= set(algorithms.REGISTRY)
  server = optimizers.make_server_optimizer('sgd')
  with pytest.raises(ValueError, match='mu'):
    algorithms.REGISTRY['fedprox'](fx.linear(), server_optimizer=server, mu=-1)
  with pytest.raises(ValueError, match='weighting'):
    fedavg.build(fx.linear(), server_optimizer=server, weighting='by_loss')


def test_scaffold_two_rounds_match_numpy():
  """SCAFFOLD option II (Karimireddy et al. 2020, Alg. 1) in NumPy: 3 clients,
  2 per round, K = 2 full-batch local SGD steps, eta_g = 1. Checks the global
  model, the server control variate and every client's control variate."""
  images, labels = fx.make_data(40)
  model = fx.linear()
  variables = fx.init_variables(model, images)
  parts = [np.arange(0, 6), np.arange(6, 16), np.arange(16, 24)]
  data = engine.DeviceData(jnp.asarray(images), jnp.asarray(labels))
  server = optimizers.make_server_optimizer('sgd')
  alg = algorithms.REGISTRY['scaffold'](model, server_optimizer=server)
  lr, steps, rounds = 0.4, 2, [[0, 2], [1, 2]]
  state, table = engine.init_state(alg, variables, 3)
  round_fn = executors.make_round_fn(
    fx.make_spec(alg, lr=lr), data, executor='vmap'
  )
  for r, ids in enumerate(rounds):
    c = fx.cohort(
      parts,
      ids,
      num_slots=2,
      batch_size=10,
      epochs=steps,
      num_steps=steps,
      round_idx=r,
    )
    state, table, _ = round_fn(state, table, c)

  def xy(k):
    x = images[parts[k]].reshape(len(parts[k]), -1).astype(np.float64) / 255
    return x, np.eye(fx.NUM_CLASSES)[labels[parts[k]]]

  p = variables['params']['Dense_0']
  x_w, x_b = (
    np.asarray(p['kernel'], np.float64),
    np.asarray(p['bias'], np.float64),
  )
  c_w, c_b = np.zeros_like(x_w), np.zeros_like(x_b)
  ci = {k: (np.zeros_like(x_w), np.zeros_like(x_b)) for k in range(3)}
  for ids in rounds:
    dy, dc = [], []
    for k in ids:
      x, y = xy(k)
      w, b = x_w.copy(), x_b.copy()
      for _ in range(steps):  # Full batch: every step sees all examples.
        gw, gb = softmax_regression_grad(w, b, x, y)
        w, b = w - lr * (gw - ci[k][0] + c_w), b - lr * (gb - ci[k][1] + c_b)
      new = (
        ci[k][0] - c_w + (x_w - w) / (steps * lr),
        ci[k][1] - c_b + (x_b - b) / (steps * lr),
      )
      dy.append((w - x_w, b - x_b))
      dc.append((new[0] - ci[k][0], new[1] - ci[k][1]))
      ci[k] = new
    x_w = x_w + np.mean([d[0] for d in dy], 0)
    x_b = x_b + np.mean([d[1] for d in dy], 0)
    c_w = c_w + np.sum([d[0] for d in dc], 0) / 3
    c_b = c_b + np.sum([d[1] for d in dc], 0) / 3
  got = state.variables['params']['Dense_0']
  np.testing.assert_allclose(got['kernel'], x_w, atol=1e-5)
  np.testing.assert_allclose(got['bias'], x_b, atol=1e-5)
  np.testing.assert_allclose(
    state.extra['control']['Dense_0']['kernel'], c_w, atol=1e-5
  )
  for k in range(3):
    np.testing.assert_allclose(
      table['Dense_0']['kernel'][k], ci[k][0], atol=1e-5
    )
  # The correction is active: plain FedAvg gives a different second round.
  assert np.abs(c_w).max() > 1e-3
