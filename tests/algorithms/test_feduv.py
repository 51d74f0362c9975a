"""FedUV: a real round vs NumPy, and its codewords.

Hosseini et al., 'Federated Learning of User Verification Models Without
Sharing Embeddings', ICML 2021, re-derived in float64 NumPy on the
bias-free linear embedding; Hadamard and random codewords against loops.
"""

import fl_fixtures as fx
import jax
import numpy as np
import pytest

from fedjax_metric import algorithms
from fedjax_metric.algorithms import feduv
from fedjax_metric.data import partition as partition_lib

from .oneclass_helpers import (
  DIM,
  SERVER,
  client_batches,
  cosine_grads,
  federation,
  kernel,
  linear_model,
  local_sgd,
  run_rounds,
)


def test_feduv_round_matches_numpy_with_random_codewords():
  x, labels, parts, data = federation()
  lr = 0.1
  model = linear_model()
  alg = algorithms.REGISTRY['feduv'](
    model, server_optimizer=SERVER, codeword_kind='random', codeword_seed=3
  )
  with jax.default_matmul_precision('highest'):
    states, cohorts = run_rounds(alg, model, parts, data, rounds=1, lr=lr)
  code = np.asarray(states[0][0].extra['codewords'], np.float64)
  assert code.shape == (fx.NUM_CLASSES, DIM)
  assert set(np.unique(code)) <= {-1.0, 1.0}
  # Minimum Hamming distance by explicit loops.
  hamming = min(
    int(np.sum(code[a] != code[b]))
    for a in range(len(code))
    for b in range(len(code))
    if a != b
  )
  assert int(states[0][0].extra['min_distance']) == hamming
  classes = partition_lib.one_class_labels(parts, labels)
  k0, kernels = kernel(states[0][0]), []
  for j in range(len(parts)):
    v = code[classes[j]]

    def grad_e(e, i, v=v):
      del i
      cos, d_e, _ = cosine_grads(e, v)
      return -d_e if cos < 1 else 0 * e

    kernels.append(local_sgd(k0, x, client_batches(cohorts[0], j), grad_e, lr))
  np.testing.assert_allclose(
    kernel(states[1][0]), np.mean(kernels, axis=0), rtol=1e-4, atol=1e-5
  )


def loop_min_hamming(v):
  best = None
  for a in range(len(v)):
    for b in range(a + 1, len(v)):
      d = sum(1 for x, y in zip(v[a], v[b]) if x != y)
      best = d if best is None else min(best, d)
  return best


@pytest.mark.parametrize(
  'num_classes, dim', [(10, 16), (10, 32), (16, 16), (3, 4)]
)
def test_hadamard_codewords_orthogonal(num_classes, dim):
  v, dmin = feduv.codewords(num_classes, dim)
  assert v.shape == (num_classes, dim) and v.dtype == np.float32
  assert set(np.unique(v).tolist()) <= {-1.0, 1.0}
  gram = [
    [
      sum(float(x) * float(y) for x, y in zip(v[a], v[b]))
      for b in range(num_classes)
    ]
    for a in range(num_classes)
  ]
  np.testing.assert_array_equal(np.array(gram), dim * np.eye(num_classes))
  assert dmin == loop_min_hamming(v) == dim // 2
  if num_classes < dim:  # The all-ones row is skipped: balanced rows.
    np.testing.assert_array_equal(v.sum(axis=1), 0.0)


@pytest.mark.parametrize('num_classes, dim', [(10, 24), (20, 16), (5, 7)])
def test_random_codewords_min_distance_by_loops(num_classes, dim):
  v, dmin = feduv.codewords(num_classes, dim, seed=2)
  assert v.shape == (num_classes, dim)
  assert set(np.unique(v).tolist()) == {-1.0, 1.0}
  assert dmin == loop_min_hamming(v) > 0
  again, _ = feduv.codewords(num_classes, dim, seed=2)
  other, _ = feduv.codewords(num_classes, dim, seed=3)
  np.testing.assert_array_equal(v, again)
  assert not np.array_equal(v, other)


def test_codewords_kinds_and_errors():
  v, dmin = feduv.codewords(4, 16, kind='random', seed=0)
  assert dmin == loop_min_hamming(v)
  assert feduv.codewords(1, 8)[1] == 8
  with pytest.raises(ValueError, match='Hadamard'):
    feduv.codewords(4, 12, kind='hadamard')
  with pytest.raises(ValueError, match='distinct'):
    feduv.codewords(5, 2)
  with pytest.raises(ValueError, match='num_classes'):
    feduv.codewords(0, 8)
  with pytest.raises(ValueError, match='kind'):
    feduv.codewords(2, 8, kind='bch')
