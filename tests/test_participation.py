"""Participation probabilities and availability patterns.

Frequencies are checked against tolerances derived from the binomial (or the
two-state Markov chain's) variance; exact rules (run lengths, transition
counts, hand-computed probabilities) are re-derived here from the pattern
definitions, independently of the implementation.
"""

import warnings

import numpy as np
import pytest

from fedjax_metric.data import participation

CYCLE = 100


def rates(mask):
  return np.asarray(mask, np.float64).mean(axis=0)


def runs(column):
  """Run-length encoding of a bool sequence: list of (value, length)."""
  out = []
  for value in column:
    if out and out[-1][0] == value:
      out[-1][1] += 1
    else:
      out.append([bool(value), 1])
  return [tuple(r) for r in out]


# ---------------------------------------------------------------------------
# probabilities
# ---------------------------------------------------------------------------

COUNTS_3X3 = np.array([[2, 1, 1], [0, 4, 0], [1, 0, 3]])
M_3 = np.array([0.5, 0.3, 0.2])
# q = rows / row sums: [.5, .25, .25], [0, 1, 0], [.25, 0, .75]
# <q, m> = .25 + .075 + .05 = .375;  .3;  .125 + .15 = .275
AFFINITY_3 = np.array([0.375, 0.3, 0.275])


def test_probabilities_hand_computed_expected():
  p = participation.probabilities(
    COUNTS_3X3, mean=0.1, floor=0.01, label_weights=M_3
  )
  # J * mean * <q, m> = 0.3 * [.375, .3, .275]; none below the floor.
  np.testing.assert_allclose(p, [0.1125, 0.09, 0.0825], rtol=1e-12)
  assert p.dtype == np.float64


def test_probabilities_hand_computed_floor():
  p = participation.probabilities(
    COUNTS_3X3, mean=0.1, floor=0.09, label_weights=M_3
  )
  # 0.0825 < 0.09 is raised to the floor; 0.09 itself stays.
  np.testing.assert_allclose(p, [0.1125, 0.09, 0.09], rtol=1e-12)


def test_probabilities_hand_computed_empirical():
  p = participation.probabilities(
    COUNTS_3X3, mean=0.1, floor=0.01, label_weights=M_3, normalize='empirical'
  )
  # mean * <q, m> / mean_n <q, m> with mean_n <q, m> = 0.95 / 3.
  expected = [
    0.1 * 0.375 / (0.95 / 3),
    0.1 * 0.3 / (0.95 / 3),
    0.1 * 0.275 / (0.95 / 3),
  ]
  np.testing.assert_allclose(p, expected, rtol=1e-12)
  np.testing.assert_allclose(p.mean(), 0.1, rtol=1e-12)


def test_probabilities_clip_warns_and_caps():
  # m = e_0, J = 3, mean = 0.9: p = 2.7 * q[:, 0] = [1.35, 0, 0.675], then
  # floor 0.02 and clip at 1 -> [1, 0.02, 0.675]; one client clipped.
  with pytest.warns(UserWarning, match='1 of 3'):
    p = participation.probabilities(
      COUNTS_3X3, mean=0.9, floor=0.02, label_weights=[1.0, 0.0, 0.0]
    )
  np.testing.assert_allclose(p, [1.0, 0.02, 0.675], rtol=1e-12)


def test_probabilities_no_warning_without_clip():
  with warnings.catch_warnings():
    warnings.simplefilter('error')  # A clipping warning would raise here.
    p = participation.probabilities(
      COUNTS_3X3, mean=0.5, floor=0.02, label_weights=[1.0, 0.0, 0.0]
    )
  assert np.all((p >= 0.02) & (p < 1.0))  # Nothing reached the clip at 1.


def test_probabilities_one_shared_dirichlet_vector():
  # One-hot clients read m off directly: p_j = J * mean * m_j, so the p's
  # of the J one-hot clients sum to J * mean when m is on the simplex.
  num_labels, mean = 10, 0.05
  counts = np.concatenate([np.eye(num_labels) * 7, np.eye(num_labels) * 3])
  p = participation.probabilities(
    counts, mean=mean, floor=1e-300, beta=0.5, seed=3
  )
  np.testing.assert_allclose(
    p[:num_labels].sum(), num_labels * mean, rtol=1e-12
  )
  # The same histogram gives the same probability (a single shared m).
  np.testing.assert_array_equal(p[:num_labels], p[num_labels:])


