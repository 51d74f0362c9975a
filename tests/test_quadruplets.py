"""FedQuad's quadruplet sampling: class constraints, determinism, fallbacks."""

import numpy as np
import pytest

from fedjax_metric.data import cohort as cohort_lib
from fedjax_metric.data import quadruplets


def per_client(anchors, client, labels, seed, num_negatives=2):
  return quadruplets.sample_companions(
    anchors, client, labels, np.random.default_rng(seed), num_negatives
  )


def vectorized(anchors, client, labels, seed, num_negatives=2):
  """`cohort_companions` for one client, in global indices like
  `sample_companions` (anchors and companions are positions inside)."""
  clients = cohort_lib.gather_clients(np.array([0]), [client])
  position = {int(g): i for i, g in enumerate(client)}
  anchor_pos = np.array([position[int(a)] for a in anchors], np.int64)
  uniforms = cohort_lib.counter_uniform(
    seed, 0, 0, 2, np.arange(len(anchors))[:, None], np.arange(5)
  )
  positives, negatives, valid = quadruplets.cohort_companions(
    anchor_pos,
    np.zeros(len(anchors), np.int64),
    clients,
    labels,
    uniforms[:, : 1 + 2 * num_negatives],
    num_negatives,
  )
  return client[positives], client[negatives], valid


SAMPLE = pytest.mark.parametrize(
  'sample', [per_client, vectorized], ids=['per_client', 'vectorized']
)


def check_constraints(anchors, positives, negatives, valid, labels):
  for a, p, n1, n2, ok in zip(
    anchors, positives, negatives[0], negatives[1], valid
  ):
    assert ok
    assert labels[p] == labels[a] and p != a
    assert labels[n1] != labels[a] and labels[n2] != labels[a]
    assert labels[n1] != labels[n2]


@SAMPLE
def test_full_quadruplets_obey_the_seed_constraints(sample):
  rng = np.random.default_rng(0)
  labels = rng.integers(0, 5, 200)
  client = np.arange(0, 200, 2)  # a client holding the even examples
  anchors = client[:40]
  positives, negatives, valid = sample(anchors, client, labels, 1)
  check_constraints(anchors, positives, negatives, valid, labels)
  assert set(positives) <= set(client) and set(negatives.ravel()) <= set(client)
  again = sample(anchors, client, labels, 1)
  np.testing.assert_array_equal(again[0], positives)
  np.testing.assert_array_equal(again[1], negatives)


def chi_square(counts):
  expected = np.sum(counts) / len(counts)
  return np.sum((np.asarray(counts) - expected) ** 2 / expected)


@SAMPLE
def test_sampling_covers_choices_uniformly(sample):
  labels = np.array([0, 0, 0, 1, 1, 2, 3])
  client = np.arange(7)
  anchors = np.zeros(3000, np.int64)  # the same anchor, many draws
  positives, negatives, _ = sample(anchors, client, labels, 0)
  # The positive: uniform over the anchor's two classmates (1 d.o.f.; the
  # chi-square's 99.99% point is 15.1), never the anchor itself.
  assert set(positives) == {1, 2}
  assert chi_square(np.bincount(positives)[1:]) < 15.1
  # Negative classes: an ordered pair of distinct classes among {1, 2, 3},
  # each of the 6 pairs equally likely (5 d.o.f.: 25.7).
  pairs = labels[negatives[0]] * 4 + labels[negatives[1]]
  values, counts = np.unique(pairs, return_counts=True)
  assert sorted(values) == [6, 7, 9, 11, 13, 14]
  assert chi_square(counts) < 25.7
  # Negative examples: uniform inside class 1 (examples 3 and 4).
  in_class_1 = negatives[0][labels[negatives[0]] == 1]
  assert chi_square(np.bincount(in_class_1)[3:]) < 15.1


@SAMPLE
def test_fallbacks(sample):
  labels = np.array([0, 1, 1, 2, 2])
  # Singleton class: the positive falls back to the anchor itself.
  p, n, v = sample(np.array([0]), np.arange(5), labels, 0)
  assert p[0] == 0 and v[0] and labels[n[0, 0]] != labels[n[1, 0]]
  # One other class only: both negatives from it.
  client = np.array([1, 2, 3])
  p, n, v = sample(np.array([3]), client, labels, 0)
  assert v[0] and labels[n[:, 0]].tolist() == [1, 1]
  # A single-class client: no negatives -> invalid (metric term masked).
  p, n, v = sample(np.array([1, 2]), np.array([1, 2]), labels, 0)
  assert not v.any()
  assert p.tolist() == [2, 1]


@pytest.mark.parametrize('sampler', cohort_lib.SAMPLERS)
def test_batch_layout_through_make_cohort(sampler):
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
    sampler=sampler,
    batches_fn=quadruplets.make_batches_fn(2),
    cohort_batches_fn=quadruplets.make_cohort_batches_fn(2),
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
