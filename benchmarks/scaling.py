r"""Seconds per round and peak memory against clients per round and population.

  python -m benchmarks.scaling                     # the default grid (see below)
  python -m benchmarks.scaling --clients_per_round=10,100 --population_factors=1 \
      --algorithms=fedavg --rounds=2 --max_seconds=300

A grid point is (algorithm, C clients per round, N total clients). N is
C x factor for each ``--population_factors`` entry: factor 1 is everyone every
round; factor 10 is a population ten times the cohort, whose data the
simulator must hold (and whose client table, for algorithms that have one,
grows with N). Per point:

  * seconds per round: the median of ``--rounds`` rounds after one warm-up
    round, each timed in sequence: sample the clients, build the cohort on the
    host (`cohort.make_cohort`, with the algorithm's own batch schedule:
    FedQuad's quadruplets are drawn here), run the round and wait for it. The
    host part is also reported alone ("cohort s"), because it grows with C on
    every backend. Compile time is the warm-up round minus the median.
  * overlapped seconds per round: the median of ``--rounds`` more rounds run
    as `experiment.run` runs them, the next round's cohort built in a thread while
    the device runs this one (`cohort.prefetch`); what is left of "cohort s" in
    it is the cohort's share of a real run (``--nooverlap``: not measured).
  * peak host RSS (``getrusage``), and peak device memory where the backend
    reports it (GPU / TPU: ``memory_stats()['peak_bytes_in_use']``; CPU: none).
    Peak RSS only ever grows within a process, so every point runs in its own
    child process (this script re-invoked with ``--point=<json>``), which prints
    its numbers as one JSON line.
  * the synthetic dataset's and the client table's size (FedAvg and FedQuad
    keep no per-client state: 0).

Data are synthetic and held in memory: uniform random uint8 28x28x1 images with
10 uniformly random labels, ``--examples_per_client`` (16) per client, so no
files are needed and the population can be any size. Each client takes
``--local_steps`` SGD steps of ``--batch_size`` on the small CNN (stride-2
convolutions); FedQuad lays each step out as [anchors | positives |
negatives_1 | negatives_2], so its steps are 4x as wide as FedAvg's.

The default work, 1 step of 4, is deliberately small: the study is about how
the simulator's cost grows with C and N (per-client dispatch, host-side cohort
building, memory), not about how fast a convolution runs, and the 10,000-client
points must finish on a 2-core CPU. There (AMD EPYC, nothing else running) a
client costs about 3.5 ms per round for FedAvg and 13 ms for FedQuad with the
host executor, so a 10,000-client round takes 35 s and 134 s, and the grid of
benchmarks/scaling_cpu.md about 20 minutes. With batch 16 a client costs about
4x more.

For the host executor, time grows about linearly in local steps x batch size
(plus a few ms per client), so other work can be extrapolated, or measured
with ``--local_steps`` / ``--batch_size``.

The per-client work flags (``--local_steps``, ``--batch_size``, ``--rounds``,
``--pool``, ``--image_shape``, ``--chunk_size``, ``--unroll``) mean what
benchmarks/bench.py's do, with smaller defaults.

``--max_seconds`` bounds each point's wall time: a point predicted (from the
last finished point of the same algorithm, scaled linearly in C) to take longer
is skipped, and one that runs longer is stopped; either way the table says so.

Outputs: the results as JSON (``--results``), a markdown table appended to
benchmarks/scaling_<backend>.md with the device named (``--table``), and a
two-panel PNG (``--plot``, default docs/results/scaling_<backend>.png).
notebooks/scaling.ipynb runs the same grid from Python.
"""

import dataclasses
import json
import math
import os
import statistics
import sys
import time
from typing import (
  Any,
  Callable,
  Dict,
  List,
  NamedTuple,
  Optional,
  Sequence,
  Tuple,
)

from absl import app, flags
import jax
import jax.numpy as jnp
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
import numpy as np
import optax

from benchmarks import machine, workload_flags
from fedjax_metric import (
  algorithms,
  engine,
  executors,
  memory,
  models,
  optimizers,
  sharding,
)
from fedjax_metric.data import augment
from fedjax_metric.data import cohort as cohort_lib

NUM_CLASSES = 10


