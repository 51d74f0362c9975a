r"""Where a federated round's time goes, op by op, from a jax.profiler trace.

  python -m benchmarks.profile_round                     # small CNN, 100 clients
  python -m benchmarks.profile_round --model=fedquad_cnn --image_shape=32,32,3 \
      --clients=100 --conv_impl=patches --precision=bf16

Builds benchmarks.bench's synthetic round (FedAvg by default; ``--algorithm``
takes any registered one, e.g. fedquad for its 4B-wide steps), runs one
warm-up round, then traces ``--rounds`` rounds with `jax.profiler.trace`.
The trace's per-op events are matched to the compiled round program's HLO
instructions, which say what each op is (convolution, fusion kind, library
call) and which line of the model made it (the JAX source path in the
instruction's metadata; ``transpose(jvp(...))`` marks the backward pass).
Printed and appended to benchmarks/profile_<backend>.md: time per round by
category and direction, and the ``--top`` ops. The raw trace stays in
``--trace_dir`` for TensorBoard's profile plugin or XProf, with the compiled
program's text beside it (round_program.hlo.txt).

Which events count: on a GPU, the device's "XLA Ops" line (one event per
kernel, attributed to its HLO op); on a CPU, XLA's thread-pool lines, leaf
ops only (the while loop and the thunk executor contain the others). CPU
ops run on several threads at once, so their sum can exceed the wall time.
"""

import collections
import glob
import json
import os
import re
import statistics
import sys
import tempfile
import time
from typing import Dict, List, NamedTuple, Optional

from absl import app, flags
import jax

from benchmarks import machine, scaling, workload_flags
from fedjax_metric import engine, executors


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
  # A GPU's library fusions (Triton GEMMs and others) say which in their
  # backend config.
  re.compile(r'"kind":"(__\w+)"'),
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
  if op.opcode == 'custom-call' and 'xla.gpu.triton' in what:
    # A Pallas kernel (models/implicit_conv.py's convolutions).
    return 'pallas kernel'
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


# Beside the trace: what was traced, and the compiled program's text.
SETTINGS_FILE = 'profile_round.json'
PROGRAM_FILE = 'round_program.hlo.txt'
LIBRARY = 'library:'  # prefix of a kernel no HLO instruction is named for


def library_op(kernel: str) -> HloOp:
  """What a library kernel is, from its name (cuBLAS's 'sm90_xmma_gemm_...'
  and 'nvjet_...', cuDNN's '..._fprop_...' / '_dgrad_' / '_wgrad_')."""
  name = kernel.lower()
  if any(k in name for k in ('fprop', 'dgrad', 'wgrad', 'conv')):
    detail = 'cuDNN convolution'
  elif 'gemm' in name or name.startswith('nvjet'):
    detail = 'cuBLAS gemm'
  elif 'memcpy' in name or 'memset' in name:
    detail = 'memcpy / memset'
  else:
    detail = 'kernel'
  return HloOp('library', detail, '')


def op_of(name: str, hlo: Dict[str, HloOp]) -> HloOp:
  """The `HloOp` of a key of `event_times`."""
  if name.startswith(LIBRARY):
    return library_op(name[len(LIBRARY) :])
  return hlo[name]


def _device_lines(data):
  """The lines whose events are the program's ops: 'XLA Ops' where the
  trace has it (TPUs), else the GPU's stream lines (one event per kernel),
  else, on a CPU, XLA's thread-pool lines."""
  device = [p for p in data.planes if p.name.startswith('/device:')]
  for wanted in (lambda n: n == 'XLA Ops', lambda n: n.startswith('Stream')):
    lines = [line for p in device for line in p.lines if wanted(line.name)]
    if lines:
      return lines
  return [
    line
    for plane in data.planes
    if plane.name.startswith('/host:')
    for line in plane.lines
    if line.name.startswith('tf_XLA')
  ]


