"""PMFL's contrastive loss (Eq. 4, `losses.pmfl_contrastive_loss`) against a
float64 NumPy loop with explicit Z+ / Z- sets.

FedAU's and PMFL's aggregation weights are tested with their algorithms:
tests/algorithms/test_fedau_intervals.py and test_pmfl_server.py.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fedjax_metric import losses


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
