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
schedule, FedAvg's by default (algorithms/fedavg.py). This module holds the
types, the initial state, local training of one client, the two
single-program forms of a round (every slot vmapped at once, or a scan over
chunks of vmapped slots) and R rounds as one program (a scan over rounds).
How a round is run (jit, a Python loop over clients, chunk sizes, rounds per
call) is executors.py; memory budgets are memory.py; device meshes are
sharding.py.

Public API: the types `Algorithm`, `ClientContext`, `Batch`, `ServerState`,
`Aggregate`, `RoundSpec`, `DeviceData`; `init_state`; the table and reduction
`gather_rows`, `scatter_rows`, `weighted_sum`; `single_program_round` and
`multi_round` (a scan of it over R rounds); and
the pieces the host executor strings together: `client_inputs`,
`start_client`, `run_steps`, `finish_client`, `finish_round`, `zero_update`.

Shape letters: N clients, C cohort slots, S local steps, B batch size.
"""

import functools
from typing import Any, Callable, NamedTuple, Optional

import jax
import jax.numpy as jnp
import optax

from fedjax_metric.data.cohort import Cohort
from fedjax_metric.models import merge_variables, split_variables


class ServerState(NamedTuple):
  """Global state. ``extra`` is the algorithm's own (e.g. past global models)."""

  variables: Any
  opt_state: Any
  round: jax.Array  # int32 scalar: rounds completed.
  extra: Any = ()


class Batch(NamedTuple):
  images: jax.Array  # float [B, H, W, C], preprocessed (and augmented).
  labels: jax.Array  # int32 [B]
  mask: jax.Array  # bool [B]; False for padded examples.
  raw_images: jax.Array  # uint8 [B, H, W, C]: for losses that draw their own
  # augmented views (SSD); unused inputs cost nothing.


class ClientContext(NamedTuple):
  """Everything a client hook may read besides its params and batch.

  Attributes:
    server_state: the round's `ServerState` (global model, server extra).
    client_row: this client's row of the client table, or ``()``.
    local_state: what ``client_begin`` returned, as updated by
      ``client_step_end``; ``()`` inside ``client_begin`` itself.
    client_id: int32 scalar, the client's index in [0, N).
    slot: int32 scalar, the client's position in this round's cohort.
    key: PRNG key depending on (seed, round, client id, step) only.
    step: int32 scalar, the local step (S in ``client_final``).
    learning_rate: float32 scalar, the round's local learning rate (before a
      per-local-epoch decay).
    num_steps: float32 scalar, the client's real (non-padding) local steps
      this round.
    num_examples: float32 scalar, the client's dataset size n_k.
    scan_batches: ``(fn, init) -> carry``: runs ``fn(carry, batch)`` over
      this round's S batches of the client (a `lax.scan`; padded steps and
      examples are masked, with the training preprocessing and a fixed key).
      In epoch mode the first ceil(n_k / B) batches hold every local example
      once: FedMetric computes its local center and radius this way.
  """

  server_state: ServerState
  client_row: Any
  local_state: Any
  client_id: jax.Array
  slot: jax.Array
  key: jax.Array
  step: jax.Array
  learning_rate: jax.Array
  num_steps: jax.Array
  num_examples: jax.Array
  scan_batches: Callable[..., Any]


class Aggregate(NamedTuple):
  """The cohort's contribution, already reduced over slots.

  ``update_sum = sum_c w_c * update_c`` with ``w_c = 0`` for padding slots.
  """

  update_sum: Any
  weight_sum: jax.Array
  num_participants: jax.Array
  client_ids: jax.Array  # [C]
  slot_mask: jax.Array  # [C]


