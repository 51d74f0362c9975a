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