@dataclasses.dataclass(frozen=True)
class Point:
  """One grid point: everything its child process needs to measure it."""

  algorithm: str
  clients_per_round: int
  num_clients: int
  local_steps: int = 1
  batch_size: int = 4
  examples_per_client: int = 16
  rounds: int = 3
  executor: str = 'auto'
  model: str = 'small_cnn'
  pool: str = 'stride'
  image_shape: tuple = (28, 28, 1)
  chunk_size: int = 10
  # None: on CPU with xla convolutions only (as benchmarks/bench.py).
  unroll: Optional[bool] = None
  seed: int = 0
  precision: str = 'default'  # executors.PRECISIONS
  conv_impl: str = 'auto'  # executors.CONV_IMPLS (config.model.conv_impl)
  cohort_sampler: str = 'per_client'  # cohort.SAMPLERS (config.cohort_sampler)
  overlap: bool = True  # also time rounds with the cohort built alongside

  def to_json(self) -> str:
    return json.dumps(dataclasses.asdict(self))

  @classmethod
  def from_json(cls, text: str) -> 'Point':
    return point_of(json.loads(text))


def make_grid(
  clients_per_round: Sequence[int],
  population_factors: Sequence[int],
  algorithm_names: Sequence[str],
  *,
  max_total_clients: int = 100_000,
  **work,
) -> List[Point]:
  """Points ordered by algorithm, then C ascending, then population.

  That order lets `run_grid` predict each point's time from a smaller one of
  the same algorithm before running it. ``work`` holds the other Point fields.
  """
  return [
    Point(algorithm, c, c * factor, **work)
    for algorithm in algorithm_names
    for c in sorted(clients_per_round)
    for factor in sorted(population_factors)
    if c * factor <= max_total_clients
  ]


# ---------------------------------------------------------------------------
# One point, measured in the current process.
# ---------------------------------------------------------------------------


def synthetic_federation(
  num_clients: int,
  examples_per_client: int,
  image_shape=(28, 28, 1),
  num_classes: int = NUM_CLASSES,
  seed: int = 0,
):
  """Random uint8 images and labels, ``examples_per_client`` per client.

  Returns ``(images uint8 [N*E, H, W, C], labels int32 [N*E], partition)``
  where ``partition[k]`` is client k's index array (row k of an [N, E] array:
  no per-client Python objects, whatever N is).
  """
  rng = np.random.default_rng(seed)
  total = num_clients * examples_per_client
  images = rng.integers(0, 256, (total, *image_shape), np.uint8)
  labels = rng.integers(0, num_classes, total).astype(np.int32)
  partition = np.arange(total).reshape(num_clients, examples_per_client)
  return images, labels, partition


def check_algorithms(names: Sequence[str]):
  unknown = sorted(set(names) - set(algorithms.REGISTRY))
  if unknown:
    raise ValueError(
      f'Unknown algorithm {unknown[0]!r}; registered: '
      f'{sorted(algorithms.REGISTRY)}.'
    )


class SyntheticRun(NamedTuple):
  """A synthetic federation and the pieces that train it (bench and scaling)."""

  images: np.ndarray
  labels: np.ndarray
  partition: np.ndarray
  algorithm: engine.Algorithm
  spec: engine.RoundSpec
  variables: Any
  model: Any = None  # models.ModelFns (bench counts a client step's FLOPs)


def round_forms(
  model_name: str,
  conv_impl: str,
  choice: executors.ExecutorChoice,
  unroll: Optional[bool] = None,
) -> Tuple[Optional[str], bool]:
  """(convolution form, unrolled local steps) a benchmark round of ``choice``
  runs with: ``conv_impl`` 'auto' as `executors.resolve_conv_impl` (None
  where the model has no choice); ``unroll`` None unrolls on CPU only where
  convolutions are nn.Conv (XLA's CPU convolutions inside a loop leave
  XNNPACK; with patches, unrolling made the round 3.6x slower)."""
  if 'conv_impl' in models.REGISTRY[model_name].__dataclass_fields__:
    conv_impl = executors.resolve_conv_impl(
      conv_impl, executors.round_is_one_program(choice)
    )
  elif conv_impl in ('auto', 'xla'):
    conv_impl = None
  else:
    raise ValueError(f'{model_name} has no conv_impl={conv_impl!r} form.')
  if unroll is None:
    unroll = jax.default_backend() == 'cpu' and conv_impl in (None, 'xla')
  return conv_impl, bool(unroll)