def test_probabilities_expected_normalisation_is_unbiased():
  # E_m[J * mean * <q_n, m>] = mean for every client since E[m] = 1_J / J.
  # J * mean = 0.5 < 1: never clipped; the floor is negligible.
  rng = np.random.default_rng(0)
  counts = rng.integers(0, 30, size=(12, 10)) + np.eye(12, 10, dtype=int)
  mean, draws = 0.05, 3000
  ps = np.stack(
    [
      participation.probabilities(
        counts, mean=mean, floor=1e-300, beta=0.1, seed=s
      )
      for s in range(draws)
    ]
  )
  se = ps.std(axis=0, ddof=1) / np.sqrt(draws)
  assert np.all(np.abs(ps.mean(axis=0) - mean) < 5 * se + 1e-12)


def test_probabilities_empirical_mean_exact():
  rng = np.random.default_rng(1)
  counts = rng.integers(1, 30, size=(40, 10))
  p = participation.probabilities(
    counts, mean=0.1, floor=1e-9, beta=1.0, seed=5, normalize='empirical'
  )
  assert p.min() > 1e-9 and p.max() < 1.0  # neither floor nor clip active
  np.testing.assert_allclose(p.mean(), 0.1, rtol=1e-12)


def test_probabilities_seeded_draws():
  counts = np.random.default_rng(2).integers(0, 20, size=(30, 10)) + 1
  a = participation.probabilities(counts, seed=7)
  b = participation.probabilities(counts, seed=7)
  c = participation.probabilities(counts, seed=8)
  np.testing.assert_array_equal(a, b)
  assert not np.allclose(a, c)
  assert a.shape == (30,) and a.min() >= 0.02 and a.max() <= 1.0


@pytest.mark.parametrize(
  'kwargs, match',
  [
    ({'class_counts': [[1, -1], [2, 2]]}, 'non-negative.*\\[0\\]'),
    (
      {'class_counts': [[1, 1], [0, 0], [3, 0]]},
      r'1 client\(s\) have no data.*first: \[1\]',
    ),
    ({'class_counts': [1, 2, 3]}, '\\[N, J\\]'),
    ({'class_counts': [[1, 2]], 'mean': 0.0}, 'mean'),
    ({'class_counts': [[1, 2]], 'mean': 1.5}, 'mean'),
    ({'class_counts': [[1, 2]], 'floor': 0.0}, 'floor'),
    ({'class_counts': [[1, 2]], 'normalize': 'median'}, 'normalize'),
    ({'class_counts': [[1, 2]], 'beta': 0.0}, 'beta'),
  ],
)
def test_probabilities_validation(kwargs, match):
  with pytest.raises(ValueError, match=match):
    participation.probabilities(**kwargs)


# ---------------------------------------------------------------------------
# sample: long-run frequencies
# ---------------------------------------------------------------------------

P_GRID = np.concatenate(
  [[0.02, 0.05, 0.1, 0.3, 0.5, 0.75, 0.97, 1.0], np.linspace(0.03, 0.9, 12)]
)


def test_bernoulli_frequencies():
  num_rounds = 20000
  mask = participation.sample(P_GRID, num_rounds, 'bernoulli', seed=0)
  assert mask.shape == (num_rounds, P_GRID.size) and mask.dtype == bool
  sd = np.sqrt(P_GRID * (1 - P_GRID) / num_rounds)
  assert np.all(np.abs(rates(mask) - P_GRID) <= 5 * sd + 1e-12)


def markov_reference_rates(p, a):
  """P(off->on), P(on->off) from the rule, rescaled when the latter > 1."""
  to_on, to_off = [], []
  for pn in p:
    down = a * (1 / pn - 1)
    if down > 1:
      to_on.append(a / down)
      to_off.append(1.0)
    else:
      to_on.append(a)
      to_off.append(down)
  return np.array(to_on), np.array(to_off)


def test_markov_frequencies():
  num_rounds, a = 40000, 0.05
  mask = participation.sample(
    P_GRID, num_rounds, 'markov', seed=1, markov_rate=a
  )
  to_on, to_off = markov_reference_rates(P_GRID, a)
  # Stationary probability of the chain, then the variance of a time average
  # of a two-state chain: p (1 - p) / T * (1 + lam) / (1 - lam), with
  # lam = 1 - P(off->on) - P(on->off) its second eigenvalue.
  stationary = to_on / (to_on + to_off)
  np.testing.assert_allclose(stationary, P_GRID, rtol=1e-12)
  lam = 1 - to_on - to_off
  sd = np.sqrt(P_GRID * (1 - P_GRID) / num_rounds * (1 + lam) / (1 - lam))
  assert np.all(np.abs(rates(mask) - P_GRID) <= 5 * sd + 1e-12)


