"""Deep SVDD inside real rounds, vs NumPy.

Ruff et al., 'Deep One-Class Classification', ICML 2018, re-derived in
float64 NumPy on the bias-free linear embedding.
"""

import jax
import numpy as np

from fedjax_metric import algorithms

from .oneclass_helpers import (
  SERVER,
  client_batches,
  federation,
  kernel,
  linear_model,
  local_sgd,
  run_rounds,
)


def test_deepsvdd_each_client_trains_its_own_model_to_a_fixed_center():
  x, _, parts, data = federation()
  eps, lr = 0.1, 0.05
  model = linear_model()
  alg = algorithms.REGISTRY['deepsvdd'](model, server_optimizer=SERVER, eps=eps)
  with jax.default_matmul_precision('highest'):
    states, cohorts = run_rounds(alg, model, parts, data, rounds=2, lr=lr)
  k0 = kernel(states[0][0])
  for j in range(len(parts)):
    real = [
      i for idx, m in client_batches(cohorts[0], j) for i, r in zip(idx, m) if r
    ]
    mean = np.mean([x[i] @ k0 for i in real], axis=0)
    # Ruff et al.'s rule: coordinates within eps of 0 move to +-eps.
    center = np.where(np.abs(mean) < eps, np.sign(mean) * eps, mean)
    k = k0
    for r in range(2):  # The center stays fixed after the first round.
      k = local_sgd(
        k, x, client_batches(cohorts[r], j), lambda e, i: 2 * (e - center), lr
      )
    table = states[2][1]
    np.testing.assert_allclose(table['center'][j], center, rtol=1e-5, atol=1e-6)
    got = table['variables']['params']['Dense_0']['kernel'][j]
    np.testing.assert_allclose(got, k, rtol=1e-4, atol=1e-5)
  # Nothing is averaged: the server's model never moves.
  np.testing.assert_array_equal(kernel(states[2][0]), k0)
  assert int(states[2][0].round) == 2