class Algorithm(NamedTuple):
  """A federated algorithm: pure functions, hyperparameters closed over.

  Every client hook takes the `ClientContext`. FedAvg fills each slot
  (algorithms/fedavg.py); a method replaces the slots it changes.

  Attributes:
    init_server: ``(variables, num_clients, key) -> ServerState``; owns the
      server optimizer's state and the algorithm's ``extra``.
    init_client: ``(variables, key) -> row`` for ONE client; the engine vmaps
      it over N per-client keys into the client table. ``()`` when stateless.
    client_begin: ``ctx -> (start_variables, local_state)``: the model the
      client trains from (the global one, or a personal one from its row) and
      the per-round state carried through its local steps.
    client_loss: ``(params, model_state, batch, ctx) -> (loss, (model_state,
      metrics))``, differentiated w.r.t. params; loss is a masked mean.
    client_step_end: ``(ctx, params, model_state) -> local_state``, after each
      real optimizer step (ctx.step is the step just taken).
    client_final: ``(ctx, end_variables) -> (update, weight, new_row)``.
    server_update: ``(server_state, aggregate, client_table) ->
      server_state``; the table already holds this round's new rows.
    client_batches: optional, host-side (NumPy): ``(example_indices, labels,
      rng, *, num_steps, batch_size, local_epochs, local_steps) -> (idx [S, B'],
      mask [S, B'])``, the client's batch schedule; None means
      `cohort.client_batches`. FedQuad lays each step out as
      [anchors | positives | negatives_1 | negatives_2].
    cohort_batches: optional, host-side: the same schedule for a whole
      cohort at once, used by ``cohort_sampler='vectorized'``: ``(clients:
      cohort.CohortClients, labels, *, seed, round_idx, num_steps,
      batch_size, local_epochs, local_steps) -> (idx [R, S, B'], mask)``;
      None means `cohort.vectorized_batches`. An algorithm that sets
      client_batches sets this too, or runs with the per-client sampler only.

  How the methods of this library map onto the slots:

  * FedProx, FedRCL, FedSCL, SupConFL: ``client_loss`` only.
  * FedQuad, QuadrupletFL, TripletFL: ``client_loss`` and the batch
    schedules (``client_batches`` / ``cohort_batches``: each step's rows are
    anchors, positives and negatives).
  * MOON: ``init_client`` (the previous local model), ``client_loss``,
    ``client_final`` (stores the new local model in the row).
  * SCAFFOLD: ``init_client`` (control variate c_i), ``init_server`` (c),
    ``client_loss`` (adds <c - c_i, w>, whose gradient is the correction),
    ``client_final`` (new c_i from ctx.learning_rate and ctx.num_steps; the
    update carries both the model delta and the control delta),
    ``server_update``.
  * FedMetric: the server extra holds every client's latest proxy center and
    margin, broadcast in ctx.server_state; ``client_begin`` computes the
    client's center with the received model; ``client_final`` computes its
    radius and new proxy and writes them to the row; ``server_update`` copies
    the table's proxies into the extra. DeepSVDD: ``client_begin`` starts
    from the client's own model in its row.
  * PMFL: the row is a ring buffer of the client's last local models,
    ``client_begin`` loads it into local_state, ``client_step_end`` pushes
    the model after every step, ``client_final`` writes it back with a weight
    from participation counters kept in the server extra; ``server_update``
    advances the counters of all N clients and mixes in past global models
    (also server extra).
  * FedAU / MIFA / FedVarp: counters or the clients' last updates live in the
    server extra or the table; ``server_update`` divides by N, not by the
    cohort's weight.
  * SSD: per-client scaling matrices in the server extra (made once by
    ``init_server``), picked by ctx.client_id or ctx.slot; ``client_loss``
    draws two augmented views of ``batch.raw_images`` with ctx.key;
    ``client_final`` weights by ctx.num_steps (local batches).
  """

  init_server: Callable[..., Any]
  init_client: Callable[..., Any]
  client_begin: Callable[..., Any]
  client_loss: Callable[..., Any]
  client_step_end: Callable[..., Any]
  client_final: Callable[..., Any]
  server_update: Callable[..., Any]
  client_batches: Optional[Callable[..., Any]] = None
  cohort_batches: Optional[Callable[..., Any]] = None


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
      per-epoch LambdaLR); 1.0 turns it off.
    batch_size: examples per local epoch step (the configured B), for
      counting epochs; 0 means the width of a step's rows. Differs from that
      width when an algorithm lays several rows out per example (FedQuad's
      4B-wide steps hold B anchors).
  """

  algorithm: Algorithm
  client_optimizer: Callable[[Any], optax.GradientTransformation]
  learning_rate: Callable[[Any], Any]
  preprocess: Callable[..., Any]
  seed: int
  local_epoch_decay: float = 1.0
  batch_size: int = 0


class DeviceData(NamedTuple):
  images: jax.Array  # uint8 [num_examples, H, W, C]
  labels: jax.Array  # int32 [num_examples]


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

  Row k is ``init_client(variables, fold_in(key, k))``; the server state is
  ``init_server(variables, N, key)``. Check the table's size first with
  `memory.check_client_table_fits` where memory is tight.
  """
  # Copies: rounds donate the state's buffers, the caller keeps `variables`.
  variables = jax.tree.map(jnp.array, variables)
  key = jax.random.key(0) if key is None else key
  keys = jax.vmap(lambda k: jax.random.fold_in(key, k))(jnp.arange(num_clients))
  client_table = jax.jit(jax.vmap(algorithm.init_client, in_axes=(None, 0)))(
    variables, keys
  )
  # A fold-in value no client index reaches.
  server_key = jax.random.fold_in(key, _SERVER_KEY)
  server_state = algorithm.init_server(variables, num_clients, server_key)
  return server_state, client_table


