"""How a round runs: executors, and the one place ``executor='auto'`` is chosen.

All executors compute the same function (`rounds.single_program_round`);
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
program (`rounds.multi_round`, a scan over rounds), so that the host returns
only to evaluate, log and checkpoint; `choose_rounds_per_call` picks R from
the run's cadence and `make_rounds_fn` builds the call.

Public API: `EXECUTORS`, `PRECISIONS`, `matmul_precision`, `ExecutorChoice`,
`choose_executor`, `fit_to_memory`, `make_round_fn`,
`make_single_program_round_fn`, `make_host_loop_round_fn`,
`choose_rounds_per_call`, `make_rounds_fn`.
"""

import functools
import math
from typing import Callable, NamedTuple, Optional, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from fedjax_metric import engine, memory, rounds, sharding
from fedjax_metric.data.cohort import Cohort
from fedjax_metric.host_loop import make_host_loop_round_fn

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
      round (`memory.chunk_memory_model`); called only when needed, since it
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
    rounds.single_program_round, spec, chunk_size=chunk_size, unroll=unroll
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
  (`rounds.multi_round`; ``.jitted`` is exposed); otherwise the one-round
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
      if mesh is not None:
        cohort = sharding.shard_cohort(cohort, mesh)
      round_data = None
      if call_data is not None:
        # One round's share of the call's examples (its indices start at
        # r * C * S * B): the one-round program's data shape.
        size = np.asarray(cohort.example_idx).size
        round_data = jax.tree.map(
          lambda x: x[r * size : (r + 1) * size], call_data
        )
        cohort = cohort._replace(
          example_idx=np.asarray(cohort.example_idx) - r * size
        )
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
  """``program`` (`rounds.single_program_round` or `rounds.multi_round`)
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
    rounds.multi_round, spec, chunk_size=choice.chunk_size, unroll=unroll
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


def plan(
  config,
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
    return memory.chunk_memory_model(
      spec,
      data,
      *state,
      cohort_for(start_round).example_idx.shape[1:],
      unroll=config.unroll,
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
    config.rounds_per_call,
    choice,
    boundaries=(
      config.eval_every,
      config.checkpoint_every,
      start_round,
      end_round,
    ),
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
    steps_per_call=config.steps_per_call,
    unroll=config.unroll,
    mesh=mesh,
  )
  return choice, rounds_per_call, rounds_fn
