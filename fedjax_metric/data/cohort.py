"""Host side of a round: which clients train, and on which examples.

Everything here is NumPy and integers. The output of `make_cohort` has shapes
that depend only on the config (C slots, S steps, B examples), never on the
round, so the jitted round compiles once per run. All randomness is a function
of (seed, round, client id): a resumed run draws the same cohorts, and a
client's batches do not depend on which slot it lands in.

Two samplers draw the same schedules (same distribution, different draws):

* ``'per_client'`` (the default): each client's batches come from its own
  NumPy generator, ``default_rng([seed, round, 1, client])``, in a Python loop
  over the cohort. Every result in docs/results was drawn this way.
* ``'vectorized'``: the whole cohort at once, from a counter-based hash of
  (seed, round, client, stream, epoch, position); a permutation is an argsort
  of hashed keys. No Python loop over clients: for cohorts of thousands of
  clients it is one to two orders of magnitude faster on the host.

Shape letters: N clients in total, C cohort slots, R real clients in the
cohort (R <= C), S local steps, B batch size, T examples of the R clients.
"""

import concurrent.futures
import math
from typing import Any, Callable, NamedTuple, Optional, Sequence

import numpy as np

SAMPLERS = ('per_client', 'vectorized')


class DeviceData(NamedTuple):
  """The training set on the device, which a `Cohort`'s ``example_idx``
  indexes (re-exported as engine.DeviceData)."""

  images: Any  # uint8 [num_examples, H, W, C]
  labels: Any  # int32 [num_examples]


class Cohort(NamedTuple):
  """One round's fixed-shape work description.

  Attributes:
    client_ids: int32 [C]; padding slots hold N (an out-of-range id whose
      client-table writes are dropped).
    slot_mask: bool [C]; True for real clients.
    example_idx: int32 [C, S, B] indices into the training set.
    example_mask: bool [C, S, B]; False for padded examples and steps.
    num_examples: float32 [C]; each client's dataset size (0 for padding).
    row_ids: int32 [C] or None: each slot's row in the client table the
      round is given. None: ``client_ids`` (the whole table is on the
      device). Where the table lives off the device (client_table.py) a
      call is given only its cohorts' rows, and row_ids index those;
      padding slots hold an out-of-range row, whose writes are dropped.
  """

  client_ids: np.ndarray
  slot_mask: np.ndarray
  example_idx: np.ndarray
  example_mask: np.ndarray
  num_examples: np.ndarray
  row_ids: Optional[np.ndarray] = None


def table_rows(cohort: Cohort):
  """The client-table row of each slot: ``row_ids``, or the client ids."""
  return cohort.client_ids if cohort.row_ids is None else cohort.row_ids


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


class CohortClients(NamedTuple):
  """The real clients of a round with their data concatenated (vectorized).

  Attributes:
    ids: int64 [R] client ids, in slot order.
    indices: int64 [T] the clients' example indices, client after client.
    starts: int64 [R] where each client's examples begin in ``indices``.
    sizes: int64 [R] each client's number of examples.
  """

  ids: np.ndarray
  indices: np.ndarray
  starts: np.ndarray
  sizes: np.ndarray


def gather_clients(
  client_ids: np.ndarray, partition: Sequence[np.ndarray]
) -> CohortClients:
  """`CohortClients` of ``client_ids`` (one concatenation, no per-client work)."""
  ids = np.asarray(client_ids, np.int64).reshape(-1)
  parts = [np.asarray(partition[c], np.int64) for c in ids]
  sizes = np.array([len(p) for p in parts], np.int64)
  indices = np.concatenate(parts) if parts else np.zeros(0, np.int64)
  return CohortClients(ids, indices, np.cumsum(sizes) - sizes, sizes)


def _splitmix64(x: np.ndarray) -> np.ndarray:
  """SplitMix64's finaliser (Steele, Lea & Flood 2014), elementwise uint64."""
  x = x + np.uint64(0x9E3779B97F4A7C15)
  x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
  x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
  return x ^ (x >> np.uint64(31))


def counter_bits(*counters, bits: Optional[np.ndarray] = None) -> np.ndarray:
  """64 random bits per element, a pure function of the integer counters.

  Each counter is an integer array (broadcast together); the bits are the
  counters absorbed one after the other, each followed by a SplitMix64 mix.
  The same counters give the same bits in any process, batch or order.
  ``bits`` continues from earlier counters' bits, so that a prefix shared by
  many elements is hashed once: ``counter_bits(a, b, c) == counter_bits(c,
  bits=counter_bits(a, b))``.
  """
  shapes = [np.shape(c) for c in counters]
  if bits is None:
    bits = np.zeros(np.broadcast_shapes(*shapes), np.uint64)
  with np.errstate(over='ignore'):  # uint64 arithmetic wraps, by design
    for counter in counters:
      bits = _splitmix64(bits ^ np.asarray(counter).astype(np.uint64))
  return bits


