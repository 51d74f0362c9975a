"""Streamed participation masks: `sample`'s rows, one round at a time.

Every row is compared with `sample`'s mask bit for bit (the published runs
drew their masks with `sample`), from round 0 and from any resumed round;
memory is checked with tracemalloc against the [T, N] mask it replaces.
"""

import tracemalloc

import numpy as np
import pytest

from fedjax_metric.data import participation

ROUNDS = 250
RNG = np.random.default_rng(0)
# Edge values first: p = 1 (bernoulli always on, markov never leaves 'on',
# cyclic active_len = cycle), 0.995 (round(99.5) = 100: active_len = cycle
# too, NumPy rounds half to even), tiny p (never or almost never on).
P_SETS = {
  'mixed': np.concatenate(
    [[1.0, 1e-9, 0.02, 0.5, 0.995, 0.07], RNG.uniform(0.01, 0.4, 35)]
  ),
  'ones': np.ones(9),
  'tiny': np.full(9, 1e-6),
}
# Cycles shorter than ROUNDS (several periods) and longer (none complete).
CYCLES = (100, 7, 400)


def stack(rows, num_clients):
  rows = list(rows)
  return np.stack(rows) if rows else np.zeros((0, num_clients), bool)


def streamed(p, num_rounds, pattern, **kwargs):
  return stack(
    participation.round_masks(p, num_rounds, pattern, **kwargs), len(p)
  )


def pattern_kwargs(pattern, cycle=100, clients_per_round=5):
  if pattern == 'uniform':
    return {'clients_per_round': clients_per_round}
  if pattern in ('cyclic', 'cyclic_offset'):
    return {'cycle': cycle}
  if pattern == 'markov':
    return {'markov_rate': 0.05}
  return {}


# ---------------------------------------------------------------------------
# Rows equal `sample`'s, bit for bit
# ---------------------------------------------------------------------------


@pytest.mark.parametrize('p_set', sorted(P_SETS))
@pytest.mark.parametrize('seed', [0, 1, 12345])
@pytest.mark.parametrize('pattern', participation.PATTERNS)
def test_rows_equal_sample(pattern, seed, p_set):
  p = P_SETS[p_set]
  kwargs = pattern_kwargs(pattern)
  expected = participation.sample(p, ROUNDS, pattern, seed=seed, **kwargs)
  got = streamed(p, ROUNDS, pattern, seed=seed, **kwargs)
  assert got.dtype == bool and got.shape == expected.shape
  np.testing.assert_array_equal(got, expected)


@pytest.mark.parametrize('cycle', CYCLES)
@pytest.mark.parametrize('pattern', ['cyclic', 'cyclic_offset'])
def test_cyclic_rows_equal_sample_for_any_cycle(pattern, cycle):
  p = P_SETS['mixed']
  for seed in range(4):
    expected = participation.sample(p, ROUNDS, pattern, seed=seed, cycle=cycle)
    np.testing.assert_array_equal(
      streamed(p, ROUNDS, pattern, seed=seed, cycle=cycle), expected
    )


def test_cycle_one_alternates_like_sample():
  # active_len = inactive_len = 1 and a first switch at round 0.
  p = np.array([0.3, 1.0])
  expected = participation.sample(p, 6, 'cyclic', cycle=1)
  np.testing.assert_array_equal(expected[:, 0], [1, 0, 1, 0, 1, 0])
  np.testing.assert_array_equal(streamed(p, 6, 'cyclic', cycle=1), expected)


@pytest.mark.parametrize('rate', [0.05, 0.5, 1.0])
def test_markov_rows_equal_sample_for_any_rate(rate):
  # rate 0.5 and 1 put many clients in the rescaled branch (to_off = 1).
  p = P_SETS['mixed']
  expected = participation.sample(p, ROUNDS, 'markov', seed=3, markov_rate=rate)
  np.testing.assert_array_equal(
    streamed(p, ROUNDS, 'markov', seed=3, markov_rate=rate), expected
  )


@pytest.mark.parametrize('k', [1, 2, 20, 41])
def test_uniform_rows_equal_sample_for_any_k(k):
  p = P_SETS['mixed']
  expected = participation.sample(p, ROUNDS, 'uniform', clients_per_round=k)
  got = streamed(p, ROUNDS, 'uniform', clients_per_round=k)
  np.testing.assert_array_equal(got, expected)
  np.testing.assert_array_equal(got.sum(axis=1), k)


