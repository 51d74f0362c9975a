"""The round engine: one federated round as pure functions over pytrees.

A round takes ``(server_state, client_table, cohort)`` and returns the new
``(server_state, client_table, metrics)``:

  gather the cohort's client-table rows -> local training of every slot
  (S optax steps; padded steps and padded examples are no-ops) ->
  ``client_final`` gives (update, weight, new row) -> scatter rows back
  (padding slots write nothing) -> weighted tree-map sum of the updates ->
  ``server_update``.

An `Algorithm` fills seven slots with pure functions; FedAvg's are the defaults
(algorithms/fedavg.py). Executors decide only *how* slots run; they all compute
the same function (tests/test_engine.py proves it):

  * ``vmap``: every slot at once, the whole round one jitted XLA program, the
    clients axis sharded over a device mesh. The default on GPU/TPU.
  * ``chunked``: ``lax.map`` over chunks of k slots inside one program; bounds
    memory for large cohorts. ``sequential`` is chunked with k = 1.
  * ``host``: a Python loop over real slots, each running jitted blocks of
    unrolled steps. The default on CPU, where XLA runs convolutions inside a
    while loop (scan / map) an order of magnitude slower than unrolled ones and
    vmapped per-client convolutions become slow grouped convolutions
    (../shared/notes/cpu-performance.md, benchmarks/cpu.md). It also skips
    blocks that are all padding, which the single program cannot.

Shape letters: N clients, C cohort slots, S local steps, B batch size.
"""

import functools
import os
from typing import Any, Callable, NamedTuple, Optional

import jax
import jax.numpy as jnp
from jax.experimental import multihost_utils
import numpy as np
import optax

from fedjax_metric.data.cohort import Cohort
from fedjax_metric.models import merge_variables, split_variables

EXECUTORS = ('vmap', 'chunked', 'sequential', 'host')


class ServerState(NamedTuple):
  """Global state. ``extra`` is the algorithm's own (e.g. past global models)."""
  variables: Any
  opt_state: Any
  round: jax.Array  # int32 scalar: rounds completed.
  extra: Any = ()


class Batch(NamedTuple):
  images: jax.Array      # float [B, H, W, C], preprocessed (and augmented).
  labels: jax.Array      # int32 [B]
  mask: jax.Array        # bool [B]; False for padded examples.
  raw_images: jax.Array  # uint8 [B, H, W, C]: for losses that draw their own
                         # augmented views (SSD); unused inputs cost nothing.


class ClientContext(NamedTuple):
  """What a client's loss and step hooks may read besides params and batch."""
  server_state: ServerState
  client_row: Any     # this client's persistent row of the client table, or ().
  local_state: Any    # per-round state the algorithm carries across steps.
  client_id: jax.Array
  key: jax.Array      # depends on (seed, round, client id, step) only.
  step: jax.Array


class Aggregate(NamedTuple):
  """The cohort's contribution, already reduced over slots.

  ``update_sum = sum_c w_c * update_c`` with ``w_c = 0`` for padding slots.
  """
  update_sum: Any
  weight_sum: jax.Array
  num_participants: jax.Array
  client_ids: jax.Array   # [C]
  slot_mask: jax.Array    # [C]


class Algorithm(NamedTuple):
  """A federated algorithm: seven pure functions, hyperparameters closed over.

  Attributes:
    init_client: ``(variables, key) -> row`` for ONE client; the engine vmaps
      it over N per-client keys into the client table. Return ``()`` for
      stateless algorithms.
    init_server_extra: ``(variables, num_clients) -> extra`` server state.
    client_begin: ``(server_state, client_row, client_id) -> local_state``, the
      per-round state carried through local steps (e.g. a frozen model).
    client_loss: ``(params, model_state, batch, ctx) -> (loss, (model_state,
      metrics))``, differentiated w.r.t. params; loss is a masked mean.
    client_step_end: ``(local_state, params, model_state, ctx) ->
      local_state``, after each optimizer step (e.g. a ring buffer of models).
    client_final: ``(server_state, client_row, client_id, local_state,
      end_variables, num_examples) -> (update, weight, new_row)``; may read
      per-client server state (e.g. participation counters) by client_id.
    server_update: ``(server_state, aggregate, client_table) -> server_state``.
    client_batches: optional, host-side (NumPy): ``(example_indices, labels,
      rng, *, num_steps, batch_size, local_epochs, local_steps) -> (idx [S, B'],
      mask [S, B'])``, the client's batch schedule; None means
      `cohort.client_batches`. FedQuad uses it to lay out each step as
      [anchors | positives | negatives_1 | negatives_2].
  """
  init_client: Callable[..., Any]
  init_server_extra: Callable[..., Any]
  client_begin: Callable[..., Any]
  client_loss: Callable[..., Any]
  client_step_end: Callable[..., Any]
  client_final: Callable[..., Any]
  server_update: Callable[..., Any]
  client_batches: Optional[Callable[..., Any]] = None


