"""Tests for fedjax_metric.data.partition (host-only NumPy partitioners)."""

import ast
import inspect
import time

import numpy as np
import pytest

from fedjax_metric.data import partition as P


def _labels(counts, seed=0):
  """Labels with counts[c] examples of class c, in a shuffled order."""
  labels = np.repeat(np.arange(len(counts)), counts)
  return np.random.default_rng(seed).permutation(labels)


LABELS = _labels(
  [70, 50, 60, 40, 80, 30, 60, 50, 40, 20]
)  # N = 500, unequal classes.
EVEN = _labels([60] * 10)  # N = 600, divisible shard sizes.

CASES = {
  'iid': (LABELS, lambda l, s: P.iid(l, 7, seed=s)),
  'niid_bench': (LABELS, lambda l, s: P.dirichlet(l, 7, 0.5, seed=s)),
  'balanced': (
    LABELS,
    lambda l, s: P.dirichlet(l, 7, 0.5, seed=s, variant='balanced'),
  ),
  'per_client': (
    LABELS,
    lambda l, s: P.dirichlet(l, 7, 0.5, seed=s, variant='per_client'),
  ),
  'per_class': (
    LABELS,
    lambda l, s: P.dirichlet(l, 7, 0.5, seed=s, variant='per_class'),
  ),
  'shards': (EVEN, lambda l, s: P.shards(l, 10, 2, seed=s)),
  'one_class': (
    LABELS,
    lambda l, s: P.one_class(l, 23, allow_repeat=True, seed=s),
  ),
}


def _assert_disjoint(parts):
  flat = np.concatenate(parts)
  assert len(np.unique(flat)) == len(flat)


