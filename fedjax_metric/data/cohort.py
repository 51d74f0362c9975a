"""Host side of a round: which clients train, and on which examples.

Everything here is NumPy and integers. The output of `make_cohort` has shapes
that depend only on the config (C slots, S steps, B examples), never on the
round, so the jitted round compiles once per run. All randomness is a function
of (seed, round, client id): a resumed run draws the same cohorts, and a
client's batches do not depend on which slot it lands in.

Shape letters: N clients in total, C cohort slots, S local steps, B batch size.
"""

import math
from typing import Any, Callable, NamedTuple, Optional, Sequence

import numpy as np


class Cohort(NamedTuple):
  """One round's fixed-shape work description.

  Attributes:
    client_ids: int32 [C]; padding slots hold N (an out-of-range id whose
      client-table writes are dropped).
    slot_mask: bool [C]; True for real clients.
    example_idx: int32 [C, S, B] indices into the training set.
    example_mask: bool [C, S, B]; False for padded examples and steps.
    num_examples: float32 [C]; each client's dataset size (0 for padding).
  """

  client_ids: np.ndarray
  slot_mask: np.ndarray
  example_idx: np.ndarray
  example_mask: np.ndarray
  num_examples: np.ndarray


def num_local_steps(
  client_sizes: Sequence[int],
  *,
  batch_size: int,
  local_epochs: int,
  local_steps: int,
) -> int:
  """S, fixed for the whole run.

  With ``local_steps > 0`` every client takes exactly that many steps. Otherwise
  a client of n examples takes ``local_epochs * ceil(n / B)`` steps (the last
  batch of an epoch is partial, like a PyTorch loader without drop_last) and S
  is that number for the largest client; smaller clients are padded.
  """
  if local_steps > 0:
    return local_steps
  if local_epochs < 1:
    raise ValueError(
      'Set local_epochs >= 1 or local_steps >= 1 '
      f'(got local_epochs={local_epochs}, local_steps={local_steps}).'
    )
  return local_epochs * max(1, math.ceil(max(client_sizes) / batch_size))


def sample_clients(
  seed: int, round_idx: int, num_clients: int, clients_per_round: int
) -> np.ndarray:
  """Uniform sampling without replacement, deterministic in (seed, round).

  Returns sorted int64 client ids [clients_per_round].
  """
  if not 1 <= clients_per_round <= num_clients:
    raise ValueError(
      f'clients_per_round={clients_per_round} must be in '
      f'[1, num_clients={num_clients}].'
    )
  if clients_per_round == num_clients:
    return np.arange(num_clients)
  rng = np.random.default_rng([seed, round_idx, 0])
  return np.sort(rng.choice(num_clients, clients_per_round, replace=False))


def client_batches(
  example_indices: np.ndarray,
  rng: np.random.Generator,
  *,
  num_steps: int,
  batch_size: int,
  local_epochs: int,
  local_steps: int,
):
  """One client's batch schedule: (idx [S, B] int32, mask [S, B] bool).

  Epoch mode: each epoch is a fresh permutation cut into ceil(n/B) batches,
  the last one partial. Step mode: a stream of fresh permutations cut into
  exactly S full batches (when n < B a batch repeats examples across epochs).
  """
  idx = np.zeros((num_steps, batch_size), np.int32)
  mask = np.zeros((num_steps, batch_size), bool)
  n = len(example_indices)
  if n == 0:
    return idx, mask
  if local_steps > 0:
    needed = num_steps * batch_size
    stream = np.concatenate(
      [rng.permutation(example_indices) for _ in range(math.ceil(needed / n))]
    )[:needed]
    return stream.reshape(num_steps, batch_size).astype(np.int32), ~mask
  steps_per_epoch = math.ceil(n / batch_size)
  if local_epochs * steps_per_epoch > num_steps:
    raise ValueError(
      f'A client of {n} examples needs {local_epochs} x '
      f'{steps_per_epoch} steps of {batch_size}, more than the '
      f'{num_steps} local steps; compute S with num_local_steps.'
    )
  for epoch in range(local_epochs):
    order = rng.permutation(example_indices)
    for b in range(steps_per_epoch):
      chunk = order[b * batch_size : (b + 1) * batch_size]
      step = epoch * steps_per_epoch + b
      idx[step, : len(chunk)] = chunk
      mask[step, : len(chunk)] = True
  return idx, mask


def make_cohort(
  client_ids: np.ndarray,
  partition: Sequence[np.ndarray],
  *,
  num_slots: int,
  num_steps: int,
  batch_size: int,
  local_epochs: int,
  local_steps: int,
  seed: int,
  round_idx: int,
  labels: Optional[np.ndarray] = None,
  batches_fn: Optional[Callable[..., Any]] = None,
) -> Cohort:
  """Builds the fixed-shape `Cohort` for the clients sampled this round.

  Args:
    client_ids: the real clients of this round, at most ``num_slots``.
    partition: per-client int index arrays into the training set (length N).
    num_slots: C; slots past ``len(client_ids)`` are padding.
    num_steps, batch_size, local_epochs, local_steps: see `num_local_steps`.
    seed, round_idx: the batch order of client k in round t depends only on
      (seed, t, k).
    labels: training labels [num_examples], passed to ``batches_fn``.
    batches_fn: an algorithm's own batch schedule (`engine.Algorithm.
      client_batches`), ``(indices, labels, rng, **shape) -> (idx [S, B'],
      mask [S, B'])``; its width B' may differ from batch_size.
  """
  if len(client_ids) > num_slots:
    raise ValueError(
      f'{len(client_ids)} clients do not fit in {num_slots} slots.'
    )
  num_clients = len(partition)
  if batches_fn is None:
    batches_fn = lambda indices, labels, rng, **shape: client_batches(
      indices, rng, **shape
    )
  shape = dict(
    num_steps=num_steps,
    batch_size=batch_size,
    local_epochs=local_epochs,
    local_steps=local_steps,
  )
  # An empty client shows the schedule's width B' (padding slots need it).
  width = batches_fn(
    np.zeros(0, np.int64), labels, np.random.default_rng(0), **shape
  )[0].shape[1]
  c = num_slots
  ids = np.full((c,), num_clients, np.int32)
  slot_mask = np.zeros((c,), bool)
  example_idx = np.zeros((c, num_steps, width), np.int32)
  example_mask = np.zeros((c, num_steps, width), bool)
  num_examples = np.zeros((c,), np.float32)
  for slot, client in enumerate(client_ids):
    rng = np.random.default_rng([seed, round_idx, 1, int(client)])
    ids[slot] = client
    slot_mask[slot] = True
    num_examples[slot] = len(partition[client])
    example_idx[slot], example_mask[slot] = batches_fn(
      partition[client], labels, rng, **shape
    )
  return Cohort(ids, slot_mask, example_idx, example_mask, num_examples)
