"""FedAwS inside a real round, vs NumPy.

Yu et al., 'Federated Learning with Only Positive Labels', ICML 2020,
re-derived in float64 NumPy on the bias-free linear embedding, the
spreadout step by numerical differentiation of the double sum.
"""

import jax
import numpy as np

from fedjax_metric import algorithms
from fedjax_metric.data import partition as partition_lib

from .oneclass_helpers import (
  SERVER,
  client_batches,
  cosine_grads,
  federation,
  kernel,
  linear_model,
  run_rounds,
  unit,
)


def spreadout_numpy(w, margin):
  """Yu et al.'s double sum with d = 1 - cos on normalised rows (loops)."""
  total = 0.0
  for a in range(len(w)):
    for b in range(len(w)):
      if a != b:
        d = 1 - unit(w[a]) @ unit(w[b])
        total += max(0.0, margin - d) ** 2
  return total


def numeric_grad(f, w, h=1e-6):
  g = np.zeros_like(w)
  for idx in np.ndindex(*w.shape):
    step = np.zeros_like(w)
    step[idx] = h
    g[idx] = (f(w + step) - f(w - step)) / (2 * h)
  return g


def test_fedaws_round_matches_numpy():
  x, labels, parts, data = federation(clients_per_class=2)
  lr, margin, multiplier, pos_margin = 0.1, 1.0, 5.0, 0.9
  model = linear_model()
  alg = algorithms.REGISTRY['fedaws'](
    model,
    server_optimizer=SERVER,
    positive_margin=pos_margin,
    spreadout_distance='cosine',
    spreadout_margin=margin,
    spreadout_steps_per_round=1,
    lr_multiplier=multiplier,
  )
  with jax.default_matmul_precision('highest'):
    states, cohorts = run_rounds(alg, model, parts, data, rounds=1, lr=lr)
  k0 = kernel(states[0][0])
  w0 = np.asarray(states[0][0].extra['class_embeddings'], np.float64)
  classes = partition_lib.one_class_labels(parts, labels)
  kernels, sums, counts = [], np.zeros_like(w0), np.zeros(len(w0))
  for j in range(len(parts)):
    k, w = k0.copy(), w0[classes[j]].copy()
    for idx, m in client_batches(cohorts[0], j):
      gk, gw = np.zeros_like(k), np.zeros_like(w)
      for i, r in zip(idx, m):
        if r:
          e = x[i] @ k
          cos, d_e, d_w = cosine_grads(e, w)
          slope = -2 * max(0.0, pos_margin - cos)
          gk += np.outer(x[i], slope * d_e)
          gw += slope * d_w
      k, w = k - lr * gk / m.sum(), w - lr * gw / m.sum()
    kernels.append(k)
    sums[classes[j]] += w
    counts[classes[j]] += 1
  averaged = sums / counts[:, None]
  expected_w = averaged - multiplier * lr * numeric_grad(
    lambda v: spreadout_numpy(v, margin), averaged
  )
  with jax.default_matmul_precision('highest'):
    state = states[1][0]
  np.testing.assert_allclose(
    kernel(state), np.mean(kernels, axis=0), rtol=1e-4, atol=1e-5
  )
  np.testing.assert_allclose(
    state.extra['class_embeddings'], expected_w, rtol=1e-4, atol=1e-5
  )
  # The spreadout step did something.
  assert np.abs(expected_w - averaged).max() > 1e-4
