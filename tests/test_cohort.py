"""Host-side cohorts: fixed shapes, determinism, epoch coverage, sampling."""

import numpy as np
import pytest

from fedjax_metric.data import cohort as cohort_lib


def test_sampling_is_deterministic_without_replacement():
  a = cohort_lib.sample_clients(3, 7, 100, 10)
  b = cohort_lib.sample_clients(3, 7, 100, 10)
  c = cohort_lib.sample_clients(3, 8, 100, 10)
  np.testing.assert_array_equal(a, b)
  assert not np.array_equal(a, c)
  assert len(set(a.tolist())) == 10 and a.max() < 100
  np.testing.assert_array_equal(
    cohort_lib.sample_clients(0, 0, 5, 5), np.arange(5)
  )
  with pytest.raises(ValueError, match='clients_per_round'):
    cohort_lib.sample_clients(0, 0, 5, 6)


def test_epoch_mode_visits_each_example_once_per_epoch():
  parts = [np.arange(10), np.arange(10, 13)]
  s = cohort_lib.num_local_steps(
    [10, 3], batch_size=4, local_epochs=2, local_steps=0
  )
  assert s == 2 * 3  # 2 epochs x ceil(10 / 4)
  c = cohort_lib.make_cohort(
    np.array([1, 0]),
    parts,
    num_slots=3,
    num_steps=s,
    batch_size=4,
    local_epochs=2,
    local_steps=0,
    seed=0,
    round_idx=0,
  )
  assert c.example_idx.shape == (3, 6, 4) and c.example_mask.shape == (3, 6, 4)
  for slot, client in enumerate([1, 0]):
    seen = c.example_idx[slot][c.example_mask[slot]]
    np.testing.assert_array_equal(
      np.sort(seen), np.sort(np.tile(parts[client], 2))
    )
  # Client 1 (3 examples): one partial batch per epoch, then padded steps.
  assert c.example_mask[0].sum(1).tolist() == [3, 3, 0, 0, 0, 0]
  np.testing.assert_array_equal(c.client_ids, [1, 0, 2])  # 2 == N: padding.
  np.testing.assert_array_equal(c.slot_mask, [True, True, False])
  np.testing.assert_array_equal(c.num_examples, [3, 10, 0])
  assert not c.example_mask[2].any()


def test_step_mode_fills_every_step():
  parts = [np.arange(5)]
  c = cohort_lib.make_cohort(
    np.array([0]),
    parts,
    num_slots=1,
    num_steps=4,
    batch_size=3,
    local_epochs=1,
    local_steps=4,
    seed=0,
    round_idx=0,
  )
  assert c.example_mask.all()
  counts = np.bincount(c.example_idx[0].ravel(), minlength=5)
  assert counts.min() >= 2 and counts.max() <= 3  # 12 draws over 5 examples.


def test_client_batches_depend_on_client_not_slot():
  parts = [np.arange(8), np.arange(8, 16), np.arange(16, 24)]
  kw = dict(
    num_steps=2,
    batch_size=4,
    local_epochs=1,
    local_steps=0,
    seed=5,
    round_idx=2,
  )
  a = cohort_lib.make_cohort(np.array([0, 2]), parts, num_slots=2, **kw)
  b = cohort_lib.make_cohort(np.array([2]), parts, num_slots=4, **kw)
  np.testing.assert_array_equal(a.example_idx[1], b.example_idx[0])
  c = cohort_lib.make_cohort(
    np.array([2]), parts, num_slots=1, **{**kw, 'round_idx': 3}
  )
  assert not np.array_equal(b.example_idx[0], c.example_idx[0])


def test_too_many_clients_for_slots_is_an_error():
  with pytest.raises(ValueError, match='slots'):
    cohort_lib.make_cohort(
      np.array([0, 1]),
      [np.arange(3)] * 2,
      num_slots=1,
      num_steps=1,
      batch_size=2,
      local_epochs=1,
      local_steps=0,
      seed=0,
      round_idx=0,
    )
  with pytest.raises(ValueError, match='local_epochs'):
    cohort_lib.num_local_steps([3], batch_size=2, local_epochs=0, local_steps=0)