@pytest.mark.parametrize('name', sorted(CASES))
def test_common_properties(name):
  labels, fn = CASES[name]
  parts = fn(labels, 0)
  assert all(
    isinstance(p, np.ndarray) and p.dtype == np.int64 and p.ndim == 1
    for p in parts
  )
  _assert_disjoint(parts)
  flat = set(np.concatenate(parts).tolist())
  n = len(labels)
  if name == 'balanced':
    assert len(flat) == len(parts) * (n // len(parts)) and flat <= set(range(n))
  else:
    assert flat == set(range(n))


@pytest.mark.parametrize('name', sorted(CASES))
def test_deterministic_in_seed(name):
  labels, fn = CASES[name]
  a, b, c = fn(labels, 3), fn(labels, 3), fn(labels, 4)
  assert len(a) == len(b) and all(np.array_equal(x, y) for x, y in zip(a, b))
  assert any(not np.array_equal(x, y) for x, y in zip(a, c))


def test_iid_near_equal_sizes():
  sizes = [len(p) for p in P.iid(LABELS, 7, seed=0)]
  assert max(sizes) - min(sizes) <= 1 and sum(sizes) == len(LABELS)


def test_niid_bench_min_size():
  for seed in range(5):
    parts = P.dirichlet(LABELS, 10, 0.1, seed=seed, min_size=20)
    assert min(len(p) for p in parts) >= 20


def test_niid_bench_unreachable_min_size_raises_quickly():
  labels = _labels([10, 10, 10, 10])
  start = time.perf_counter()
  with pytest.raises(ValueError, match='min_size') as err:
    P.dirichlet(labels, 20, 0.01, seed=0, min_size=2, max_tries=5)
  assert 'larger alpha' in str(err.value)
  assert time.perf_counter() - start < 2.0


def test_niid_bench_infeasible_min_size_raises_immediately():
  with pytest.raises(ValueError, match='min_size=60'):
    P.dirichlet(LABELS, 10, 0.5, seed=0, min_size=60, max_tries=10**9)


def test_niid_bench_cuts_cap_and_floor():
  # Party 0 already holds 10 >= N/J = 20/3 examples, so it gets nothing and party 1 takes all.
  cuts = P._niid_bench_cuts(
    np.array([0.5, 0.5, 0.0]), np.array([10, 0, 0]), 20, 7
  )
  assert [len(x) for x in np.split(np.arange(7), cuts)] == [0, 7, 0]
  # Floor, not round: cumsum * 10 = [3.33, 6.67, 10] -> cuts [3, 6] -> sizes 3, 3, 4.
  cuts = P._niid_bench_cuts(np.full(3, 1 / 3), np.zeros(3, int), 30, 10)
  assert cuts.tolist() == [3, 6]
  # Surviving proportions all zero: the attempt is rejected, not divided by zero.
  assert (
    P._niid_bench_cuts(np.array([1.0, 0.0]), np.array([60, 0]), 100, 5) is None
  )


def test_niid_bench_cap_in_full_procedure():
  # N = 100, J = 2, N/J = 50. A party that got >= 50 of class 0 must get none of class 1.
  labels = np.repeat([0, 1], [90, 10])
  capped = 0
  for seed in range(40):
    counts = P.class_counts(
      labels, P.dirichlet(labels, 2, 1.0, seed=seed, min_size=0)
    )
    for j in range(2):
      if counts[j, 0] >= 50:
        capped += 1
        assert counts[j, 1] == 0
  assert capped > 0


@pytest.mark.parametrize('variant', P.VARIANTS)
def test_small_alpha_gives_fewer_classes(variant):
  labels = _labels([200] * 10)

  def mean_classes(alpha):
    kw = {'min_size': 0} if variant == 'niid_bench' else {}
    parts = P.dirichlet(labels, 10, alpha, seed=1, variant=variant, **kw)
    return P.summarize(parts, labels)['mean_classes_per_client']

  small, large = mean_classes(0.05), mean_classes(100.0)
  assert small < 5 and large == 10 and small < large


def test_balanced_exact_sizes():
  for alpha in (0.01, 0.3, 10.0):
    parts = P.dirichlet(LABELS, 7, alpha, seed=0, variant='balanced')
    assert [len(p) for p in parts] == [500 // 7] * 7


def test_balanced_exhausted_classes_fall_back():
  # A dominant class runs out: 2 clients x 50 from 60 + 40; tiny alpha makes weights one-hot.
  labels = np.repeat([0, 1], [60, 40])
  for seed in range(10):
    parts = P.dirichlet(labels, 2, 0.001, seed=seed, variant='balanced')
    assert [len(p) for p in parts] == [50, 50]
    _assert_disjoint(parts)


def test_weighted_sample_takes_positive_weights_first():
  rng = np.random.default_rng(0)
  got = P._weighted_sample(rng, np.array([1.0, 0.0, 0.0, 0.0, 2.0]), 3)
  assert len(set(got.tolist())) == 3 and {0, 4} <= set(got.tolist())
  got = P._weighted_sample(rng, np.array([0.0, 5.0, 0.0, 1.0]), 2)
  assert sorted(got.tolist()) == [1, 3]


def test_weighted_sample_follows_weights():
  rng = np.random.default_rng(0)
  firsts = [
    P._weighted_sample(rng, np.array([1.0, 9.0]), 1)[0] for _ in range(2000)
  ]
  assert 0.85 < np.mean(firsts) < 0.95


@pytest.mark.parametrize('variant', ['per_client', 'per_class'])
def test_sizes_sum_to_n(variant):
  parts = P.dirichlet(LABELS, 9, 0.2, seed=0, variant=variant)
  assert len(parts) == 9 and sum(len(p) for p in parts) == len(LABELS)


def test_per_client_cuts_each_class_in_order():
  # FedAU cuts the ascending class-c index list sequentially: client order == index order.
  parts = P.dirichlet(LABELS, 6, 0.5, seed=2, variant='per_client')
  for c in range(10):
    seq = np.concatenate([p[LABELS[p] == c] for p in parts])
    assert np.array_equal(seq, np.flatnonzero(LABELS == c))


def test_largest_remainder():
  # 10 * r = [2, 2.4, 5.6]: floors [2, 2, 5], the one leftover goes to the largest remainder.
  assert P._largest_remainder(10, np.array([0.2, 0.24, 0.56])).tolist() == [
    2,
    2,
    6,
  ]
  assert P._largest_remainder(7, np.array([2.0, 0.0, 0.0])).tolist() == [
    7,
    0,
    0,
  ]


def test_shards_classes_per_client():
  for cpc in (1, 2, 3):
    parts = P.shards(EVEN, 10, cpc, seed=0)
    assert all(len(np.unique(EVEN[p])) <= cpc for p in parts)
    assert all(len(p) == 600 // 10 for p in parts)


def test_shards_invalid():
  with pytest.raises(ValueError, match='divisible'):
    P.shards(LABELS, 7, 2, seed=0)
  with pytest.raises(ValueError, match='classes_per_client'):
    P.shards(EVEN, 10, 0, seed=0)


def test_one_class_default_one_client_per_class():
  parts = P.one_class(LABELS)
  assert len(parts) == 10
  for k, p in enumerate(parts):
    assert sorted(p.tolist()) == np.flatnonzero(LABELS == k).tolist()


def test_one_class_allow_repeat():
  parts = P.one_class(LABELS, 25, allow_repeat=True, seed=0)
  assert len(parts) == 25
  for i, p in enumerate(parts):
    assert len(p) > 0 and set(LABELS[p].tolist()) == {i % 10}
  # Class 9 (20 examples) is shared by clients 9 and 19: a near-equal split.
  assert sorted([len(parts[9]), len(parts[19])]) == [10, 10]


def test_one_class_errors():
  with pytest.raises(ValueError, match='allow_repeat=True'):
    P.one_class(LABELS, 11)
  with pytest.raises(ValueError, match='num_clients >= num_classes'):
    P.one_class(LABELS, 9)
  with pytest.raises(ValueError, match='examples but'):
    P.one_class(np.repeat([0, 1], [1, 5]), 4, allow_repeat=True)


def test_class_counts_hand_example():
  labels = np.array([0, 1, 1, 2, 0, 2, 2])
  parts = [np.array([0, 1, 2]), np.array([3, 5]), np.array([4, 6])]
  expected = np.array([[1, 2, 0], [0, 0, 2], [1, 0, 1]])
  got = P.class_counts(labels, parts)
  assert got.dtype == np.int64 and np.array_equal(got, expected)
  assert P.class_counts(labels, parts, num_classes=5).shape == (3, 5)


def test_plot_class_counts_writes_png(tmp_path):
  counts = P.class_counts(LABELS, P.dirichlet(LABELS, 7, 0.3, seed=0))
  path = tmp_path / 'sub' / 'counts.png'
  assert P.plot_class_counts(counts, path, title='niid_bench') == path
  data = path.read_bytes()
  assert len(data) > 1000 and data[:8] == b'\x89PNG\r\n\x1a\n'


def test_summarize():
  labels = np.array([0, 1, 1, 2, 0, 2, 2])
  s = P.summarize(
    [np.array([0, 1, 2]), np.array([3, 5]), np.array([4, 6])], labels
  )
  assert s == {
    'num_clients': 3,
    'num_examples': 7,
    'min_size': 2,
    'median_size': 2.0,
    'max_size': 3,
    'mean_classes_per_client': 5 / 3,
  }


@pytest.mark.parametrize('alpha', [0, -1, float('nan'), float('inf')])
def test_invalid_alpha(alpha):
  with pytest.raises(ValueError, match='alpha'):
    P.dirichlet(LABELS, 5, alpha, seed=0)


def test_invalid_variant_lists_valid_ones():
  with pytest.raises(
    ValueError, match='niid_bench.*balanced.*per_client.*per_class'
  ):
    P.dirichlet(LABELS, 5, 0.5, seed=0, variant='fedbox')


@pytest.mark.parametrize(
  'fn',
  [
    lambda n: P.iid(LABELS, n, seed=0),
    lambda n: P.dirichlet(LABELS, n, 0.5, seed=0, variant='per_class'),
    lambda n: P.shards(LABELS, n, 1, seed=0),
    lambda n: P.one_class(LABELS, n, allow_repeat=True),
  ],
)
def test_invalid_num_clients(fn):
  with pytest.raises(ValueError, match='num_clients=501.*N=500'):
    fn(501)
  with pytest.raises(ValueError, match='num_clients=0'):
    fn(0)
  # A whole float is refused in one line, not deep in an index or reshape.
  with pytest.raises(ValueError, match=r'num_clients=10.0 must be an int'):
    fn(10.0)
  assert len(fn(np.int64(10))) == 10


def test_module_does_not_import_jax():
  tree = ast.parse(inspect.getsource(P))
  names = [
    a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names
  ]
  names += [
    n.module or '' for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)
  ]
  assert not any(name.split('.')[0] == 'jax' for name in names)
