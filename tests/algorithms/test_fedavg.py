"""FedAvg with a server optimizer inside a real round, vs NumPy."""

import numpy as np

from fedjax_metric import optimizers
from fedjax_metric.algorithms import fedavg

from .helpers import one_client_round, softmax_regression_grad


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