def synthetic_run(
  algorithm_name: str,
  model_name: str,
  *,
  pool: str,
  image_shape,
  num_clients: int,
  examples_per_client: int,
  seed: int = 0,
  precision: str = 'default',
  conv_impl: Optional[str] = None,
) -> SyntheticRun:
  """`synthetic_federation` + a model + the algorithm with client SGD 0.01
  and a plain SGD server: what benchmarks/bench.py and this study time.
  ``precision``: as ``config.precision`` (executors.matmul_precision);
  ``conv_impl``: 'xla' or 'patches' from `round_forms` (None: the model's
  own default)."""
  images, labels, partition = synthetic_federation(
    num_clients, examples_per_client, image_shape, seed=seed
  )
  model_kwargs = {'conv_impl': conv_impl} if conv_impl else {}
  if model_name == 'small_cnn':
    model_kwargs['pool'] = pool
  model = models.build(
    model_name,
    NUM_CLASSES,
    image_shape,
    compute_dtype=jnp.bfloat16 if precision == 'bf16' else None,
    **model_kwargs,
  )
  preprocess = augment.make_preprocess(*augment.channel_stats(images[:1000]))
  variables = model.init(
    jax.random.key(seed), preprocess(jnp.asarray(images[:1]), None)
  )
  server_optimizer = optimizers.make_server_optimizer('sgd')
  algorithm = algorithms.REGISTRY[algorithm_name](
    model, server_optimizer=server_optimizer
  )
  spec = engine.RoundSpec(
    algorithm,
    optimizers.make_client_optimizer('sgd'),
    optimizers.make_round_schedule(0.01),
    preprocess,
    seed,
  )
  return SyntheticRun(
    images, labels, partition, algorithm, spec, variables, model
  )


def client_step_flops(run, batch_size):
  """XLA's FLOP count (cost analysis) of one client's SGD step.

  One step = forward, cross-entropy, backward and the parameter update on a
  batch of ``batch_size``; a round does ``clients * local_steps`` of them.
  Counted on the single step because XLA's cost analysis counts a loop body
  once, not once per iteration; and on the program as lowered, before the
  backend's passes, because a GPU's compiled program calls cuBLAS / cuDNN,
  whose FLOPs its cost analysis can miss (an H100 gave 1.6 GFLOP for the
  FedQuad CNN step that is 6.7 GFLOP lowered and compiled for CPU). The count
  is the model's arithmetic, so it is the same on every device; it is taken
  with ``nn.Conv`` whatever ``conv_impl`` the run uses (the patches form's
  zero taps are not credited, and the implicit form's Pallas kernels are
  custom calls XLA does not count). Returns NaN where no count is given.
  """
  model = run.model
  if getattr(model.module, 'conv_impl', 'xla') != 'xla':
    model = models.make_model_fns(model.module.clone(conv_impl='xla'))
  params, model_state = models.split_variables(run.variables)
  images = jnp.zeros((batch_size, *run.images.shape[1:]), jnp.float32)
  labels = jnp.zeros((batch_size,), jnp.int32)
  mask = jnp.ones((batch_size,), bool)

  def step(params, model_state, images, labels, mask):
    def loss(p):
      outputs, new_state = model.apply(
        p, model_state, images, train=True, mask=mask
      )
      ce = optax.softmax_cross_entropy_with_integer_labels(
        outputs['logits'].astype(jnp.float32), labels
      ).mean()
      return ce, new_state

    grads, new_state = jax.grad(loss, has_aux=True)(params)
    return jax.tree.map(lambda p, g: p - 0.01 * g, params, grads), new_state

  args = (params, model_state, images, labels, mask)
  flops = _lowered_flops(step, args)
  if math.isnan(flops) and jax.default_backend() != 'cpu':
    # jax 0.11's lowered cost analysis gives no count for a GPU program
    # (seen on an H100); the same step lowered for the CPU counts the same
    # arithmetic.
    flops = _lowered_flops(step, jax.device_put(args, jax.devices('cpu')[0]))
  return flops


def _lowered_flops(step, args) -> float:
  """XLA's FLOP count of ``jax.jit(step)`` lowered for ``args``' device
  (NaN where the cost analysis gives none)."""
  cost = jax.jit(step).lower(*args).cost_analysis()
  if isinstance(cost, (list, tuple)):  # older jax: one dict per program
    cost = cost[0] if cost else {}
  return float((cost or {}).get('flops', float('nan')))