@pytest.mark.parametrize('sampler', ['per_client', 'vectorized'])
@pytest.mark.parametrize(
  'ids, match',
  [
    ([1, 1], r'at most once; 1 id\(s\) repeat'),
    ([-1, 0], r'client ids must be in \[0, 3\), got -1 to 0'),
    ([0, 3], r'client ids must be in \[0, 3\), got 0 to 3'),
  ],
)
def test_a_cohort_of_repeated_or_unknown_clients_is_refused(
  ids, match, sampler
):
  """A repeated client would train twice and be written back once, so the
  executors would disagree; a negative id would index from the end."""
  kw = dict(
    num_slots=2,
    num_steps=2,
    batch_size=2,
    local_epochs=1,
    local_steps=0,
    seed=0,
    round_idx=0,
    sampler=sampler,
  )
  parts = [np.arange(3), np.arange(3, 6), np.arange(6, 9)]
  with pytest.raises(ValueError, match=match):
    cohort_lib.make_cohort(np.array(ids), parts, **kw)
  assert cohort_lib.make_cohort(np.array([2, 0]), parts, **kw).slot_mask.all()


def test_prefetch_of_no_keys_yields_nothing():
  assert list(cohort_lib.prefetch(lambda k: k * 2, [])) == []
  assert list(cohort_lib.prefetch(lambda k: k * 2, [1, 2, 3])) == [2, 4, 6]


# ---------------------------------------------------------------------------
# The vectorized sampler.
# ---------------------------------------------------------------------------


def splitmix64_reference(x: int) -> int:
  """SplitMix64's finaliser in Python integers (Steele, Lea & Flood 2014)."""
  m = 2**64 - 1
  z = (x + 0x9E3779B97F4A7C15) & m
  z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & m
  z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & m
  return z ^ (z >> 31)


def test_counter_bits_match_a_python_integer_reference():
  counters = [(7, 3, 12, 0, 1, 5), (0, 0, 0, 0, 0, 0), (2**31, 1, 99, 2, 4, 0)]
  for values in counters:
    bits = 0
    for v in values:
      bits = splitmix64_reference(bits ^ v)
    assert int(cohort_lib.counter_bits(*values)) == bits
  # Broadcasting: a batch gives each element the bits it gets alone.
  batch = cohort_lib.counter_bits(7, 3, np.arange(5)[:, None], np.arange(4))
  assert batch.shape == (5, 4)
  assert int(batch[2, 3]) == int(cohort_lib.counter_bits(7, 3, 2, 3))
  # Continuing from a prefix's bits is the same as hashing all counters.
  prefix = cohort_lib.counter_bits(7, 3, np.arange(5))
  np.testing.assert_array_equal(
    cohort_lib.counter_bits(np.arange(4), bits=prefix[:, None]), batch
  )
  u = cohort_lib.counter_uniform(1, 2, np.arange(100_000))
  assert 0.0 <= u.min() and u.max() < 1.0
  # Ten equal bins of 10,000 expected: a chi-square far beyond 9 d.o.f.'s
  # 99.99% point (33.7) would mean the draws are not uniform.
  counts = np.bincount((u * 10).astype(int), minlength=10)
  assert np.sum((counts - 10_000) ** 2 / 10_000) < 33.7


def vectorized(client_ids, parts, **kw):
  return cohort_lib.make_cohort(
    np.asarray(client_ids), parts, sampler='vectorized', **kw
  )


