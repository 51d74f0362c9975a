"""What one federated round computes, as pure functions over pytrees.

A round maps ``(server_state, client_table, cohort)`` to the new
``(server_state, client_table, metrics)``:

  gather the cohort's client-table rows -> for every slot: ``client_begin``,
  S optax steps on the client's batches (``client_loss``, then
  ``client_step_end``; padded steps and padded examples change nothing),
  ``client_final`` -> (update, weight, new row) -> scatter the rows back
  (padding slots write nothing) -> weighted tree-map sum of the updates ->
  ``server_update``.

An `Algorithm` is seven pure functions and an optional host-side batch
schedule, FedAvg's by default (algorithms/fedavg.py); its types live in
contract.py and are re-exported here. This module holds the initial state,
the client table, one client's local training (`client_update`), the
server step (`finish_round`), and the round as one traceable function
(`single_program_round`: every slot vmapped, or a scan over chunks of
them) with R rounds as one (`multi_round`, a scan over rounds). How a round
is run (jit, a Python loop over clients, chunk sizes, rounds per call) is
executors.py; memory budgets are memory.py; device meshes are sharding.py.

Public API: the types `Algorithm`, `ClientContext`, `Batch`, `ServerState`,
`Aggregate`, `RoundSpec` (from contract.py), `DeviceData` (data/cohort.py); `init_state`; the
table and reduction `gather_rows`, `scatter_rows`, `weighted_sum`,
`mask_slots`; `client_update` and the pieces the host executor cuts it into
(`client_inputs`, `start_client`, `run_steps`, `finish_client`);
`finish_round`, `zero_update`; `single_program_round`, `multi_round`.

Shape letters: N clients, C cohort slots, S local steps, B batch size.
"""

import functools
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import optax

from fedjax_metric.contract import (  # re-exported: engine.Algorithm etc.
  Aggregate as Aggregate,
)
from fedjax_metric.contract import (
  Algorithm as Algorithm,
)
from fedjax_metric.contract import (
  Batch as Batch,
)
from fedjax_metric.contract import (
  ClientContext as ClientContext,
)
from fedjax_metric.contract import (
  RoundSpec as RoundSpec,
)
from fedjax_metric.contract import (
  ServerState as ServerState,
)
from fedjax_metric.data.cohort import Cohort, table_rows
from fedjax_metric.data.cohort import DeviceData as DeviceData  # re-exported
from fedjax_metric.models import merge_variables, split_variables

# Fold-in values outside the range of step (and client) indices.
_BEGIN_KEY, _FINAL_KEY, _SERVER_KEY = 2**31 - 1, 2**31 - 2, 2**31 - 3


class _LocalCarry(NamedTuple):
  """What local training carries from step to step."""

  params: Any
  model_state: Any
  opt_state: Any
  local_state: Any
  loss_sum: jax.Array  # sum over real examples of the step's mean loss
  example_count: jax.Array
  # The loss's named terms (its aux dict: 'ce', 'metric', ...), summed like
  # loss_sum, so that a round logs each term and not only their total.
  term_sums: Any


class _ClientInputs(NamedTuple):
  """One slot's per-round inputs, fixed through its local training."""

  client_row: Any
  client_id: jax.Array
  slot: jax.Array
  num_examples: jax.Array  # float32
  num_steps: jax.Array  # float32: real steps
  example_idx: jax.Array  # int32 [S, B]: the round's batches
  example_mask: jax.Array  # bool [S, B]


# ---------------------------------------------------------------------------
# Client table and server state.
# ---------------------------------------------------------------------------


def init_state(algorithm: Algorithm, variables, num_clients: int, key=None):
  """Initial ``(server_state, client_table)``; the table has N rows.

  Row k is ``init_client(variables, fold_in(key, k))`` (`init_rows`); the
  server state is ``init_server(variables, N, fold_in(key, 2**31 - 3))``
  (`init_server_state`). Check the table's size first with
  `memory.check_client_table_fits` where memory is tight; a table that
  lives off the device (client_table.py) is never built whole.
  """
  key = jax.random.key(0) if key is None else key
  client_table = init_rows(algorithm, variables, key, jnp.arange(num_clients))
  return init_server_state(algorithm, variables, num_clients, key), client_table


def init_server_state(algorithm: Algorithm, variables, num_clients, key):
  """The server half of `init_state`."""
  # Copies: rounds donate the state's buffers, the caller keeps `variables`.
  variables = jax.tree.map(jnp.array, variables)
  # A fold-in value no client index reaches.
  server_key = jax.random.fold_in(key, _SERVER_KEY)
  return algorithm.init_server(variables, num_clients, server_key)