@pytest.mark.parametrize('p, a', [(0.3, 0.05), (0.1, 0.05), (0.6, 0.2)])
def test_markov_transition_rates(p, a):
  num_rounds, clients = 20000, 4
  mask = participation.sample(
    np.full(clients, p), num_rounds, 'markov', seed=2, markov_rate=a
  )
  before, after = mask[:-1].ravel(), mask[1:].ravel()
  off, on = ~before, before
  (to_on,), (to_off,) = markov_reference_rates([p], a)
  assert to_off <= 1  # the plain branch
  for observed, n, r in [
    (np.sum(off & after), off.sum(), to_on),
    (np.sum(on & ~after), on.sum(), to_off),
  ]:
    assert abs(observed / n - r) <= 5 * np.sqrt(r * (1 - r) / n)


def test_markov_rescaled_branch():
  # a (1/p - 1) = 0.5 * 4 = 2 > 1: P(on->off) = 1, P(off->on) = 0.5 / 2.
  num_rounds, clients, p, a = 20000, 4, 0.2, 0.5
  mask = participation.sample(
    np.full(clients, p), num_rounds, 'markov', seed=3, markov_rate=a
  )
  before, after = mask[:-1].ravel(), mask[1:].ravel()
  # Every 'on' round is followed by an 'off' round.
  assert before.sum() > 0 and not np.any(before & after)
  off = ~before
  rate = np.sum(off & after) / off.sum()
  assert abs(rate - 0.25) <= 5 * np.sqrt(0.25 * 0.75 / off.sum())
  assert abs(mask.mean() - p) <= 0.02


def test_markov_rates_helper_matches_rule():
  to_on, to_off = participation.markov_rates(P_GRID, 0.05)
  ref_on, ref_off = markov_reference_rates(P_GRID, 0.05)
  np.testing.assert_allclose(to_on, ref_on, rtol=1e-12)
  np.testing.assert_allclose(to_off, ref_off, rtol=1e-12)


def cyclic_reference_lengths(pn, cycle):
  active = max(1, int(np.round(cycle * pn)))
  return active, max(1, cycle - active)


def test_cyclic_frequencies():
  num_rounds = 20000
  p = P_GRID[P_GRID <= 0.99]
  mask = participation.sample(p, num_rounds, 'cyclic', seed=4, cycle=CYCLE)
  # Up to rounding of cycle * p (<= 0.5 / cycle) and one partial cycle.
  assert np.all(
    np.abs(rates(mask) - p) <= 0.5 / CYCLE + (CYCLE + 1) / num_rounds
  )


def test_cyclic_probability_one_keeps_one_inactive_round():
  # active_len = 100, inactive_len = max(1, 0) = 1.
  mask = participation.sample(
    [1.0], 10 * (CYCLE + 1), 'cyclic', seed=0, cycle=CYCLE
  )
  assert mask.sum() == 10 * CYCLE


def test_cyclic_run_lengths_and_phase():
  p = np.array([0.02, 0.1, 0.25, 0.333, 0.5, 0.9, 0.97, 1.0])
  num_rounds = 1000
  mask = participation.sample(p, num_rounds, 'cyclic', seed=5, cycle=CYCLE)
  for n, pn in enumerate(p):
    active_len, inactive_len = cyclic_reference_lengths(pn, CYCLE)
    column = runs(mask[:, n])
    if not column[0][0]:  # initial inactive phase, shorter than a full run
      assert 1 <= column[0][1] <= inactive_len - 1
      column = column[1:]
    # From the first switch on: full runs alternate, starting active; only
    # the last run may be cut by the horizon.
    for i, (value, length) in enumerate(column):
      assert value == (i % 2 == 0)
      full = active_len if value else inactive_len
      if i < len(column) - 1:
        assert length == full
      else:
        assert 1 <= length <= full


def test_cyclic_phase_covers_range():
  clients = 300
  mask = participation.sample(
    np.full(clients, 0.1), 200, 'cyclic', seed=6, cycle=CYCLE
  )
  # The first active round equals the initial rounds_to_switch, drawn from
  # UniformInt[0, inactive_len - 1] = [0, 89].
  first_active = np.argmax(mask, axis=0)
  assert np.all(mask.any(axis=0))
  assert first_active.min() >= 0 and first_active.max() <= 89
  assert len(np.unique(first_active)) >= 60  # about 87 expected


