"""MIFA, and FedVarp on MIFA's stored-update table, inside real rounds: one
stored update per client in the client table, vs float64 NumPy loops."""

import fl_fixtures as fx
import numpy as np
import pytest

from fedjax_metric import algorithms

from .participation_helpers import (
  NUM_CLIENTS,
  ROUNDS,
  client_xy,
  kernel_bias,
  local_delta,
  run_rounds,
  server,
)


def ref_stored_updates(images, labels, w, b, method, *, eta):
  y = [(np.zeros_like(w), np.zeros_like(b)) for _ in range(NUM_CLIENTS)]
  ybar = (np.zeros_like(w), np.zeros_like(b))
  for ids in ROUNDS:
    deltas = {n: local_delta(w, b, *client_xy(images, labels, n)) for n in ids}
    if method == 'mifa':
      for n in ids:
        y[n] = deltas[n]
      # Every round, also one nobody joins: the mean over all N clients.
      w = w + eta * np.mean([u[0] for u in y], 0)
      b = b + eta * np.mean([u[1] for u in y], 0)
      continue
    if not ids:
      continue
    v_w = np.mean([deltas[n][0] - y[n][0] for n in ids], 0) + ybar[0]
    v_b = np.mean([deltas[n][1] - y[n][1] for n in ids], 0) + ybar[1]
    w, b = w + eta * v_w, b + eta * v_b
    for n in ids:
      y[n] = deltas[n]
    ybar = (np.mean([u[0] for u in y], 0), np.mean([u[1] for u in y], 0))
  return w, b, y, ybar


@pytest.mark.parametrize('method', ['mifa', 'fedvarp'])
def test_stored_update_methods_match_numpy(method):
  eta = 0.8
  alg = algorithms.REGISTRY[method](fx.linear(), server_optimizer=server(eta))
  variables, state, table, images, labels = run_rounds(alg, ROUNDS)
  w, b, y, ybar = ref_stored_updates(
    images, labels, *kernel_bias(variables), method, eta=eta
  )
  got = state.variables['params']['Dense_0']
  np.testing.assert_allclose(got['kernel'], w, atol=2e-5)
  np.testing.assert_allclose(got['bias'], b, atol=2e-5)
  for n in range(NUM_CLIENTS):
    np.testing.assert_allclose(
      table['params']['Dense_0']['kernel'][n], y[n][0], atol=2e-5
    )
  if method == 'fedvarp':
    np.testing.assert_allclose(
      state.extra['ybar']['params']['Dense_0']['bias'], ybar[1], atol=2e-5
    )
