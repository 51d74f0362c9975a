"""How a round runs: executors, and the one place ``executor='auto'`` is chosen.

All executors compute the same function (`engine.single_program_round`);
tests/test_executors.py proves it:

  * ``vmap``: every slot at once, the whole round one jitted XLA program, the
    clients axis sharded over a device mesh. The default on GPU/TPU.
  * ``chunked``: a scan over chunks of k vmapped slots inside one program;
    bounds memory for large cohorts. ``sequential`` is chunked with k = 1.
  * ``host``: a Python loop over real slots, each running jitted blocks of
    unrolled steps. The default on CPU, where XLA runs convolutions inside a
    while loop (scan / map) an order of magnitude slower than unrolled ones and
    vmapped per-client convolutions become slow grouped convolutions
    (benchmarks/cpu.md). It also skips blocks that are all padding, which the
    single program cannot.

Rounds per call: the single-program executors can also run R rounds as one
program (`engine.multi_round`, a scan over rounds), so that the host returns
only to evaluate, log and checkpoint; `choose_rounds_per_call` picks R from
the run's cadence and `make_rounds_fn` builds the call.

`plan` puts it together for a run from typed `CallSettings` (assemble.py
makes them from the config; nothing here reads the config).

Public API: `EXECUTORS`, `PRECISIONS`, `matmul_precision`, `ExecutorChoice`,
`choose_executor`, `fit_to_memory`, `chunk_memory_model`, `make_round_fn`,
`make_single_program_round_fn`, `make_host_loop_round_fn`,
`choose_rounds_per_call`, `make_rounds_fn`, `CallSettings`, `plan`.
"""

import functools
import math
from typing import Callable, NamedTuple, Optional, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from fedjax_metric import engine, memory, sharding
from fedjax_metric.data.cohort import Cohort, table_rows

EXECUTORS = ('auto', 'vmap', 'chunked', 'sequential', 'host')


PRECISIONS = ('default', 'highest', 'bf16')


def matmul_precision(precision: str):
  """The context a run's programs are traced in (``config.precision``).

  'default': the platform's float32 matmuls and convolutions (TF32 on recent
  NVIDIA GPUs: ~1e-3 relative error, the fastest float32 path); 'highest':
  full float32 everywhere; 'bf16': bfloat16 compute, float32 parameters and
  optimizer state (assemble.build_model's ``compute_dtype``). On CPU the three
  differ only in 'bf16'.
  """
  if precision not in PRECISIONS:
    raise ValueError(
      f'Unknown precision {precision!r}; use one of '
      f'{PRECISIONS} (--config.precision).'
    )
  return jax.default_matmul_precision(
    'highest' if precision == 'highest' else 'default'
  )


class ExecutorChoice(NamedTuple):
  """A resolved executor.

  Attributes:
    name: 'vmap', 'chunked' or 'host'.
    chunk_size: k for 'chunked'.
    fit_to_memory: k (or vmap itself) is still to be checked against a
      memory budget: `fit_to_memory` does it.
    reason: why this was chosen, for the log.
  """

  name: str
  chunk_size: int = 0
  fit_to_memory: bool = False
  reason: str = ''


def choose_executor(
  requested: str,
  *,
  chunk_size: int = 0,
  backend: Optional[str] = None,
  process_count: Optional[int] = None,
) -> ExecutorChoice:
  """Resolves an executor name, ``auto`` included, before anything is built.

  ``auto`` is ``host`` on a one-process CPU run (measured fastest there,
  benchmarks/cpu.md) and ``vmap`` elsewhere, to be checked against the memory
  budget (it falls back to ``chunked``). ``chunked`` with ``chunk_size = 0``
  takes the largest k that fits. ``sequential`` is ``chunked`` with k = 1.
  ``host`` drives one client at a time from Python, so it cannot span
  processes.
  """
  if requested not in EXECUTORS:
    raise ValueError(
      f'Unknown executor {requested!r}; choose one of '
      f'{EXECUTORS} (--config.executor).'
    )
  if chunk_size < 0:
    raise ValueError(f'chunk_size must be >= 0, got {chunk_size}.')
  backend = backend or jax.default_backend()
  process_count = process_count or jax.process_count()
  if requested == 'auto':
    if backend == 'cpu' and process_count == 1:
      return ExecutorChoice('host', reason='auto: host on one CPU process')
    return ExecutorChoice(
      'vmap',
      fit_to_memory=True,
      reason=f'auto: vmap on {backend} x{process_count}',
    )
  if requested == 'host' and process_count > 1:
    raise ValueError(
      f'executor=host cannot span {process_count} processes; use '
      '--config.executor=vmap (or chunked / sequential, or auto).'
    )
  if requested == 'sequential':
    return ExecutorChoice('chunked', 1, reason='sequential: chunks of 1')
  if requested == 'chunked':
    return ExecutorChoice('chunked', chunk_size, fit_to_memory=chunk_size == 0)
  return ExecutorChoice(requested)