def full_cohort(
  run: SyntheticRun, round_idx: int, *, local_steps: int, batch_size: int
) -> cohort_lib.Cohort:
  """Round ``round_idx``'s cohort with every client of ``run`` taking part,
  each taking exactly ``local_steps`` steps of ``batch_size`` (with the
  algorithm's own schedule): the round benchmarks.bench and
  benchmarks.profile_round time."""
  num_clients = len(run.partition)
  return cohort_lib.make_cohort(
    np.arange(num_clients),
    run.partition,
    num_slots=num_clients,
    num_steps=local_steps,
    batch_size=batch_size,
    local_epochs=1,
    local_steps=local_steps,
    seed=0,
    round_idx=round_idx,
    labels=run.labels,
    batches_fn=run.algorithm.client_batches,
  )


def measure_point(point: Point) -> Dict[str, Any]:
  """Builds the federation and round function for ``point`` and times rounds.

  Peak memory is this process's: run each point in a fresh process
  (`measure_in_subprocess`) for a per-point number. The executor is chosen
  as experiment.run chooses it (``auto`` falls back to chunks that fit the
  memory budget).
  """
  with executors.matmul_precision(point.precision):
    return _measure_point(point)


def _measure_point(point: Point) -> Dict[str, Any]:
  check_algorithms([point.algorithm])
  backend = jax.default_backend()
  choice = executors.choose_executor(
    point.executor, chunk_size=point.chunk_size
  )
  conv_impl, unroll = round_forms(
    point.model, point.conv_impl, choice, point.unroll
  )
  images, labels, partition, algorithm, spec, variables, _ = synthetic_run(
    point.algorithm,
    point.model,
    pool=point.pool,
    image_shape=point.image_shape,
    num_clients=point.num_clients,
    examples_per_client=point.examples_per_client,
    seed=point.seed,
    precision=point.precision,
    conv_impl=conv_impl,
  )
  # As experiment.run: the single-program executors shard the cohort over a mesh.
  mesh = sharding.make_mesh() if choice.name != 'host' else None
  put = (lambda x: sharding.replicate(x, mesh)) if mesh else jax.device_put
  place_cohort = (
    (lambda c: sharding.shard_cohort(c, mesh)) if mesh else (lambda c: c)
  )
  num_slots = (
    mesh.size * math.ceil(point.clients_per_round / mesh.size)
    if mesh
    else point.clients_per_round
  )
  data = put(engine.DeviceData(images, labels))
  state, table = put(engine.init_state(algorithm, variables, point.num_clients))
  client_table_mb = memory.tree_bytes(table) / 2**20

  def cohort_for(round_idx):
    ids = cohort_lib.sample_clients(
      point.seed, round_idx, point.num_clients, point.clients_per_round
    )
    return cohort_lib.make_cohort(
      ids,
      partition,
      num_slots=num_slots,
      num_steps=point.local_steps,
      batch_size=point.batch_size,
      local_epochs=1,
      local_steps=point.local_steps,
      seed=point.seed,
      round_idx=round_idx,
      labels=labels,
      batches_fn=algorithm.client_batches,
      cohort_batches_fn=algorithm.cohort_batches,
      sampler=point.cohort_sampler,
    )

  choice = executors.fit_to_memory(
    choice,
    lambda: executors.chunk_memory_model(
      spec,
      data,
      state,
      table,
      cohort_for(0).example_idx.shape[1:],
      unroll=unroll,
    ),
    memory_budget=memory.default_memory_budget(),
    num_slots=num_slots,
    num_devices=mesh.size if mesh else 1,
  )
  round_fn = executors.make_round_fn(
    spec, data, executor=choice, steps_per_call=point.local_steps, unroll=unroll
  )

  round_times, cohort_times = [], []
  for round_idx in range(point.rounds + 1):
    start = time.perf_counter()
    cohort = cohort_for(round_idx)
    cohort_times.append(time.perf_counter() - start)
    state, table, metrics = round_fn(state, table, place_cohort(cohort))
    jax.block_until_ready((state, table, metrics))
    round_times.append(time.perf_counter() - start)
  seconds = statistics.median(round_times[1:])
  overlapped = None
  if point.overlap:
    # As experiment.run: round r + 1's cohort is built in a thread while the
    # device runs round r. The first of these rounds builds its own cohort
    # with nothing to hide behind, so it is not counted.
    overlapped_times = []
    start = time.perf_counter()
    first = point.rounds + 1
    for cohort in cohort_lib.prefetch(
      cohort_for, range(first, first + point.rounds + 1)
    ):
      state, table, metrics = round_fn(state, table, place_cohort(cohort))
      jax.block_until_ready((state, table, metrics))
      overlapped_times.append(time.perf_counter() - start)
      start = time.perf_counter()
    overlapped = statistics.median(overlapped_times[1:])
  return {
    **dataclasses.asdict(point),
    'executor': choice.name,
    'chunk_used': choice.chunk_size,
    'unroll': unroll,
    'conv_used': conv_impl,
    'status': 'ok',
    'note': '',
    'backend': backend,
    'device': machine.device_name(),
    'jax_version': jax.__version__,
    'seconds_per_round': seconds,
    'seconds_min': min(round_times[1:]),
    'seconds_max': max(round_times[1:]),
    'cohort_seconds': statistics.median(cohort_times[1:]),
    'overlapped_seconds_per_round': overlapped,
    'compile_seconds': max(round_times[0] - seconds, 0.0),
    'client_steps_per_second': point.clients_per_round
    * point.local_steps
    / seconds,
    'peak_rss_mb': machine.peak_rss_mb(),
    'peak_device_mb': machine.peak_device_mb(),
    'data_mb': (images.nbytes + labels.nbytes) / 2**20,
    'client_table_mb': client_table_mb,
    'train_loss': float(
      metrics['train_loss_sum'] / max(float(metrics['train_examples']), 1.0)
    ),
  }