def test_vectorized_epoch_mode_has_the_per_client_layout():
  rng = np.random.default_rng(0)
  sizes = [10, 3, 0, 1, 8, 5]
  parts = [rng.choice(1000, n, replace=False) for n in sizes]
  kw = dict(
    num_slots=8,
    num_steps=cohort_lib.num_local_steps(
      sizes, batch_size=4, local_epochs=2, local_steps=0
    ),
    batch_size=4,
    local_epochs=2,
    local_steps=0,
    seed=3,
    round_idx=1,
  )
  ids = [4, 1, 2, 3, 0, 5]
  v = vectorized(ids, parts, **kw)
  p = cohort_lib.make_cohort(np.asarray(ids), parts, **kw)
  for field in ('client_ids', 'slot_mask', 'example_mask', 'num_examples'):
    np.testing.assert_array_equal(getattr(v, field), getattr(p, field))
  for slot, client in enumerate(ids):
    n = sizes[client]
    per_epoch = -(-n // 4)
    for epoch in range(2):
      steps = slice(epoch * per_epoch, (epoch + 1) * per_epoch)
      seen = v.example_idx[slot, steps][v.example_mask[slot, steps]]
      np.testing.assert_array_equal(np.sort(seen), np.sort(parts[client]))
  assert not v.example_mask[6:].any() and (v.example_idx[6:] == 0).all()


def test_vectorized_step_mode_is_a_stream_of_permutations():
  parts = [np.arange(5), np.arange(100, 103), np.zeros(0, int)]
  c = vectorized(
    [0, 1, 2],
    parts,
    num_slots=3,
    num_steps=4,
    batch_size=3,
    local_epochs=1,
    local_steps=4,
    seed=0,
    round_idx=0,
  )
  np.testing.assert_array_equal(c.example_mask.all(axis=(1, 2)), [1, 1, 0])
  for slot, part in enumerate(parts[:2]):
    stream = c.example_idx[slot].ravel()  # 12 draws
    n = len(part)
    for start in range(0, 12 - n + 1, n):  # every complete pass
      np.testing.assert_array_equal(np.sort(stream[start : start + n]), part)
    assert set(stream[12 - 12 % n :]) <= set(part)


def test_vectorized_draws_depend_on_seed_round_and_client_only():
  parts = [np.arange(8), np.arange(8, 16), np.arange(16, 24)]
  kw = dict(num_steps=2, batch_size=4, local_epochs=1, local_steps=0, seed=5)
  a = vectorized([0, 2], parts, num_slots=2, round_idx=2, **kw)
  b = vectorized([2], parts, num_slots=4, round_idx=2, **kw)
  np.testing.assert_array_equal(a.example_idx[1], b.example_idx[0])
  c = vectorized([2], parts, num_slots=1, round_idx=3, **kw)
  assert not np.array_equal(b.example_idx[0], c.example_idx[0])
  d = vectorized([2], parts, num_slots=1, round_idx=2, **{**kw, 'seed': 6})
  assert not np.array_equal(b.example_idx[0], d.example_idx[0])


def test_vectorized_permutations_are_uniform():
  """Over 6,000 rounds each of the 3! orders of a 3-example client appears
  about 1,000 times (the uniform distribution over permutations)."""
  parts = [np.arange(3)]
  cl = cohort_lib.gather_clients(np.array([0]), parts)
  orders = {}
  for r in range(6000):
    pos, _ = cohort_lib.vectorized_schedule(
      cl,
      seed=0,
      round_idx=r,
      num_steps=1,
      batch_size=3,
      local_epochs=1,
      local_steps=0,
    )
    key = tuple(pos[0, 0])
    orders[key] = orders.get(key, 0) + 1
  assert len(orders) == 6
  counts = np.array(list(orders.values()))
  # Chi-square with 5 d.o.f.; its 99.99% point is 25.7.
  assert np.sum((counts - 1000) ** 2 / 1000) < 25.7


def test_vectorized_needs_the_algorithms_own_cohort_schedule():
  def batches_fn(indices, labels, rng, **shape):
    return cohort_lib.client_batches(indices, rng, **shape)

  kw = dict(
    num_slots=1,
    num_steps=1,
    batch_size=2,
    local_epochs=1,
    local_steps=0,
    seed=0,
    round_idx=0,
  )
  with pytest.raises(ValueError, match="cohort_sampler='per_client'"):
    vectorized([0], [np.arange(2)], batches_fn=batches_fn, **kw)
  with pytest.raises(ValueError, match='sampler'):
    cohort_lib.make_cohort(np.array([0]), [np.arange(2)], sampler='fast', **kw)
  empty = vectorized([], [np.arange(2)], **kw)  # a round nobody joins
  assert not empty.slot_mask.any() and empty.example_idx.shape == (1, 1, 2)


def test_sampling_costs_the_cohort_not_the_population():
  """C of N without replacement allocates O(C), not O(N): NumPy's
  Generator.choice uses Floyd's algorithm for C <= N / 50 (a tail shuffle
  of at most 50 C entries otherwise). At N = 2^31 - 1 a permutation of the
  population would need 16 GiB; drawing 1,000 must stay under 1 MiB."""
  import tracemalloc

  tracemalloc.start()
  ids = cohort_lib.sample_clients(3, 7, 2**31 - 1, 1000)
  _, peak = tracemalloc.get_traced_memory()
  tracemalloc.stop()
  assert peak < 2**20, peak
  assert len(np.unique(ids)) == 1000 and ids.max() < 2**31 - 1
  np.testing.assert_array_equal(
    ids, cohort_lib.sample_clients(3, 7, 2**31 - 1, 1000)
  )
