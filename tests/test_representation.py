"""Representation metrics against float64 NumPy re-derivations and hand cases.

The references below are written from the definitions (explicit loops over
samples, classes and pairs; np.linalg.pinv / matrix_rank / svd in float64) and
share no code with fedjax_metric/evaluation/representation.py.
"""

import functools
import math

import jax
import numpy as np
import pytest

from fedjax_metric import evaluation, models
from fedjax_metric.evaluation import representation as rep

# float32 against float64: a few ulps of the accumulated sums.
RTOL = 2e-4
ATOL = 1e-5


# ---------------------------------------------------------------------------
# NumPy float64 references, from the definitions.
# ---------------------------------------------------------------------------


def np_class_stats(h, y, num_classes):
  """Returns (present classes, n_c, mu_c, mu_G) with explicit loops."""
  h = np.asarray(h, np.float64)
  n, d = h.shape
  mu_g = np.zeros(d)
  for i in range(n):
    mu_g += h[i]
  mu_g /= n
  present, counts, means = [], {}, {}
  for c in range(num_classes):
    rows = [h[i] for i in range(n) if y[i] == c]
    if rows:  # Absent classes are excluded, by definition.
      present.append(c)
      counts[c] = len(rows)
      means[c] = np.sum(rows, axis=0) / len(rows)
  return present, counts, means, mu_g


def np_sigmas(h, y, num_classes):
  """(Sigma_W, Sigma_B, Sigma_T) with Sigma_T the directly computed covariance."""
  h = np.asarray(h, np.float64)
  n, d = h.shape
  present, counts, means, mu_g = np_class_stats(h, y, num_classes)
  sigma_w = np.zeros((d, d))
  sigma_t = np.zeros((d, d))
  for i in range(n):
    dw = h[i] - means[y[i]]
    dt = h[i] - mu_g
    sigma_w += np.outer(dw, dw) / n
    sigma_t += np.outer(dt, dt) / n
  sigma_b = np.zeros((d, d))
  for c in present:
    db = means[c] - mu_g
    sigma_b += counts[c] / n * np.outer(db, db)
  return sigma_w, sigma_b, sigma_t


def np_entropy_erank(sigma):
  p = np.asarray(sigma, np.float64) / np.sum(np.abs(sigma))
  entropy = 0.0
  for pk in p:
    if pk > 0:  # 0 log 0 = 0.
      entropy -= pk * math.log(pk)
  return math.exp(entropy)


def np_effective_rank(h, matrix='covariance'):
  h = np.asarray(h, np.float64)
  if matrix == 'covariance':
    _, _, sigma_t = np_sigmas(h, np.zeros(len(h), int), 1)
    a = sigma_t  # FedRCL: the covariance matrix of all feature embeddings.
  else:
    a = h
  return np_entropy_erank(np.linalg.svd(a, compute_uv=False))


def np_vci(h, y, num_classes):
  _, sigma_b, sigma_t = np_sigmas(h, y, num_classes)
  return 1.0 - (
    np.trace(np.linalg.pinv(sigma_t, hermitian=True) @ sigma_b)
    / np.linalg.matrix_rank(sigma_b, hermitian=True)
  )


def np_uniformity(h, t=2.0):
  h = np.asarray(h, np.float64)
  f = h / np.linalg.norm(h, axis=1, keepdims=True)
  total, count = 0.0, 0
  for i in range(len(f)):
    for j in range(len(f)):
      if i != j:
        total += math.exp(-t * np.sum((f[i] - f[j]) ** 2))
        count += 1
  return math.log(total / count)


def random_data(seed, n=120, d=12, num_classes=5, separation=1.0):
  rng = np.random.default_rng(seed)
  labels = rng.integers(0, num_classes, n)
  means = separation * rng.normal(size=(num_classes, d))
  features = means[labels] + rng.normal(size=(n, d)) * rng.uniform(0.2, 2.0, d)
  return features.astype(np.float32), labels.astype(np.int32)