# ---------------------------------------------------------------------------
# Points in child processes, and the grid.
# ---------------------------------------------------------------------------


def not_measured(point: Point, status: str, note: str) -> Dict[str, Any]:
  """The row of a point that was skipped, timed out or failed."""
  return {**dataclasses.asdict(point), 'status': status, 'note': note}


def measure_in_subprocess(
  point: Point, *, timeout: Optional[float] = None
) -> Dict[str, Any]:
  """`measure_point` in a fresh Python process: per-point peak memory.

  Adds ``wall_seconds`` (the child's whole life, start-up included).
  """
  child = machine.run_child(
    'benchmarks.scaling', [f'--point={point.to_json()}'], timeout=timeout
  )
  if child.status == 'timeout':
    return not_measured(
      point, 'timeout', f'stopped after --max_seconds={timeout:g} s'
    )
  if child.status != 'ok':
    return not_measured(point, child.status, child.note)
  return {**child.result, 'wall_seconds': child.wall_seconds}


def predict_wall_seconds(
  point: Point, finished: Sequence[Dict[str, Any]]
) -> Optional[float]:
  """Wall time of ``point`` from the largest smaller finished point like it.

  Round time is scaled linearly in C (the host executor and the host-side
  cohort are linear; a GPU is at most that); start-up and compile are not.
  """
  like = [
    r
    for r in finished
    if r['status'] == 'ok'
    and r['algorithm'] == point.algorithm
    and r['clients_per_round'] <= point.clients_per_round
    and 'wall_seconds' in r
  ]
  if not like:
    return None
  ref = max(like, key=lambda r: (r['clients_per_round'], r['num_clients']))
  rounds = ref['rounds'] + 1
  fixed = max(ref['wall_seconds'] - rounds * ref['seconds_per_round'], 0.0)
  ratio = point.clients_per_round / ref['clients_per_round']
  return fixed + (point.rounds + 1) * ref['seconds_per_round'] * ratio


def run_grid(
  points: Sequence[Point],
  *,
  max_seconds: float = 0.0,
  isolate: bool = True,
  log: Callable[[str], None] = print,
) -> List[Dict[str, Any]]:
  """Measures every point (each in its own process unless ``isolate=False``).

  ``max_seconds > 0`` skips points predicted to take longer and stops those
  that do (isolated points only). In-process points share one peak RSS.
  """
  results = []
  for point in points:
    name = (
      f'{point.algorithm:>8} C={point.clients_per_round:<6} '
      f'N={point.num_clients:<7}'
    )
    predicted = predict_wall_seconds(point, results)
    if max_seconds > 0 and predicted is not None and predicted > max_seconds:
      result = not_measured(
        point,
        'skipped',
        f'predicted {predicted:.0f} s > --max_seconds={max_seconds:g}',
      )
    elif isolate:
      result = measure_in_subprocess(point, timeout=max_seconds or None)
    else:
      start = time.perf_counter()
      result = measure_point(point)
      result['wall_seconds'] = time.perf_counter() - start
    result['isolated'] = isolate
    results.append(result)
    if result['status'] == 'ok':
      log(
        f'{name} {result["seconds_per_round"]:8.3f} s/round (cohort '
        f'{result["cohort_seconds"]:.3f} s, compile '
        f'{result["compile_seconds"]:.1f} s), peak RSS '
        f'{result["peak_rss_mb"]:.0f} MB'
      )
    else:
      log(f'{name} {result["status"]}: {result["note"]}')
  return results