def event_key(
  event_name: str,
  hlo_op: Optional[str],
  hlo: Dict[str, HloOp],
  kernel_names: Dict[str, str],
  *,
  kernel: bool,
) -> Optional[str]:
  """The `event_times` key of one trace event: the op its ``hlo_op`` stat
  or its name names (``kernel_names``: an op's name as a kernel's, '.' and
  '-' as '_'); for an unmatched GPU ``kernel``, 'library:' + its name; None
  for a container (its children are timed) or an unmatched CPU event."""
  for name in (hlo_op, event_name, kernel_names.get(event_name)):
    if name in hlo and hlo[name].opcode not in CONTAINERS:
      return name
  return LIBRARY + event_name if kernel else None


def event_times(
  xspace_path: str, hlo: Dict[str, HloOp]
) -> Dict[str, List[float]]:
  """{op name: [duration ns of each event]} for the ops of ``hlo``.

  A GPU kernel is matched by its ``hlo_op`` stat when that names an op,
  else by its name: XLA names a fusion's kernel after the instruction with
  '.' and '-' as '_' (``gemm_fusion_dot_11`` for ``gemm_fusion_dot.11``).
  Inside a CUDA graph (a command buffer) the stat names the buffer, and a
  cuBLAS / cuDNN kernel keeps the library's own name: those are keyed
  ``'library:' + kernel name`` (see `op_of`)."""
  data = jax.profiler.ProfileData.from_file(xspace_path)
  kernel_names = {re.sub(r'[.\-]', '_', name): name for name in hlo}
  times = collections.defaultdict(list)
  for line in _device_lines(data):
    kernels = line.name.startswith('Stream')
    for event in line.events:
      stat = dict(event.stats).get('hlo_op') if kernels else None
      key = event_key(event.name, stat, hlo, kernel_names, kernel=kernels)
      if key is not None:
        times[key].append(event.duration_ns)
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
    op = op_of(name, hlo)
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
    op = op_of(name, hlo)
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
  """A traced round: the program's `HloOp`s by name, each op's event
  durations (ns; `event_times`), the xplane file, and what was traced
  (`settings`: the arguments of `profile`, with the convolution form and
  unrolling it resolved, the traced rounds' wall seconds, device and jax
  version; saved beside the trace as profile_round.json)."""

  hlo: Dict[str, HloOp]
  times: Dict[str, List[float]]
  path: str
  settings: dict


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
  ``unroll``: as benchmarks/bench.py's (None: unrolled local steps on CPU with
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
    program = round_fn.jitted.lower(state, table, first, data).compile()
    state, table, metrics = round_fn(state, table, first)
    jax.block_until_ready((state, table, metrics))
    cohorts = [cohort(r) for r in range(1, rounds + 1)]
    trace_dir = trace_dir or tempfile.mkdtemp(prefix='profile_round_')
    # The program's text beside the trace: its op names are the trace's
    # event names, so the two can be matched again later (parse_hlo).
    os.makedirs(trace_dir, exist_ok=True)
    with open(os.path.join(trace_dir, PROGRAM_FILE), 'w') as f:
      f.write(program.as_text())
    seconds = []
    with jax.profiler.trace(trace_dir):
      for c in cohorts:
        start = time.perf_counter()
        state, table, metrics = round_fn(state, table, c)
        jax.block_until_ready((state, table, metrics))
        seconds.append(time.perf_counter() - start)
  settings = dict(
    algorithm=algorithm,
    model=model,
    image_shape=list(image_shape),
    clients=num_clients,
    local_steps=local_steps,
    batch_size=batch_size,
    executor=executor,
    conv_impl=conv_used,
    precision=precision,
    rounds=rounds,
    unroll=unroll,
    seconds=seconds,
    device=machine.device_name(),
    backend=jax.default_backend(),
    jax=jax.__version__,
  )
  with open(os.path.join(trace_dir, SETTINGS_FILE), 'w') as f:
    json.dump(settings, f)
  return saved_profile(trace_dir)