# ---------------------------------------------------------------------------
# Against the references on random data.
# ---------------------------------------------------------------------------


def test_reference_total_covariance_is_within_plus_between():
  """The frequency weighting makes Sigma_T = Sigma_W + Sigma_B exactly."""
  h, y = random_data(0)
  sigma_w, sigma_b, sigma_t = np_sigmas(h, y, 5)
  np.testing.assert_allclose(sigma_w + sigma_b, sigma_t, atol=1e-10)


@pytest.mark.parametrize('seed', [0, 1, 2])
@pytest.mark.parametrize('matrix', ['covariance', 'features'])
def test_effective_rank_matches_reference(seed, matrix):
  h, _ = random_data(seed, d=10 + seed)
  got = float(rep.effective_rank(h, matrix=matrix))
  np.testing.assert_allclose(got, np_effective_rank(h, matrix), rtol=RTOL)


def test_effective_rank_covariance_is_centred_and_features_is_not():
  h, _ = random_data(3)
  shifted = h + 100.0
  np.testing.assert_allclose(
    float(rep.effective_rank(shifted)), float(rep.effective_rank(h)), rtol=1e-3
  )
  # A large common offset dominates the raw matrix: one big singular value.
  assert (
    float(rep.effective_rank(shifted, matrix='features'))
    < float(rep.effective_rank(h, matrix='features')) - 1.0
  )


@pytest.mark.parametrize('seed', [0, 1, 2, 3])
def test_traces_match_reference(seed):
  h, y = random_data(seed, num_classes=4 + seed)
  k = 4 + seed
  sigma_w, sigma_b, _ = np_sigmas(h, y, k)
  np.testing.assert_allclose(
    float(rep.within_class_trace(h, y, k)), np.trace(sigma_w), rtol=RTOL
  )
  np.testing.assert_allclose(
    float(rep.between_class_trace(h, y, k)), np.trace(sigma_b), rtol=RTOL
  )
  np.testing.assert_allclose(
    float(rep.within_between_ratio(h, y, k)),
    np.trace(sigma_w) / np.trace(sigma_b),
    rtol=RTOL,
  )


@pytest.mark.parametrize('seed,separation', [(0, 0.3), (1, 1.0), (2, 3.0)])
def test_vci_matches_reference(seed, separation):
  h, y = random_data(seed, separation=separation)
  got = float(rep.vci(h, y, 5))
  np.testing.assert_allclose(got, np_vci(h, y, 5), rtol=RTOL, atol=ATOL)
  assert 0.0 <= got <= 1.0


def test_vci_matches_reference_when_sigma_t_is_singular():
  """D > N - 1: Sigma_T is rank-deficient and the pseudo-inverse matters."""
  h, y = random_data(4, n=20, d=32)
  np.testing.assert_allclose(
    float(rep.vci(h, y, 5)), np_vci(h, y, 5), rtol=RTOL, atol=ATOL
  )


@pytest.mark.parametrize('seed', [0, 1])
def test_uniformity_matches_reference(seed):
  h, _ = random_data(seed, n=40)
  for t in (0.5, 2.0, 10.0):
    np.testing.assert_allclose(
      float(rep.uniformity(h, t)), np_uniformity(h, t), rtol=RTOL
    )


# ---------------------------------------------------------------------------
# Hand cases.
# ---------------------------------------------------------------------------


@pytest.mark.parametrize('d', [1, 4, 16])
def test_effective_rank_of_isotropic_features_is_d(d):
  # Rows +-sqrt(d) e_k: mean 0 and covariance exactly the identity.
  eye = np.sqrt(d) * np.eye(d, dtype=np.float32)
  h = np.concatenate([eye, -eye])
  np.testing.assert_allclose(float(rep.effective_rank(h)), d, rtol=1e-5)
  np.testing.assert_allclose(
    float(rep.effective_rank(np.eye(d, dtype=np.float32), matrix='features')),
    d,
    rtol=1e-5,
  )