def init_rows(algorithm: Algorithm, variables, key, client_ids):
  """Initial rows of ``client_ids`` [K]: row k is ``init_client(variables,
  fold_in(key, k))``, the same whichever rows are made together (a table
  made in pieces equals one made whole)."""
  variables = jax.tree.map(jnp.array, variables)
  return _init_rows(algorithm.init_client, variables, key, client_ids)


@functools.partial(jax.jit, static_argnums=(0,))
def _init_rows(init_client, variables, key, client_ids):
  keys = jax.vmap(lambda k: jax.random.fold_in(key, k))(client_ids)
  return jax.vmap(init_client, in_axes=(None, 0))(variables, keys)


def gather_rows(client_table, client_ids):
  """The rows of ``client_ids`` [C]; padding ids (>= N) read row N - 1."""
  return jax.tree.map(lambda t: t.at[client_ids].get(mode='clip'), client_table)


def gathered(client_table, row_ids):
  """`gather_rows`, materialised before anything reads it.

  Why the barrier: XLA may fuse a gather into what consumes it, and the
  fused loop can sum in another order depending on the shape of the table
  gathered from, so the same rows from the whole [N, ...] table (the device
  placement) and from a call's [R * C, ...] rows (host or disk,
  client_table.py) could give results differing in the last bit. Behind
  the barrier both see the same [C, ...] array.
  """
  return jax.lax.optimization_barrier(gather_rows(client_table, row_ids))


def scatter_rows(client_table, client_ids, rows):
  """Writes ``rows`` [C, ...] at ``client_ids``; padding ids are dropped."""
  return jax.tree.map(
    lambda t, r: t.at[client_ids].set(r, mode='drop'), client_table, rows
  )


def weighted_sum(weights, stacked):
  """``sum_c weights[c] * stacked[c]`` for every leaf: the aggregation.

  weights [C] float; each leaf [C, ...] -> [...] in the leaf's dtype. An
  integer leaf (a counter in a client's state) is summed in float32 and
  rounded: cast to the leaf's dtype, fractional weights would become 0.
  """

  def combine(x):
    if jnp.issubdtype(x.dtype, jnp.inexact):
      return jnp.tensordot(weights.astype(x.dtype), x, axes=1)
    total = jnp.tensordot(
      weights.astype(jnp.float32), x.astype(jnp.float32), axes=1
    )
    return jnp.round(total).astype(x.dtype)

  return jax.tree.map(combine, stacked)


def _tree_where(pred, on_true, on_false):
  return jax.tree.map(lambda a, b: jnp.where(pred, a, b), on_true, on_false)


def mask_slots(slot_mask, stacked):
  """Every [C, ...] leaf of ``stacked`` with the rows of padding slots
  (``slot_mask`` [C] False) replaced by zeros, whatever they held."""

  def mask(x):
    keep = slot_mask.reshape((-1,) + (1,) * (x.ndim - 1))
    return jnp.where(keep, x, jnp.zeros_like(x))

  return jax.tree.map(mask, stacked)


# ---------------------------------------------------------------------------
# Local training of one client: start -> S steps -> finish.
# ---------------------------------------------------------------------------


def _client_key(spec: RoundSpec, round_idx, client_id, step):
  key = jax.random.fold_in(jax.random.key(spec.seed), round_idx)
  return jax.random.fold_in(jax.random.fold_in(key, client_id), step)


def _batch(spec: RoundSpec, data: DeviceData, example_idx, example_mask, key):
  raw_images = data.images[example_idx]
  return Batch(
    spec.preprocess(raw_images, key),
    data.labels[example_idx],
    example_mask,
    raw_images,
  )


def _batch_scanner(spec: RoundSpec, data: DeviceData, inputs: _ClientInputs):
  """``ctx.scan_batches`` of one client (see `ClientContext`)."""

  def scan_batches(fn, init):
    key = jax.random.key(spec.seed)

    def body(carry, step_inputs):
      return fn(carry, _batch(spec, data, *step_inputs, key)), None

    carry, _ = jax.lax.scan(
      body, init, (inputs.example_idx, inputs.example_mask)
    )
    return carry

  return scan_batches


