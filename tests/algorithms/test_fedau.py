"""FedAU inside real rounds, vs float64 NumPy loops.

The reference is written from the released FedAU code's bookkeeping
(github.com/IBM/fedau, main.py: explicit interval lists), with local
training re-derived by hand (softmax regression with full-batch SGD).
"""

import fl_fixtures as fx
import numpy as np
import pytest

from fedjax_metric import algorithms
from fedjax_metric.algorithms import fedau, fedau_intervals
from fedjax_metric.contract import RunFacts

from .participation_helpers import (
  NUM_CLIENTS,
  ROUNDS,
  client_xy,
  kernel_bias,
  local_delta,
  run_rounds,
  server,
)

PROBS = np.array([0.5, 0.25, 0.8])


def ref_fedau(images, labels, w, b, aggregation, *, eta, cutoff):
  """The released code's loop (github.com/IBM/fedau, main.py) in NumPy."""
  counters, intervals = [0] * NUM_CLIENTS, [[] for _ in range(NUM_CLIENTS)]
  omegas = []
  for ids in ROUNDS:
    sum_w, sum_b, round_omega = 0.0, 0.0, {}
    for n in range(NUM_CLIENTS):
      if n in ids:
        dw, db = local_delta(w, b, *client_xy(images, labels, n))
        if aggregation == 'adaptive':
          omega = np.mean(intervals[n]) if intervals[n] else 1.0
        elif aggregation == 'known_prob':
          omega = 1.0 / PROBS[n]
        else:
          omega = 1.0
        round_omega[n] = omega
        sum_w, sum_b = sum_w + omega * dw, sum_b + omega * db
        intervals[n].append(counters[n] + 1)
        counters[n] = 0
      else:
        counters[n] += 1
        if cutoff is not None and counters[n] >= cutoff:
          intervals[n].append(counters[n])
          counters[n] = 0
    omegas.append(round_omega)
    if aggregation == 'average_participating':
      if not ids:
        continue
      divisor = len(ids)
    else:
      divisor = NUM_CLIENTS
    w, b = w + eta * sum_w / divisor, b + eta * sum_b / divisor
  return w, b, counters, intervals, omegas


@pytest.mark.parametrize('aggregation', fedau.AGGREGATIONS)
def test_fedau_aggregations_match_numpy(aggregation):
  eta, cutoff = 1.5, 2
  alg = algorithms.REGISTRY['fedau'](
    fx.linear(),
    server_optimizer=server(eta),
    aggregation=aggregation,
    cutoff=cutoff,
    run=RunFacts(participation_probabilities=PROBS),
  )
  variables, state, _, images, labels = run_rounds(alg, ROUNDS)
  w, b, counters, intervals, omegas = ref_fedau(
    images, labels, *kernel_bias(variables), aggregation, eta=eta, cutoff=cutoff
  )
  got = state.variables['params']['Dense_0']
  np.testing.assert_allclose(got['kernel'], w, atol=2e-5)
  np.testing.assert_allclose(got['bias'], b, atol=2e-5)
  extra = state.extra
  np.testing.assert_array_equal(extra['counter'], counters)
  np.testing.assert_array_equal(
    extra['interval_count'], [len(i) for i in intervals]
  )
  np.testing.assert_array_equal(
    extra['interval_sum'], [sum(i) for i in intervals]
  )
  if aggregation == 'adaptive':
    # The hand table of the weights that scaled the updates (K = 2), and the
    # public host helper over the same participation mask.
    assert omegas == [
      {0: 1.0, 2: 1.0},
      {1: 1.0},
      {},
      {0: 1.5, 1: 2.0, 2: 1.5},
      {2: 4 / 3},
      {0: 4 / 3},
    ]
    mask = np.zeros((len(ROUNDS), NUM_CLIENTS), bool)
    for t, ids in enumerate(ROUNDS):
      mask[t, ids] = True
    table = fedau_intervals.interval_weights(mask, cutoff=cutoff)
    for t, round_omega in enumerate(omegas):
      for n in range(NUM_CLIENTS):
        assert table[t, n] == pytest.approx(round_omega.get(n, 0.0))
    assert int(state.round) == len(ROUNDS)


def test_fedau_average_participating_is_uniform_fedavg():
  images, labels = fx.make_data(40)
  results = []
  for make in (
    lambda: algorithms.REGISTRY['fedau'](
      fx.linear(),
      server_optimizer=server(1.0),
      aggregation='average_participating',
    ),
    lambda: algorithms.REGISTRY['fedavg'](
      fx.linear(), server_optimizer=server(1.0), weighting='uniform'
    ),
  ):
    _, state, _, _, _ = run_rounds(
      make(), ROUNDS[:4], images=images, labels=labels
    )
    results.append(state.variables)
  assert fx.max_abs_diff(*results) < 1e-6


def test_fedau_validation():
  with pytest.raises(ValueError, match='aggregation'):
    fedau.SPEC(fx.linear(), server_optimizer=server(1.0), aggregation='mean')
  with pytest.raises(ValueError, match='participation probabilities'):
    fedau.SPEC(
      fx.linear(), server_optimizer=server(1.0), aggregation='known_prob'
    )
  with pytest.raises(ValueError, match=r'\(0, 1\]'):
    fedau.SPEC(
      fx.linear(),
      server_optimizer=server(1.0),
      aggregation='known_prob',
      run=RunFacts(participation_probabilities=[0.5, 0.0, 1.0]),
    )
  with pytest.raises(ValueError, match='cutoff'):
    fedau.SPEC(fx.linear(), server_optimizer=server(1.0), cutoff=0)