def test_effective_rank_of_rank_one_features_is_one():
  rng = np.random.default_rng(0)
  h = np.outer(rng.normal(size=50), rng.normal(size=8)).astype(np.float32)
  np.testing.assert_allclose(float(rep.effective_rank(h)), 1.0, rtol=1e-4)
  np.testing.assert_allclose(
    float(rep.effective_rank(h, matrix='features')), 1.0, rtol=1e-4
  )


def test_effective_rank_of_known_spectrum():
  # Covariance diag(2, 1, 1): p = (1/2, 1/4, 1/4), H = 1.5 log 2, erank = 2^1.5.
  lam = np.array([2.0, 1.0, 1.0])
  rows = np.sqrt(3 * lam)[:, None] * np.eye(3)
  h = np.concatenate([rows, -rows]).astype(np.float32)
  np.testing.assert_allclose(float(rep.effective_rank(h)), 2**1.5, rtol=1e-5)


def test_effective_rank_of_constant_features_is_zero_not_nan():
  assert float(rep.effective_rank(np.ones((10, 4), np.float32))) == 0.0


@pytest.mark.parametrize('seed', [0, 1, 2])
def test_vci_is_zero_when_within_class_variability_collapses(seed):
  # Sigma_W = 0 => Sigma_T = Sigma_B => Tr(Sigma_B^+ Sigma_B) = rank(Sigma_B).
  rng = np.random.default_rng(seed)
  y = rng.integers(0, 10, 200)
  one_hot = np.eye(10, dtype=np.float32)[y]  # Sigma_T singular (rank 9).
  means = rng.normal(size=(10, 16)).astype(np.float32)
  for h in (one_hot, means[y]):
    assert abs(float(rep.vci(h, y, 10))) < 1e-5
    assert float(rep.within_class_trace(h, y, 10)) < 1e-10


@pytest.mark.parametrize('a', [0.5, 1.0, 3.0])
def test_vci_and_traces_of_two_one_dimensional_classes(a):
  # Class 0 at -1 +- a, class 1 at +1 +- a (balanced): mu_G = 0,
  # Sigma_B = 1/2 * 1 + 1/2 * 1 = 1, Sigma_W = a^2, Sigma_T = 1 + a^2,
  # rank(Sigma_B) = 1, so VCI = 1 - 1 / (1 + a^2) = a^2 / (1 + a^2).
  h = np.array([[-1 - a], [-1 + a], [1 - a], [1 + a]], np.float32)
  y = np.array([0, 0, 1, 1])
  np.testing.assert_allclose(
    float(rep.vci(h, y, 2)), a * a / (1 + a * a), rtol=1e-5
  )
  np.testing.assert_allclose(
    float(rep.within_class_trace(h, y, 2)), a * a, rtol=1e-6
  )
  np.testing.assert_allclose(
    float(rep.between_class_trace(h, y, 2)), 1.0, rtol=1e-6
  )


def test_vci_is_invariant_under_invertible_linear_maps():
  h, y = random_data(5)
  rng = np.random.default_rng(5)
  a = (rng.normal(size=(12, 12)) + 3 * np.eye(12)).astype(np.float32)
  np.testing.assert_allclose(
    float(rep.vci(h @ a.T, y, 5)), float(rep.vci(h, y, 5)), rtol=1e-3
  )


def test_vci_is_one_without_between_class_variance():
  # Each class holds the same rows, so every mu_c = mu_G and Sigma_B = 0.
  rng = np.random.default_rng(0)
  block = rng.normal(size=(5, 3)).astype(np.float32)
  h = np.concatenate([block, block])
  y = np.array([0] * 5 + [1] * 5)
  assert float(rep.vci(h, y, 2)) == 1.0
  assert abs(float(rep.between_class_trace(h, y, 2))) < 1e-10


def test_uniformity_of_antipodal_points_is_minus_four_t():
  h = np.array([[1.0, 0.0], [-1.0, 0.0]], np.float32)
  for t in (0.5, 2.0, 7.0):
    np.testing.assert_allclose(
      float(rep.uniformity(h, t)), math.log(math.exp(-4 * t)), rtol=1e-6
    )