@pytest.mark.parametrize(
  'pn, per_cycle', [(0.07, 7), (0.075, 8), (0.02, 2), (0.5, 50), (1.0, 100)]
)
def test_cyclic_offset_matches_paper_rule(pn, per_cycle):
  # A = 1 iff (t - o) mod cycle < p * cycle: ceil(p * cycle) active rounds in
  # every window of `cycle` rounds, one contiguous (cyclic) block.
  clients, num_rounds = 50, 3 * CYCLE
  mask = participation.sample(
    np.full(clients, pn), num_rounds, 'cyclic_offset', seed=7, cycle=CYCLE
  )
  np.testing.assert_array_equal(mask[:-CYCLE], mask[CYCLE:])
  np.testing.assert_array_equal(mask[:CYCLE].sum(axis=0), per_cycle)
  for n in range(clients):
    doubled = np.concatenate([mask[:CYCLE, n], mask[:CYCLE, n]])
    assert (
      max((length for value, length in runs(doubled) if value), default=0)
      >= per_cycle
    )
  if pn < 1:
    starts = [
      np.argmax(mask[:CYCLE, n] & ~np.roll(mask[:CYCLE, n], 1))
      for n in range(clients)
    ]
    assert len(set(starts)) > 20  # random offsets


def test_uniform_counts_per_round():
  num_rounds, clients, k = 4000, 20, 5
  mask = participation.sample(
    np.full(clients, 0.5), num_rounds, 'uniform', seed=8, clients_per_round=k
  )
  np.testing.assert_array_equal(mask.sum(axis=1), k)
  q = k / clients
  assert np.all(
    np.abs(rates(mask) - q) <= 5 * np.sqrt(q * (1 - q) / num_rounds)
  )
  # p only gives N.
  other = participation.sample(
    np.full(clients, 0.9), num_rounds, 'uniform', seed=8, clients_per_round=k
  )
  np.testing.assert_array_equal(mask, other)


@pytest.mark.parametrize('pattern', participation.PATTERNS)
def test_sample_deterministic_in_seed(pattern):
  p = np.linspace(0.05, 0.6, 30)
  kwargs = {'clients_per_round': 4}
  a = participation.sample(p, 300, pattern, seed=11, **kwargs)
  b = participation.sample(p, 300, pattern, seed=11, **kwargs)
  c = participation.sample(p, 300, pattern, seed=12, **kwargs)
  np.testing.assert_array_equal(a, b)
  assert not np.array_equal(a, c)


@pytest.mark.parametrize('pattern', participation.PATTERNS)
def test_a_shorter_run_sees_the_first_rounds_of_a_longer_ones_mask(pattern):
  """The mask for T rounds is the first T rows of the mask for more rounds,
  so an algorithm that does not read T (FedAU, FedAvg) gives the same
  first T rounds in a run of any length: a long run read at round T
  (launch.sweep table --at=...@T) stands for a run of T rounds."""
  p = np.linspace(0.05, 0.6, 30)
  kwargs = {'clients_per_round': 4}
  short = participation.sample(p, 250, pattern, seed=3, **kwargs)
  long = participation.sample(p, 2000, pattern, seed=3, **kwargs)
  np.testing.assert_array_equal(short, long[:250])


@pytest.mark.parametrize(
  'args, kwargs, match',
  [
    (([0.1, 0.2], 10, 'poisson'), {}, 'unknown pattern'),
    (([0.1, 0.0], 10, 'bernoulli'), {}, '\\[1\\]'),
    (([0.1, 1.2], 10, 'markov'), {}, '\\[1\\]'),
    (([0.1, 0.2], 10, 'uniform'), {}, 'clients_per_round'),
    (([0.1, 0.2], 10, 'uniform'), {'clients_per_round': 3}, 'integer'),
    (([0.1, 0.2], 0, 'bernoulli'), {}, 'num_rounds'),
    (([0.1, 0.2], 10, 'markov'), {'markov_rate': 0.0}, 'markov_rate'),
    (([0.1, 0.2], 10, 'cyclic'), {'cycle': 0}, 'cycle'),
  ],
)
def test_sample_validation(args, kwargs, match):
  with pytest.raises(ValueError, match=match):
    participation.sample(*args, **kwargs)


# ---------------------------------------------------------------------------
# max_active and plot
# ---------------------------------------------------------------------------


def test_max_active():
  mask = np.array([[1, 0, 1], [1, 1, 1], [0, 0, 0]], bool)
  assert participation.max_active(mask) == 3
  assert participation.max_active(np.zeros((4, 3), bool)) == 1
  for bad in (np.zeros(3, bool), np.zeros((0, 3), bool)):
    with pytest.raises(ValueError, match=r'non-empty \[T, N\]'):
      participation.max_active(bad)


def test_plot_writes_png(tmp_path):
  mask = participation.sample(np.linspace(0.05, 0.5, 12), 80, 'markov', seed=0)
  path = tmp_path / 'mask.png'
  participation.plot(mask, path, title='markov')
  data = path.read_bytes()
  assert data[:8] == b'\x89PNG\r\n\x1a\n' and len(data) > 1000
