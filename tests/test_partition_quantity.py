"""Quantity-skew partitions: `partition.quantity` and its config wiring.

References are independent of the implementation: scipy's Beta law (the
marginal of a Dirichlet), a Python-loop Zipf count, and scipy's
contingency-table chi-square test for labels being IID within clients.
"""

import math

import numpy as np
import pytest
from scipy import stats

from fedjax_metric import assemble, validation
from fedjax_metric import settings as common
from fedjax_metric.data import partition as P
from fedjax_metric.data import quantity as Q


def _labels(counts, seed=0):
  """Labels with counts[c] examples of class c, in a shuffled order."""
  labels = np.repeat(np.arange(len(counts)), counts)
  return np.random.default_rng(seed).permutation(labels)


LABELS = _labels([700, 500, 600, 400, 800, 300, 600, 500, 400, 200])  # 5000


def _dirichlet(labels, seed, **kw):
  return Q.quantity(labels, 6, seed=seed, distribution='dirichlet', **kw)


def _power_law(labels, seed, **kw):
  return Q.quantity(labels, 6, seed=seed, distribution='power_law', **kw)


@pytest.mark.parametrize('make', [_dirichlet, _power_law])
def test_every_example_once_and_sizes_sum_to_n(make):
  for seed in range(5):
    parts = make(LABELS, seed, min_size=20)
    assert len(parts) == 6
    assert all(p.dtype == np.int64 for p in parts)
    sizes = [len(p) for p in parts]
    assert sum(sizes) == LABELS.size
    assert min(sizes) >= 20
    np.testing.assert_array_equal(
      np.sort(np.concatenate(parts)), np.arange(LABELS.size)
    )


@pytest.mark.parametrize('make', [_dirichlet, _power_law])
def test_deterministic_by_seed(make):
  a, b, c = make(LABELS, 3), make(LABELS, 3), make(LABELS, 4)
  for x, y in zip(a, b):
    np.testing.assert_array_equal(x, y)
  assert any(len(x) != len(y) or not np.array_equal(x, y) for x, y in zip(a, c))


def test_dirichlet_sizes_follow_the_beta_marginal():
  """Each client's share n_j / N of a Dir(alpha 1_J) draw is
  Beta(alpha, (J - 1) alpha); checked by KS and by the first two moments."""
  num_clients, alpha, n = 5, 1.5, 20000
  labels = np.zeros(n, dtype=np.int64)
  shares = np.array(
    [
      [len(p) / n for p in Q.quantity(labels, num_clients, seed=s, alpha=alpha)]
      for s in range(300)
    ]
  )  # [seeds, J]
  a, b = alpha, (num_clients - 1) * alpha
  for j in (0, num_clients - 1):
    assert stats.kstest(shares[:, j], stats.beta(a, b).cdf).pvalue > 1e-3
    # The same samples clearly reject a wrong concentration.
    wrong = stats.beta(4 * a, 4 * b).cdf
    assert stats.kstest(shares[:, j], wrong).pvalue < 1e-6
  mean = 1 / num_clients
  var = mean * (1 - mean) / (num_clients * alpha + 1)
  assert abs(shares.mean() - mean) < 1e-6  # Shares sum to 1 per seed.
  np.testing.assert_allclose(shares.var(axis=0), var, rtol=0.3)


def _redrawn_sizes(seed, n, num_clients, alpha, min_size):
  """NIID-Bench's rule, re-derived: draw p ~ Dir(alpha), cut at
  floor(cumsum(p) N), and draw the whole p again until every client has
  min_size; returns the sizes and how many draws it took."""
  rng = np.random.default_rng(seed)
  draws = 0
  while True:
    draws += 1
    p = rng.dirichlet(np.full(num_clients, alpha))
    cuts = np.floor(np.cumsum(p) * n).astype(np.int64)[:-1]
    sizes = np.diff(np.concatenate([[0], cuts, [n]]))
    if sizes.min() >= min_size:
      return list(sizes), draws


def test_dirichlet_min_size_resamples_the_whole_draw():
  """Not any way of reaching min_size (topping up small clients would do
  that too): the sizes are those of the first whole redraw that is valid."""
  labels = np.zeros(400, dtype=np.int64)
  redrawn = 0
  for seed in range(20):
    sizes = [
      len(p) for p in Q.quantity(labels, 10, seed=seed, alpha=1.0, min_size=15)
    ]
    expected, draws = _redrawn_sizes(seed, 400, 10, 1.0, 15)
    assert sizes == expected
    assert min(sizes) >= 15 and sum(sizes) == 400
    redrawn += draws > 1
  assert redrawn == 20  # min_size 15 of 40 on average: every seed redraws.


def _zipf_counts(n, num_clients, exponent):
  """Largest-remainder counts of n r^-s / sum_q q^-s, with Python loops."""
  weights = [r**-exponent for r in range(1, num_clients + 1)]
  total = math.fsum(weights)
  exact = [n * w / total for w in weights]
  counts = [math.floor(x) for x in exact]
  order = sorted(
    range(num_clients), key=lambda r: exact[r] - counts[r], reverse=True
  )
  for r in order[: n - sum(counts)]:
    counts[r] += 1
  return sorted(counts, reverse=True)


