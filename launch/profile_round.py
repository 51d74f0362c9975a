r"""Where a federated round's time goes, op by op, from a jax.profiler trace.

  python -m launch.profile_round                     # small CNN, 100 clients
  python -m launch.profile_round --model=fedquad_cnn --image_shape=32,32,3 \
      --clients=100 --conv_impl=patches --precision=bf16

Builds launch.bench's synthetic round (FedAvg by default; ``--algorithm``
takes any registered one, e.g. fedquad for its 4B-wide steps), runs one
warm-up round, then traces ``--rounds`` rounds with `jax.profiler.trace`.
The trace's per-op events are matched to the compiled round program's HLO
instructions, which say what each op is (convolution, fusion kind, library
call) and which line of the model made it (the JAX source path in the
instruction's metadata; ``transpose(jvp(...))`` marks the backward pass).
Printed and appended to benchmarks/profile_<backend>.md: time per round by
category and direction, and the ``--top`` ops. The raw trace stays in
``--trace_dir`` for TensorBoard's profile plugin or XProf.

Which events count: on a GPU, the device's "XLA Ops" line (one event per
kernel, attributed to its HLO op); on a CPU, XLA's thread-pool lines, leaf
ops only (the while loop and the thunk executor contain the others). CPU
ops run on several threads at once, so their sum can exceed the wall time.
"""

import collections
import glob
import os
import re
import statistics
import sys
import tempfile
import time
from typing import Dict, List, NamedTuple, Optional

from absl import app, flags
import jax

from fedjax_metric import engine, executors
from launch import machine, scaling


class HloOp(NamedTuple):
  """One instruction of the compiled program.

  Attributes:
    opcode: 'convolution', 'fusion', 'custom-call', 'dot', ...
    detail: what else says what it is: a fusion's kind, a library call's
      target, a convolution's group counts ('' when none).
    source: the JAX source path from its metadata, shortened ('' if none).
  """

  opcode: str
  detail: str
  source: str


CONTAINERS = ('while', 'conditional', 'call')  # they time their children
_DETAILS = (
  re.compile(r'kind=(k\w+)'),
  re.compile(r'custom_call_target="([^"]+)"'),
  re.compile(r'(feature_group_count=\d+)'),
  re.compile(r'(batch_group_count=\d+)'),
)


def _skip_type(text: str) -> str:
  """``text`` after its leading HLO type (a shape, or a tuple of shapes)."""
  if not text.startswith('('):
    return text.split(' ', 1)[1] if ' ' in text else ''
  depth = 0
  for i, char in enumerate(text):
    depth += {'(': 1, ')': -1}.get(char, 0)
    if depth == 0:
      return text[i + 1 :].lstrip()
  return ''


def shorten_source(op_name: str, parts: int = 3) -> str:
  """The last ``parts`` components of a JAX op_name path, with 'backward'
  in front when it comes from a transpose (the gradient computation)."""
  components = [c for c in op_name.split('/') if c]
  tail = '/'.join(components[-parts:])
  return f'backward {tail}' if 'transpose(' in op_name else tail


def parse_hlo(text: str) -> Dict[str, HloOp]:
  """{instruction name: `HloOp`} of every instruction in an HLO module's
  text (``compiled.as_text()``)."""
  ops = {}
  for line in text.splitlines():
    line = line.strip()
    if line.startswith('ROOT '):
      line = line[5:]
    if ' = ' not in line or line.startswith(('HloModule', '//')):
      continue
    name, rest = line.split(' = ', 1)
    name = name.lstrip('%')
    if not re.fullmatch(r'[\w.\-]+', name):
      continue
    call = _skip_type(rest)
    opcode = call.split('(', 1)[0].strip()
    if not re.fullmatch(r'[a-z][\w\-]*', opcode):
      continue
    details = [m.group(1) for p in _DETAILS for m in [p.search(call)] if m]
    source = re.search(r'op_name="([^"]+)"', call)
    ops[name] = HloOp(
      opcode,
      ' '.join(details),
      shorten_source(source.group(1)) if source else '',
    )
  return ops


def category(op: HloOp) -> str:
  """A coarse class of an op, for the per-category table."""
  what = f'{op.opcode} {op.detail}'.lower()
  if 'conv' in what:
    return 'convolution'
  if op.opcode == 'dot' or any(k in what for k in ('gemm', 'cublas', 'matmul')):
    return 'matmul'
  if op.opcode in ('copy', 'transpose', 'copy-start', 'copy-done'):
    return 'copy / transpose'
  if op.opcode in (
    'gather',
    'scatter',
    'dynamic-slice',
    'dynamic-update-slice',
  ):
    return 'gather / scatter'
  if op.opcode in ('reduce', 'reduce-window', 'select-and-scatter'):
    return op.opcode
  if op.opcode == 'fusion':
    # XLA's CPU backend calls XNNPACK for its 'kCustom' fusions, which hold
    # the convolutions and matmuls it hands over.
    return 'fusion (library)' if 'kCustom' in op.detail else 'fusion'
  return 'other'