CONV_IMPLS = ('auto', 'xla', 'patches', 'implicit')


def round_is_one_program(choice: ExecutorChoice) -> bool:
  """Whether the round's local training is one XLA program with loops over
  clients and steps (vmap, chunked, sequential), not the host loop."""
  return choice.name != 'host'


def resolve_conv_impl(conv_impl: str, one_program: bool) -> str:
  """``model.conv_impl`` for a run: 'auto' is 'patches' (`layers.PatchConv`:
  im2col by slicing, then a matmul) when the round is one program
  (`round_is_one_program`) and 'xla' (nn.Conv) for the host loop.

  Why (docs/concepts.md, "Convolutions as batched matmuls"): in one program, vmap over
  per-client weights turns each convolution into a grouped one (a group per
  client), and on CPU XLA runs convolutions inside loops with its generic
  kernel instead of XNNPACK; the matmul form avoids both. Measured with
  benchmarks.bench on the 2-core CPU (benchmarks/cpu.md), 10 steps of 32: small
  CNN at 10 clients, vmap 0.20 s with patches vs 0.51 s (nn.Conv, steps
  unrolled) or 2.39 s (in the loop), sequential 0.13 s vs 2.6 s; FedQuad CNN
  vmap 4.7 s vs 22.8 s. The host loop keeps nn.Conv (0.15-0.20 s vs 0.22 s
  with patches).
  """
  if conv_impl not in CONV_IMPLS:
    raise ValueError(
      f'Unknown conv_impl {conv_impl!r}; use one of {CONV_IMPLS} '
      '(--config.model.conv_impl).'
    )
  if conv_impl != 'auto':
    return conv_impl
  return 'patches' if one_program else 'xla'


def fit_to_memory(
  choice: ExecutorChoice,
  memory_model: Callable[[], tuple],
  *,
  memory_budget: int,
  num_slots: int,
  num_devices: int = 1,
) -> ExecutorChoice:
  """Settles a choice that depends on memory (see `choose_executor`).

  Args:
    choice: from `choose_executor`; returned as is unless
      ``choice.fit_to_memory``.
    memory_model: ``() -> (fixed_bytes, bytes_per_slot)`` of the chunked
      round (`chunk_memory_model`); called only when needed, since it
      compiles the round twice.
    memory_budget: bytes per device.
    num_slots, num_devices: C and the mesh size.
  """
  if not choice.fit_to_memory:
    return choice
  fixed, per_slot = memory_model()
  k = memory.choose_chunk_size(
    fixed, per_slot, memory_budget, num_slots, num_devices
  )
  gib = 1024**3
  budget = (
    f'{fixed / gib:.2f} GiB fixed + {per_slot / 1024**2:.1f} MiB '
    f'per client slot, budget {memory_budget / gib:.2f} GiB per device'
  )
  if choice.name == 'vmap' and k >= num_slots:
    return ExecutorChoice('vmap', reason=f'{choice.reason}; fits: {budget}')
  return ExecutorChoice('chunked', k, reason=f'{budget} -> chunks of {k}')