def test_smallest_k_breaks_ties_as_argsort():
  # Uniform doubles almost never tie; here ties straddle the k-th place in
  # most rows, so the argsort fallback decides, as in `_uniform`.
  rng = np.random.default_rng(4)
  u = rng.integers(0, 6, size=(200, 31)).astype(np.float64)
  for k in (1, 3, 10, 30, 31):
    expected = np.zeros(u.shape, bool)
    np.put_along_axis(expected, np.argsort(u, axis=1)[:, :k], True, axis=1)
    got = np.stack([participation._smallest_k(row, k) for row in u])
    np.testing.assert_array_equal(got, expected)


def test_a_double_takes_one_generator_output():
  """What the O(1) resume of 'bernoulli' / 'uniform' rests on: after
  rng.random(n), PCG64 has moved n outputs (advance(n) lands there)."""
  drawn = participation._rng(9, 'bernoulli')
  jumped = participation._rng(9, 'bernoulli')
  drawn.random(1234)
  jumped.bit_generator.advance(1234)
  np.testing.assert_array_equal(drawn.random(50), jumped.random(50))


# ---------------------------------------------------------------------------
# Resuming: start / seek / mask_at
# ---------------------------------------------------------------------------


@pytest.mark.parametrize('pattern', participation.PATTERNS)
def test_start_gives_the_rows_from_round_start(pattern):
  p = P_SETS['mixed']
  kwargs = pattern_kwargs(pattern, cycle=30)
  expected = participation.sample(p, ROUNDS, pattern, seed=5, **kwargs)
  for start in (0, 1, 29, 30, 117, ROUNDS - 1, ROUNDS):
    got = streamed(p, ROUNDS, pattern, seed=5, start=start, **kwargs)
    np.testing.assert_array_equal(got, expected[start:])


@pytest.mark.parametrize('pattern', participation.PATTERNS)
def test_seek_and_mask_at_in_any_order(pattern):
  p = P_SETS['mixed']
  kwargs = pattern_kwargs(pattern, cycle=30)
  expected = participation.sample(p, ROUNDS, pattern, seed=6, **kwargs)
  stream = participation.ParticipationStream(
    p, ROUNDS, pattern, seed=6, **kwargs
  )
  for t in (40, 41, 3, 200, 0, 199, ROUNDS - 1, 41):
    np.testing.assert_array_equal(stream.mask_at(t), expected[t])
    assert stream.next_round == t + 1
  stream.seek(10)
  np.testing.assert_array_equal(stack(stream, p.size), expected[10:])


@pytest.mark.parametrize('pattern', participation.PATTERNS)
def test_stream_ends_after_the_last_round(pattern):
  p = P_SETS['mixed']
  stream = participation.ParticipationStream(
    p, 5, pattern, start=3, **pattern_kwargs(pattern)
  )
  assert (stream.num_rounds, stream.num_clients) == (5, p.size)
  assert len(list(stream)) == 2 and stream.next_round == 5
  with pytest.raises(StopIteration):
    next(stream)


def test_a_kept_markov_row_does_not_steer_the_chain():
  p = P_SETS['mixed']
  expected = participation.sample(p, 20, 'markov', seed=2)
  stream = participation.ParticipationStream(p, 20, 'markov', seed=2)
  rows = []
  for row in stream:
    rows.append(row.copy())
    row[:] = ~row  # a caller that writes into its row
  np.testing.assert_array_equal(np.stack(rows), expected)


# ---------------------------------------------------------------------------
# max_active_streamed
# ---------------------------------------------------------------------------


@pytest.mark.parametrize('num_rounds', [1, 20, ROUNDS])
@pytest.mark.parametrize('pattern', participation.PATTERNS)
def test_max_active_streamed_equals_max_active(pattern, num_rounds):
  for p_set, seed, cycle in [
    ('mixed', 0, 100),
    ('mixed', 1, 7),
    ('ones', 2, 100),
    ('tiny', 3, 100),
  ]:
    p = P_SETS[p_set]
    kwargs = pattern_kwargs(pattern, cycle=cycle, clients_per_round=4)
    mask = participation.sample(p, num_rounds, pattern, seed=seed, **kwargs)
    assert participation.max_active_streamed(
      p, num_rounds, pattern, seed=seed, **kwargs
    ) == participation.max_active(mask), (p_set, seed, cycle)


