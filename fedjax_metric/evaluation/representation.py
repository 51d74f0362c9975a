"""Representation-quality metrics of a model's features (embeddings).

All metrics are pure, jittable ``jax.numpy`` functions of

  features: float [N, D], one row per example (e.g. ``outputs['embedding']``);
  labels:   int [N] class ids in [0, num_classes) (``num_classes`` is static);
  mask:     optional bool [N]; False rows (padding) are ignored entirely.

Class statistics (used by `within_class_trace`, `between_class_trace`, `vci`)
follow Papyan et al. 2020 with frequency weights, so that the law of total
covariance holds exactly on the sample:

  mu_c    = (1 / n_c) sum_{i: y_i = c} h_i            (class means)
  mu_G    = (1 / n)   sum_i h_i                        (global mean)
  Sigma_W = (1 / n)   sum_i (h_i - mu_{y_i})(h_i - mu_{y_i})^T
  Sigma_B = sum_c (n_c / n) (mu_c - mu_G)(mu_c - mu_G)^T
  Sigma_T = (1 / n)   sum_i (h_i - mu_G)(h_i - mu_G)^T = Sigma_W + Sigma_B.

Classes with n_c = 0 get weight 0 (their undefined mean never enters), so a
subset of the classes never produces NaN. Rows whose label is outside
[0, num_classes) are treated as masked for the class-based metrics.

Float32 matrix products run at ``Precision.HIGHEST``: on accelerators the
default may drop to bf16/TF32 passes, which is fine for training but not for
eigen-spectra that are read off to a few significant digits.

References:
  FedRCL: Seo et al., "Relaxed Contrastive Learning for Federated Learning",
    CVPR 2024, Sec. 4.2 and Definition 2 (effective rank of the covariance of
    all feature embeddings; traces of Sigma_W and Sigma_B).
  Roy & Vetterli, "The effective rank: a measure of effective dimensionality",
    EUSIPCO 2007.
  Xu & Liu, "Quantifying the Variability Collapse of Neural Networks",
    ICML 2023 (VCI).
  Wang & Isola, "Understanding Contrastive Representation Learning through
    Alignment and Uniformity on the Hypersphere", ICML 2020 (uniformity);
    SSD (Soft Separation and Distillation), Eq. (4), uses the same quantity.
"""

from typing import Dict, Optional

import jax
import jax.numpy as jnp
import numpy as np

from fedjax_metric.evaluation import forward as forward_lib

_HIGHEST = jax.lax.Precision.HIGHEST
EFFECTIVE_RANK_MATRICES = ('covariance', 'features')


# ---------------------------------------------------------------------------
# Shared pieces.
# ---------------------------------------------------------------------------


def _as_float(features) -> jax.Array:
  x = jnp.asarray(features)
  return x.astype(jnp.promote_types(x.dtype, jnp.float32))


def _row_weights(x: jax.Array, mask) -> jax.Array:
  """float [N]: 1 for rows that count, 0 for masked-out rows."""
  if mask is None:
    return jnp.ones(x.shape[:1], x.dtype)
  return jnp.asarray(mask).astype(bool).astype(x.dtype)


def _class_weights(x, labels, num_classes, mask) -> jax.Array:
  """Row weights that also drop labels outside [0, num_classes)."""
  labels = jnp.asarray(labels)
  valid = (labels >= 0) & (labels < num_classes)
  return _row_weights(x, mask) * valid.astype(x.dtype)


def _centered_rows(x, w) -> jax.Array:
  """[N, D]: rows sqrt(w_i / n) (h_i - mu_G), so that A^T A = Sigma_T.

  Masked rows become exactly zero and so do not change any singular value.
  """
  n = jnp.maximum(jnp.sum(w), 1.0)
  mean = jnp.einsum('n,nd->d', w, x, precision=_HIGHEST) / n
  return (x - mean) * jnp.sqrt(w / n)[:, None]


def _class_stats(x, labels, num_classes, w):
  """Frequency-weighted class statistics.

  Returns:
    counts: [K] n_c (0 for absent classes).
    means: [K, D] mu_c (0 for absent classes, whose weight is 0 anyway).
    global_mean: [D] mu_G over the rows that count.
    n: scalar, the number of rows that count.
  """
  onehot = jax.nn.one_hot(labels, num_classes, dtype=x.dtype) * w[:, None]
  counts = jnp.sum(onehot, axis=0)
  n = jnp.sum(counts)
  sums = jnp.einsum('nk,nd->kd', onehot, x, precision=_HIGHEST)
  means = sums / jnp.maximum(counts, 1.0)[:, None]
  global_mean = jnp.sum(sums, axis=0) / jnp.maximum(n, 1.0)
  return counts, means, global_mean, n