# ---------------------------------------------------------------------------
# Outputs: JSON, markdown, plot.
# ---------------------------------------------------------------------------

COLUMNS = [
  'algorithm',
  'clients/round',
  'total clients',
  's/round (median)',
  'min-max',
  'cohort s',
  'overlapped s/round',
  'compile s',
  'client-steps/s',
  'peak RSS MB',
  'peak device MB',
  'data MB',
  'client table MB',
  'note',
]


def _number(value, digits):
  return '-' if value is None else f'{value:.{digits}f}'


def format_row(result: Dict[str, Any]) -> List[str]:
  """One table row's cells; a point that was not measured keeps its note."""
  head = [
    result['algorithm'],
    result['clients_per_round'],
    result['num_clients'],
  ]
  if result['status'] != 'ok':
    return head + ['-'] * 10 + [f'{result["status"]}: {result["note"]}']
  return head + [
    f'{result["seconds_per_round"]:.3f}',
    f'{result["seconds_min"]:.3f}-{result["seconds_max"]:.3f}',
    f'{result["cohort_seconds"]:.3f}',
    _number(result.get('overlapped_seconds_per_round'), 3),
    f'{result["compile_seconds"]:.1f}',
    f'{result["client_steps_per_second"]:.0f}',
    f'{result["peak_rss_mb"]:.0f}',
    _number(result['peak_device_mb'], 0),
    f'{result["data_mb"]:.1f}',
    f'{result["client_table_mb"]:.1f}',
    result['note'],
  ]


def describe_work(point: Point) -> str:
  steps = 'step' if point.local_steps == 1 else 'steps'
  pool = f' ({point.pool})' if point.model == 'small_cnn' else ''
  return (
    f'{point.model}{pool}, {"x".join(map(str, point.image_shape))}, '
    f'{point.local_steps} local {steps} of {point.batch_size}, '
    f'{point.examples_per_client} synthetic examples per client, '
    f'{point.cohort_sampler} cohort sampler'
  )


def format_section(
  results: Sequence[Dict[str, Any]], *, device: str, backend: str, command: str
) -> str:
  """A dated markdown section: settings, device, command, one row per point."""
  first = results[0]
  measured = [r for r in results if r['status'] == 'ok']
  executor = measured[0]['executor'] if measured else first['executor']
  jax_version = measured[0]['jax_version'] if measured else '?'
  isolation = (
    'each point in its own process'
    if first.get('isolated', True)
    else 'all points in one process (peak RSS is cumulative)'
  )
  notes = [
    f'Device: {device} ({backend}); jax {jax_version}; executor '
    f'{executor}; median of {first["rounds"]} rounds after 1 warm-up, each '
    'round timed with its host-side cohort building ("cohort s"); '
    '"overlapped s/round": as many more rounds with the next cohort built '
    'in a thread while the device runs the round, as experiment.run does; '
    f'{isolation}.',
    f'Command: `{command}`',
  ]
  return machine.markdown_section(
    f'scaling: {describe_work(point_of(first))}',
    notes,
    COLUMNS,
    [format_row(r) for r in results],
  )


def point_of(result: Dict[str, Any]) -> Point:
  """The `Point` a result (or its JSON) describes; other keys are ignored."""
  names = {f.name for f in dataclasses.fields(Point)}
  fields = {k: v for k, v in result.items() if k in names}
  if 'image_shape' in fields:  # JSON turned the tuple into a list.
    fields['image_shape'] = tuple(fields['image_shape'])
  return Point(**fields)


def append_section(path: str, section: str, backend: str):
  machine.append_markdown(
    path, section, title=f'Scaling on {backend}', script='benchmarks/scaling.py'
  )