def chunk_memory_model(
  spec: engine.RoundSpec,
  data,
  server_state,
  client_table,
  example_shape,
  *,
  unroll=1,
):
  """``(fixed_bytes, bytes_per_slot)`` of the chunked round, from XLA.

  Compiles the chunked round for cohorts of 1 and 2 slots (one chunk each)
  and reads XLA's buffer assignment (arguments + temporaries + outputs -
  donated aliases). Working memory grows linearly in the chunk size k, so
  two points fix the line. ``example_shape`` is a slot's [S, B].
  """

  def cohort_of(k):
    spec_of = jax.ShapeDtypeStruct
    return Cohort(
      spec_of((k,), jnp.int32),
      spec_of((k,), jnp.bool_),
      spec_of((k, *example_shape), jnp.int32),
      spec_of((k, *example_shape), jnp.bool_),
      spec_of((k,), jnp.float32),
    )

  def total(k):
    round_fn = jax.jit(
      functools.partial(
        engine.single_program_round, spec, chunk_size=k, unroll=unroll
      ),
      donate_argnums=(1, 2),
    )
    analysis = (
      round_fn.lower(data, server_state, client_table, cohort_of(k))
      .compile()
      .memory_analysis()
    )
    return (
      analysis.argument_size_in_bytes
      + analysis.temp_size_in_bytes
      + analysis.output_size_in_bytes
      - analysis.alias_size_in_bytes
    )

  one, two = total(1), total(2)
  per_slot = max(two - one, 1)
  # On GPUs the step from k = 1 to 2 can exceed a slot's share (convolution
  # workspaces chosen per shape), which would make the intercept negative;
  # the arguments are always resident, so they floor the fixed part.
  floor = memory.tree_bytes((data, server_state))
  return max(one - per_slot, floor), per_slot


def make_round_fn(
  spec: engine.RoundSpec,
  data: engine.DeviceData,
  *,
  executor,
  chunk_size: int = 0,
  steps_per_call: int = 10,
  unroll: int | bool = 1,
):
  """``(server_state, client_table, cohort) -> (state, table, metrics)``.

  ``executor`` is an `ExecutorChoice`, or a name resolved by
  `choose_executor` (without a memory budget: ``chunked`` then needs
  ``chunk_size``).
  """
  choice = executor
  if isinstance(executor, str):
    choice = choose_executor(executor, chunk_size=chunk_size)
  if choice.name == 'chunked' and choice.chunk_size < 1:
    raise ValueError(
      'executor=chunked needs chunk_size >= 1 '
      '(--config.chunk_size=K), or a memory budget to pick it.'
    )
  if choice.name == 'host':
    return make_host_loop_round_fn(spec, data, steps_per_call=steps_per_call)
  return make_single_program_round_fn(
    spec, data, chunk_size=choice.chunk_size, unroll=unroll
  )


def make_single_program_round_fn(spec, data, *, chunk_size=0, unroll=1):
  """Jitted ``(server_state, client_table, cohort) -> (state, table, metrics)``.

  Sharding comes from the inputs: with a mesh, callers replicate the state and
  data and place the cohort with `sharding.shard_cohort`; XLA turns the
  weighted sum over the sharded clients axis into an all-reduce.
  """

  jitted = _jit_program(
    engine.single_program_round, spec, chunk_size=chunk_size, unroll=unroll
  )

  def round_fn(server_state, client_table, cohort, call_data=None):
    return jitted(
      server_state,
      client_table,
      cohort,
      data if call_data is None else call_data,
    )

  round_fn.jitted = jitted
  return round_fn


# Host and device memory the stacked cohorts of one call may take (their
# index arrays are [R, C, S, B]); `choose_rounds_per_call` keeps R below it.
STACKED_COHORT_BYTES = 64 * 1024**2


def cohort_bytes(cohort: Cohort) -> int:
  """Bytes of one round's cohort arrays."""
  return sum(np.asarray(x).nbytes for x in cohort)