def _between_rows(x, labels, num_classes, w) -> jax.Array:
  """[K, D]: rows sqrt(n_c / n) (mu_c - mu_G), so that M^T M = Sigma_B."""
  counts, means, global_mean, n = _class_stats(x, labels, num_classes, w)
  return (means - global_mean) * jnp.sqrt(counts / jnp.maximum(n, 1.0))[:, None]


def _entropy(p: jax.Array) -> jax.Array:
  """Shannon entropy -sum p log p (nats) with the convention 0 log 0 = 0."""
  positive = p > 0
  return -jnp.sum(
    jnp.where(positive, p * jnp.log(jnp.where(positive, p, 1.0)), 0.0)
  )


# ---------------------------------------------------------------------------
# Metrics.
# ---------------------------------------------------------------------------


def effective_rank(
  features, mask: Optional[jax.Array] = None, *, matrix: str = 'covariance'
) -> jax.Array:
  """Effective rank (Roy & Vetterli 2007; FedRCL Definition 2).

  For a matrix A with singular values sigma_1..sigma_Q, Q = min(m, n):

    p_k = sigma_k / sum_i |sigma_i|,   erank(A) = exp(-sum_k p_k log p_k),

  with 0 log 0 = 0. It lies in [1, rank(A)]: 1 for a rank-1 matrix, Q when all
  singular values are equal.

  Which matrix A: FedRCL (Sec. 4.2) measures "the effective rank of the
  covariance matrix of all feature embeddings", so the default is
  A = Sigma_T = (1/n) sum_i (h_i - mu_G)(h_i - mu_G)^T, i.e. the features are
  centred. Sigma_T is symmetric PSD, so its singular values are its
  eigenvalues, s_k^2 / n with s_k the singular values of the centred feature
  matrix; we take the SVD of the [N, D] centred features and square, which is
  more accurate in float32 than decomposing the D x D covariance (whose small
  eigenvalues are lost below eps * lambda_max). ``matrix='features'`` instead
  uses A = the raw, uncentred [N, D] features (SSD Appendix A.2, RankMe), whose
  p_k are proportional to s_k rather than s_k^2, so it gives larger values on
  the same data.

  Args:
    features: float [N, D].
    mask: optional bool [N]; False rows are dropped (also from the mean).
    matrix: 'covariance' (FedRCL, default) or 'features' (static).

  Returns:
    Scalar in [1, min(N, D)]; 0 for an all-zero matrix (e.g. constant
    features with ``matrix='covariance'``), whose rank is 0.
  """
  if matrix not in EFFECTIVE_RANK_MATRICES:
    raise ValueError(
      f'matrix must be one of {EFFECTIVE_RANK_MATRICES}, got {matrix!r}.'
    )
  x = _as_float(features)
  w = _row_weights(x, mask)
  if matrix == 'covariance':
    a = _centered_rows(x, w)
    sigma = jnp.square(jnp.linalg.svd(a, compute_uv=False))
  else:
    sigma = jnp.linalg.svd(x * w[:, None], compute_uv=False)
  total = jnp.sum(jnp.abs(sigma))
  p = sigma / jnp.where(total > 0, total, 1.0)
  return jnp.where(total > 0, jnp.exp(_entropy(p)), 0.0)


def within_class_trace(
  features, labels, num_classes: int, mask: Optional[jax.Array] = None
) -> jax.Array:
  """Tr(Sigma_W) = (1/n) sum_i ||h_i - mu_{y_i}||^2 (FedRCL Fig. 2b).

  Args:
    features: float [N, D]; labels: int [N]; num_classes: K (static).
    mask: optional bool [N].

  Returns:
    Scalar >= 0: the mean squared distance of a feature to its class mean.
  """
  x = _as_float(features)
  labels = jnp.asarray(labels)
  w = _class_weights(x, labels, num_classes, mask)
  _, means, _, n = _class_stats(x, labels, num_classes, w)
  # Out-of-range labels index a clamped row, but their weight is 0.
  deviations = x - means[jnp.clip(labels, 0, num_classes - 1)]
  return jnp.sum(w * jnp.sum(jnp.square(deviations), axis=-1)) / jnp.maximum(
    n, 1.0
  )