def gather_rows(client_table, client_ids):
  """The rows of ``client_ids`` [C]; padding ids (>= N) read row N - 1."""
  return jax.tree.map(lambda t: t.at[client_ids].get(mode='clip'), client_table)


def scatter_rows(client_table, client_ids, rows):
  """Writes ``rows`` [C, ...] at ``client_ids``; padding ids are dropped."""
  return jax.tree.map(
    lambda t, r: t.at[client_ids].set(r, mode='drop'), client_table, rows
  )


def weighted_sum(weights, stacked):
  """``sum_c weights[c] * stacked[c]`` for every leaf: the aggregation."""
  return jax.tree.map(
    lambda x: jnp.tensordot(weights.astype(x.dtype), x, axes=1), stacked
  )


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
  local_state = alg.client_step_end(ctx, params, model_state)
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
  update, weight, new_row = spec.algorithm.client_final(ctx, end_variables)
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
):
  """The server's step on the reduced cohort, and the round's metrics:
  ``train_loss_sum``, ``train_examples`` and ``train_<term>_sum`` for each
  named term of the loss (sums over the round's real examples)."""
  aggregate = Aggregate(
    update_sum,
    weight_sum,
    jnp.sum(cohort.slot_mask.astype(jnp.float32)),
    cohort.client_ids,
    cohort.slot_mask,
  )
  server_state = spec.algorithm.server_update(
    server_state, aggregate, client_table
  )
  metrics = {'train_loss_sum': loss_sum, 'train_examples': example_count}
  metrics.update({f'train_{k}_sum': v for k, v in term_sums.items()})
  return server_state, client_table, metrics


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


# ---------------------------------------------------------------------------
# The round as one traceable function: all slots vmapped, or chunks of them.
# ---------------------------------------------------------------------------


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
  client_table, *sums = _vmapped_slots(
    spec, data, server_state, client_table, cohort, slots, unroll=unroll
  )
  return finish_round(spec, server_state, client_table, cohort, *sums)


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
    ``(server_state, client_table, metrics)``; each metric has shape [R].
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

  Returns ``(client_table with the new rows, update_sum, weight_sum,
  loss_sum, example_count, term_sums)``; padding slots get weight 0 and
  write no row.
  """
  rows = gather_rows(client_table, cohort.client_ids)
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
  return (
    scatter_rows(client_table, cohort.client_ids, new_rows),
    weighted_sum(weights, updates),
    jnp.sum(weights),
    jnp.sum(loss_sums),
    jnp.sum(counts),
    jax.tree.map(jnp.sum, term_sums),
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

  return cohort._replace(
    client_ids=pad_leaf(cohort.client_ids, jnp.iinfo(jnp.int32).max),
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
    table, *chunk_sums = _vmapped_slots(
      spec, data, server_state, table, *chunk, unroll=unroll
    )
    return (table, *jax.tree.map(jnp.add, sums, chunk_sums)), None

  zero = jnp.zeros((), jnp.float32)
  update_zeros, term_zeros = zero_update(
    spec, data, server_state, client_table, cohort.example_idx.shape[1:]
  )
  carry = (client_table, update_zeros, zero, zero, zero, term_zeros)
  (client_table, *sums), _ = jax.lax.scan(one_chunk, carry, chunks)
  return finish_round(spec, server_state, client_table, cohort, *sums)