def test_uniformity_normalises_and_is_zero_for_one_direction():
  h = np.array([[1.0, 2.0], [2.0, 4.0], [0.5, 1.0]], np.float32)
  np.testing.assert_allclose(float(rep.uniformity(h)), 0.0, atol=1e-6)


# ---------------------------------------------------------------------------
# Absent classes, masks, jit.
# ---------------------------------------------------------------------------


def test_absent_classes_are_excluded_not_nan():
  h, y_compact = random_data(6, num_classes=3)
  y_sparse = np.array([0, 4, 8])[y_compact]  # Classes 1-3, 5-7, 9 absent.
  sparse = rep.representation_metrics(h, y_sparse, 10)
  compact = rep.representation_metrics(h, y_compact, 3)
  for name, value in sparse.items():
    assert np.isfinite(float(value)), name
    np.testing.assert_allclose(
      float(value), float(compact[name]), rtol=1e-5, err_msg=name
    )
  np.testing.assert_allclose(
    float(sparse['vci']), np_vci(h, y_sparse, 10), rtol=RTOL
  )


def test_mask_equals_the_subset():
  h, y = random_data(7, n=60)
  mask = np.random.default_rng(7).random(60) < 0.6
  masked = rep.representation_metrics(h, y, 5, mask)
  subset = rep.representation_metrics(h[mask], y[mask], 5)
  assert set(masked) == {
    'effective_rank',
    'vci',
    'within_class_trace',
    'between_class_trace',
    'uniformity',
  }
  for name in masked:
    np.testing.assert_allclose(
      float(masked[name]),
      float(subset[name]),
      rtol=1e-4,
      atol=1e-6,
      err_msg=name,
    )


def test_representation_metrics_jit_and_exports():
  h, y = random_data(8)
  jitted = jax.jit(evaluation.representation_metrics, static_argnums=2)(h, y, 5)
  eager = rep.representation_metrics(h, y, 5)
  for name in eager:
    np.testing.assert_allclose(
      float(jitted[name]), float(eager[name]), rtol=1e-5, err_msg=name
    )
  vci_jit = jax.jit(functools.partial(evaluation.vci, num_classes=5))
  np.testing.assert_allclose(
    float(vci_jit(h, y)), float(eager['vci']), rtol=1e-5
  )
  assert callable(evaluation.make_evaluate_fn)


def test_effective_rank_rejects_unknown_matrix():
  with pytest.raises(ValueError, match='covariance'):
    rep.effective_rank(np.ones((3, 2), np.float32), matrix='gram')


# ---------------------------------------------------------------------------
# make_feature_fn.
# ---------------------------------------------------------------------------


def test_make_feature_fn_returns_the_subset_embeddings():
  rng = np.random.default_rng(0)
  images = rng.integers(0, 256, (37, 8, 8, 1), dtype=np.uint8)
  labels = rng.integers(0, 10, 37).astype(np.int32)
  model = models.build('small_cnn', 10, width=8, embedding_dim=16)
  preprocess = lambda x, key: x.astype(np.float32) / 255.0
  variables = model.init(jax.random.key(0), preprocess(images[:1], None))
  feature_fn = rep.make_feature_fn(
    model, preprocess, images, labels, batch_size=10, max_examples=25
  )
  features, subset_labels = feature_fn(variables)
  assert isinstance(features, np.ndarray) and features.shape == (25, 16)
  np.testing.assert_array_equal(subset_labels, labels[:25])
  direct, _ = model.apply(
    variables['params'], {}, preprocess(images[:25], None), train=False
  )
  np.testing.assert_allclose(
    features, np.asarray(direct['embedding']), rtol=1e-5, atol=1e-5
  )
  with pytest.raises(ValueError, match='No examples'):
    rep.make_feature_fn(model, preprocess, images, labels, max_examples=0)