def event_times(
  xspace_path: str, hlo: Dict[str, HloOp]
) -> Dict[str, List[float]]:
  """{op name: [duration ns of each event]} for the ops of ``hlo``."""
  data = jax.profiler.ProfileData.from_file(xspace_path)
  device_lines = [
    line
    for plane in data.planes
    if plane.name.startswith('/device:')
    for line in plane.lines
    if line.name == 'XLA Ops'
  ]
  lines = device_lines or [
    line
    for plane in data.planes
    if plane.name.startswith('/host:')
    for line in plane.lines
    if line.name.startswith('tf_XLA')
  ]
  times = collections.defaultdict(list)
  for line in lines:
    for event in line.events:
      op = hlo.get(event.name)
      if op is not None and op.opcode not in CONTAINERS:
        times[event.name].append(event.duration_ns)
  return dict(times)


def summarize(
  times: Dict[str, List[float]],
  hlo: Dict[str, HloOp],
  *,
  rounds: int,
  top: int,
):
  """(category rows, top rows, total op ms per round), rows as lists of
  table cells, largest first. A top row is every op of one kind made by one
  line of the model (an unrolled loop copies it once per step)."""
  total = sum(sum(t) for t in times.values()) / rounds / 1e6
  by_category = collections.Counter()
  for name, durations in times.items():
    op = hlo[name]
    direction = 'backward' if op.source.startswith('backward') else 'forward'
    by_category[(category(op), direction)] += sum(durations) / rounds / 1e6
  share = lambda ms: f'{100 * ms / total:.1f}%' if total else '-'
  category_rows = [
    [kind, direction, f'{ms:.2f}', share(ms)]
    for (kind, direction), ms in by_category.most_common()
  ]
  # Ops that do the same thing for the same line of the model (the copies an
  # unrolled loop makes, one per step) are one row.
  groups = collections.defaultdict(lambda: [0.0, 0, []])
  for name, durations in times.items():
    op = hlo[name]
    group = groups[(f'{op.opcode} {op.detail}'.strip(), op.source or '-')]
    group[0] += sum(durations) / rounds / 1e6
    group[1] += len(durations)
    group[2].append(name)
  ranked = sorted(groups.items(), key=lambda kv: -kv[1][0])[:top]
  op_rows = [
    [
      what,
      source,
      f'`{min(names)}`' + (f' (+{len(names) - 1})' if len(names) > 1 else ''),
      f'{calls / rounds:g}',
      f'{ms:.2f}',
      share(ms),
    ]
    for (what, source), (ms, calls, names) in ranked
  ]
  return category_rows, op_rows, total


class Profile(NamedTuple):
  """What `profile` traced: the program's `HloOp`s by name, each op's event
  durations (ns), the traced rounds' wall seconds, the xplane file, and the
  convolution form (None: the model has no choice) and unrolling used."""

  hlo: Dict[str, HloOp]
  times: Dict[str, List[float]]
  seconds: List[float]
  path: str
  conv_impl: Optional[str]
  unroll: bool


def profile(
  *,
  algorithm: str = 'fedavg',
  model: str = 'small_cnn',
  pool: str = 'stride',
  image_shape=(28, 28, 1),
  num_clients: int = 100,
  local_steps: int = 10,
  batch_size: int = 32,
  executor: str = 'vmap',
  conv_impl: str = 'auto',
  precision: str = 'default',
  rounds: int = 2,
  trace_dir: str = '',
  unroll=None,
):
  """Traces ``rounds`` rounds after a warm-up one. ``conv_impl``,
  ``unroll``: as launch/bench.py's (None: unrolled local steps on CPU with
  xla convolutions only).

  Returns a `Profile`.
  """
  conv_used, unroll = scaling.round_forms(
    model, conv_impl, executors.choose_executor(executor), unroll
  )
  with executors.matmul_precision(precision):
    run = scaling.synthetic_run(
      algorithm,
      model,
      pool=pool,
      image_shape=tuple(image_shape),
      num_clients=num_clients,
      examples_per_client=local_steps * batch_size,
      precision=precision,
      conv_impl=conv_used,
    )
    data = jax.device_put(engine.DeviceData(run.images, run.labels))
    round_fn = executors.make_round_fn(
      run.spec,
      data,
      executor=executor,
      steps_per_call=local_steps,
      unroll=unroll,
    )
    state, table = engine.init_state(run.algorithm, run.variables, num_clients)

    def cohort(round_idx):
      return jax.device_put(
        scaling.full_cohort(
          run, round_idx, local_steps=local_steps, batch_size=batch_size
        )
      )

    first = cohort(0)
    hlo = parse_hlo(
      round_fn.jitted.lower(state, table, first, data).compile().as_text()
    )
    state, table, metrics = round_fn(state, table, first)
    jax.block_until_ready((state, table, metrics))
    cohorts = [cohort(r) for r in range(1, rounds + 1)]
    trace_dir = trace_dir or tempfile.mkdtemp(prefix='profile_round_')
    seconds = []
    with jax.profiler.trace(trace_dir):
      for c in cohorts:
        start = time.perf_counter()
        state, table, metrics = round_fn(state, table, c)
        jax.block_until_ready((state, table, metrics))
        seconds.append(time.perf_counter() - start)
  paths = sorted(
    glob.glob(os.path.join(trace_dir, '**', '*.xplane.pb'), recursive=True)
  )
  return Profile(
    hlo,
    event_times(paths[-1], hlo),
    seconds,
    paths[-1],
    conv_used,
    unroll,
  )