def to_uniform(bits: np.ndarray) -> np.ndarray:
  """Uniform float64 in [0, 1) from 64 random bits (their top 53)."""
  return (bits >> np.uint64(11)) * 2.0**-53


def counter_uniform(*counters) -> np.ndarray:
  """Uniform float64 in [0, 1), a pure function of the counters."""
  return to_uniform(counter_bits(*counters))


def _permutations(
  clients: CohortClients, epochs: np.ndarray, *, seed, round_idx, stream
):
  """A fresh permutation of every client's data in every one of its epochs.

  Args:
    clients: the cohort's clients (R of them).
    epochs: int [R], how many permutations client r gets.
    seed, round_idx, stream: the permutations are argsorts of
      ``counter_bits(seed, round, client id, stream, epoch, i)``.

  Returns:
    (slot, epoch, rank, value), each int64 [M], M = sum(epochs * sizes): the
    element at position ``rank`` of permutation (slot, epoch) is the
    client's example number ``value`` (0 <= value < sizes[slot]).
  """
  epochs = np.asarray(epochs, np.int64)
  perm_slot = np.repeat(np.arange(len(epochs)), epochs)  # [G]
  perm_epoch = np.arange(len(perm_slot)) - np.repeat(
    np.cumsum(epochs) - epochs, epochs
  )
  perm_size = clients.sizes[perm_slot]
  elem_perm = np.repeat(np.arange(len(perm_slot)), perm_size)  # [M], sorted
  rank = np.arange(len(elem_perm)) - np.repeat(
    np.cumsum(perm_size) - perm_size, perm_size
  )
  # Hash (seed, round, client, stream, epoch) once per permutation, then the
  # rank once per element: bits = counter_bits(seed, ..., epoch, rank).
  perm_bits = counter_bits(
    seed, round_idx, clients.ids[perm_slot], stream, perm_epoch
  )
  keys = counter_bits(rank, bits=perm_bits[elem_perm])
  # One sort of (permutation in the high bits, key in the low bits): each
  # permutation's positions end up ordered by their keys. elem_perm is
  # already sorted, so position j keeps its permutation and rank. A stable
  # sort makes the rare tie of truncated keys deterministic.
  id_bits = max(1, int(len(perm_slot)).bit_length())
  sort_key = (elem_perm.astype(np.uint64) << np.uint64(64 - id_bits)) | (
    keys >> np.uint64(id_bits)
  )
  order = np.argsort(sort_key, kind='stable')
  return perm_slot[elem_perm], perm_epoch[elem_perm], rank, rank[order]