class LocalCarry(NamedTuple):
  params: Any
  model_state: Any
  opt_state: Any
  local_state: Any
  loss_sum: jax.Array       # sum over real examples of the step's mean loss
  example_count: jax.Array
  num_examples: jax.Array   # the client's dataset size: epoch boundaries


class RoundSpec(NamedTuple):
  """Everything static a round needs, closed over by the jitted functions.

  Attributes:
    algorithm: the `Algorithm`.
    client_optimizer: ``learning_rate -> optax.GradientTransformation``.
    learning_rate: ``round -> local learning rate`` (an optax schedule).
    preprocess: ``(images uint8 [B,H,W,C], key) -> float images``.
    seed: base of every PRNG key.
    local_epoch_decay: the local learning rate is multiplied by
      ``local_epoch_decay ** e`` in local epoch e of a round (FedRCL's
      per-epoch LambdaLR, methods.md 1.3); 1.0 turns it off.
  """
  algorithm: Algorithm
  client_optimizer: Callable[[Any], optax.GradientTransformation]
  learning_rate: Callable[[Any], Any]
  preprocess: Callable[..., Any]
  seed: int
  local_epoch_decay: float = 1.0


class DeviceData(NamedTuple):
  images: jax.Array  # uint8 [num_examples, H, W, C]
  labels: jax.Array  # int32 [num_examples]


# ---------------------------------------------------------------------------
# Client table and server state.
# ---------------------------------------------------------------------------


def init_state(algorithm: Algorithm, variables, num_clients: int,
               server_optimizer: optax.GradientTransformation, key=None,
               memory_budget: int | None = None):
  """Initial ``(server_state, client_table)``; the table has N rows.

  Row k is ``init_client(variables, fold_in(key, k))``. With a
  ``memory_budget`` (bytes per device), a table that cannot fit raises
  `MemoryBudgetError` before anything is allocated.
  """
  if memory_budget is not None:
    check_client_table_fits(
        client_table_bytes(algorithm, variables, num_clients), num_clients,
        memory_budget)
  # Copies: rounds donate the state's buffers, the caller keeps `variables`.
  variables = jax.tree.map(jnp.array, variables)
  key = jax.random.key(0) if key is None else key
  keys = jax.vmap(lambda k: jax.random.fold_in(key, k))(jnp.arange(num_clients))
  client_table = jax.jit(jax.vmap(algorithm.init_client, in_axes=(None, 0)))(
      variables, keys)
  server_state = ServerState(
      variables=variables,
      opt_state=server_optimizer.init(variables['params']),
      round=jnp.zeros((), jnp.int32),
      extra=algorithm.init_server_extra(variables, num_clients))
  return server_state, client_table


def gather_rows(client_table, client_ids):
  # Padding slots carry id N: 'clip' reads row N-1, which nothing uses.
  return jax.tree.map(lambda t: t.at[client_ids].get(mode='clip'), client_table)


def scatter_rows(client_table, client_ids, rows):
  # Id N is out of range, so 'drop' discards the padding slots' writes.
  return jax.tree.map(lambda t, r: t.at[client_ids].set(r, mode='drop'),
                      client_table, rows)


def weighted_sum(weights, stacked):
  """``sum_c weights[c] * stacked[c]`` for every leaf: the aggregation."""
  return jax.tree.map(
      lambda x: jnp.tensordot(weights.astype(x.dtype), x, axes=1), stacked)


def tree_where(pred, on_true, on_false):
  return jax.tree.map(lambda a, b: jnp.where(pred, a, b), on_true, on_false)


