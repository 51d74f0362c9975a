"""FedQuad's quadruplet sampling: class constraints, determinism, fallbacks."""

import numpy as np

from fedjax_metric.data import cohort as cohort_lib
from fedjax_metric.data import quadruplets


def check_constraints(anchors, positives, negatives, valid, labels):
  for a, p, n1, n2, ok in zip(
    anchors, positives, negatives[0], negatives[1], valid
  ):
    assert ok
    assert labels[p] == labels[a] and p != a
    assert labels[n1] != labels[a] and labels[n2] != labels[a]
    assert labels[n1] != labels[n2]


def test_full_quadruplets_obey_the_seed_constraints():
  rng = np.random.default_rng(0)
  labels = rng.integers(0, 5, 200)
  client = np.arange(0, 200, 2)  # a client holding the even examples
  anchors = client[:40]
  positives, negatives, valid = quadruplets.sample_companions(
    anchors, client, labels, np.random.default_rng(1)
  )
  check_constraints(anchors, positives, negatives, valid, labels)
  assert set(positives) <= set(client) and set(negatives.ravel()) <= set(client)
  again = quadruplets.sample_companions(
    anchors, client, labels, np.random.default_rng(1)
  )
  np.testing.assert_array_equal(again[0], positives)
  np.testing.assert_array_equal(again[1], negatives)


def test_sampling_covers_choices_uniformly_enough():
  labels = np.array([0, 0, 0, 1, 1, 2, 3])
  client = np.arange(7)
  anchors = np.zeros(3000, np.int64)  # the same anchor, many draws
  positives, negatives, _ = quadruplets.sample_companions(
    anchors, client, labels, np.random.default_rng(0)
  )
  assert set(positives) == {1, 2}  # never the anchor itself
  first_classes = labels[negatives[0]]
  counts = np.bincount(first_classes, minlength=4)[1:]
  assert counts.min() > 800  # classes 1, 2, 3 about 1000 each


def test_fallbacks():
  labels = np.array([0, 1, 1, 2, 2])
  # Singleton class: the positive falls back to the anchor itself.
  p, n, v = quadruplets.sample_companions(
    np.array([0]), np.arange(5), labels, np.random.default_rng(0)
  )
  assert p[0] == 0 and v[0] and labels[n[0, 0]] != labels[n[1, 0]]
  # One other class only: both negatives from it.
  client = np.array([1, 2, 3])
  p, n, v = quadruplets.sample_companions(
    np.array([3]), client, labels, np.random.default_rng(0)
  )
  assert v[0] and labels[n[:, 0]].tolist() == [1, 1]
  # A single-class client: no negatives -> invalid (metric term masked).
  p, n, v = quadruplets.sample_companions(
    np.array([1, 2]), np.array([1, 2]), labels, np.random.default_rng(0)
  )
  assert not v.any()
  assert p.tolist() == [2, 1]


def test_batch_layout_through_make_cohort():
  rng = np.random.default_rng(3)
  labels = rng.integers(0, 4, 60).astype(np.int32)
  parts = [np.arange(0, 30), np.arange(30, 60), np.array([], np.int64)]
  c = cohort_lib.make_cohort(
    np.array([1, 0]),
    parts,
    num_slots=3,
    num_steps=4,
    batch_size=8,
    local_epochs=1,
    local_steps=0,
    seed=0,
    round_idx=4,
    labels=labels,
    batches_fn=quadruplets.make_batches_fn(2),
  )
  assert c.example_idx.shape == (3, 4, 32)
  for slot, client in enumerate([1, 0]):
    idx, mask = c.example_idx[slot], c.example_mask[slot]
    anchors = idx[:, :8][mask[:, :8]]
    np.testing.assert_array_equal(np.sort(anchors), parts[client])
    for step in range(idx.shape[0]):
      live = mask[step, :8]
      a, p, n1, n2 = (idx[step, g * 8 : (g + 1) * 8][live] for g in range(4))
      check_constraints(
        a, p, np.stack([n1, n2]), mask[step, 8:16][live], labels
      )
      # Companion columns are masked exactly where anchors are padding.
      np.testing.assert_array_equal(mask[step, 8:16], live)
  assert not c.example_mask[2].any()
