"""FedAU's aggregation weights (fedau_intervals): pure-Python list
bookkeeping written from the released FedAU code, and hand-derived tables."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fedjax_metric.algorithms import fedau_intervals

from .participation_helpers import HAND_MASK, random_masks


def ref_fedau(mask, cutoff):
  """omega[t, n] with explicit interval lists T_n (released FedAU code)."""
  num_rounds, num_clients = mask.shape
  omega = np.zeros((num_rounds, num_clients))
  for n in range(num_clients):
    counter, intervals = 0, []
    for t in range(num_rounds):
      if mask[t, n]:
        omega[t, n] = np.mean(intervals) if intervals else 1.0
        intervals.append(counter + 1)
        counter = 0
      else:
        counter += 1
        if cutoff is not None and counter >= cutoff:
          intervals.append(cutoff)
          counter = 0
  return omega


@pytest.mark.parametrize('cutoff', [1, 3, 50, None])
def test_fedau_matches_list_reference(cutoff):
  for mask in random_masks():
    np.testing.assert_allclose(
      fedau_intervals.interval_weights(mask, cutoff=cutoff),
      ref_fedau(mask, cutoff),
      rtol=1e-6,
    )


# Hand derivation, K = 3 (T_n = completed intervals, c = counter):
# client 0: t0 P: T=[] -> 1; T=[1]       t1 N c=1   t2 N c=2
#           t3 P: mean[1] = 1; T=[1,3]   t4 P: mean[1,3] = 2; T=[1,3,1]
#           t5 N c=1   t6 N c=2   t7 N c=3 >= K: T=[1,3,1,3], c=0
#           t8 P: mean[1,3,1,3] = 2
# client 1: t0-t2 N, c reaches 3 = K: T=[3]   t3 N c=1
#           t4 P: mean[3] = 3 (not 1: T is no longer empty); T=[3,2]
#           t5 N c=1   t6 P: mean[3,2] = 2.5; T=[3,2,2]
#           t7 P: mean[3,2,2] = 7/3; T=[3,2,2,1]   t8 P: mean = 8/4 = 2
FEDAU_HAND = np.array(
  [[1, 0, 0, 1, 2, 0, 0, 0, 2], [0, 0, 0, 0, 3, 0, 2.5, 7 / 3, 2]]
).T


def test_fedau_hand_table():
  np.testing.assert_allclose(
    fedau_intervals.interval_weights(HAND_MASK, cutoff=3), FEDAU_HAND, rtol=1e-6
  )


def test_fedau_hand_table_without_cutoff():
  # No cutoff: client 1's first interval is 5 rounds (t0-t4).
  # client 0: 1, 1, mean[1,3] = 2, then t8: mean[1,3,1] = 5/3
  # client 1: t4 first participation -> 1; T=[5]; t6 -> 5; T=[5,2];
  #           t7 -> 3.5; T=[5,2,1]; t8 -> 8/3
  expected = np.array(
    [[1, 0, 0, 1, 2, 0, 0, 0, 5 / 3], [0, 0, 0, 0, 1, 0, 5, 3.5, 8 / 3]]
  ).T
  np.testing.assert_allclose(
    fedau_intervals.interval_weights(HAND_MASK, cutoff=None),
    expected,
    rtol=1e-6,
  )


def test_fedau_step_under_jit_matches_hand_table():
  step = jax.jit(functools.partial(fedau_intervals.interval_step, cutoff=3))
  state = fedau_intervals.init_interval_state(2)
  for t in range(HAND_MASK.shape[0]):
    state, omega = step(state, jnp.asarray(HAND_MASK[t]))
    np.testing.assert_allclose(np.asarray(omega), FEDAU_HAND[t], rtol=1e-6)
  # After t8 both clients just participated: counters reset, 5 intervals.
  np.testing.assert_array_equal(np.asarray(state.counter), [0, 0])
  np.testing.assert_array_equal(np.asarray(state.interval_count), [5, 5])


def test_fedau_validation():
  with pytest.raises(ValueError, match='cutoff'):
    fedau_intervals.interval_weights(HAND_MASK, cutoff=0)
  with pytest.raises(ValueError, match='\\[T, N\\]'):
    fedau_intervals.interval_weights(np.ones(4, bool), cutoff=3)