# ---------------------------------------------------------------------------
# Local training of one client: begin -> S steps -> finish.
# ---------------------------------------------------------------------------


def client_key(spec: RoundSpec, round_idx, client_id):
  key = jax.random.fold_in(jax.random.key(spec.seed), round_idx)
  return jax.random.fold_in(key, client_id)


def client_begin(spec: RoundSpec, server_state, client_row, client_id,
                 num_examples):
  """The carry at step 0: global params, fresh optimizer state."""
  params, model_state = split_variables(server_state.variables)
  tx = spec.client_optimizer(spec.learning_rate(server_state.round))
  local_state = spec.algorithm.client_begin(server_state, client_row, client_id)
  zero = jnp.zeros((), jnp.float32)
  return LocalCarry(params, model_state, tx.init(params), local_state, zero,
                    zero, jnp.asarray(num_examples, jnp.float32))


def local_step(spec: RoundSpec, data: DeviceData, server_state, client_row,
               client_id, carry: LocalCarry, example_idx, example_mask, step):
  """One optax step on one batch; a step with no real example is a no-op.

  Args:
    example_idx: int32 [B]; example_mask: bool [B]; step: int32 scalar.
  """
  alg = spec.algorithm
  key = jax.random.fold_in(client_key(spec, server_state.round, client_id), step)
  augment_key, loss_key = jax.random.split(key)
  raw_images = data.images[example_idx]
  batch = Batch(spec.preprocess(raw_images, augment_key),
                data.labels[example_idx], example_mask, raw_images)
  ctx = ClientContext(server_state, client_row, carry.local_state, client_id,
                      loss_key, step)
  grad_fn = jax.value_and_grad(alg.client_loss, has_aux=True)
  (loss, (model_state, _)), grads = grad_fn(
      carry.params, carry.model_state, batch, ctx)
  tx = spec.client_optimizer(spec.learning_rate(server_state.round))
  updates, opt_state = tx.update(grads, carry.opt_state, carry.params)
  if spec.local_epoch_decay != 1.0:
    factor = local_epoch_factor(spec.local_epoch_decay, step,
                                carry.num_examples, example_idx.shape[0])
    updates = jax.tree.map(lambda u: u * factor, updates)
  params = optax.apply_updates(carry.params, updates)
  local_state = alg.client_step_end(carry.local_state, params, model_state, ctx)
  count = jnp.sum(example_mask.astype(jnp.float32))
  new = carry._replace(params=params, model_state=model_state,
                       opt_state=opt_state, local_state=local_state,
                       loss_sum=carry.loss_sum + loss * count,
                       example_count=carry.example_count + count)
  return tree_where(count > 0, new, carry)


def local_epoch_factor(decay, step, num_examples, batch_size):
  """``decay ** e`` with e = step // ceil(n_k / B), the step's local epoch.

  Scaling the optimizer's final update by it equals scaling its learning rate
  (PyTorch's LambdaLR) for SGD with or without momentum and for Adam: each
  applies ``p -= lr * direction`` with a direction that does not depend on lr.
  Epochs are counted in batches of B examples, no drop_last (the reference).
  """
  steps_per_epoch = jnp.maximum(jnp.ceil(num_examples / batch_size), 1.0)
  epoch = jnp.floor(step.astype(jnp.float32) / steps_per_epoch)
  return jnp.asarray(decay, jnp.float32) ** epoch


def run_steps(spec, data, server_state, client_row, client_id, carry,
              example_idx, example_mask, first_step, *, unroll):
  """`local_step` over the leading axis of ``example_idx`` [K, B] (a scan)."""
  steps = first_step + jnp.arange(example_idx.shape[0], dtype=jnp.int32)

  def body(carry, inputs):
    return local_step(spec, data, server_state, client_row, client_id, carry,
                      *inputs), None

  carry, _ = jax.lax.scan(body, carry, (example_idx, example_mask, steps),
                          unroll=unroll)
  return carry


def client_finish(spec: RoundSpec, server_state, client_row, client_id, carry,
                  num_examples):
  """-> (update, weight, new_row, (loss_sum, example_count))."""
  end_variables = merge_variables(carry.params, carry.model_state)
  update, weight, new_row = spec.algorithm.client_final(
      server_state, client_row, client_id, carry.local_state, end_variables,
      num_examples)
  return update, weight, new_row, (carry.loss_sum, carry.example_count)