def _context(
  spec: RoundSpec,
  data,
  server_state,
  inputs: _ClientInputs,
  local_state,
  step,
  key_data,
):
  return ClientContext(
    server_state=server_state,
    client_row=inputs.client_row,
    local_state=local_state,
    client_id=inputs.client_id,
    slot=inputs.slot,
    key=_client_key(spec, server_state.round, inputs.client_id, key_data),
    step=jnp.asarray(step, jnp.int32),
    learning_rate=jnp.asarray(
      spec.learning_rate(server_state.round), jnp.float32
    ),
    num_steps=inputs.num_steps,
    num_examples=inputs.num_examples,
    scan_batches=_batch_scanner(spec, data, inputs),
  )


def _client_optimizer(spec: RoundSpec, server_state):
  return spec.client_optimizer(spec.learning_rate(server_state.round))


def _loss_terms(terms):
  """A loss's aux dict as float32 scalars (a term that is not a scalar is
  averaged): what a round sums and logs as ``train_<name>``."""
  return {
    name: jnp.mean(jnp.asarray(value, jnp.float32))
    for name, value in terms.items()
  }


@functools.partial(jax.jit, static_argnums=(0,))
def start_client(spec: RoundSpec, data, server_state, inputs: _ClientInputs):
  """The carry at step 0: the start model, fresh optimizer state."""
  ctx = _context(spec, data, server_state, inputs, (), 0, _BEGIN_KEY)
  variables, local_state = spec.algorithm.client_begin(ctx)
  params, model_state = split_variables(variables)
  zero = jnp.zeros((), jnp.float32)
  # The loss's term names, found by abstract evaluation on the first batch.
  batch = _batch(
    spec, data, inputs.example_idx[0], inputs.example_mask[0], ctx.key
  )
  step_ctx = ctx._replace(local_state=local_state)
  _, (_, terms) = jax.eval_shape(
    lambda p, s, b: spec.algorithm.client_loss(p, s, b, step_ctx),
    params,
    model_state,
    batch,
  )
  return _LocalCarry(
    params,
    model_state,
    _client_optimizer(spec, server_state).init(params),
    local_state,
    zero,
    zero,
    dict.fromkeys(terms, zero),
  )


@functools.partial(jax.jit, static_argnums=(0,))
def _local_step(
  spec: RoundSpec,
  data: DeviceData,
  server_state,
  inputs,
  carry: _LocalCarry,
  example_idx,
  example_mask,
  step,
):
  """One optax step on one batch; a step with no real example is a no-op.

  Args:
    example_idx: int32 [B]; example_mask: bool [B]; step: int32 scalar.
  """
  alg = spec.algorithm
  ctx = _context(
    spec, data, server_state, inputs, carry.local_state, step, step
  )
  augment_key, loss_key = jax.random.split(ctx.key)
  batch = _batch(spec, data, example_idx, example_mask, augment_key)
  grad_fn = jax.value_and_grad(alg.client_loss, has_aux=True)
  (loss, (model_state, terms)), grads = grad_fn(
    carry.params, carry.model_state, batch, ctx._replace(key=loss_key)
  )
  updates, opt_state = _client_optimizer(spec, server_state).update(
    grads, carry.opt_state, carry.params
  )
  if spec.local_epoch_decay != 1.0:
    factor = _local_epoch_factor(
      spec.local_epoch_decay,
      step,
      inputs.num_examples,
      spec.batch_size or example_idx.shape[0],
    )
    updates = jax.tree.map(lambda u: u * factor, updates)
  params = optax.apply_updates(carry.params, updates)
  local_state = alg.client_step_end(params, model_state, ctx)
  count = jnp.sum(example_mask.astype(jnp.float32))
  new = carry._replace(
    params=params,
    model_state=model_state,
    opt_state=opt_state,
    local_state=local_state,
    loss_sum=carry.loss_sum + loss * count,
    example_count=carry.example_count + count,
    term_sums=jax.tree.map(
      lambda total, term: total + term * count,
      carry.term_sums,
      _loss_terms(terms),
    ),
  )
  return _tree_where(count > 0, new, carry)


def _local_epoch_factor(decay, step, num_examples, batch_size):
  """``decay ** e`` with e = step // ceil(n_k / B), the step's local epoch.

  Scaling the optimizer's final update by it equals scaling its learning rate
  (PyTorch's LambdaLR) for SGD with or without momentum and for Adam: each
  applies ``p -= lr * direction`` with a direction that does not depend on lr.
  Epochs are counted in batches of B examples, no drop_last (the reference).
  """
  steps_per_epoch = jnp.maximum(jnp.ceil(num_examples / batch_size), 1.0)
  epoch = jnp.floor(step.astype(jnp.float32) / steps_per_epoch)
  return jnp.asarray(decay, jnp.float32) ** epoch


