"""PMFL's server arithmetic (pmfl_server, re-exported by pmfl): Algorithm
2's weights against a literal float64 running mean (Eq. 8) and a
hand-derived table, the history mixing weight (Eq. 11) and the mixing step
factor."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fedjax_metric.algorithms import pmfl

from .participation_helpers import HAND_MASK, random_masks


def ref_pmfl(mask, cutoff):
  """x_k^t of Algorithm 2, Eq. 8 as a literal float64 running mean."""
  num_rounds, num_nodes = mask.shape
  out = np.zeros((num_rounds, num_nodes))
  for k in range(num_nodes):
    interval, count, x = 0, 0, 0.0
    for t in range(num_rounds):
      interval += 1
      if mask[t, k] or (cutoff is not None and interval == cutoff):
        q_star = interval
        x = float(q_star) if count == 0 else (count * x + q_star) / (count + 1)
        count += 1
        interval = 0
      out[t, k] = x
  return out


@pytest.mark.parametrize('cutoff', [1, 3, 50, None])
def test_pmfl_matches_algorithm_2_reference(cutoff):
  for mask in random_masks():
    np.testing.assert_allclose(
      pmfl.adaptive_weights(mask, cutoff=cutoff),
      ref_pmfl(mask, cutoff),
      rtol=1e-6,
    )


# Hand derivation, C = 3 (Q interval, R count, x weight; x starts at 0):
# node 0: t0 Q=1 P, R=0: x=1; R=1      t1 Q=1 x=1   t2 Q=2 x=1
#         t3 Q=3 P: x=(1*1+3)/2 = 2; R=2   t4 Q=1 P: x=(2*2+1)/3 = 5/3; R=3
#         t5 Q=1   t6 Q=2   t7 Q=3 = C: x=(3*5/3+3)/4 = 2; R=4
#         t8 Q=1 P: x=(4*2+1)/5 = 9/5
# node 1: t0 Q=1 x=0   t1 Q=2 x=0   t2 Q=3 = C, R=0: x=3; R=1
#         t3 Q=1 x=3   t4 Q=2 P: x=(3+2)/2 = 2.5; R=2   t5 Q=1 x=2.5
#         t6 Q=2 P: x=(2*2.5+2)/3 = 7/3; R=3   t7 Q=1 P: x=(7+1)/4 = 2; R=4
#         t8 Q=1 P: x=(4*2+1)/5 = 9/5
PMFL_HAND = np.array(
  [
    [1, 1, 1, 2, 5 / 3, 5 / 3, 5 / 3, 2, 9 / 5],
    [0, 0, 3, 3, 2.5, 2.5, 7 / 3, 2, 9 / 5],
  ]
).T


def test_pmfl_hand_table():
  np.testing.assert_allclose(
    pmfl.adaptive_weights(HAND_MASK, cutoff=3), PMFL_HAND, rtol=1e-6
  )


def test_pmfl_step_under_jit_matches_hand_table():
  step = jax.jit(functools.partial(pmfl.adaptive_step, cutoff=3))
  state = pmfl.init_adaptive_state(2)
  for t in range(HAND_MASK.shape[0]):
    state, x = step(state, jnp.asarray(HAND_MASK[t]))
    np.testing.assert_allclose(np.asarray(x), PMFL_HAND[t], rtol=1e-6)
  np.testing.assert_array_equal(np.asarray(state.count), [5, 5])


def test_pmfl_default_cutoff_is_50():
  mask = np.zeros((120, 1), bool)
  # Only cutoffs: x = 50 from round 49 on, 0 before.
  x = pmfl.adaptive_weights(mask)[:, 0]
  np.testing.assert_array_equal(x[:49], 0)
  np.testing.assert_array_equal(x[49:], 50)


def test_history_mixing_weight():
  # psi = 1/2 - t / (2 (T - 1)), Eq. 11.
  assert float(pmfl.history_mixing_weight(0, 11)) == pytest.approx(0.5)
  assert float(pmfl.history_mixing_weight(5, 11)) == pytest.approx(0.25)
  assert float(pmfl.history_mixing_weight(10, 11)) == pytest.approx(0.0)
  assert float(pmfl.history_mixing_weight(0, 1)) == 0.0
  traced = jax.jit(pmfl.history_mixing_weight)(3, 7)
  assert float(traced) == pytest.approx(0.5 - 3 / 12)
  with pytest.raises(ValueError):
    pmfl.history_mixing_weight(0, 0)


def test_mixing_step_factor_is_the_steady_drift_of_eq_10():
  """Iterate Eq. 10 with a constant update u at a fixed psi (H = 3) until
  the drift is steady: the global model then moves by factor * u a round;
  with `mixing_compensation`'s 1 / factor it moves by u."""
  u = 1.0
  for psi in (0.5, 0.25, 0.1, 0.0):
    factor = float(pmfl.mixing_step_factor(psi, 2))
    for scale, want in ((1.0, factor), (1.0 / factor, 1.0)):
      w = [0.0, 0.0, 0.0]  # W^{t-2}, W^{t-1}, W^t
      for _ in range(400):
        w_next = (1 - psi) * (w[-1] + scale * u) + psi * (w[-2] + w[-3]) / 2
        w = w[1:] + [w_next]
      assert abs((w[-1] - w[-2]) - want) < 1e-6, (psi, scale)  # float32
  # The paper's schedule (Eq. 11) averages to 0.58 over a run.
  psis = 0.5 - np.arange(1000) / (2 * 999)
  mean = np.mean([float(pmfl.mixing_step_factor(p, 2)) for p in psis])
  assert abs(mean - 0.577) < 0.003
  assert float(pmfl.mixing_step_factor(0.3, 0)) == 1.0


def test_pmfl_participant_weight_equals_adaptive_step():
  rng = np.random.default_rng(1)
  extra = {
    'interval': jnp.asarray(rng.integers(0, 9, 6), jnp.int32),
    'count': jnp.asarray(rng.integers(0, 4, 6), jnp.int32),
  }
  extra['interval_sum'] = extra['count'] * 3 + jnp.asarray(
    rng.integers(0, 3, 6), jnp.int32
  )
  _, x = pmfl.adaptive_step(
    pmfl.AdaptiveState(
      extra['interval'], extra['count'], extra['interval_sum']
    ),
    np.ones(6, bool),
    cutoff=50,
  )
  got = jax.vmap(lambda k: pmfl.participant_weight(extra, k))(jnp.arange(6))
  np.testing.assert_allclose(got, x, rtol=1e-6)