def client_update(spec, data, server_state, client_row, client_id, example_idx,
                  example_mask, num_examples, *, unroll):
  """One client's whole local training: [S, B] indices -> finish outputs."""
  carry = client_begin(spec, server_state, client_row, client_id,
                       num_examples)
  carry = run_steps(spec, data, server_state, client_row, client_id, carry,
                    example_idx, example_mask, jnp.zeros((), jnp.int32),
                    unroll=unroll)
  return client_finish(spec, server_state, client_row, client_id, carry,
                       num_examples)


def finish_round(spec: RoundSpec, server_state, client_table, cohort, update_sum,
                 weight_sum, loss_sum, example_count):
  aggregate = Aggregate(update_sum, weight_sum,
                        jnp.sum(cohort.slot_mask.astype(jnp.float32)),
                        cohort.client_ids, cohort.slot_mask)
  server_state = spec.algorithm.server_update(server_state, aggregate,
                                              client_table)
  metrics = {'train_loss_sum': loss_sum, 'train_examples': example_count}
  return server_state, client_table, metrics


# ---------------------------------------------------------------------------
# Executors.
# ---------------------------------------------------------------------------


def single_program_round(spec: RoundSpec, data, server_state, client_table,
                         cohort: Cohort, *, chunk_size: int = 0,
                         unroll: int | bool = 1):
  """The whole round as one traceable function (``vmap`` / ``chunked``).

  ``chunk_size = 0`` vmaps all C slots; k > 0 scans over ceil(C / k) chunks of
  k vmapped slots (`chunked_round`; k = 1 is the sequential form).
  """
  if chunk_size:
    return chunked_round(spec, data, server_state, client_table, cohort,
                         chunk_size=chunk_size, unroll=unroll)
  client_table, *sums = vmapped_slots(spec, data, server_state, client_table,
                                      cohort, unroll=unroll)
  return finish_round(spec, server_state, client_table, cohort, *sums)


def vmapped_slots(spec: RoundSpec, data, server_state, client_table,
                  cohort: Cohort, *, unroll):
  """Trains the cohort's slots side by side (vmap) and reduces over them.

  Returns ``(client_table with the new rows, update_sum, weight_sum,
  loss_sum, example_count)``; padding slots get weight 0 and write no row.
  """
  rows = gather_rows(client_table, cohort.client_ids)
  per_client = functools.partial(client_update, spec, data, server_state,
                                 unroll=unroll)
  updates, weights, new_rows, (loss_sums, counts) = jax.vmap(per_client)(
      rows, cohort.client_ids, cohort.example_idx, cohort.example_mask,
      cohort.num_examples)
  weights = jnp.where(cohort.slot_mask, weights, 0.0)
  return (scatter_rows(client_table, cohort.client_ids, new_rows),
          weighted_sum(weights, updates), jnp.sum(weights),
          jnp.sum(loss_sums), jnp.sum(counts))


def pad_cohort(cohort: Cohort, num_slots: int) -> Cohort:
  """Appends padding slots up to ``num_slots``: no steps, no weight.

  Their client id is int32 max: out of range, so gathers clip and scatters
  drop, as for the cohort's own padding slots.
  """
  pad = num_slots - cohort.client_ids.shape[0]
  if pad == 0:
    return cohort
  def pad_leaf(x, value):
    widths = [(0, pad)] + [(0, 0)] * (x.ndim - 1)
    return jnp.pad(x, widths, constant_values=value)
  return cohort._replace(
      client_ids=pad_leaf(cohort.client_ids, jnp.iinfo(jnp.int32).max),
      slot_mask=pad_leaf(cohort.slot_mask, False),
      example_idx=pad_leaf(cohort.example_idx, 0),
      example_mask=pad_leaf(cohort.example_mask, False),
      num_examples=pad_leaf(cohort.num_examples, 0))