def test_cyclic_max_active_period_without_the_p_one_clients():
  # Without active_len = cycle clients every period is `cycle`: the rows
  # repeat with period `cycle` from round 0, so the first `cycle` rounds
  # hold every count of a 1000-round run.
  p = RNG.uniform(0.02, 0.9, 300)
  for seed in range(3):
    mask = participation.sample(p, 1000, 'cyclic', seed=seed, cycle=50)
    stream = participation.ParticipationStream(
      p, 1000, 'cyclic', seed=seed, cycle=50
    )
    assert stream.rounds_covering_counts() == 50
    np.testing.assert_array_equal(mask[50:], mask[:-50])
    assert participation.max_active_streamed(
      p, 1000, 'cyclic', seed=seed, cycle=50
    ) == participation.max_active(mask)


@pytest.mark.parametrize(
  'pattern, p, kwargs, expected',
  [
    ('bernoulli', [0.1, 0.2], {}, ROUNDS),
    ('markov', [0.1, 0.2], {}, ROUNDS),
    ('uniform', [0.1, 0.2], {'clients_per_round': 2}, 1),
    ('cyclic_offset', [0.1, 1.0], {'cycle': 30}, 30),
    ('cyclic_offset', [0.1, 1.0], {'cycle': 300}, ROUNDS),
    ('cyclic', [0.1, 0.5], {'cycle': 30}, 30),
    # active_len = 30 for p = 1: periods 30 and 31, lcm 930 > T.
    ('cyclic', [0.1, 1.0], {'cycle': 30}, ROUNDS),
    ('cyclic', [1.0, 1.0], {'cycle': 30}, 31),
  ],
)
def test_rounds_covering_counts(pattern, p, kwargs, expected):
  stream = participation.ParticipationStream(p, ROUNDS, pattern, **kwargs)
  assert stream.rounds_covering_counts() == expected


# ---------------------------------------------------------------------------
# Memory: O(N), never O(T N)
# ---------------------------------------------------------------------------


@pytest.mark.parametrize('pattern', participation.PATTERNS)
def test_memory_is_a_few_rows_not_the_mask(pattern):
  num_clients, num_rounds = 200_000, 400
  # A few float64 [N] arrays; the [T, N] bool mask alone is 5 times more
  # (bernoulli / markov / uniform draws for it 40 times more).
  budget = 64 * num_clients
  assert 5 * budget <= num_rounds * num_clients
  p = np.random.default_rng(1).uniform(0.02, 0.3, num_clients)
  kwargs = pattern_kwargs(pattern, clients_per_round=1000)
  tracemalloc.start()
  try:
    counts = [
      np.count_nonzero(row)
      for row in participation.round_masks(p, num_rounds, pattern, **kwargs)
    ]
    most = participation.max_active_streamed(p, num_rounds, pattern, **kwargs)
    resumed = participation.ParticipationStream(
      p, num_rounds, pattern, start=num_rounds - 1, **kwargs
    )
    last = next(resumed)
    _, peak = tracemalloc.get_traced_memory()
  finally:
    tracemalloc.stop()
  assert peak < budget, f'{peak} bytes'
  assert len(counts) == num_rounds and most == max(1, max(counts))
  assert np.count_nonzero(last) == counts[-1]


# ---------------------------------------------------------------------------
# Argument checks: `sample`'s, plus start / round_index
# ---------------------------------------------------------------------------


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
    (([0.1, 0.2], 10, 'bernoulli'), {'start': 11}, 'start'),
    (([0.1, 0.2], 10, 'bernoulli'), {'start': -1}, 'start'),
    (([0.1, 0.2], 10, 'cyclic'), {'start': 2.5}, 'start'),
  ],
)
def test_stream_validation(args, kwargs, match):
  with pytest.raises(ValueError, match=match):
    participation.round_masks(*args, **kwargs)
  if 'start' not in kwargs:
    with pytest.raises(ValueError, match=match):
      participation.sample(*args, **kwargs)
    with pytest.raises(ValueError, match=match):
      participation.max_active_streamed(*args, **kwargs)


def test_seek_and_mask_at_bounds():
  stream = participation.ParticipationStream([0.1, 0.2], 10, 'bernoulli')
  stream.seek(10)  # a finished run: nothing left
  assert list(stream) == []
  for bad in (-1, 10):
    with pytest.raises(ValueError, match='round_index'):
      stream.mask_at(bad)
  with pytest.raises(ValueError, match='round_index'):
    stream.seek(11)