def run_steps(
  spec,
  data,
  server_state,
  inputs,
  carry,
  example_idx,
  example_mask,
  first_step,
  *,
  unroll,
):
  """`_local_step` over the leading axis of ``example_idx`` [K, B] (a scan)."""
  steps = first_step + jnp.arange(example_idx.shape[0], dtype=jnp.int32)

  def body(carry, step_inputs):
    return _local_step(
      spec, data, server_state, inputs, carry, *step_inputs
    ), None

  carry, _ = jax.lax.scan(
    body, carry, (example_idx, example_mask, steps), unroll=unroll
  )
  return carry


@functools.partial(jax.jit, static_argnums=(0,))
def finish_client(spec: RoundSpec, data, server_state, inputs, carry):
  """-> (update, weight, new_row, (loss_sum, example_count, term_sums))."""
  ctx = _context(
    spec,
    data,
    server_state,
    inputs,
    carry.local_state,
    inputs.example_idx.shape[0],
    _FINAL_KEY,
  )
  end_variables = merge_variables(carry.params, carry.model_state)
  update, weight, new_row = spec.algorithm.client_final(end_variables, ctx)
  return (
    update,
    weight,
    new_row,
    (carry.loss_sum, carry.example_count, carry.term_sums),
  )


def client_inputs(
  client_row, client_id, slot, num_examples, example_idx, example_mask
):
  """A slot's `_ClientInputs` from its row, ids and [S, B] batch schedule."""
  num_steps = jnp.sum(jnp.any(example_mask, axis=-1).astype(jnp.float32))
  return _ClientInputs(
    client_row,
    jnp.asarray(client_id, jnp.int32),
    jnp.asarray(slot, jnp.int32),
    jnp.asarray(num_examples, jnp.float32),
    num_steps,
    example_idx,
    example_mask,
  )


# Jitted with the spec static (as are `start_client`, `_local_step` and
# `finish_client`), so that JAX traces one client's local training once per
# spec and slot shapes: the vmap and chunked executors, R rounds a call and
# the host loop (its whole-client call, or its begin / steps / finish calls)
# all run it on the same per-slot shapes and reuse that trace (vmap batches
# the traced program) instead of tracing the algorithm, model and optimizer
# again. Inside those programs the calls are inlined, so the compiled round
# is unchanged.
@functools.partial(jax.jit, static_argnums=(0,), static_argnames=('unroll',))
def client_update(
  spec,
  data,
  server_state,
  client_row,
  client_id,
  slot,
  example_idx,
  example_mask,
  num_examples,
  *,
  unroll,
):
  """One client's whole local training: [S, B] indices -> finish outputs."""
  inputs = client_inputs(
    client_row, client_id, slot, num_examples, example_idx, example_mask
  )
  carry = start_client(spec, data, server_state, inputs)
  carry = run_steps(
    spec,
    data,
    server_state,
    inputs,
    carry,
    example_idx,
    example_mask,
    jnp.zeros((), jnp.int32),
    unroll=unroll,
  )
  return finish_client(spec, data, server_state, inputs, carry)


def client_report(update, loss_sum, example_count):
  """One slot's per-client metrics (``RoundSpec.per_client``): its loss per
  real example, its number of real examples, and the global L2 norm of its
  whole update (the model delta, and for SCAFFOLD or FedProc their extra
  parts too). Scalars; vmapped over slots by the round."""
  return {
    'loss': loss_sum / jnp.maximum(example_count, 1.0),
    'examples': example_count,
    'update_norm': jnp.sqrt(
      sum(jnp.sum(jnp.square(x)) for x in jax.tree.leaves(update))
    ),
  }


def finish_round(
  spec: RoundSpec,
  server_state,
  client_table,
  cohort,
  update_sum,
  weight_sum,
  loss_sum,
  example_count,
  term_sums,
  per_slot=None,
):
  """The server's step on the reduced cohort, and the round's metrics:
  ``train_loss_sum``, ``train_examples`` and ``train_<term>_sum`` for each
  named term of the loss (sums over the round's real examples); with
  ``per_slot`` ([C] arrays of `client_report`), ``clients`` too, with the
  slots' ``client_id`` and ``slot_mask``."""
  aggregate = Aggregate(
    update_sum,
    weight_sum,
    jnp.sum(cohort.slot_mask.astype(jnp.float32)),
    cohort.client_ids,
    cohort.slot_mask,
    population(spec, client_table, cohort),
  )
  # The cohort's rows as this round left them: all the server may read of
  # the table (where the table lives off the device, nothing else is here).
  cohort_rows = gathered(client_table, table_rows(cohort))
  server_state = spec.algorithm.server_update(
    server_state, aggregate, cohort_rows
  )
  metrics = {'train_loss_sum': loss_sum, 'train_examples': example_count}
  metrics.update({f'train_{k}_sum': v for k, v in term_sums.items()})
  if per_slot:
    metrics['clients'] = {
      **per_slot,
      'client_id': cohort.client_ids,
      'slot_mask': cohort.slot_mask,
    }
  return server_state, client_table, metrics