def chunked_round(spec: RoundSpec, data, server_state, client_table,
                  cohort: Cohort, *, chunk_size: int, unroll: int | bool = 1):
  """The round as a scan over chunks of k vmapped slots.

  Memory is O(k * one client's training + model + client table) for any C:
  each chunk's weighted updates are summed into the scan carry and its rows
  scattered into the table before the next chunk runs, so no [C, ...] stack
  of updates exists. Chunk j holds slots j, j + m, j + 2m, ... (m = C / k):
  with the clients axis sharded over D devices and D | k, every chunk has
  k / D slots on each device, so all devices work at every scan step.
  """
  k = chunk_size
  num_chunks = -(-cohort.client_ids.shape[0] // k)
  # [C, ...] -> [k, m, ...] -> [m, k, ...]: the scan runs over m chunks.
  chunks = jax.tree.map(
      lambda x: jnp.swapaxes(x.reshape((k, num_chunks) + x.shape[1:]), 0, 1),
      pad_cohort(cohort, num_chunks * k))

  def one_chunk(carry, chunk):
    table, *sums = carry
    table, *chunk_sums = vmapped_slots(spec, data, server_state, table, chunk,
                                       unroll=unroll)
    return (table, *jax.tree.map(jnp.add, sums, chunk_sums)), None

  zero = jnp.zeros((), jnp.float32)
  carry = (client_table, _zero_update(spec, server_state, client_table),
           zero, zero, zero)
  (client_table, *sums), _ = jax.lax.scan(one_chunk, carry, chunks)
  return finish_round(spec, server_state, client_table, cohort, *sums)


def make_single_program_round_fn(spec, data, *, chunk_size=0, unroll=1):
  """Jitted ``(server_state, client_table, cohort) -> (state, table, metrics)``.

  Sharding comes from the inputs: with a mesh, callers replicate the state and
  data and place the cohort with `shard_cohort`; XLA turns the
  weighted sum over the sharded clients axis into an all-reduce.
  """

  # The dataset is an argument, not a closure: a closed-over array would be
  # baked into the program as a constant.
  @functools.partial(jax.jit, donate_argnums=(0, 1))
  def jitted(server_state, client_table, cohort, data):
    return single_program_round(spec, data, server_state, client_table, cohort,
                                chunk_size=chunk_size, unroll=unroll)

  def round_fn(server_state, client_table, cohort):
    return jitted(server_state, client_table, cohort, data)

  round_fn.jitted = jitted
  return round_fn


class HostLoopFns(NamedTuple):
  """The jitted pieces the ``host`` executor strings together."""
  zero_accumulator: Callable
  begin: Callable
  steps: Callable
  finish: Callable
  whole_client: Callable
  server: Callable


def make_host_loop_round_fn(spec, data, *, steps_per_call: int, unroll=True):
  """A round as a Python loop over real slots of jitted unrolled step blocks.

  Each slot: gather its row and start (one call), ``ceil(S / steps_per_call)``
  calls of `run_steps` (blocks whose steps are all padding are skipped; they
  would be no-ops), then one call that computes the update, scatters the row
  and adds ``weight * update`` into a running sum. When all S steps fit one
  block, the three are fused into one call per slot (``whole_client``):
  dispatch, not arithmetic, dominates small clients. Memory stays O(model):
  no stacked [C, ...] updates exist. Every function compiles once per run.
  """

  def begin_body(server_state, client_table, client_id, num_examples):
    row = gather_rows(client_table, client_id)
    return row, client_begin(spec, server_state, row, client_id, num_examples)

  def steps_body(server_state, row, client_id, carry, example_idx,
                 example_mask, first_step, data):
    return run_steps(spec, data, server_state, row, client_id, carry,
                     example_idx, example_mask, first_step, unroll=unroll)

  def finish_body(server_state, client_table, row, client_id, accumulator,
                  carry, num_examples):
    update, weight, new_row, (loss_sum, count) = client_finish(
        spec, server_state, row, client_id, carry, num_examples)
    client_table = scatter_rows(client_table, client_id, new_row)
    update_sum, weight_sum, loss_total, count_total = accumulator
    accumulator = (jax.tree.map(lambda s, u: s + weight * u, update_sum, update),
                   weight_sum + weight, loss_total + loss_sum,
                   count_total + count)
    return client_table, accumulator

  @functools.partial(jax.jit, donate_argnums=(1, 2))
  def whole_client(server_state, client_table, accumulator, client_id,
                   num_examples, example_idx, example_mask, data):
    row, carry = begin_body(server_state, client_table, client_id,
                            num_examples)
    carry = steps_body(server_state, row, client_id, carry, example_idx,
                       example_mask, jnp.zeros((), jnp.int32), data)
    return finish_body(server_state, client_table, row, client_id,
                       accumulator, carry, num_examples)

  @jax.jit
  def zero_accumulator(server_state, client_table):
    # Made on the device: a jnp.zeros here would be a host-to-device transfer.
    # The four outputs are distinct buffers, as `finish` donates them.
    return (_zero_update(spec, server_state, client_table),
            *(jnp.zeros((), jnp.float32) for _ in range(3)))

  @functools.partial(jax.jit, donate_argnums=(0, 1))
  def server(server_state, client_table, cohort, accumulator):
    return finish_round(spec, server_state, client_table, cohort, *accumulator)

  fns = HostLoopFns(zero_accumulator, jax.jit(begin_body), jax.jit(steps_body),
                    jax.jit(finish_body, donate_argnums=(1, 4)), whole_client,
                    server)

  def round_fn(server_state, client_table, cohort: Cohort):
    host = jax.tree.map(np.asarray, cohort)  # The host needs the masks.
    num_steps = host.example_idx.shape[1]
    k = min(steps_per_call, num_steps)
    # Pad S to a multiple of k with all-padding steps, which are no-ops.
    pad = (-num_steps) % k
    example_idx = np.pad(host.example_idx, ((0, 0), (0, pad), (0, 0)))
    example_mask = np.pad(host.example_mask, ((0, 0), (0, pad), (0, 0)))
    accumulator = fns.zero_accumulator(server_state, client_table)
    for slot in np.flatnonzero(host.slot_mask):
      # One transfer per slot of its index arrays, which the round needs anyway.
      if num_steps + pad == k:
        inputs = jax.device_put((host.client_ids[slot], host.num_examples[slot],
                                 example_idx[slot], example_mask[slot]))
        client_table, accumulator = fns.whole_client(
            server_state, client_table, accumulator, *inputs, data)
        continue
      live_blocks = [first for first in range(0, num_steps + pad, k)
                     if example_mask[slot, first:first + k].any()]
      client_id, num_examples, blocks = jax.device_put(
          (host.client_ids[slot], host.num_examples[slot],
           [(example_idx[slot, f:f + k], example_mask[slot, f:f + k],
             np.int32(f)) for f in live_blocks]))
      row, carry = fns.begin(server_state, client_table, client_id,
                             num_examples)
      for block in blocks:
        carry = fns.steps(server_state, row, client_id, carry, *block, data)
      client_table, accumulator = fns.finish(server_state, client_table, row,
                                             client_id, accumulator, carry,
                                             num_examples)
    return fns.server(server_state, client_table, jax.device_put(host),
                      accumulator)

  round_fn.fns = fns
  return round_fn


def _zero_update(spec, server_state, client_table):
  """Zeros shaped like one client's update (found by abstract evaluation)."""
  def one_update(server_state, client_table):
    row = gather_rows(client_table, jnp.zeros((), jnp.int32))
    carry = client_begin(spec, server_state, row, jnp.zeros((), jnp.int32),
                         jnp.zeros((), jnp.float32))
    update, *_ = client_finish(spec, server_state, row,
                               jnp.zeros((), jnp.int32), carry,
                               jnp.zeros((), jnp.float32))
    return update
  shapes = jax.eval_shape(one_update, server_state, client_table)
  return jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), shapes)


