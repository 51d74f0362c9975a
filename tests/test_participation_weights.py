"""FedAU / PMFL aggregation weights and PMFL's contrastive loss.

References: pure-Python list bookkeeping written from the rules (FedAU's
released code, PMFL's Algorithm 2 with Eq. 8 as a literal float64 running
mean), hand-derived tables, and a float64 NumPy loop for l_con (Eq. 4).
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fedjax_metric import losses
from fedjax_metric.algorithms import fedau_intervals, pmfl

# Two clients, nine rounds (1 = participates). Client 0 hits the cutoff
# K = C = 3 after round 4; client 1 hits it before it ever participates.
HAND_MASK = np.array(
  [[1, 0, 0, 1, 1, 0, 0, 0, 1], [0, 0, 0, 0, 1, 0, 1, 1, 1]], bool
).T  # [T=9, N=2]


def random_masks():
  rng = np.random.default_rng(0)
  p = np.array([0.02, 0.05, 0.1, 0.3, 0.6, 0.9, 1.0, 0.15])
  return [
    rng.random((300, p.size)) < p,
    np.zeros((40, 3), bool),
    np.ones((40, 3), bool),
  ]


# ---------------------------------------------------------------------------
# FedAU
# ---------------------------------------------------------------------------


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


# ---------------------------------------------------------------------------
# PMFL Algorithm 2
# ---------------------------------------------------------------------------


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


# ---------------------------------------------------------------------------
# PMFL contrastive loss (Eq. 4)
# ---------------------------------------------------------------------------


def np_cos(a, b):
  a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
  return float(a @ b / max(np.linalg.norm(a) * np.linalg.norm(b), 1e-8))


def ref_pmfl_loss(z, z_global, z_buffer, buffer_mask, mu, tau):
  """Eq. 4 with explicit Z+ / Z- sets, float64; a similarity within 1e-6
  of mu is a tie, hence positive (the documented float32 tie rule)."""
  out = np.zeros(len(z))
  for i in range(len(z)):
    pos = np.exp(np_cos(z[i], z_global[i]) / tau)
    neg = 0.0
    for j in range(len(z_buffer)):
      if not buffer_mask[j]:
        continue
      s = np_cos(z[i], z_buffer[j, i])
      if s >= mu[i] - 1e-6:
        pos += np.exp(s / tau)
      else:
        neg += np.exp(s / tau)
    out[i] = -np.log(pos / (pos + neg))
  return out


def total_loss(z, z_global, z_buffer, mu, buffer_mask):
  return losses.pmfl_contrastive_loss(
    z, z_global, z_buffer, buffer_mask, mu
  ).sum()


grad_all = jax.jit(jax.grad(total_loss, argnums=(0, 1, 2, 3)))


def random_loss_inputs(seed, batch=6, dim=5, slots=4):
  rng = np.random.default_rng(seed)
  z = rng.normal(size=(batch, dim))
  z_global = z + 0.8 * rng.normal(size=(batch, dim))
  z_buffer = z[None] + rng.normal(size=(slots, batch, dim))
  mu = rng.uniform(-0.3, 0.6, size=batch)
  # Keep every threshold at least 1e-3 away from every similarity so float32
  # and float64 pick the same sets.
  for i in range(batch):
    sims = [np_cos(z[i], z_buffer[j, i]) for j in range(slots)]
    while min(abs(s - mu[i]) for s in sims) < 1e-3:
      mu[i] += 2e-3
  return (
    z.astype(np.float32),
    z_global.astype(np.float32),
    z_buffer.astype(np.float32),
    mu.astype(np.float32),
  )


# Jitted once per shape: eager dispatch of every small op is what costs time.
pmfl_loss = jax.jit(
  losses.pmfl_contrastive_loss, static_argnames=('temperature',)
)


def jax_loss(z, z_global, z_buffer, buffer_mask, mu, tau, mask=None):
  with jax.default_matmul_precision('highest'):
    return np.asarray(
      pmfl_loss(
        jnp.asarray(z),
        jnp.asarray(z_global),
        jnp.asarray(z_buffer),
        jnp.asarray(buffer_mask),
        jnp.asarray(mu),
        temperature=tau,
        mask=mask,
      )
    )


@pytest.mark.parametrize('seed', [0, 1, 2])
@pytest.mark.parametrize('tau', [0.5, 0.1])
def test_pmfl_loss_matches_numpy_loop(seed, tau):
  z, z_global, z_buffer, mu = random_loss_inputs(seed)
  buffer_mask = np.array([True, False, True, True])
  expected = ref_pmfl_loss(z, z_global, z_buffer, buffer_mask, mu, tau)
  np.testing.assert_allclose(
    jax_loss(z, z_global, z_buffer, buffer_mask, mu, tau),
    expected,
    rtol=2e-5,
    atol=2e-5,
  )


def test_pmfl_loss_inputs_exercise_both_sets():
  # Precondition of the test above: the random cases contain positives and
  # negatives from the buffer, so both branches of the set split are tested.
  signs = []
  for seed in [0, 1, 2]:
    z, _, z_buffer, mu = random_loss_inputs(seed)
    signs += [
      np_cos(z[i], z_buffer[j, i]) >= mu[i]
      for i in range(len(z))
      for j in range(len(z_buffer))
    ]
  assert 0 < sum(signs) < len(signs)


def test_pmfl_loss_all_negative_is_moon_with_buffer_negatives():
  # mu above every similarity: Z+ is empty and Eq. 4 becomes MOON's loss
  # with the valid buffer slots as its negatives.
  z, z_global, z_buffer, _ = random_loss_inputs(3)
  mu = np.full(len(z), 2.0, np.float32)
  buffer_mask = np.array([True, True, False, True])
  with jax.default_matmul_precision('highest'):
    moon = np.asarray(
      jax.jit(losses.moon_contrastive_loss)(
        jnp.asarray(z),
        jnp.asarray(z_global),
        jnp.asarray(z_buffer[buffer_mask]),
      )
    )  # its default tau is 0.5
  np.testing.assert_allclose(
    jax_loss(z, z_global, z_buffer, buffer_mask, mu, 0.5),
    moon,
    rtol=2e-5,
    atol=2e-5,
  )


def test_pmfl_loss_empty_buffer_is_zero():
  z, z_global, z_buffer, mu = random_loss_inputs(4)
  buffer_mask = np.zeros(len(z_buffer), bool)
  np.testing.assert_array_equal(
    jax_loss(z, z_global, z_buffer, buffer_mask, mu, 0.5), 0.0
  )
  grads = grad_all(
    jnp.asarray(z),
    jnp.asarray(z_global),
    jnp.asarray(z_buffer),
    jnp.asarray(mu),
    jnp.asarray(buffer_mask),
  )[0]
  np.testing.assert_array_equal(np.asarray(grads), 0.0)


def test_pmfl_loss_ties_are_positives():
  # Unit axis vectors give exactly representable similarities 1, 0 and -1.
  eye = np.eye(4, dtype=np.float32)
  z = np.stack([eye[0], eye[1]])
  z_global = np.stack([eye[2], eye[1]])
  z_buffer = np.stack(
    [
      np.stack([eye[0], eye[0]]),  # sims 1, 0
      np.stack([eye[1], -eye[1]]),  # sims 0, -1
      np.stack([-eye[0], eye[1]]),
    ]
  )  # sims -1, 1
  buffer_mask = np.ones(3, bool)
  for mu in ([0.0, 0.0], [1.0, 1.0], [1e-5, -1.0], [-1.0, 1e-5], [5e-7, 0.0]):
    mu = np.array(mu, np.float32)
    np.testing.assert_allclose(
      jax_loss(z, z_global, z_buffer, buffer_mask, mu, 0.5),
      ref_pmfl_loss(z, z_global, z_buffer, buffer_mask, mu, 0.5),
      rtol=1e-6,
      atol=1e-6,
    )
  # A tie (mu = 0 on a similarity of exactly 0), or a near-tie within
  # float32 rounding (mu = 5e-7), changes the loss compared with a threshold
  # above it (1e-5).
  above = jax_loss(
    z, z_global, z_buffer, buffer_mask, np.full(2, 1e-5, np.float32), 0.5
  )
  for tied in (0.0, 5e-7):
    at = jax_loss(
      z, z_global, z_buffer, buffer_mask, np.full(2, tied, np.float32), 0.5
    )
    assert np.all(at < above - 1e-3), tied


def test_pmfl_loss_padding_mask():
  z, z_global, z_buffer, mu = random_loss_inputs(5)
  buffer_mask = np.ones(len(z_buffer), bool)
  full = jax_loss(z, z_global, z_buffer, buffer_mask, mu, 0.5)
  mask = np.array([True, False, True, True, False, True])
  masked = jax_loss(
    z, z_global, z_buffer, buffer_mask, mu, 0.5, mask=jnp.asarray(mask)
  )
  np.testing.assert_array_equal(masked[~mask], 0.0)
  np.testing.assert_allclose(masked[mask], full[mask], rtol=1e-6)


def test_pmfl_loss_gradients_finite_at_zero_vectors():
  z, z_global, z_buffer, mu = (jnp.asarray(a) for a in random_loss_inputs(6))
  z = z.at[0].set(0.0)
  z_global = z_global.at[1].set(0.0)
  z_buffer = z_buffer.at[2].set(0.0)
  buffer_mask = jnp.array([True, True, True, False])
  grads = grad_all(z, z_global, z_buffer, mu, buffer_mask)
  for g in grads:
    assert np.all(np.isfinite(np.asarray(g)))
  # The set split is a hard selection: the threshold gets no gradient.
  np.testing.assert_array_equal(np.asarray(grads[3]), 0.0)
  # An empty slot gets no gradient either.
  np.testing.assert_array_equal(np.asarray(grads[2][3]), 0.0)


def test_pmfl_loss_gradient_matches_finite_differences():
  z, z_global, z_buffer, mu = random_loss_inputs(7, batch=3, dim=4, slots=3)
  buffer_mask = np.array([True, True, False])
  with jax.default_matmul_precision('highest'):
    grad = np.asarray(
      grad_all(
        jnp.asarray(z),
        jnp.asarray(z_global),
        jnp.asarray(z_buffer),
        jnp.asarray(mu),
        jnp.asarray(buffer_mask),
      )[0]
    )
  h = 1e-6
  numeric = np.zeros(z.shape)
  z64 = z.astype(np.float64)
  for idx in np.ndindex(*z.shape):
    plus, minus = z64.copy(), z64.copy()
    plus[idx] += h
    minus[idx] -= h
    numeric[idx] = (
      ref_pmfl_loss(plus, z_global, z_buffer, buffer_mask, mu, 0.5).sum()
      - ref_pmfl_loss(minus, z_global, z_buffer, buffer_mask, mu, 0.5).sum()
    ) / (2 * h)
  np.testing.assert_allclose(grad, numeric, rtol=1e-3, atol=1e-4)


def test_pmfl_loss_shape_validation():
  z, z_global, z_buffer, mu = random_loss_inputs(8)
  with pytest.raises(ValueError, match='buffer_mask'):
    losses.pmfl_contrastive_loss(z, z_global, z_buffer, np.ones(2, bool), mu)
  with pytest.raises(ValueError, match='z_buffer'):
    losses.pmfl_contrastive_loss(
      z, z_global, z_buffer[:, :2], np.ones(4, bool), mu
    )
  with pytest.raises(ValueError, match='mu'):
    losses.pmfl_contrastive_loss(
      z, z_global, z_buffer, np.ones(4, bool), mu[:2]
    )
