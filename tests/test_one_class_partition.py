"""one_class with clients_per_class, and one_class_labels."""

import numpy as np
import pytest

from fedjax_metric.data import partition as P

# Label values 3, 5, 7, 8 (not 0..C-1) with unequal class sizes.
LABELS = np.random.default_rng(0).permutation(
  np.repeat([3, 5, 7, 8], [23, 40, 31, 9])
)
VALUES = [3, 5, 7, 8]


@pytest.mark.parametrize('k', [1, 2, 3])
def test_clients_per_class_layout(k):
  parts = P.one_class(LABELS, clients_per_class=k, seed=1)
  assert len(parts) == 4 * k
  flat = np.concatenate(parts)
  assert sorted(flat.tolist()) == list(range(len(LABELS)))  # Disjoint, full.
  for i, p in enumerate(parts):
    assert p.dtype == np.int64 and len(p) > 0
    assert set(LABELS[p].tolist()) == {VALUES[i % 4]}
  for c, value in enumerate(VALUES):
    sizes = [len(parts[i]) for i in range(c, 4 * k, 4)]
    assert sum(sizes) == np.sum(LABELS == value)
    assert max(sizes) - min(sizes) <= 1  # Near-equal split.


def test_clients_per_class_equals_allow_repeat_layout():
  a = P.one_class(LABELS, clients_per_class=2, seed=5)
  b = P.one_class(LABELS, 8, allow_repeat=True, seed=5)
  c = P.one_class(LABELS, 8, clients_per_class=2, seed=5)
  assert all(
    np.array_equal(x, y) and np.array_equal(x, z) for x, y, z in zip(a, b, c)
  )
  one = P.one_class(LABELS, clients_per_class=1, seed=5)
  default = P.one_class(LABELS, seed=5)
  assert all(np.array_equal(x, y) for x, y in zip(one, default))


def test_one_class_labels_recovers_each_clients_class():
  parts = P.one_class(LABELS, clients_per_class=3)
  got = P.one_class_labels(parts, LABELS)
  want = [LABELS[p[0]] for p in parts]
  assert got.tolist() == want == [VALUES[i % 4] for i in range(12)]
  repeat = P.one_class(LABELS, 6, allow_repeat=True)
  assert P.one_class_labels(repeat, LABELS).tolist() == [3, 5, 7, 8, 3, 5]


def test_one_class_labels_rejects_mixed_or_empty_clients():
  labels = np.array([0, 0, 1, 1])
  with pytest.raises(ValueError, match='Client 1 holds 2 classes'):
    P.one_class_labels([np.array([0]), np.array([1, 2])], labels)
  with pytest.raises(ValueError, match='Client 0 holds 0 classes'):
    P.one_class_labels([np.array([], np.int64), np.array([2])], labels)


def test_clients_per_class_errors():
  with pytest.raises(ValueError, match='clients_per_class must be'):
    P.one_class(LABELS, clients_per_class=0)
  with pytest.raises(ValueError, match='clients_per_class must be'):
    P.one_class(LABELS, clients_per_class=1.5)
  with pytest.raises(ValueError, match='num_clients=9 but 4 classes x'):
    P.one_class(LABELS, 9, clients_per_class=2)
  with pytest.raises(ValueError, match='num_clients=7 but 4 classes x'):
    P.one_class(LABELS, 7, clients_per_class=2)
  # Class 8 has 9 examples: 10 clients per class would leave one empty.
  with pytest.raises(ValueError, match='would get no data'):
    P.one_class(LABELS, clients_per_class=10)
  # Without allow_repeat or clients_per_class, extra clients are an error.
  with pytest.raises(ValueError, match='clients_per_class'):
    P.one_class(LABELS, 5)