# ---------------------------------------------------------------------------
# Memory: the client table's size up front, and the chunk size from a budget.
# ---------------------------------------------------------------------------


class MemoryBudgetError(MemoryError):
  """The run cannot fit the memory budget; the message says what to change."""


def default_memory_budget(device=None) -> int:
  """Bytes one device may use: 80% of an accelerator's memory limit, or on
  CPU half the machine's RAM split over the (simulated) CPU devices."""
  device = device or jax.local_devices()[0]
  stats = device.memory_stats() if hasattr(device, 'memory_stats') else None
  if stats and stats.get('bytes_limit'):
    return int(0.8 * stats['bytes_limit'])
  ram = os.sysconf('SC_PHYS_PAGES') * os.sysconf('SC_PAGE_SIZE')
  return int(0.5 * ram / max(1, len(jax.local_devices(backend='cpu'))))


def tree_bytes(tree) -> int:
  """Bytes of a pytree of arrays or ShapeDtypeStructs."""
  return sum(int(np.prod(x.shape)) * np.dtype(x.dtype).itemsize
             for x in jax.tree.leaves(tree))


def client_table_bytes(algorithm: Algorithm, variables, num_clients: int) -> int:
  """Bytes of the N-row client table, found without allocating it."""
  row = jax.eval_shape(algorithm.init_client, variables, jax.random.key(0))
  return num_clients * tree_bytes(row)