def between_class_trace(
  features, labels, num_classes: int, mask: Optional[jax.Array] = None
) -> jax.Array:
  """Tr(Sigma_B) = sum_c (n_c / n) ||mu_c - mu_G||^2 (FedRCL Fig. 2c).

  Frequency weights n_c / n (not 1/K) make Tr(Sigma_W) + Tr(Sigma_B) the total
  variance exactly, whatever the class balance; absent classes weigh 0.

  Args:
    features: float [N, D]; labels: int [N]; num_classes: K (static).
    mask: optional bool [N].

  Returns:
    Scalar >= 0.
  """
  x = _as_float(features)
  w = _class_weights(x, labels, num_classes, mask)
  return jnp.sum(
    jnp.square(_between_rows(x, jnp.asarray(labels), num_classes, w))
  )


def within_between_ratio(
  features, labels, num_classes: int, mask: Optional[jax.Array] = None
) -> jax.Array:
  """Tr(Sigma_W) / Tr(Sigma_B): smaller means tighter, better separated classes.

  A scalar summary of FedRCL Fig. 2b/2c (not the NC1 metric Tr(Sigma_W
  Sigma_B^+) / K). It is +inf when Tr(Sigma_B) = 0 < Tr(Sigma_W), and NaN only
  when both are 0.
  """
  return within_class_trace(
    features, labels, num_classes, mask
  ) / between_class_trace(features, labels, num_classes, mask)


def vci(
  features,
  labels,
  num_classes: int,
  mask: Optional[jax.Array] = None,
  *,
  rtol: Optional[float] = None,
) -> jax.Array:
  """Variability Collapse Index (Xu & Liu, ICML 2023).

    VCI = 1 - Tr(Sigma_T^+ Sigma_B) / rank(Sigma_B),

  with Sigma_T = Sigma_W + Sigma_B the total covariance (module docstring) and
  ^+ the Moore-Penrose pseudo-inverse. Because Sigma_T >= Sigma_B (PSD order),
  Sigma_T^{+1/2} Sigma_B Sigma_T^{+1/2} has eigenvalues in [0, 1] and rank
  rank(Sigma_B), so VCI is in [0, 1]: 0 when within-class variability has
  collapsed (Sigma_W = 0), towards 1 when the class means explain little of the
  variance. It is invariant under invertible linear maps of the features.

  Numerics: with A = [sqrt(1/n)(h_i - mu_G)]_i = U S V^T (so A^T A = Sigma_T)
  and M = [sqrt(n_c/n)(mu_c - mu_G)]_c (so M^T M = Sigma_B),
  Tr(Sigma_T^+ Sigma_B) = ||M V_r S_r^{-1}||_F^2 over the singular values
  s_k > tol, and rank(Sigma_B) = #{singular values of M > tol}, with one
  absolute tol = rtol * max(s). Working with singular values of A rather than
  eigenvalues of Sigma_T keeps float32 meaningful down to eps rather than
  sqrt(eps) of the spectrum, and the shared tol makes a collapsed input give
  exactly rank / rank.

  Args:
    features: float [N, D]; labels: int [N]; num_classes: K (static).
    mask: optional bool [N].
    rtol: relative cutoff on singular values; default max(N, D) * eps(dtype),
      the NumPy ``matrix_rank`` default.

  Returns:
    Scalar in [0, 1] (up to rounding). By convention 1 when rank(Sigma_B) = 0
    (fewer than two distinct class means): class means explain nothing.
  """
  x = _as_float(features)
  labels = jnp.asarray(labels)
  w = _class_weights(x, labels, num_classes, mask)
  if rtol is None:
    rtol = max(x.shape) * float(jnp.finfo(x.dtype).eps)
  a = _centered_rows(x, w)
  m = _between_rows(x, labels, num_classes, w)
  _, s, vt = jnp.linalg.svd(a, full_matrices=False)
  tol = rtol * jnp.max(s, initial=0.0)
  keep = s > tol
  inv_s = jnp.where(keep, 1.0 / jnp.where(keep, s, 1.0), 0.0)
  whitened = jnp.einsum('kd,rd->kr', m, vt, precision=_HIGHEST) * inv_s
  explained = jnp.sum(jnp.square(whitened))
  rank_b = jnp.sum(jnp.linalg.svd(m, compute_uv=False) > tol).astype(x.dtype)
  return jnp.where(rank_b > 0, 1.0 - explained / jnp.maximum(rank_b, 1.0), 1.0)


