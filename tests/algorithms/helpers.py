"""Softmax regression by hand, shared by several algorithm tests: the
gradient of the mean cross-entropy and one client's round run by FedAvg's
machinery (the FedAvg, FedProx, SCAFFOLD and participation tests)."""

import fl_fixtures as fx
import jax.numpy as jnp
import numpy as np

from fedjax_metric import engine, executors


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
