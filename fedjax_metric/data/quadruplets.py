"""FedQuad's stochastic quadruplet sampling per client (Section III-A).

Goksu & Pugeault, 'FedQuad: Federated Stochastic Quadruplet Learning to
Mitigate Data Heterogeneity', arXiv:2509.04107, 2025.

For every anchor x_a of class k on client i, drawn from the client's own data:
  x_p  ~ D_k \\ {x_a}                 (same class, not the anchor itself)
  x_n1 ~ D_k'   with k'  != k         (a class present on the client)
  x_n2 ~ D_k''  with k'' not in {k, k'}
Host-side NumPy, deterministic in (seed, round, client): `sample_companions`
per client from its generator (the 'per_client' sampler),
`cohort_companions` for the whole cohort from counter-based draws (the
'vectorized' sampler; same distribution, different draws). Each local
step's row of indices is laid out as [anchors | positives | negatives_1 |
negatives_2], B each, so the device side gathers 4B images in one go and the
loss splits them.

Fallbacks, for clients whose data cannot form a full quadruplet (the paper
does not cover this case; docs/methods.md, FedQuad):
  * the anchor is the only example of its class: x_p = x_a (d(a, p) = 0, the
    negatives are still pushed away);
  * exactly one other class on the client: k'' = k' (two negatives of that
    class, drawn independently, so they can be the same example);
  * no other class at all: the companions are masked out and only the
    cross-entropy term trains on that anchor.
"""

import functools

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


def batches_with_companions(
  num_negatives,
  indices,
  labels,
  rng,
  *,
  num_steps,
  batch_size,
  local_epochs,
  local_steps,
):
  """An `engine.Algorithm.client_batches` (bound to ``num_negatives`` K by
  `make_batches_fn`): anchors as usual, then companions.

  Returns ``(idx [S, (2+K)B], mask)``; companion columns are masked where
  the anchor is padding or has no valid negative.
  """
  idx, mask = cohort_lib.client_batches(
    indices,
    rng,
    num_steps=num_steps,
    batch_size=batch_size,
    local_epochs=local_epochs,
    local_steps=local_steps,
  )
  # With no anchor, sample_companions returns before drawing anything.
  positives, negatives, valid = sample_companions(
    idx[mask], np.asarray(indices), labels, rng, num_negatives
  )
  return with_companions(idx, mask, positives, negatives, valid)


def make_batches_fn(num_negatives: int = 2):
  """`batches_with_companions` for K = num_negatives: ``(indices, labels,
  rng, **shape) -> (idx [S, (2+K)B], mask)``."""
  return functools.partial(batches_with_companions, num_negatives)


def with_companions(anchors, mask, positives, negatives, valid):
  """The step layout [anchors | positives | negatives_1 | ...] on the last
  axis: anchors and mask [..., B]; companions and valid [M] for the M True
  entries of mask, negatives [K, M]. Companion columns are masked where the
  anchor is padding or has no valid negative.
  """
  groups, masks = [anchors], [mask]
  for values in (positives, *negatives):
    group, group_mask = np.zeros_like(anchors), np.zeros_like(mask)
    group[mask], group_mask[mask] = values, valid
    groups.append(group)
    masks.append(group_mask)
  return np.concatenate(groups, axis=-1), np.concatenate(masks, axis=-1)