def define_flags():
  """This script's flags, defined only when it is the program."""
  flags.DEFINE_string('algorithm', 'fedavg', 'Registered algorithm.')
  flags.DEFINE_string('model', 'small_cnn', 'Model (models.build).')
  flags.DEFINE_string('pool', 'stride', 'small_cnn pool: stride|avg|max.')
  flags.DEFINE_list('image_shape', ['28', '28', '1'], 'H,W,C.')
  flags.DEFINE_integer('clients', 100, 'Clients per round.')
  flags.DEFINE_integer('local_steps', 10, 'Local steps per client.')
  flags.DEFINE_integer('batch_size', 32, 'Batch size.')
  flags.DEFINE_enum(
    'executor', 'vmap', ['vmap', 'chunked', 'sequential'], 'Executor.'
  )
  flags.DEFINE_enum(
    'conv_impl',
    'auto',
    list(executors.CONV_IMPLS),
    'Convolution form (config.model.conv_impl).',
  )
  flags.DEFINE_enum(
    'precision', 'default', list(executors.PRECISIONS), 'config.precision.'
  )
  flags.DEFINE_integer('rounds', 2, 'Traced rounds after one warm-up.')
  flags.DEFINE_boolean(
    'unroll',
    None,
    'Unroll local steps (default: on CPU with xla convolutions, as '
    'launch.bench).',
  )
  flags.DEFINE_integer('top', 20, 'Ops listed.')
  flags.DEFINE_string('trace_dir', '', 'Where the trace stays (default: tmp).')
  flags.DEFINE_string(
    'out', '', 'Markdown log (default benchmarks/profile_<backend>.md).'
  )


def main(argv):
  del argv
  f = flags.FLAGS
  scaling.check_algorithms([f.algorithm])
  image_shape = tuple(int(x) for x in f.image_shape)
  backend = jax.default_backend()
  traced = profile(
    algorithm=f.algorithm,
    model=f.model,
    pool=f.pool,
    image_shape=image_shape,
    num_clients=f.clients,
    local_steps=f.local_steps,
    batch_size=f.batch_size,
    executor=f.executor,
    conv_impl=f.conv_impl,
    precision=f.precision,
    rounds=f.rounds,
    trace_dir=f.trace_dir,
    unroll=f.unroll,
  )
  category_rows, op_rows, total = summarize(
    traced.times, traced.hlo, rounds=f.rounds, top=f.top
  )
  seconds, path = traced.seconds, traced.path
  wall = statistics.median(seconds)
  notes = [
    f'Device: {machine.device_name()} ({backend}); jax {jax.__version__}; '
    f'{f.algorithm}, {f.clients} clients x {f.local_steps} steps of '
    f'{f.batch_size}, executor {f.executor}, conv '
    f'{traced.conv_impl or "-"} ({f.conv_impl}), precision {f.precision}, '
    f'unroll={traced.unroll}.',
    f'Round wall time while tracing: median {wall * 1e3:.1f} ms of '
    f'{len(seconds)}; ops listed: {total:.1f} ms per round (on CPU, summed '
    'over threads). Trace: ' + path,
    f'Command: `{" ".join(["python -m launch.profile_round", *sys.argv[1:]])}`',
  ]
  shape = 'x'.join(map(str, image_shape))
  section = machine.markdown_section(
    f'profile: {f.model} {shape}, {f.clients} clients',
    notes,
    ['category', 'pass', 'ms per round', 'share'],
    category_rows,
  )
  section += '\n' + machine.markdown_table(
    ['what', 'source', 'ops', 'calls per round', 'ms per round', 'share'],
    op_rows,
  )
  machine.append_markdown(
    f.out or os.path.join('benchmarks', f'profile_{backend}.md'),
    section,
    title=f'Round profiles on {backend}',
    script='launch/profile_round.py',
  )
  print(section)


if __name__ == '__main__':
  define_flags()
  app.run(main)