def saved_profile(trace_dir: str) -> Profile:
  """A `Profile` re-read from a ``trace_dir`` that `profile` left: its
  newest xplane, round_program.hlo.txt and profile_round.json."""
  paths = sorted(
    glob.glob(os.path.join(trace_dir, '**', '*.xplane.pb'), recursive=True)
  )
  program = os.path.join(trace_dir, PROGRAM_FILE)
  saved = os.path.join(trace_dir, SETTINGS_FILE)
  if not paths or not os.path.exists(program) or not os.path.exists(saved):
    raise FileNotFoundError(
      f'{trace_dir} lacks a *.xplane.pb, {PROGRAM_FILE} or '
      f'{SETTINGS_FILE}: give --from_trace the --trace_dir of an earlier '
      'profile_round run.'
    )
  with open(program) as f:
    hlo = parse_hlo(f.read())
  with open(saved) as f:
    settings = json.load(f)
  return Profile(hlo, event_times(paths[-1], hlo), paths[-1], settings)


def report(traced: Profile, *, top: int, out: str):
  """Prints the tables of a `Profile` and appends them to ``out``
  (default benchmarks/profile_<the traced backend>.md)."""
  settings = traced.settings
  backend = settings['backend']
  category_rows, op_rows, total = summarize(
    traced.times, traced.hlo, rounds=settings['rounds'], top=top
  )
  seconds = settings.get('seconds')
  wall = (
    f'median {statistics.median(seconds) * 1e3:.1f} ms of {len(seconds)}'
    if seconds
    else 'not recorded'
  )
  notes = [
    f'Device: {settings["device"]} ({backend}); jax {settings["jax"]}; '
    f'{settings["algorithm"]}, {settings["clients"]} clients x '
    f'{settings["local_steps"]} steps of {settings["batch_size"]}, executor '
    f'{settings["executor"]}, conv {settings["conv_impl"] or "-"}, precision '
    f'{settings["precision"]}, unroll={settings["unroll"]}.',
    f'Round wall time while tracing: {wall}; ops listed: {total:.1f} ms per '
    'round (on CPU, summed over threads; on a GPU, kernel time, '
    "cuBLAS / cuDNN kernels as 'library'). Trace: " + traced.path,
    f'Command: `{" ".join(["python -m benchmarks.profile_round", *sys.argv[1:]])}`',
  ]
  shape = 'x'.join(map(str, settings['image_shape']))
  section = machine.markdown_section(
    f'profile: {settings["model"]} {shape}, {settings["clients"]} clients',
    notes,
    ['category', 'pass', 'ms per round', 'share'],
    category_rows,
  )
  section += '\n' + machine.markdown_table(
    ['what', 'source', 'ops', 'calls per round', 'ms per round', 'share'],
    op_rows,
  )
  machine.append_markdown(
    out or os.path.join('benchmarks', f'profile_{backend}.md'),
    section,
    title=f'Round profiles on {backend}',
    script='benchmarks/profile_round.py',
  )
  print(section)


def define_flags():
  """This script's flags, defined only when it is the program."""
  flags.DEFINE_string('algorithm', 'fedavg', 'Registered algorithm.')
  workload_flags.define(
    rounds=2, rounds_help='Traced rounds after one warm-up.', unroll=True
  )
  flags.DEFINE_integer('clients', 100, 'Clients per round.')
  flags.DEFINE_enum(
    'executor', 'vmap', ['vmap', 'chunked', 'sequential'], 'Executor.'
  )
  flags.DEFINE_integer('top', 20, 'Ops listed.')
  flags.DEFINE_string('trace_dir', '', 'Where the trace stays (default: tmp).')
  flags.DEFINE_string(
    'from_trace',
    '',
    'Report on a trace an earlier run left in this --trace_dir instead of '
    'tracing (its profile_round.json says what was traced).',
  )
  flags.DEFINE_string(
    'out', '', 'Markdown log (default benchmarks/profile_<backend>.md).'
  )


def main(argv):
  del argv
  f = flags.FLAGS
  if f.from_trace:
    report(saved_profile(f.from_trace), top=f.top, out=f.out)
    return
  scaling.check_algorithms([f.algorithm])
  traced = profile(
    algorithm=f.algorithm,
    model=f.model,
    pool=f.pool,
    image_shape=tuple(int(x) for x in f.image_shape),
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
  report(traced, top=f.top, out=f.out)


if __name__ == '__main__':
  define_flags()
  app.run(main)
