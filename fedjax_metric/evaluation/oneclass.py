"""One-class (one-vs-rest) evaluation: per-class scores and AUROC.

For class c the positives are the test examples of class c and the negatives
all other test examples; a score s_c(x) says how strongly x belongs to c
(higher = more likely). AUROC_c is the Mann-Whitney rank statistic with ties
counted 1/2, the same number as ``sklearn.metrics.roc_auc_score``; the
one-class papers (Park, Hosseini and Yun, 'Federated Learning with Metric
Loss', FL-ICML workshop 2021, Table 2) report its mean over classes.

Scores: `center_scores` (minus the Euclidean distance to a class center: a
mean training embedding from `class_centers`, or a FedMetric / Deep SVDD
center) and `cosine_scores` (cosine to a class embedding, FedAwS, or to a
codeword, FedUV). AUROC is invariant to monotone transforms of one class's
scores, so -d and -d^2 give the same AUROC.
"""

import jax
import jax.numpy as jnp
import numpy as np

from fedjax_metric.losses.metric import _cosine
from fedjax_metric.losses.metric import _distance


def _average_ranks(values):
  """1-based ranks of ``values`` [N], tied values sharing their mean rank."""
  _, inverse, counts = np.unique(values, return_inverse=True,
                                 return_counts=True)
  # A run of t ties starting after `below` smaller values occupies ranks
  # below + 1 .. below + t, whose mean is below + (t + 1) / 2.
  below = np.cumsum(counts) - counts
  return (below + (counts + 1) / 2.0)[inverse.reshape(-1)]


def auroc(scores, is_positive):
  """Area under the ROC curve by the Mann-Whitney U statistic.

  Hanley and McNeil, 'The Meaning and Use of the Area under a Receiver
  Operating Characteristic (ROC) Curve', Radiology 1982::

    AUROC = (sum_{i positive} rank_i - P (P + 1) / 2) / (P N)

  with average ranks for ties, i.e. the probability that a random positive
  scores above a random negative, ties counted 1/2.

  Args:
    scores: [N] float, higher = more likely positive.
    is_positive: [N] bool.

  Returns:
    float in [0, 1].

  Raises:
    ValueError: shapes differ, a score is NaN, or there are no positives or
      no negatives.
  """
  scores = np.asarray(scores, np.float64).reshape(-1)
  is_positive = np.asarray(is_positive, bool).reshape(-1)
  if scores.shape != is_positive.shape:
    raise ValueError(f'scores and is_positive must have the same length, '
                     f'got {scores.shape} and {is_positive.shape}.')
  if np.isnan(scores).any():
    raise ValueError('auroc: scores contain NaN.')
  num_pos = int(is_positive.sum())
  num_neg = is_positive.size - num_pos
  if num_pos == 0 or num_neg == 0:
    raise ValueError(f'auroc needs positives and negatives, got {num_pos} '
                     f'positives and {num_neg} negatives.')
  rank_sum = _average_ranks(scores)[is_positive].sum()
  return float((rank_sum - num_pos * (num_pos + 1) / 2.0) /
               (num_pos * num_neg))


def one_class_auroc(scores, labels):
  """Per-class one-vs-rest AUROC: class c ranks scores[:, c], positives y = c.

  The protocol of the one-class evaluations of Park, Hosseini and Yun,
  'Federated Learning with Metric Loss', FL-ICML workshop 2021, Table 2 (the
  mean over classes of this vector).

  Args:
    scores: [N, C] float, column c the class-c score.
    labels: [N] int in [0, C).

  Returns:
    [C] np.float64.

  Raises:
    ValueError: a class has no test example, or every example is of it.
  """
  scores = np.asarray(scores)
  labels = np.asarray(labels).reshape(-1)
  if scores.ndim != 2 or scores.shape[0] != labels.size:
    raise ValueError(f'scores must be [N, C] with N = len(labels); got '
                     f'{scores.shape} and {labels.size} labels.')
  return np.array([auroc(scores[:, c], labels == c)
                   for c in range(scores.shape[1])], np.float64)


def center_scores(embeddings, centers, *, squared=False):
  """Class scores -||e - c_k|| (or -||e - c_k||^2), [N, D] x [C, D] -> [N, C].

  The Euclidean score for center-based one-class models (Ruff et al., 'Deep
  One-Class Classification', ICML 2018, use ||e - c||^2 as the anomaly
  score; Park, Hosseini and Yun, 'Federated Learning with Metric
  Loss', FL-ICML workshop 2021, measure everything with d). Computed from
  explicit differences, not the |a|^2 + |b|^2 - 2ab expansion, so it is
  exact for nearby points and needs no matmul precision.

  Args:
    embeddings: [N, D].
    centers: [C, D].
    squared: negate the squared distance instead.

  Returns:
    [N, C].
  """
  embeddings = jnp.asarray(embeddings)
  centers = jnp.asarray(centers)
  return -_distance(embeddings[:, None, :], centers[None], squared=squared)


def cosine_scores(embeddings, class_vectors):
  """Class scores cos(e, w_k), [N, D] x [C, D] -> [N, C].

  The score of normalised-embedding one-class models: FedAwS's cosine to
  the class embedding (Yu et al., 'Federated Learning with Only Positive
  Labels', ICML 2020) and FedUV's v^T f(x) / c, which equals the cosine for
  +-1 codewords (Hosseini et al., 'Federated Learning of User Verification
  Models Without Sharing Embeddings', ICML 2021).

  Args:
    embeddings: [N, D].
    class_vectors: [C, D].

  Returns:
    [N, C] in [-1, 1]; 0 for a zero row.
  """
  embeddings = jnp.asarray(embeddings)
  class_vectors = jnp.asarray(class_vectors)
  return _cosine(embeddings[:, None, :], class_vectors[None])


def class_centers(embeddings, labels, num_classes, mask=None):
  """Mean embedding per class: c_k = mean_{i : y_i = k} e_i, -> [C, D].

  The class representative for models that keep no class embedding (the
  mean training embedding of class k), as a center for `center_scores`.

  Args:
    embeddings: [N, D].
    labels: [N] int in [0, num_classes).
    num_classes: C.
    mask: optional [N] bool; False rows are left out.

  Returns:
    [C, D]; zeros for a class with no (real) example.
  """
  embeddings = jnp.asarray(embeddings)
  labels = jnp.asarray(labels)
  weights = jnp.ones(labels.shape, embeddings.dtype) if mask is None else (
      jnp.asarray(mask).astype(embeddings.dtype))
  # segment_sum adds rows exactly (no matmul, no TF32 rounding).
  sums = jax.ops.segment_sum(weights[:, None] * embeddings, labels,
                             num_segments=num_classes)
  counts = jax.ops.segment_sum(weights, labels, num_segments=num_classes)
  return sums / jnp.maximum(counts, 1.0)[:, None]
