"""SCAFFOLD inside real rounds, vs a NumPy re-derivation."""

import fl_fixtures as fx
import jax.numpy as jnp
import numpy as np

from fedjax_metric import algorithms, engine, executors, optimizers

from .helpers import softmax_regression_grad


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


def test_a_client_without_examples_keeps_its_control_variate():
  """A participant with no local step learned nothing: option II would set
  its c_i to c_i - c and send -c; it keeps c_i and sends nothing."""
  images, labels = fx.make_data(40)
  model = fx.linear()
  variables = fx.init_variables(model, images)
  parts = [np.arange(0, 6), np.arange(6, 16), np.arange(0)]
  data = engine.DeviceData(jnp.asarray(images), jnp.asarray(labels))
  server = optimizers.make_server_optimizer('sgd')
  alg = algorithms.REGISTRY['scaffold'](
    model, server_optimizer=server, weighting='uniform'
  )
  state, table = engine.init_state(alg, variables, 3)
  round_fn = executors.make_round_fn(
    fx.make_spec(alg, lr=0.4), data, executor='vmap'
  )
  for r, ids in enumerate([[0, 1], [1, 2]]):
    c = fx.cohort(
      parts, ids, num_slots=2, batch_size=10, epochs=2, num_steps=2, round_idx=r
    )
    state, table, _ = round_fn(state, table, c)
  assert np.abs(state.extra['control']['Dense_0']['kernel']).max() > 0
  np.testing.assert_array_equal(table['Dense_0']['kernel'][2], 0.0)