def population(spec: RoundSpec, client_table, cohort) -> int:
  """N: ``spec.num_clients``, or the table's rows where the whole table is
  given (``cohort.row_ids`` None)."""
  if spec.num_clients:
    return spec.num_clients
  if cohort.row_ids is not None:
    raise ValueError(
      'RoundSpec.num_clients must be set when the client table holds only '
      "the cohort's rows (cohort.row_ids)."
    )
  leaves = jax.tree.leaves(client_table)
  return leaves[0].shape[0] if leaves else 0


def zero_update(spec, data, server_state, client_table, example_shape):
  """Zeros shaped like one client's update and like its loss-term sums
  (found by abstract evaluation): ``(update, term_sums)``.

  ``example_shape`` is a slot's [S, B].
  """

  def one_update(server_state, client_table, data):
    zero = jnp.zeros((), jnp.int32)
    inputs = client_inputs(
      gather_rows(client_table, zero),
      zero,
      zero,
      0.0,
      jnp.zeros(example_shape, jnp.int32),
      jnp.zeros(example_shape, bool),
    )
    carry = start_client(spec, data, server_state, inputs)
    update, *_ = finish_client(spec, data, server_state, inputs, carry)
    return update, carry.term_sums

  shapes = jax.eval_shape(one_update, server_state, client_table, data)
  return jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), shapes)


# The round as one program, and R rounds as one program.


def single_program_round(
  spec: RoundSpec,
  data,
  server_state,
  client_table,
  cohort: Cohort,
  *,
  chunk_size: int = 0,
  unroll: int | bool = 1,
):
  """The whole round as one traceable function (``vmap`` / ``chunked``).

  ``chunk_size = 0`` vmaps all C slots; k > 0 scans over ceil(C / k) chunks of
  k vmapped slots (`_chunked_round`; k = 1 is the sequential form).
  """
  if chunk_size:
    return _chunked_round(
      spec,
      data,
      server_state,
      client_table,
      cohort,
      chunk_size=chunk_size,
      unroll=unroll,
    )
  slots = jnp.arange(cohort.client_ids.shape[0], dtype=jnp.int32)
  client_table, sums, per_slot = _vmapped_slots(
    spec, data, server_state, client_table, cohort, slots, unroll=unroll
  )
  return finish_round(
    spec, server_state, client_table, cohort, *sums, per_slot=per_slot
  )


def multi_round(
  spec: RoundSpec,
  data,
  server_state,
  client_table,
  cohorts: Cohort,
  *,
  chunk_size: int = 0,
  unroll: int | bool = 1,
):
  """R rounds as one traceable function: a ``lax.scan`` of
  `single_program_round` over the leading [R] axis of ``cohorts``.

  Every key, learning rate and schedule inside a round is a function of
  ``server_state.round``, which each round advances, so R rounds here
  compute what R separate calls compute; the host only returns every R
  rounds (to evaluate, log, checkpoint). Why: with tiny rounds (one local
  step of a few clients) the host round trip, not the arithmetic, is the
  cost of a round.

  Args:
    cohorts: a `Cohort` whose leaves have a leading [R] axis (round r's
      cohort at index r).

  Returns:
    ``(server_state, client_table, metrics)``; each metric has shape [R]
    (per-client reports, ``metrics['clients']``, [R, C]).
  """

  def one_round(carry, cohort):
    state, table = carry
    state, table, metrics = single_program_round(
      spec, data, state, table, cohort, chunk_size=chunk_size, unroll=unroll
    )
    return (state, table), metrics

  (server_state, client_table), metrics = jax.lax.scan(
    one_round, (server_state, client_table), cohorts
  )
  return server_state, client_table, metrics