def check_client_table_fits(table_bytes: int, num_clients: int,
                            budget_bytes: int):
  """Raises `MemoryBudgetError` (with the options) if the table cannot fit.

  The table is replicated on every device of the mesh, so the budget is one
  device's. Checked before allocation: the alternative is an out-of-memory
  crash minutes into a run.
  """
  if table_bytes <= budget_bytes:
    return
  gb = 1024 ** 3
  row = table_bytes / max(num_clients, 1)
  raise MemoryBudgetError(
      f'The per-client state table needs {table_bytes / gb:.2f} GiB '
      f'({num_clients:,} clients x {row / 1024 ** 2:.2f} MiB per client), more '
      f'than the memory budget of {budget_bytes / gb:.2f} GiB per device. '
      'Options: fewer clients (--config.num_clients); fewer history/buffer '
      'slots for algorithms that keep several models per client; a smaller '
      'model; or a larger --config.memory_budget_gb if the device really has '
      'the memory. (Chunking bounds the round\'s working memory, not the '
      'table, which every round reads and writes.)')


def chunk_memory_model(spec: RoundSpec, data, server_state, client_table,
                       example_shape, *, unroll=1):
  """``(fixed_bytes, bytes_per_slot)`` of the chunked round, from XLA.

  Compiles the chunked round for cohorts of 1 and 2 slots (one chunk each)
  and reads XLA's buffer assignment (arguments + temporaries + outputs -
  donated aliases). Working memory grows linearly in the chunk size k, so
  two points fix the line. ``example_shape`` is a slot's [S, B].
  """
  def cohort_of(k):
    spec_of = jax.ShapeDtypeStruct
    return Cohort(spec_of((k,), jnp.int32), spec_of((k,), jnp.bool_),
                  spec_of((k, *example_shape), jnp.int32),
                  spec_of((k, *example_shape), jnp.bool_),
                  spec_of((k,), jnp.float32))

  def total(k):
    fn = make_single_program_round_fn(spec, data, chunk_size=k, unroll=unroll)
    analysis = fn.jitted.lower(server_state, client_table, cohort_of(k),
                               data).compile().memory_analysis()
    return (analysis.argument_size_in_bytes + analysis.temp_size_in_bytes +
            analysis.output_size_in_bytes - analysis.alias_size_in_bytes)

  one, two = total(1), total(2)
  per_slot = max(two - one, 1)
  return one - per_slot, per_slot