def uniformity(
  features, t: float = 2.0, mask: Optional[jax.Array] = None
) -> jax.Array:
  """Uniformity (Wang & Isola 2020; SSD Eq. (4) is its negative).

    U = log( 1/|P| sum_{(i, j) in P} exp(-t ||f_i - f_j||^2) ),
    f_i = h_i / ||h_i||,  P = {(i, j): i != j},

  over ordered pairs of distinct rows (the sum is symmetric, so this equals the
  mean over unordered pairs). U is in [-4t, 0]: 0 when all features point the
  same way, lower is more uniform on the hypersphere. For unit vectors
  ||f_i - f_j||^2 = 2 - 2 <f_i, f_j>, and the log-mean-exp is taken with
  logsumexp so that large t does not underflow to log 0.

  Args:
    features: float [N, D]; zero rows stay zero (they sit at the origin).
    t: the temperature, 2 in Wang & Isola.
    mask: optional bool [N]; pairs with a masked row are dropped.

  Returns:
    Scalar; NaN if fewer than two rows count (no pairs).
  """
  x = _as_float(features)
  w = _row_weights(x, mask)
  norms = jnp.linalg.norm(x, axis=-1, keepdims=True)
  f = x / jnp.where(norms > 0, norms, 1.0)
  sq_norms = jnp.sum(jnp.square(f), axis=-1)
  gram = jnp.einsum('id,jd->ij', f, f, precision=_HIGHEST)
  # Rounding can make the expansion slightly negative; distances are >= 0.
  sq_dists = jnp.maximum(
    sq_norms[:, None] + sq_norms[None, :] - 2.0 * gram, 0.0
  )
  pairs = w[:, None] * w[None, :] * (1.0 - jnp.eye(x.shape[0], dtype=x.dtype))
  num_pairs = jnp.sum(pairs)
  return jax.nn.logsumexp(-t * sq_dists, b=pairs) - jnp.log(
    jnp.where(num_pairs > 0, num_pairs, jnp.nan)
  )


def representation_metrics(
  features, labels, num_classes: int, mask: Optional[jax.Array] = None
) -> Dict[str, jax.Array]:
  """All metrics above with their defaults, as ``{name: scalar}``.

  Keys: 'effective_rank' (covariance, FedRCL), 'vci', 'within_class_trace',
  'between_class_trace', 'uniformity' (t = 2). Jittable with ``num_classes``
  static.
  """
  return {
    'effective_rank': effective_rank(features, mask),
    'vci': vci(features, labels, num_classes, mask),
    'within_class_trace': within_class_trace(
      features, labels, num_classes, mask
    ),
    'between_class_trace': between_class_trace(
      features, labels, num_classes, mask
    ),
    'uniformity': uniformity(features, mask=mask),
  }


# ---------------------------------------------------------------------------
# Features of a model on a fixed evaluation subset.
# ---------------------------------------------------------------------------


def make_feature_fn(
  model,
  preprocess,
  images: np.ndarray,
  labels: np.ndarray,
  *,
  batch_size: int = 1000,
  max_examples: int = 2000,
):
  """Returns ``variables -> (features [n, D] np.ndarray, labels [n])``.

  The features are ``outputs['embedding']`` of ``model.apply(..., train=False)``
  on the first ``n = min(len(labels), max_examples)`` examples, a fixed subset
  so that metrics are comparable across rounds and runs. As in
  `make_evaluate_fn`, it is one `forward.make_forward_pass` over the subset.

  Args:
    model: `ModelFns`.
    preprocess: ``(uint8 images, key) -> float images`` without augmentation.
    images: uint8 [N, H, W, C]; labels: int [N].
    batch_size: examples per jitted forward.
    max_examples: size of the subset.
  """
  n = min(len(labels), max_examples)
  if n == 0:
    raise ValueError(
      'No examples to compute features on (empty split or max_examples <= 0).'
    )
  forward = forward_lib.make_forward_pass(
    model,
    preprocess,
    np.asarray(images[:n]),
    np.asarray(labels[:n]),
    batch_size=batch_size,
    feature_examples=n,
    classify=False,
  )
  subset_labels = np.asarray(labels[:n]).copy()

  def features(variables):
    return forward(variables).features, subset_labels

  return features