def _vmapped_slots(
  spec: RoundSpec,
  data,
  server_state,
  client_table,
  cohort: Cohort,
  slots,
  *,
  unroll,
):
  """Trains the cohort's slots side by side (vmap) and reduces over them.

  Returns ``(client_table with the new rows, (update_sum, weight_sum,
  loss_sum, example_count, term_sums), per_slot)``; padding slots get
  weight 0 and write no row. ``per_slot`` is {} unless ``spec.per_client``:
  then [C] arrays of `engine.client_report`, zero for padding slots.
  """
  rows = gathered(client_table, table_rows(cohort))
  per_client = functools.partial(
    client_update, spec, data, server_state, unroll=unroll
  )
  updates, weights, new_rows, (loss_sums, counts, term_sums) = jax.vmap(
    per_client
  )(
    rows,
    cohort.client_ids,
    slots,
    cohort.example_idx,
    cohort.example_mask,
    cohort.num_examples,
  )
  # Padding is removed by selection, not by a zero weight: 0 * inf is NaN,
  # and a hook may divide by a padding slot's zero example count.
  weights = jnp.where(cohort.slot_mask, weights, 0.0)
  updates = mask_slots(cohort.slot_mask, updates)
  per_slot = {}
  if spec.per_client:
    per_slot = mask_slots(
      cohort.slot_mask, jax.vmap(client_report)(updates, loss_sums, counts)
    )
  sums = (
    weighted_sum(weights, updates),
    jnp.sum(weights),
    jnp.sum(loss_sums),
    jnp.sum(counts),
    jax.tree.map(jnp.sum, term_sums),
  )
  return (
    scatter_rows(client_table, table_rows(cohort), new_rows),
    sums,
    per_slot,
  )


def _pad_cohort(cohort: Cohort, num_slots: int) -> Cohort:
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

  out_of_range = jnp.iinfo(jnp.int32).max
  if cohort.row_ids is not None:
    cohort = cohort._replace(row_ids=pad_leaf(cohort.row_ids, out_of_range))
  return cohort._replace(
    client_ids=pad_leaf(cohort.client_ids, out_of_range),
    slot_mask=pad_leaf(cohort.slot_mask, False),
    example_idx=pad_leaf(cohort.example_idx, 0),
    example_mask=pad_leaf(cohort.example_mask, False),
    num_examples=pad_leaf(cohort.num_examples, 0),
  )


def _chunked_round(
  spec: RoundSpec,
  data,
  server_state,
  client_table,
  cohort: Cohort,
  *,
  chunk_size: int,
  unroll: int | bool = 1,
):
  """The round as a scan over chunks of k vmapped slots.

  Memory is O(k * one client's training + model + client table) for any C:
  each chunk's weighted updates are summed into the scan carry and its rows
  scattered into the table before the next chunk runs, so no [C, ...] stack
  of updates exists. Chunk j holds slots j, j + m, j + 2m, ... (m = C / k):
  with the clients axis sharded over D devices and D | k, every chunk has
  k / D slots on each device, so all devices work at every scan step.
  """
  k = chunk_size
  num_slots = cohort.client_ids.shape[0]
  num_chunks = -(-num_slots // k)
  padded = _pad_cohort(cohort, num_chunks * k)
  slots = jnp.arange(num_chunks * k, dtype=jnp.int32)
  # [C, ...] -> [k, m, ...] -> [m, k, ...]: the scan runs over m chunks.
  chunks = jax.tree.map(
    lambda x: jnp.swapaxes(x.reshape((k, num_chunks) + x.shape[1:]), 0, 1),
    (padded, slots),
  )

  def one_chunk(carry, chunk):
    table, *sums = carry
    table, chunk_sums, per_slot = _vmapped_slots(
      spec, data, server_state, table, *chunk, unroll=unroll
    )
    return (table, *jax.tree.map(jnp.add, tuple(sums), chunk_sums)), per_slot

  zero = jnp.zeros((), jnp.float32)
  update_zeros, term_zeros = zero_update(
    spec, data, server_state, client_table, cohort.example_idx.shape[1:]
  )
  carry = (client_table, update_zeros, zero, zero, zero, term_zeros)
  (client_table, *sums), per_chunk = jax.lax.scan(one_chunk, carry, chunks)
  # [m, k] back to slot order (chunk j, position i held slot i * m + j).
  per_slot = jax.tree.map(
    lambda x: jnp.swapaxes(x, 0, 1).reshape(-1)[:num_slots], per_chunk
  )
  return finish_round(
    spec, server_state, client_table, cohort, *sums, per_slot=per_slot
  )
