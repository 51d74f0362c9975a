"""FedMetric's hyperspheres (fedmetric_proxies, re-exported by fedmetric):
proxy centers and the local center, vs float64 NumPy loops."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fedjax_metric.algorithms import fedmetric

from .oneclass_helpers import TOL, np_dist


@pytest.mark.parametrize(
  'scale, radius', [(0.0, 0.7), (0.5, 0.3), (1.5, 2.0), (3.0, 0.0)]
)
def test_proxy_center_distance_and_margin(scale, radius):
  center = jnp.array([0.3, -1.0, 2.0, 0.0, 0.5])
  a, m = fedmetric.proxy_center(center, radius, scale, jax.random.key(1))
  assert a.shape == center.shape
  assert np_dist(a, center) == pytest.approx(scale * radius, abs=1e-5)
  assert float(m) == pytest.approx(radius * (1 + scale), abs=1e-6)
  if scale * radius == 0:
    np.testing.assert_array_equal(np.asarray(a), np.asarray(center))


def test_proxy_center_deterministic_in_key_and_traceable():
  c = jnp.zeros(4)
  a1, _ = fedmetric.proxy_center(c, 1.0, 2.0, jax.random.key(3))
  a2, _ = fedmetric.proxy_center(c, 1.0, 2.0, jax.random.key(3))
  a3, _ = fedmetric.proxy_center(c, 1.0, 2.0, jax.random.key(4))
  np.testing.assert_array_equal(np.asarray(a1), np.asarray(a2))
  assert not np.allclose(np.asarray(a1), np.asarray(a3))
  a4, m4 = jax.jit(fedmetric.proxy_center)(
    c, jnp.float32(1.0), jnp.float32(2.0), jax.random.key(3)
  )
  np.testing.assert_allclose(np.asarray(a4), np.asarray(a1), **TOL)
  assert float(m4) == pytest.approx(3.0)


def test_proxy_center_negative_scale_or_radius():
  with pytest.raises(ValueError, match='scale'):
    fedmetric.proxy_center(jnp.zeros(3), 1.0, -0.1, jax.random.key(0))
  with pytest.raises(ValueError, match='radius'):
    fedmetric.proxy_center(jnp.zeros(3), -1.0, 1.0, jax.random.key(0))


def test_proxy_center_direction_is_uniform_on_the_sphere():
  """Mean direction ~ 0; in 3-D each coordinate of u is uniform on [-1, 1].

  Archimedes' hat-box theorem: for u uniform on S^2, u_1 ~ U[-1, 1]. A
  chi-square test on 10 equal bins (9 dof; 27.9 is the 0.1% point).
  """
  n = 4000
  keys = jax.random.split(jax.random.key(11), n)
  center = jnp.array([5.0, -3.0, 1.0])
  a, _ = jax.vmap(lambda k: fedmetric.proxy_center(center, 2.0, 0.5, k))(keys)
  u = (np.asarray(a, np.float64) - np.asarray(center)) / 1.0  # D = 1.
  np.testing.assert_allclose(np.linalg.norm(u, axis=1), 1.0, atol=1e-5)
  # Each coordinate has variance 1/3: the mean is within 4 standard errors.
  assert np.all(np.abs(u.mean(axis=0)) < 4 * np.sqrt(1 / 3 / n))
  for axis in range(3):
    counts = np.histogram(u[:, axis], bins=10, range=(-1, 1))[0]
    chi2 = sum((c - n / 10) ** 2 / (n / 10) for c in counts)
    assert chi2 < 27.9, (axis, counts)


def test_local_center_matches_numpy():
  rng = np.random.default_rng(9)
  e = rng.normal(size=(7, 3)).astype(np.float32)
  e[5] = 100.0  # A masked outlier must not count.
  mask = np.array([1, 1, 0, 1, 1, 0, 1], bool)
  c = fedmetric.local_center(e, mask)
  real = [i for i in range(7) if mask[i]]
  want_c = [sum(float(e[i, k]) for i in real) / len(real) for k in range(3)]
  np.testing.assert_allclose(np.asarray(c), want_c, **TOL)
  full = fedmetric.local_center(e[:5])
  np.testing.assert_allclose(
    np.asarray(full), e[:5].astype(np.float64).mean(0), **TOL
  )
  none = jnp.zeros(3, bool)
  np.testing.assert_array_equal(
    np.asarray(fedmetric.local_center(jnp.ones((3, 2)), none)), 0.0
  )
