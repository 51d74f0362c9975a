"""The batch schedule of two-view (unsupervised) training, both forms.

The `engine.Algorithm` slots ``client_batches`` (per client) and
``cohort_batches`` (the whole cohort, vectorized) of FedAlignUniform, SSD,
FedDecorr, FedU2, FedX and L-DAWA: `cohort.client_batches` (a fresh
permutation per local epoch, the last batch partial) and then

* ``drop_last``: every partial batch dropped (torch DataLoader
  drop_last=True; the SSD released code sets it when K <= 10);
* batches with fewer than ``min_batch_examples`` real examples dropped (the
  released SSD, FedU2 and FedX clients skip batches of one example);
* ``random_batch``: each step is [batch | random batch], width 2B: the
  second half comes from an independent permutation of the client's data,
  FedX's ``random_loader`` zipped with its train loader (Han et al., 'FedX:
  Unsupervised Federated Learning with Cross Knowledge Distillation', ECCV
  2022; github.com/Sungwon-Han/FEDX, main.py);
* ``even_epochs_cap > 0``: FedU2's 'even' schedule (Liao et al., 'Rethinking
  the Representation in Federated Unsupervised Learning with Non-IID Data',
  CVPR 2024; github.com/XeniaLLL/FedU2,
  src/my/algo/fedU2/fedsimclr_client.py): a client with ceil(n_k / B)
  batches per epoch runs E_k = min(S // ceil(n_k / B), cap) epochs, S the
  run's steps per round, so small clients take about as many steps as the
  largest (the code's S is (max n // B + 1) x epochs; here S is
  `cohort.num_local_steps`, epochs x ceil(max n / B)).

Steps that are dropped keep their slot in the [S, B] layout with an
all-False mask, so they are no-ops and do not count in ctx.num_steps.
"""

import dataclasses
import functools

import jax.numpy as jnp
import numpy as np

from fedjax_metric.data import cohort as cohort_lib


@dataclasses.dataclass(frozen=True)
class Schedule:
  """The knobs of the schedule (see the module docstring)."""

  drop_last: bool = False
  min_batch_examples: int = 2
  random_batch: bool = False
  even_epochs_cap: int = 0

  def __post_init__(self):
    if self.min_batch_examples < 0 or self.even_epochs_cap < 0:
      raise ValueError(
        'min_batch_examples and even_epochs_cap must be >= 0 '
        f'(got {self.min_batch_examples}, {self.even_epochs_cap}).'
      )


def epochs_of(
  schedule, sizes, *, num_steps, batch_size, local_epochs, local_steps
):
  """Local epochs of clients with ``sizes`` examples (int array)."""
  sizes = np.asarray(sizes)
  if not (schedule.even_epochs_cap and local_steps == 0):
    return np.full(sizes.shape, local_epochs)
  per_epoch = np.maximum(-(-sizes // batch_size), 1)
  return np.clip(num_steps // per_epoch, 1, schedule.even_epochs_cap)


def kept_steps(schedule, mask, batch_size):
  """[..., S, 1] which steps train: enough real examples (and full)."""
  counts = mask.sum(axis=-1)
  keep = counts >= max(schedule.min_batch_examples, 1)
  if schedule.drop_last:
    keep &= counts == batch_size
  return keep[..., None]


def client_batches(schedule, indices, labels, rng, **shape):
  """client_batches: ``(indices, labels, rng, *, num_steps, batch_size,
  local_epochs, local_steps) -> (idx [S, B or 2B], mask [S, B or 2B])``."""
  del labels
  shape['local_epochs'] = int(epochs_of(schedule, len(indices), **shape))
  idx, mask = cohort_lib.client_batches(indices, rng, **shape)
  keep = kept_steps(schedule, mask, shape['batch_size'])
  mask = mask & keep
  if schedule.random_batch:
    idx_r, mask_r = cohort_lib.client_batches(indices, rng, **shape)
    idx = np.concatenate([idx, idx_r], axis=1)
    mask = np.concatenate([mask, mask_r & keep], axis=1)
  return idx, mask


def cohort_batches(schedule, clients, labels, *, seed, round_idx, **shape):
  """cohort_batches: ``(clients, labels, *, seed, round_idx, **shape) ->
  (idx [R, S, B or 2B], mask)``; the random batch comes from its own stream
  of permutations."""
  del labels
  epochs = epochs_of(schedule, clients.sizes, **shape)
  draws = dict(seed=seed, round_idx=round_idx, epochs=epochs, **shape)
  pos, mask = cohort_lib.vectorized_schedule(clients, **draws)
  keep = kept_steps(schedule, mask, shape['batch_size'])
  mask = mask & keep
  if schedule.random_batch:  # the second loader: an independent stream
    pos_r, mask_r = cohort_lib.vectorized_schedule(clients, stream=1, **draws)
    pos = np.concatenate([pos, pos_r], axis=2)
    mask = np.concatenate([mask, mask_r & keep], axis=2)
  return cohort_lib.take(clients, pos, mask), mask


def ssl_batch_schedules(**knobs):
  """``dict(client_batches=..., cohort_batches=...)``, the two slots bound
  to ``Schedule(**knobs)`` (drop_last, min_batch_examples, random_batch,
  even_epochs_cap)."""
  schedule = Schedule(**knobs)
  return dict(
    client_batches=functools.partial(client_batches, schedule),
    cohort_batches=functools.partial(cohort_batches, schedule),
  )


def batches_per_epoch(ctx):
  """The client's batches in one local epoch, counted on its schedule.

  Walks ctx.scan_batches and counts the leading steps whose examples still
  fit in n_k: in epoch mode those are the first epoch's batches. A batch
  that the schedule dropped (one example, or partial with drop_last) is not
  counted, which differs from len(loader) of the reference code by at most
  one batch.

  Returns:
    float32 scalar.
  """

  def count(carry, batch):
    seen, steps = carry
    real = jnp.sum(batch.mask.astype(jnp.float32))
    take = (real > 0) & (seen + real <= ctx.num_examples)
    return seen + jnp.where(take, real, 0.0), steps + take.astype(jnp.float32)

  zero = jnp.zeros((), jnp.float32)
  return ctx.scan_batches(count, (zero, zero))[1]