@pytest.mark.parametrize(
  'n, num_clients, exponent', [(5000, 6, 1.0), (1234, 9, 1.7), (100, 7, 0.0)]
)
def test_power_law_sizes_match_a_hand_computation(n, num_clients, exponent):
  labels = np.zeros(n, dtype=np.int64)
  parts = Q.quantity(
    labels, num_clients, seed=1, distribution='power_law', exponent=exponent
  )
  assert sorted((len(p) for p in parts), reverse=True) == _zipf_counts(
    n, num_clients, exponent
  )
  assert Q.power_law_sizes(n, num_clients, exponent).tolist() == (
    _zipf_counts(n, num_clients, exponent)
  )


def test_power_law_slope_and_random_assignment():
  sizes = Q.power_law_sizes(10**6, 40, 1.3).astype(np.float64)
  slope = np.polyfit(np.log(np.arange(1, 41)), np.log(sizes), 1)[0]
  assert abs(slope + 1.3) < 0.01
  # Which client is the largest is uniform over clients across seeds.
  labels = np.zeros(300, dtype=np.int64)
  largest = [
    np.argmax([len(p) for p in _power_law(labels, s, exponent=1.0)])
    for s in range(600)
  ]
  assert stats.chisquare(np.bincount(largest, minlength=6)).pvalue > 1e-3


@pytest.mark.parametrize('make', [_dirichlet, _power_law])
def test_labels_within_clients_are_iid(make):
  """Client x class counts pass a chi-square independence test; the same
  test rejects a label-skew partition, so it can fail."""
  for seed in range(3):
    counts = P.class_counts(LABELS, make(LABELS, seed, min_size=50))
    assert stats.chi2_contingency(counts).pvalue > 1e-3
    biggest = counts[counts.sum(axis=1).argmax()]
    global_hist = np.bincount(LABELS) / LABELS.size
    tv = 0.5 * np.abs(biggest / biggest.sum() - global_hist).sum()
    assert tv < 0.06
  skewed = P.class_counts(LABELS, P.dirichlet(LABELS, 6, 0.1, seed=0))
  assert stats.chi2_contingency(skewed).pvalue < 1e-6


@pytest.mark.parametrize(
  'kwargs, match',
  [
    (dict(distribution='zipf'), 'dirichlet, power_law'),
    (dict(alpha=0.0), 'alpha must be'),
    (dict(alpha=float('nan')), 'alpha must be'),
    (dict(distribution='power_law', exponent=-1.0), 'exponent'),
    (dict(min_size=0), 'min_size >= 1'),
    (dict(min_size=900), 'fewer clients or a smaller min_size'),
    (
      dict(distribution='power_law', exponent=4.0, min_size=10),
      'smaller exponent, fewer clients',
    ),
    (dict(alpha=0.01, min_size=100, max_tries=5), 'larger alpha'),
  ],
)
def test_impossible_inputs_name_the_fix(kwargs, match):
  with pytest.raises(ValueError, match=match):
    Q.quantity(LABELS, 6, seed=0, **kwargs)


def test_more_clients_than_examples_is_refused():
  with pytest.raises(ValueError, match='no more clients than examples'):
    Q.quantity(LABELS[:5], 6, seed=0)


def _config(**partition):
  config = common.base_config()
  config.num_clients = 6
  config.clients_per_round = 6
  config.partition.update(partition)
  return config


@pytest.mark.parametrize('dist', ['dirichlet', 'power_law'])
def test_make_partition_uses_the_config(dist):
  config = _config(
    method='quantity',
    size_distribution=dist,
    alpha=0.7,
    power_law_exponent=0.8,
    min_size=30,
  )
  got = assemble.make_partition(config, LABELS)
  want = Q.quantity(
    LABELS,
    6,
    seed=config.seed,
    distribution=dist,
    alpha=0.7,
    exponent=0.8,
    min_size=30,
  )
  assert [p.tolist() for p in got] == [p.tolist() for p in want]
  assert P.label(config.partition).startswith('quantity')


def test_validation_refuses_bad_quantity_fields():
  with pytest.raises(validation.ConfigError, match='size_distribution'):
    validation.validate(_config(method='quantity', size_distribution='zipf'))
  with pytest.raises(validation.ConfigError, match='power_law_exponent'):
    validation.validate(
      _config(
        method='quantity', size_distribution='power_law', power_law_exponent=-1
      )
    )
  # digits has 1438 training examples: 100 clients at exponent 2 leave the
  # smallest with 1438 / (100^2 * 1.63) < 1 example.
  steep = _config(
    method='quantity', size_distribution='power_law', power_law_exponent=2.0
  )
  steep.num_clients = 100
  with pytest.raises(validation.ConfigError, match='Lower the exponent'):
    validation.validate(steep)
  validation.validate(_config(method='quantity', size_distribution='power_law'))