def choose_rounds_per_call(
  requested: int,
  choice: ExecutorChoice,
  *,
  boundaries: Sequence[int],
  round_bytes: int,
) -> tuple:
  """R, the rounds one call runs, and why: ``(R, reason)``.

  R divides every round at which the host must act (``boundaries``: the
  evaluation and checkpoint cadence, the run's first and last round), so
  evaluations, checkpoints and the end fall where they fall with one round
  per call, and every call has the same length: the program compiles once.
  It is the largest such divisor that is at most ``requested`` (0: no
  limit but memory) and keeps R stacked cohorts under
  `STACKED_COHORT_BYTES`. The ``host`` executor drives each client from
  Python, so it runs one round per call.

  A stop signal (SIGTERM, Ctrl-C) is honoured between calls: at most R - 1
  rounds after it, and R is at most the evaluation interval.
  """
  if requested < 0:
    raise ValueError(
      f'rounds_per_call must be >= 0 (0 = automatic), got {requested} '
      '(--config.rounds_per_call).'
    )
  if choice.name == 'host':
    return 1, 'the host executor runs one round per call'
  cadence = 0
  for b in boundaries:
    cadence = math.gcd(cadence, int(b))
  cadence = max(cadence, 1)
  limit = max(1, STACKED_COHORT_BYTES // max(round_bytes, 1))
  why = f'divides the cadence ({cadence} rounds)'
  if requested:
    limit = min(limit, requested)
    why += f', at most rounds_per_call={requested}'
  else:
    why += f', cohorts under {STACKED_COHORT_BYTES // 1024**2} MiB'
  r = max(d for d in range(1, min(cadence, limit) + 1) if cadence % d == 0)
  return r, why


def make_rounds_fn(
  spec: engine.RoundSpec,
  data: engine.DeviceData,
  *,
  executor,
  rounds_per_call: int,
  chunk_size: int = 0,
  steps_per_call: int = 10,
  unroll: int | bool = 1,
  mesh=None,
):
  """``(server_state, client_table, cohorts) -> (state, table, metrics)``.

  ``cohorts`` is a list of R = ``rounds_per_call`` host (NumPy) cohorts,
  rounds t .. t + R - 1; each metric comes back with shape [R]. A call may
  pass its own ``call_data`` (`DeviceData` of the shape ``data`` has), the
  examples made for its cohorts (data/on_demand.py); ``data`` is then only
  a template. With R > 1
  and a single-program executor the R rounds are one jitted program
  (`engine.multi_round`; ``.jitted`` is exposed); otherwise the one-round
  function of `make_round_fn` is called R times. Both give the same result.
  With a ``mesh`` the cohorts are split over its clients axis.
  """
  choice = executor
  if isinstance(executor, str):
    choice = choose_executor(executor, chunk_size=chunk_size)
  if rounds_per_call > 1 and choice.name != 'host':
    return _make_multi_round_fn(
      spec, data, choice, rounds_per_call, unroll, mesh
    )
  round_fn = make_round_fn(
    spec,
    data,
    executor=choice,
    steps_per_call=steps_per_call,
    unroll=unroll,
  )

  def rounds_fn(server_state, client_table, cohorts, call_data=None):
    metrics = []
    for r, cohort in enumerate(cohorts):
      round_data = None
      if call_data is not None:
        # One round's share of the call's examples (its indices start at
        # r * C * S * B): the one-round program's data shape. Re-based on
        # the host cohort, before sharding: a sharded index array may span
        # other processes' devices, which np.asarray cannot read.
        size = np.asarray(cohort.example_idx).size
        round_data = jax.tree.map(
          lambda x: x[r * size : (r + 1) * size], call_data
        )
        cohort = cohort._replace(
          example_idx=np.asarray(cohort.example_idx) - r * size
        )
      if mesh is not None:
        cohort = sharding.shard_cohort(cohort, mesh)
      server_state, client_table, m = round_fn(
        server_state, client_table, cohort, round_data
      )
      metrics.append(m)
    return (
      server_state,
      client_table,
      jax.tree.map(lambda *m: jnp.stack(m), *metrics),
    )

  rounds_fn.round_fn = round_fn
  return rounds_fn


def _jit_program(program, spec, *, chunk_size, unroll):
  """``program`` (`engine.single_program_round` or `engine.multi_round`)
  jitted as ``(server_state, client_table, cohort(s), data)``, the state
  donated. The dataset is an argument, not a closure: a closed-over array
  would be baked into the program as a constant."""

  @functools.partial(jax.jit, donate_argnums=(0, 1))
  def jitted(server_state, client_table, cohorts, data):
    return program(
      spec,
      data,
      server_state,
      client_table,
      cohorts,
      chunk_size=chunk_size,
      unroll=unroll,
    )

  return jitted


def _make_multi_round_fn(spec, data, choice, rounds_per_call, unroll, mesh):
  """`make_rounds_fn` for R > 1 rounds in one single-program call."""
  jitted = _jit_program(
    engine.multi_round, spec, chunk_size=choice.chunk_size, unroll=unroll
  )

  def rounds_fn(server_state, client_table, cohorts, call_data=None):
    if len(cohorts) != rounds_per_call:
      raise ValueError(
        f'{len(cohorts)} cohorts for a call of {rounds_per_call} rounds.'
      )
    stacked = jax.tree.map(lambda *x: np.stack(x), *cohorts)
    if mesh is not None:
      stacked = sharding.shard_cohort(stacked, mesh, stacked=True)
    return jitted(
      server_state,
      client_table,
      stacked,
      data if call_data is None else call_data,
    )

  rounds_fn.jitted = jitted
  return rounds_fn


class CallSettings(NamedTuple):
  """How a run asks its rounds to be called (built from the config by
  `assemble.call_settings`).

  Attributes:
    cadence: the rounds at which the host must act, as intervals (the
      evaluation and checkpoint intervals): R divides each.
    rounds_per_call: the largest R asked for (0: as memory allows).
    steps_per_call: the host executor's unrolled local steps per jitted call.
    unroll: the single-program executors' scan unroll over local steps.
  """

  cadence: Sequence[int] = (1,)
  rounds_per_call: int = 0
  steps_per_call: int = 10
  unroll: int | bool = 1


def plan(
  settings: CallSettings,
  choice: ExecutorChoice,
  spec: engine.RoundSpec,
  data: engine.DeviceData,
  state,
  cohort_for: Callable[[int], Cohort],
  *,
  round_range: tuple,
  memory_budget: int,
  num_slots: int,
  mesh=None,
  report=print,
  extra_bytes_per_round: int = 0,
):
  """How a run's rounds will be called: ``(choice, R, rounds_fn)``.

  Fits the executor to ``memory_budget`` when it was chosen automatically
  (`fit_to_memory`), picks R rounds per call from the evaluation and
  checkpoint cadence (`choose_rounds_per_call`) and builds the call
  (`make_rounds_fn`). ``state`` is ``(server_state, client_table)``;
  ``cohort_for(round)`` builds a round's cohort (the first round's shapes
  are every round's); ``round_range`` is ``(first round, end round)``; ``report``
  prints each decision in one line. ``extra_bytes_per_round``: what else a
  call carries per round (the client rows of a table off the device, the
  examples of clients made on demand); it counts against R like the
  cohorts.
  """
  start_round, end_round = round_range
  num_devices = mesh.size if mesh is not None else 1

  def memory_model():
    return chunk_memory_model(
      spec,
      data,
      *state,
      cohort_for(start_round).example_idx.shape[1:],
      unroll=settings.unroll,
    )

  if choice.fit_to_memory:
    choice = fit_to_memory(
      choice,
      memory_model,
      memory_budget=memory_budget,
      num_slots=num_slots,
      num_devices=num_devices,
    )
    report(f'Memory: executor={choice.name}; {choice.reason}.')
  rounds_per_call, why = choose_rounds_per_call(
    settings.rounds_per_call,
    choice,
    boundaries=(*settings.cadence, start_round, end_round),
    round_bytes=(
      cohort_bytes(cohort_for(start_round)) + extra_bytes_per_round
      if start_round < end_round
      else 0
    ),
  )
  if rounds_per_call > 1:
    report(f'{rounds_per_call} rounds per call: {why}.')
  rounds_fn = make_rounds_fn(
    spec,
    data,
    executor=choice,
    rounds_per_call=rounds_per_call,
    steps_per_call=settings.steps_per_call,
    unroll=settings.unroll,
    mesh=mesh,
  )
  return choice, rounds_per_call, rounds_fn


# ---------------------------------------------------------------------------
# The ``host`` executor: a round as a Python loop over its real slots.
#
# Each slot runs the engine's client update (`engine.client_update`) as one
# jitted call, or, when its S local steps exceed ``steps_per_call``, the same
# update cut at block boundaries (`engine.start_client`, ``ceil(S / k)`` calls
# of `engine.run_steps`, `engine.finish_client`), skipping blocks that are all
# padding. Results equal the single-program executors'
# (tests/test_executors.py). The default on one CPU process
# (`choose_executor` says why).
# ---------------------------------------------------------------------------


def _accumulate(client_table, row_id, slot, accumulator, outputs):
  """Writes a slot's new row (at ``row_id``) and adds ``weight * update``
  (and its loss sums) into the round's running totals; with per-client
  reports on (a non-empty last entry of ``accumulator``), writes the slot's
  report."""
  update, weight, new_row, (loss_sum, count, terms) = outputs
  client_table = engine.scatter_rows(client_table, row_id, new_row)
  (update_sum, weight_sum, loss_total, count_total, term_totals, per_slot) = (
    accumulator
  )
  if per_slot:
    report = engine.client_report(update, loss_sum, count)
    per_slot = {k: v.at[slot].set(report[k]) for k, v in per_slot.items()}
  accumulator = (
    jax.tree.map(lambda s, u: s + weight * u, update_sum, update),
    weight_sum + weight,
    loss_total + loss_sum,
    count_total + count,
    jax.tree.map(jnp.add, term_totals, terms),
    per_slot,
  )
  return client_table, accumulator


class HostLoopFns(NamedTuple):
  """The jitted pieces the ``host`` executor strings together."""

  zero_accumulator: Callable
  begin: Callable
  steps: Callable
  finish: Callable
  whole_client: Callable
  server: Callable


def _host_loop_fns(spec, *, unroll=True) -> HostLoopFns:
  """The jitted pieces a ``host`` round strings together, for one run.

  ``begin`` gathers a slot's row and starts its update; ``steps`` runs one
  block of k local steps (`engine.run_steps`); ``finish`` computes the update,
  scatters the row and adds ``weight * update`` into the running sums;
  ``whole_client`` is the three fused (all S steps in one call: dispatch, not
  arithmetic, dominates small clients); ``zero_accumulator`` makes the sums
  and ``server`` applies them (`engine.finish_round`). Each compiles once per
  run (tests/test_executors.py); the table and the sums are donated, so
  memory stays O(model).
  """

  def begin(
    server_state,
    client_table,
    row_id,
    client_id,
    slot,
    num_examples,
    example_idx,
    example_mask,
    data,
  ):
    row = engine.gathered(client_table, row_id)
    inputs = engine.client_inputs(
      row, client_id, slot, num_examples, example_idx, example_mask
    )
    return inputs, engine.start_client(spec, data, server_state, inputs)

  def steps(
    server_state, inputs, carry, example_idx, example_mask, first_step, data
  ):
    return engine.run_steps(
      spec,
      data,
      server_state,
      inputs,
      carry,
      example_idx,
      example_mask,
      first_step,
      unroll=unroll,
    )

  def finish(
    server_state, client_table, row_id, inputs, accumulator, carry, data
  ):
    outputs = engine.finish_client(spec, data, server_state, inputs, carry)
    return _accumulate(client_table, row_id, inputs.slot, accumulator, outputs)

  def whole_client(
    server_state,
    client_table,
    accumulator,
    row_id,
    client_id,
    slot,
    num_examples,
    example_idx,
    example_mask,
    data,
  ):
    # The engine's client update itself, as the single-program executors run
    # it for each slot.
    outputs = engine.client_update(
      spec,
      data,
      server_state,
      engine.gathered(client_table, row_id),
      client_id,
      slot,
      example_idx,
      example_mask,
      num_examples,
      unroll=unroll,
    )
    return _accumulate(client_table, row_id, slot, accumulator, outputs)

  def zero_accumulator(
    server_state, client_table, data, example_shape, num_slots
  ):
    # Made on the device: a jnp.zeros here would be a host-to-device transfer.
    # The outputs are distinct buffers, as `finish` donates them.
    update, terms = engine.zero_update(
      spec, data, server_state, client_table, example_shape
    )
    per_slot = {}
    if spec.per_client:
      per_slot = {
        name: jnp.zeros((num_slots,), jnp.float32)
        for name in ('loss', 'examples', 'update_norm')
      }
    scalars = (jnp.zeros((), jnp.float32) for _ in range(3))
    return (update, *scalars, terms, per_slot)

  def server(server_state, client_table, cohort, accumulator):
    *sums, per_slot = accumulator
    return engine.finish_round(
      spec, server_state, client_table, cohort, *sums, per_slot=per_slot
    )

  return HostLoopFns(
    zero_accumulator=jax.jit(zero_accumulator, static_argnums=(3, 4)),
    begin=jax.jit(begin),
    steps=jax.jit(steps),
    finish=jax.jit(finish, donate_argnums=(1, 4)),
    whole_client=jax.jit(whole_client, donate_argnums=(1, 2)),
    server=jax.jit(server, donate_argnums=(0, 1)),
  )


def _slot_client(host, row_ids, slot):
  """The per-slot arguments of ``begin`` / ``whole_client``, on the host:
  (row id, client id, slot, num_examples, example_idx [S, B], example_mask)."""
  return (
    row_ids[slot],
    host.client_ids[slot],
    np.int32(slot),
    host.num_examples[slot],
    host.example_idx[slot],
    host.example_mask[slot],
  )


def _live_step_blocks(example_idx, example_mask, k):
  """One slot's steps cut into blocks of k: [(idx [k, B], mask [k, B],
  first step)], leaving out blocks whose steps are all padding (no-ops).

  ``example_idx`` / ``example_mask``: [S', B] with S' a multiple of k.
  """
  return [
    (
      example_idx[first : first + k],
      example_mask[first : first + k],
      np.int32(first),
    )
    for first in range(0, example_idx.shape[0], k)
    if example_mask[first : first + k].any()
  ]


def _train_slot_in_blocks(
  fns, server_state, client_table, accumulator, client, blocks, data
):
  """One slot's update as ``begin``, one ``steps`` call a block, ``finish``.
  Returns (client_table, accumulator)."""
  client, blocks = jax.device_put((client, blocks))
  inputs, carry = fns.begin(server_state, client_table, *client, data)
  for block in blocks:
    carry = fns.steps(server_state, inputs, carry, *block, data)
  return fns.finish(
    server_state, client_table, client[0], inputs, accumulator, carry, data
  )


def make_host_loop_round_fn(spec, data, *, steps_per_call: int, unroll=True):
  """A round as a Python loop over real slots of jitted unrolled step blocks.

  Each slot: one ``whole_client`` call when its S local steps fit one block
  of ``k = min(steps_per_call, S)``; otherwise ``begin``, ``ceil(S / k)``
  ``steps`` calls (all-padding blocks skipped) and ``finish``
  (`_host_loop_fns`). Then one ``server`` call. No stacked [C, ...] updates
  exist. ``round_fn.fns`` exposes the jitted pieces (tests count compiles).
  """
  if isinstance(steps_per_call, bool) or steps_per_call < 1:
    raise ValueError(
      f'steps_per_call={steps_per_call!r}: the host loop runs blocks of at '
      'least 1 local step; use steps_per_call >= 1.'
    )
  fns = _host_loop_fns(spec, unroll=unroll)
  bound_data = data

  def round_fn(server_state, client_table, cohort: Cohort, call_data=None):
    data = bound_data if call_data is None else call_data
    host = jax.tree.map(np.asarray, cohort)  # The host needs the masks.
    row_ids = table_rows(host)
    num_steps = host.example_idx.shape[1]
    k = min(steps_per_call, num_steps)
    # Pad S to a multiple of k with all-padding steps, which are no-ops.
    pad = (-num_steps) % k
    example_idx = np.pad(host.example_idx, ((0, 0), (0, pad), (0, 0)))
    example_mask = np.pad(host.example_mask, ((0, 0), (0, pad), (0, 0)))
    accumulator = fns.zero_accumulator(
      server_state,
      client_table,
      data,
      host.example_idx.shape[1:],
      host.client_ids.shape[0],
    )
    for slot in np.flatnonzero(host.slot_mask):
      # One transfer per slot of its index arrays, which the round needs anyway.
      client = _slot_client(host, row_ids, slot)
      if num_steps + pad == k:
        client_table, accumulator = fns.whole_client(
          server_state, client_table, accumulator, *jax.device_put(client), data
        )
      else:
        blocks = _live_step_blocks(example_idx[slot], example_mask[slot], k)
        client_table, accumulator = _train_slot_in_blocks(
          fns, server_state, client_table, accumulator, client, blocks, data
        )
    return fns.server(
      server_state, client_table, jax.device_put(host), accumulator
    )

  round_fn.fns = fns
  return round_fn
