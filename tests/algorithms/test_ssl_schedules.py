"""The two-view batch schedules (ssl_schedules), both forms, against hand
counts."""

import numpy as np
import pytest

from fedjax_metric.algorithms import ssl_schedules
from fedjax_metric.data import cohort as cohort_lib

SCHEDULE_FORMS = ('client_batches', 'cohort_batches')


def schedule(schedules, n, *, batch_size, epochs, num_steps, form, seed=0):
  """One client's (idx [S, B'], mask) from either slot of the schedule."""
  shape = dict(
    num_steps=num_steps,
    batch_size=batch_size,
    local_epochs=epochs,
    local_steps=0,
  )
  indices = np.arange(100, 100 + n)
  if form == 'client_batches':
    return schedules[form](indices, None, np.random.default_rng(seed), **shape)
  clients = cohort_lib.gather_clients(np.array([3]), {3: indices})
  idx, mask = schedules[form](clients, None, seed=seed, round_idx=0, **shape)
  return idx[0], mask[0]


@pytest.mark.parametrize('form', SCHEDULE_FORMS)
def test_drop_last_and_single_example_batches(form):
  # n = 10, B = 4: batches of 4, 4, 2 per epoch.
  idx, mask = schedule(
    ssl_schedules.ssl_batch_schedules(drop_last=True),
    10,
    batch_size=4,
    epochs=2,
    num_steps=6,
    form=form,
  )
  assert mask.sum(1).tolist() == [4, 4, 0, 4, 4, 0]
  # n = 9, B = 4: batches of 4, 4, 1; the one-example batch is skipped.
  idx, mask = schedule(
    ssl_schedules.ssl_batch_schedules(),
    9,
    batch_size=4,
    epochs=1,
    num_steps=3,
    form=form,
  )
  assert mask.sum(1).tolist() == [4, 4, 0]
  assert sorted(idx[mask].tolist()) != list(range(100, 109))  # one left out
  assert len(set(idx[mask].tolist())) == 8


@pytest.mark.parametrize('form', SCHEDULE_FORMS)
def test_random_batch_is_an_independent_epoch_of_the_same_shape(form):
  fn = ssl_schedules.ssl_batch_schedules(random_batch=True)
  idx, mask = schedule(fn, 10, batch_size=4, epochs=1, num_steps=3, form=form)
  assert idx.shape == (3, 8)
  first, second = idx[:, :4][mask[:, :4]], idx[:, 4:][mask[:, 4:]]
  np.testing.assert_array_equal(mask[:, :4], mask[:, 4:])
  assert (
    sorted(first.tolist()) == sorted(second.tolist()) == list(range(100, 110))
  )
  assert first.tolist() != second.tolist()


@pytest.mark.parametrize('form', SCHEDULE_FORMS)
def test_fedu2_even_schedule_epochs(form):
  fn = ssl_schedules.ssl_batch_schedules(even_epochs_cap=10)
  # S = 12 steps; n = 10, B = 4: 3 batches per epoch -> 4 epochs.
  _, mask = schedule(fn, 10, batch_size=4, epochs=1, num_steps=12, form=form)
  assert int(mask.any(1).sum()) == 12
  # n = 3: 1 batch per epoch -> min(12, cap 10) = 10 epochs.
  _, mask = schedule(fn, 3, batch_size=4, epochs=1, num_steps=12, form=form)
  assert int(mask.any(1).sum()) == 10
