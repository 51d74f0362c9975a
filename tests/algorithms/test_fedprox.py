"""FedProx inside a real round, vs a NumPy re-derivation."""

import numpy as np

from fedjax_metric import algorithms, optimizers

from .helpers import one_client_round, softmax_regression_grad


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