def vectorized_schedule(
  clients: CohortClients,
  *,
  seed: int,
  round_idx: int,
  num_steps: int,
  batch_size: int,
  local_epochs: int,
  local_steps: int,
  epochs: Optional[np.ndarray] = None,
  stream: int = 0,
):
  """`client_batches`' schedule for a whole cohort at once.

  The same rules as `client_batches` (epoch mode: a fresh permutation per
  epoch cut into ceil(n / B) batches, the last one partial; step mode: a
  stream of permutations cut into S full batches), with `_permutations`'
  counter-based draws instead of a generator per client.

  Args:
    clients: the cohort's R clients.
    seed, round_idx: with the client id, what the draws depend on.
    num_steps, batch_size, local_epochs, local_steps: see `num_local_steps`.
    epochs: optional int [R], each client's epochs (epoch mode), replacing
      local_epochs (FedU2's even schedule).
    stream: another value gives independent permutations (a second loader).

  Returns:
    (pos [R, S, B] int64 positions into ``clients.indices``, mask [R, S, B]
    bool); masked-out entries hold 0.
  """
  sizes = clients.sizes
  num_real = len(sizes)
  pos = np.zeros((num_real, num_steps, batch_size), np.int64)
  mask = np.zeros((num_real, num_steps, batch_size), bool)
  if local_steps > 0:
    needed = num_steps * batch_size
    epochs = np.where(sizes > 0, -(-needed // np.maximum(sizes, 1)), 0)
    slot, epoch, rank, value = _permutations(
      clients, epochs, seed=seed, round_idx=round_idx, stream=stream
    )
    # Elements come ordered by (slot, epoch, rank), i.e. by position in each
    # client's stream; every non-empty client keeps its first S * B.
    keep = epoch * sizes[slot] + rank < needed
    filled = sizes > 0
    pos[filled] = (clients.starts[slot] + value)[keep].reshape(
      -1, num_steps, batch_size
    )
    mask[filled] = True
    return pos, mask
  # Epoch mode.
  if epochs is None:
    epochs = np.full(num_real, local_epochs, np.int64)
  epochs = np.where(sizes > 0, epochs, 0)
  steps_per_epoch = -(-sizes // batch_size)
  too_long = epochs * steps_per_epoch > num_steps
  if too_long.any():
    r = int(np.argmax(too_long))
    raise ValueError(
      f'A client of {sizes[r]} examples needs {epochs[r]} x '
      f'{steps_per_epoch[r]} steps of {batch_size}, more than the '
      f'{num_steps} local steps; compute S with num_local_steps.'
    )
  slot, epoch, rank, value = _permutations(
    clients, epochs, seed=seed, round_idx=round_idx, stream=stream
  )
  step = epoch * steps_per_epoch[slot] + rank // batch_size
  col = rank % batch_size
  pos[slot, step, col] = clients.starts[slot] + value
  mask[slot, step, col] = True
  return pos, mask


def take(clients: CohortClients, pos: np.ndarray, mask: np.ndarray):
  """Example indices (int32, 0 where masked) at positions ``pos``."""
  if len(clients.indices) == 0:
    return np.zeros(pos.shape, np.int32)
  return np.where(mask, clients.indices[pos], 0).astype(np.int32)


def vectorized_batches(
  clients: CohortClients,
  labels: Optional[np.ndarray],
  *,
  seed: int,
  round_idx: int,
  **shape,
):
  """The default ``cohort_batches``: `vectorized_schedule`'s example indices.

  Returns (idx [R, S, B] int32, mask [R, S, B] bool).
  """
  del labels
  pos, mask = vectorized_schedule(
    clients, seed=seed, round_idx=round_idx, **shape
  )
  return take(clients, pos, mask), mask


def _check_client_ids(client_ids, num_clients: int):
  """A round's clients are distinct ids in [0, N): a repeated client would
  be trained twice and written back once (which write survives a scatter is
  unspecified), so executors would disagree."""
  ids = np.asarray(client_ids)
  if ids.size == 0:
    return
  if ids.min() < 0 or ids.max() >= num_clients:
    raise ValueError(
      f'client ids must be in [0, {num_clients}), got {ids.min()} to '
      f'{ids.max()}.'
    )
  repeats = ids.size - np.unique(ids).size
  if repeats:
    raise ValueError(
      f'a round samples each client at most once; {repeats} id(s) repeat.'
    )


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
  cohort_batches_fn: Optional[Callable[..., Any]] = None,
  sampler: str = 'per_client',
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
    cohort_batches_fn: the same schedule for the whole cohort (`engine.
      Algorithm.cohort_batches`), ``(clients: CohortClients, labels, *,
      seed, round_idx, **shape) -> (idx [R, S, B'], mask [R, S, B'])``; None
      means `vectorized_batches`. Used by the vectorized sampler.
    sampler: 'per_client' | 'vectorized' (module docstring).
  """
  if len(client_ids) > num_slots:
    raise ValueError(
      f'{len(client_ids)} clients do not fit in {num_slots} slots.'
    )
  if sampler not in SAMPLERS:
    raise ValueError(f'sampler={sampler!r}; expected one of {SAMPLERS}.')
  num_clients = len(partition)
  _check_client_ids(client_ids, num_clients)
  shape = dict(
    num_steps=num_steps,
    batch_size=batch_size,
    local_epochs=local_epochs,
    local_steps=local_steps,
  )
  if sampler == 'vectorized':
    if batches_fn is not None and cohort_batches_fn is None:
      raise ValueError(
        "This algorithm's batch schedule (client_batches) has no vectorized "
        "form (cohort_batches); use cohort_sampler='per_client'."
      )
    clients = gather_clients(client_ids, partition)
    idx, mask = (cohort_batches_fn or vectorized_batches)(
      clients, labels, seed=seed, round_idx=round_idx, **shape
    )
    real = len(clients.ids)
    pad = ((0, num_slots - real), (0, 0), (0, 0))
    return Cohort(
      np.pad(
        clients.ids.astype(np.int32),
        (0, num_slots - real),
        constant_values=num_clients,
      ),
      np.arange(num_slots) < real,
      np.pad(idx, pad),
      np.pad(mask, pad),
      np.pad(clients.sizes.astype(np.float32), (0, num_slots - real)),
    )
  if batches_fn is None:
    batches_fn = lambda indices, labels, rng, **shape: client_batches(
      indices, rng, **shape
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


def prefetch(fn, keys):
  """Yields ``fn(k)`` for each k of ``keys``, computing the next in a thread.

  The host builds the next call's cohorts (NumPy) while the device runs the
  current call, so cohort building leaves the critical path.
  """
  keys = list(keys)
  if not keys:
    return
  with concurrent.futures.ThreadPoolExecutor(max_workers=1) as pool:
    pending = pool.submit(fn, keys[0]) if keys else None
    for following in keys[1:] + [None]:
      current = pending
      pending = pool.submit(fn, following) if following is not None else None
      yield current.result()