def write_json(path: str, results: Sequence[Dict[str, Any]]):
  os.makedirs(os.path.dirname(path) or '.', exist_ok=True)
  with open(path, 'w') as f:
    json.dump(list(results), f, indent=1)


def plot_scaling(
  results: Sequence[Dict[str, Any]],
  path: Optional[str] = None,
  *,
  title: str = '',
):
  """Two log-log panels against clients per round: s/round and peak memory.

  One line per (algorithm, population factor N / C); peak device memory, where
  reported, is dashed beside peak host RSS. Draws on a `Figure` with the Agg
  canvas (no global pyplot backend); saves to ``path`` if given.
  """
  measured = [r for r in results if r['status'] == 'ok']
  fig = Figure(figsize=(11, 4.2))
  FigureCanvasAgg(fig)
  time_ax, memory_ax = fig.subplots(1, 2)
  markers = dict(zip(sorted({r['algorithm'] for r in measured}), 'osD^v<>'))
  lines = sorted(
    {
      (r['algorithm'], r['num_clients'] // r['clients_per_round'])
      for r in measured
    }
  )
  colors = [f'C{i}' for i in range(10)]
  for i, (algorithm, factor) in enumerate(lines):
    rows = sorted(
      (
        r
        for r in measured
        if r['algorithm'] == algorithm
        and r['num_clients'] // r['clients_per_round'] == factor
      ),
      key=lambda r: r['clients_per_round'],
    )
    x = [r['clients_per_round'] for r in rows]
    population = 'N = C' if factor == 1 else f'N = {factor} C'
    style = dict(marker=markers[algorithm], color=colors[i % len(colors)])
    time_ax.plot(
      x,
      [r['seconds_per_round'] for r in rows],
      label=f'{algorithm}, {population}',
      **style,
    )
    memory_ax.plot(
      x,
      [r['peak_rss_mb'] for r in rows],
      label=f'{algorithm}, {population}: host RSS',
      **style,
    )
    device = [
      (xi, r['peak_device_mb'])
      for xi, r in zip(x, rows)
      if r.get('peak_device_mb') is not None
    ]
    if device:
      memory_ax.plot(
        *zip(*device),
        linestyle='--',
        label=f'{algorithm}, {population}: device',
        **style,
      )
  for ax, ylabel in (
    (time_ax, 'seconds per round (median)'),
    (memory_ax, 'peak memory (MB)'),
  ):
    ax.set_xscale('log')
    ax.set_yscale('log')
    ax.set_xlabel('clients per round C')
    ax.set_ylabel(ylabel)
    ax.grid(True, which='both', alpha=0.3)
    if lines:
      ax.legend(fontsize=7)
  time_ax.set_title('time per round')
  memory_ax.set_title('peak memory')
  if title:
    fig.suptitle(title, fontsize=9)
  fig.tight_layout()
  if path:
    os.makedirs(os.path.dirname(path) or '.', exist_ok=True)
    fig.savefig(path, dpi=120)
  return fig


def plot_title(
  results: Sequence[Dict[str, Any]], device: str, backend: str
) -> str:
  measured = [r for r in results if r['status'] == 'ok'] or list(results)
  executor = measured[0].get('executor', '?')
  work = describe_work(point_of(measured[0]))
  return f'{device} ({backend}, executor {executor}): {work}'


def default_paths(backend: str) -> Dict[str, str]:
  return {
    'results': os.path.join('benchmarks', f'scaling_{backend}.json'),
    'table': os.path.join('benchmarks', f'scaling_{backend}.md'),
    'plot': os.path.join('docs', 'results', f'scaling_{backend}.png'),
  }


def save_outputs(
  results: Sequence[Dict[str, Any]],
  *,
  device: str,
  backend: str,
  command: str,
  results_path: str,
  table_path: str,
  plot_path: str,
) -> str:
  """Writes the JSON, appends the markdown section, draws the PNG (none
  when ``plot_path`` is '').

  Returns the markdown section.
  """
  write_json(results_path, results)
  section = format_section(
    results, device=device, backend=backend, command=command
  )
  append_section(table_path, section, backend)
  if plot_path:
    plot_scaling(results, plot_path, title=plot_title(results, device, backend))
  return section


# ---------------------------------------------------------------------------
# Command line.
# ---------------------------------------------------------------------------


def define_flags():
  """The command line, defined only when this file runs as a script.

  Importing the module (the tests, the notebook) then registers no absl flags,
  which could clash with other launch/ modules' in the same process.
  """
  flags.DEFINE_list(
    'clients_per_round', ['10', '100', '1000', '10000'], 'Cohort sizes C.'
  )
  flags.DEFINE_list(
    'population_factors',
    ['1', '10'],
    'Total clients N = C x factor, one point per factor.',
  )
  flags.DEFINE_integer(
    'max_total_clients', 100_000, 'Points with more total clients are left out.'
  )
  flags.DEFINE_list(
    'algorithms',
    ['fedavg', 'fedquad'],
    'Names in fedjax_metric.algorithms.REGISTRY.',
  )
  flags.DEFINE_string(
    'executor',
    'auto',
    'host | vmap | chunked | sequential | auto (host on '
    'CPU, vmap elsewhere: executors.choose_executor).',
  )
  workload_flags.define(
    rounds=Point.rounds,
    model=Point.model,
    pool=Point.pool,
    image_shape=Point.image_shape,
    local_steps=Point.local_steps,
    batch_size=Point.batch_size,
    conv_impl=Point.conv_impl,
    precision=Point.precision,
    unroll=True,
  )
  flags.DEFINE_integer(
    'examples_per_client',
    Point.examples_per_client,
    'Synthetic examples each client holds.',
  )
  flags.DEFINE_integer(
    'chunk_size', Point.chunk_size, 'Slots per chunk (chunked).'
  )
  flags.DEFINE_enum(
    'cohort_sampler',
    Point.cohort_sampler,
    list(cohort_lib.SAMPLERS),
    'How the host draws batches (config.cohort_sampler).',
  )
  flags.DEFINE_boolean(
    'overlap',
    Point.overlap,
    'Also time --rounds rounds with the next cohort built in a thread while '
    'the device runs the round, as experiment.run does ("overlapped s/round").',
  )
  flags.DEFINE_float(
    'max_seconds', 1800.0, 'Wall-time budget of one grid point; 0 = none.'
  )
  flags.DEFINE_string(
    'results', None, 'JSON results (default benchmarks/scaling_<backend>.json).'
  )
  flags.DEFINE_string(
    'table',
    None,
    'Markdown file appended to (default benchmarks/scaling_<backend>.md).',
  )
  flags.DEFINE_string(
    'plot',
    None,
    "PNG (default docs/results/scaling_<backend>.png; --plot='': none).",
  )
  flags.DEFINE_string(
    'point',
    None,
    'Internal: measure this JSON-encoded '
    'Point in this process and print its result line.',
  )


def main(argv):
  del argv
  f = flags.FLAGS
  if f.point:
    machine.print_result(measure_point(Point.from_json(f.point)))
    return
  try:
    check_algorithms(f.algorithms)
  except ValueError as e:
    raise app.UsageError(str(e)) from e
  points = make_grid(
    [int(c) for c in f.clients_per_round],
    [int(x) for x in f.population_factors],
    f.algorithms,
    max_total_clients=f.max_total_clients,
    local_steps=f.local_steps,
    batch_size=f.batch_size,
    examples_per_client=f.examples_per_client,
    rounds=f.rounds,
    executor=f.executor,
    model=f.model,
    pool=f.pool,
    image_shape=tuple(int(x) for x in f.image_shape),
    chunk_size=f.chunk_size,
    unroll=f.unroll,
    precision=f.precision,
    conv_impl=f.conv_impl,
    cohort_sampler=f.cohort_sampler,
    overlap=f.overlap,
  )
  described = machine.describe_backend()
  backend, device = described['backend'], described['device']
  print(
    f'{len(points)} points on {device} ({backend}); each in its own '
    f'process, at most {f.max_seconds:g} s each.',
    flush=True,
  )
  results = run_grid(
    points, max_seconds=f.max_seconds, log=lambda line: print(line, flush=True)
  )
  paths = default_paths(backend)
  command = ' '.join(['python -m benchmarks.scaling', *sys.argv[1:]])
  section = save_outputs(
    results,
    device=device,
    backend=backend,
    command=command,
    results_path=f.results or paths['results'],
    table_path=f.table or paths['table'],
    plot_path=paths['plot'] if f.plot is None else f.plot,
  )
  print(section)


if __name__ == '__main__':
  define_flags()
  app.run(main)
