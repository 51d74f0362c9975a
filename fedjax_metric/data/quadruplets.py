"""FedQuad's stochastic quadruplet sampling per client (Section III-A).

Goksu & Pugeault, 'FedQuad: Federated Stochastic Quadruplet Learning to
Mitigate Data Heterogeneity', arXiv:2509.04107, 2025.

For every anchor x_a of class k on client i, drawn from the client's own data:
  x_p  ~ D_k \\ {x_a}                 (same class, not the anchor itself)
  x_n1 ~ D_k'   with k'  != k         (a class present on the client)
  x_n2 ~ D_k''  with k'' not in {k, k'}
Host-side NumPy, deterministic in the generator it is given (the cohort seeds it
from (seed, round, client)). Each local step's row of indices is laid out as
[anchors | positives | negatives_1 | negatives_2], B each, so the device side
gathers 4B images in one go and the loss splits them.

Fallbacks, for clients whose data cannot form a full quadruplet (the paper
does not cover this case; docs/methods.md, FedQuad):
  * the anchor is the only example of its class: x_p = x_a (d(a, p) = 0, the
    negatives are still pushed away);
  * exactly one other class on the client: k'' = k' (two negatives of that
    class, distinct examples when it has two);
  * no other class at all: the companions are masked out and only the
    cross-entropy term trains on that anchor.
"""

import numpy as np

from fedjax_metric.data import cohort as cohort_lib


def sample_companions(
  anchors: np.ndarray,
  client_indices: np.ndarray,
  labels: np.ndarray,
  rng: np.random.Generator,
  num_negatives: int = 2,
):
  """Positive and negatives for each anchor.

  Args:
    anchors: int [n] global example indices (all on this client).
    client_indices: int [m] the client's global example indices.
    labels: int [num_examples] global labels.
    rng: NumPy generator.
    num_negatives: 1 (triplets) or 2 (quadruplets).

  Returns:
    (positives [n], negatives [num_negatives, n], valid [n] bool); invalid
    anchors (no other class on the client) have companions equal to themselves.
  """
  n = len(anchors)
  positives = anchors.copy()
  negatives = np.tile(anchors, (num_negatives, 1))
  valid = np.zeros(n, bool)
  if n == 0:
    return positives, negatives, valid
  client_labels = labels[client_indices]
  classes, counts = np.unique(client_labels, return_counts=True)
  order = np.argsort(client_labels, kind='stable')
  by_class = client_indices[order]  # client examples grouped by class
  starts = np.concatenate([[0], np.cumsum(counts)[:-1]])
  anchor_class = np.searchsorted(classes, labels[anchors])

  # Positive: uniform over the class's other members (skip the anchor's slot).
  position = np.empty(len(client_indices), np.int64)
  position[order] = np.arange(len(client_indices))
  where_anchor = {int(g): int(p) for g, p in zip(client_indices, position)}
  self_slot = (
    np.array([where_anchor[int(a)] for a in anchors]) - starts[anchor_class]
  )
  size = counts[anchor_class]
  draw = (rng.random(n) * np.maximum(size - 1, 1)).astype(np.int64)
  draw = np.minimum(
    draw + (draw >= self_slot), size - 1
  )  # size-1 classes: unused
  has_positive = size > 1
  positives[has_positive] = by_class[starts[anchor_class] + draw][has_positive]

  # Negative classes: distinct random classes other than the anchor's.
  num_classes = len(classes)
  valid = np.full(n, num_classes > 1)
  if num_classes == 1:
    return positives, negatives, valid
  scores = rng.random((n, num_classes))
  scores[np.arange(n), anchor_class] = np.inf  # never the anchor's class
  ranked = np.argsort(scores, axis=1)
  for j in range(num_negatives):
    # With one other class, every negative comes from it (fallback).
    neg_class = ranked[:, min(j, num_classes - 2)]
    pick = (rng.random(n) * counts[neg_class]).astype(np.int64)
    negatives[j] = by_class[starts[neg_class] + pick]
  return positives, negatives, valid


def make_batches_fn(num_negatives: int = 2):
  """An `engine.Algorithm.client_batches`: anchors as usual, then companions.

  Returns ``(indices, labels, rng, **shape) -> (idx [S, (2+K)B], mask)`` with
  K = num_negatives; companion columns are masked where the anchor is padding
  or has no valid negative.
  """

  def batches(
    indices, labels, rng, *, num_steps, batch_size, local_epochs, local_steps
  ):
    idx, mask = cohort_lib.client_batches(
      indices,
      rng,
      num_steps=num_steps,
      batch_size=batch_size,
      local_epochs=local_epochs,
      local_steps=local_steps,
    )
    groups = [idx] + [np.zeros_like(idx) for _ in range(1 + num_negatives)]
    masks = [mask] + [np.zeros_like(mask) for _ in range(1 + num_negatives)]
    if mask.any():
      positives, negatives, valid = sample_companions(
        idx[mask], np.asarray(indices), labels, rng, num_negatives
      )
      for group, values in zip(groups[1:], [positives, *negatives]):
        group[mask] = values
      for m in masks[1:]:
        m[mask] = valid
    return np.concatenate(groups, axis=1), np.concatenate(masks, axis=1)

  return batches