def choose_chunk_size(fixed_bytes: int, bytes_per_slot: int,
                      budget_bytes: int, num_slots: int,
                      num_devices: int = 1) -> int:
  """The largest chunk size k whose round fits ``budget_bytes`` per device.

  A chunk's k slots split over the D devices, so one device holds
  ``fixed + (k / D) * per_slot``. k is a multiple of D (each device gets the
  same share) and at most the cohort size rounded up to one.
  """
  per_device = (budget_bytes - fixed_bytes) // bytes_per_slot
  if per_device < 1:
    gb = 1024 ** 3
    raise MemoryBudgetError(
        f'Even one client per device needs {(fixed_bytes + bytes_per_slot) / gb:.2f} '
        f'GiB, over the memory budget of {budget_bytes / gb:.2f} GiB per '
        'device. Lower --config.local.batch_size, use a smaller model, or '
        'raise --config.memory_budget_gb if the device has the memory.')
  most = num_devices * -(-num_slots // num_devices)
  return int(min(per_device * num_devices, most))


# ---------------------------------------------------------------------------
# Sharding the clients axis.
# ---------------------------------------------------------------------------


def make_mesh(num_devices: int | None = None):
  """A 1-D mesh over the ``clients`` axis, over every process's devices.

  Axis type Auto, not the Explicit default of `jax.make_mesh`: indexing the
  replicated dataset with client-sharded indices raises a ShardingTypeError
  under Explicit axes. With several processes (`jax.distributed.initialize`)
  each runs the same program, so the mesh must hold all their devices.
  """
  if (num_devices and jax.process_count() > 1
      and num_devices != jax.device_count()):
    raise ValueError(
        f'num_devices={num_devices} with {jax.process_count()} processes: a '
        f'multi-process mesh spans all {jax.device_count()} devices. Set '
        '--config.num_devices=0.')
  devices = jax.devices()[:num_devices] if num_devices else jax.devices()
  return jax.sharding.Mesh(np.asarray(devices), ('clients',),
                           axis_types=(jax.sharding.AxisType.Auto,))


def shard_cohort(cohort: Cohort, mesh) -> Cohort:
  """Puts every cohort array on the mesh, split along its leading [C] axis."""
  sharding = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec('clients'))
  return put_global(cohort, sharding)


def replicate(tree, mesh):
  sharding = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
  return put_global(tree, sharding)


def put_global(tree, sharding):
  """`jax.device_put` onto ``sharding``, also when it spans several processes.

  One process: exactly `jax.device_put`. Several: every process holds the
  same full host value (cohorts, data and initial state are functions of the
  seed), so each builds only its own devices' shards with
  `jax.make_array_from_callback`. `jax.device_put` would first check that
  equality with a cross-process all-gather of every array, every round.
  """
  if jax.process_count() == 1:
    return jax.device_put(tree, sharding)
  return jax.tree.map(lambda x: _global_array(x, sharding), tree)


def _global_array(x, sharding):
  if isinstance(x, jax.Array) and not x.is_fully_addressable:
    return jax.device_put(x, sharding)  # Already global: a reshard.
  if isinstance(x, jax.Array) and jax.dtypes.issubdtype(
      x.dtype, jax.dtypes.prng_key):
    data = _global_array(jax.random.key_data(x), sharding)
    return jax.random.wrap_key_data(data, impl=jax.random.key_impl(x))
  value = np.asarray(x)
  return jax.make_array_from_callback(value.shape, sharding,
                                      lambda index: value[index])


def local_copy(tree):
  """Process-local copies of global arrays, for code outside the round.

  Evaluation jits over the test set held by this process; arrays spanning
  other processes' devices cannot enter that program. A replicated array's
  first local shard is its whole value; anything else is all-gathered, a
  collective every process must reach. Local arrays pass through unchanged.
  """
  def one(x):
    if not isinstance(x, jax.Array) or x.is_fully_addressable:
      return x
    if x.is_fully_replicated:
      return x.addressable_data(0)
    return multihost_utils.process_allgather(x, tiled=True)
  return jax.tree.map(one, tree)


def default_executor(backend: str | None = None) -> str:
  """``host`` on CPU (measured fastest, benchmarks/cpu.md), else ``vmap``."""
  backend = backend or jax.default_backend()
  return 'host' if backend == 'cpu' else 'vmap'


def make_round_fn(spec: RoundSpec, data: DeviceData, *, executor: str,
                  chunk_size: int = 0, steps_per_call: int = 10,
                  unroll: int | bool = 1):
  """Builds the round function for an executor name (see module docstring)."""
  if executor == 'auto':
    executor = default_executor()
  if executor == 'vmap':
    return make_single_program_round_fn(spec, data, unroll=unroll)
  if executor in ('chunked', 'sequential'):
    k = 1 if executor == 'sequential' else chunk_size
    if k < 1:
      raise ValueError('executor=chunked needs chunk_size >= 1 '
                       '(--config.chunk_size=K).')
    return make_single_program_round_fn(spec, data, chunk_size=k,
                                        unroll=unroll)
  if executor == 'host':
    return make_host_loop_round_fn(spec, data, steps_per_call=steps_per_call)
  raise ValueError(f'Unknown executor {executor!r}; choose one of '
                   f"{EXECUTORS + ('auto',)}.")