def cohort_companions(
  anchor_pos: np.ndarray,
  anchor_slot: np.ndarray,
  clients: cohort_lib.CohortClients,
  labels: np.ndarray,
  uniforms: np.ndarray,
  num_negatives: int = 2,
):
  """`sample_companions` for all the anchors of a cohort at once.

  The same rules and fallbacks, with the cohort's examples grouped by
  (client, class) in one sort instead of one `np.unique` per client.

  Args:
    anchor_pos: int [M] anchors as positions into ``clients.indices``.
    anchor_slot: int [M] the client (slot r < R) each anchor belongs to.
    clients: the cohort's clients.
    labels: int [num_examples] global labels.
    uniforms: float [M, 1 + 2 * num_negatives] in [0, 1): the positive's
      draw, then for each negative the draw of its class and of its member.
    num_negatives: 1 (triplets) or 2 (quadruplets).

  Returns:
    (positives [M], negatives [num_negatives, M], valid [M] bool) as
    positions into ``clients.indices``; invalid anchors (no other class on
    the client) have companions equal to themselves.
  """
  if num_negatives not in (1, 2):
    raise ValueError(f'num_negatives={num_negatives}; expected 1 or 2.')
  total = len(clients.indices)
  elem_slot = np.repeat(np.arange(len(clients.sizes)), clients.sizes)
  elem_label = labels[clients.indices]
  # The cohort's examples grouped by (client, class): group g holds
  # by_class[group_start[g] : group_start[g] + group_size[g]].
  by_class = np.lexsort((elem_label, elem_slot))
  rank_of = np.empty(total, np.int64)
  rank_of[by_class] = np.arange(total)
  sorted_slot, sorted_label = elem_slot[by_class], elem_label[by_class]
  new_group = np.ones(total, bool)
  new_group[1:] = (sorted_slot[1:] != sorted_slot[:-1]) | (
    sorted_label[1:] != sorted_label[:-1]
  )
  group_of = np.cumsum(new_group) - 1  # [T], by sorted rank
  group_start = np.flatnonzero(new_group)
  group_size = np.diff(np.append(group_start, total))
  classes_on = np.bincount(
    sorted_slot[group_start], minlength=len(clients.sizes)
  )  # [R]
  first_group = np.cumsum(classes_on) - classes_on  # [R]

  rank = rank_of[anchor_pos]
  group = group_of[rank]
  size = group_size[group]
  # Positive: uniform over the class's other members (skip the anchor).
  draw = (uniforms[:, 0] * np.maximum(size - 1, 1)).astype(np.int64)
  draw = np.minimum(draw + (draw >= rank - group_start[group]), size - 1)
  positives = np.where(
    size > 1, by_class[group_start[group] + draw], anchor_pos
  )

  # Negative classes: distinct random classes other than the anchor's,
  # drawn as indices among the client's m - 1 other classes (the second
  # skips the first); with one other class both come from it (fallback).
  m = classes_on[anchor_slot]
  valid = m > 1
  own = group - first_group[anchor_slot]  # the anchor's class index, < m
  negatives = np.tile(anchor_pos, (num_negatives, 1))
  first = (uniforms[:, 1] * np.maximum(m - 1, 1)).astype(np.int64)
  others = [first]
  if num_negatives == 2:
    second = (uniforms[:, 3] * np.maximum(m - 2, 1)).astype(np.int64)
    others.append(np.where(m > 2, second + (second >= first), first))
  for j, other in enumerate(others):
    neg_group = np.where(
      valid, first_group[anchor_slot] + other + (other >= own), group
    )
    member = (uniforms[:, 2 + 2 * j] * group_size[neg_group]).astype(np.int64)
    negatives[j] = np.where(
      valid, by_class[group_start[neg_group] + member], anchor_pos
    )
  return positives, negatives, valid


def cohort_batches_with_companions(
  num_negatives, clients, labels, *, seed, round_idx, **shape
):
  """An `engine.Algorithm.cohort_batches` (bound to ``num_negatives`` K by
  `make_cohort_batches_fn`): `batches_with_companions` for a cohort.

  Returns ``(idx [R, S, (2+K)B], mask)``, the same layout; the companions'
  draws are ``counter_uniform(seed, round, client, 2, step, column, j)``
  for companion draw j.
  """
  pos, mask = cohort_lib.vectorized_schedule(
    clients, seed=seed, round_idx=round_idx, **shape
  )
  slot, step, col = np.nonzero(mask)
  # counter_bits(seed, round, client, 2, step, column, j), its shared
  # prefixes hashed once; stream 2 is apart from the permutations'.
  client_bits = cohort_lib.counter_bits(seed, round_idx, clients.ids, 2)
  anchor_bits = cohort_lib.counter_bits(step, col, bits=client_bits[slot])
  uniforms = cohort_lib.to_uniform(
    cohort_lib.counter_bits(
      np.arange(1 + 2 * num_negatives), bits=anchor_bits[:, None]
    )
  )
  positives, negatives, valid = cohort_companions(
    pos[mask], slot, clients, labels, uniforms, num_negatives
  )
  pos, mask = with_companions(pos, mask, positives, negatives, valid)
  return cohort_lib.take(clients, pos, mask), mask


def make_cohort_batches_fn(num_negatives: int = 2):
  """`cohort_batches_with_companions` for K = num_negatives: ``(clients,
  labels, *, seed, round_idx, **shape) -> (idx [R, S, (2+K)B], mask)``."""
  return functools.partial(cohort_batches_with_companions, num_negatives)


def batch_schedules(num_negatives: int = 2):
  """Both schedule slots of an `engine.Algorithm` (per-client, vectorized)."""
  return dict(
    client_batches=make_batches_fn(num_negatives),
    cohort_batches=make_cohort_batches_fn(num_negatives),
  )
