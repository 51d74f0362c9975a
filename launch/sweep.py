r"""Multi-seed sweeps: a grid of independent runs, then tables and curves.

Run a grid (configs x overrides x seeds), one workdir per point:

  python -m launch.sweep run --root=runs/sweeps/demo \
      --config=configs/fedavg.py:dataset=fashion_mnist \
      --config=configs/fedprox.py:dataset=fashion_mnist \
      --set='num_rounds=5' --grid='partition.alpha=0.1,0.3;seed=0,1,2' \
      --parallel=1

Every point is ``<root>/<config>/<overrides>``, trained by its own process
(``python -m launch.sweep point``, log in ``<workdir>/sweep.log``). Running
the same command again skips finished points (a ``summary.json`` for the
same config), resumes unfinished ones from their checkpoints, and refuses a
workdir that holds a different experiment. A point whose process a signal
stops (SIGTERM: preemption, a ``kill``) saves its checkpoint and exits 128 +
the signal; the sweep reports it 'stopped', not done, and exits non-zero.
``--parallel=N`` runs N points at
once; ``--gpus=0,1`` pins each process slot to one GPU. ``--backend=slurm``
submits the points as a SLURM job array instead (launch/sweep_slurm.py).

Aggregate the finished workdirs under one or more roots:

  python -m launch.sweep table --root=runs/sweeps/demo --rows=algorithm \
      --cols=partition.alpha --metric=test_accuracy,test_accuracy_ema \
      --at=final --format=markdown
  python -m launch.sweep plot --root=runs/sweeps/demo --rows=algorithm \
      --cols=partition.alpha --metric=test_accuracy --out=curves.png

A table cell is ``mean ± std (n=...)`` over the runs whose configs differ
only in seed (anything else that differs inside a cell is an error: add the
key to --rows or --cols, or narrow with --where; a field that only some
runs' config.json holds, one added to the library in between, is ignored).
``--at`` picks each run's value: ``final`` (last evaluation), ``best``
(maximum), ``last:K`` (mean of the last K evaluations), ``top:K`` (mean of
the K best) or ``round:R``; ``@T`` after any of them reads the run as if it
had stopped at round T (``top:5@1000``). A
metric named ``<name>_ema`` is the exponential moving average
(``--ema_decay``, 0.9) of ``<name>`` over the run's evaluations,
bias-corrected (``s_t = d s_{t-1} + (1 - d) x_t`` from
``s_0 = 0``, divided by ``1 - d^t``): FedRCL's reported accuracy (Seo et
al., 'Relaxed Contrastive Learning for Federated Learning', CVPR 2024,
Table 1: "exponential moving average results with parameter 0.9"). Curves
show the mean over seeds with a shaded band of one standard deviation.
"""

import collections
import csv
import difflib
import io
import json
import math
import os
import signal
import subprocess
import sys
import threading
import time
from typing import Any, Callable, Dict, List, NamedTuple, Optional, Sequence

from absl import app, flags, logging
import numpy as np

from fedjax_metric.config_io import flatten
from fedjax_metric.overrides import assignments, parse_assignments

from . import cli, sweep_slurm
from .sweep_point import (
  MAX_NAME,
  POINT_FILE,
  RESUMABLE_KEYS,
  Point,
  PointStopped,
  config_dict,
  differing_keys,
  grid_points,
  make_points,
  parse_grid,
  parse_set,
  point_status,
  read_json,
  resolve,
  run_point,
  workdir_for,
  write_point_file,
)

# What other modules and the tests use from launch.sweep (some defined in
# launch/sweep_point.py and re-exported).
__all__ = [
  'build_table',
  'Cell',
  'config_dict',
  'default_scale',
  'define_flags',
  'differing_keys',
  'ema',
  'EXECUTION_KEYS',
  'find_runs',
  'format_cell',
  'format_csv',
  'format_markdown',
  'gpu_environments',
  'grid_points',
  'group_runs',
  'label',
  'LOG_FILE',
  'main',
  'make_points',
  'matches',
  'MAX_NAME',
  'mean_curve',
  'parse_assignments',
  'parse_grid',
  'parse_set',
  'pick',
  'plot_curves',
  'plot_groups',
  'Point',
  'point_command',
  'POINT_FILE',
  'point_status',
  'PointStopped',
  'read_json',
  'read_run',
  'resolve',
  'RESUMABLE_KEYS',
  'Run',
  'run_point',
  'run_points',
  'series',
  'sort_points',
  'STOP_SIGNALS',
  'sweep_slurm',
  'Table',
  'train_points',
  'workdir_for',
  'write_point_file',
]

LOG_FILE = 'sweep.log'
# A point's process exits 128 + one of these after it saved its checkpoint.
STOP_SIGNALS = (int(signal.SIGTERM), int(signal.SIGINT))
# Config keys that change how a run executes or logs, not what it computes:
# runs that differ only in these (and the seed) share a table cell.
EXECUTION_KEYS = (
  'seed',
  'progress',
  'checkpoint_every',
  'keep_checkpoints',
  'plot_partition',
  'executor',
  'chunk_size',
  'steps_per_call',
  'unroll',
  'num_devices',
  'memory_budget_gb',
  'logging.per_client',
  'logging.wandb',
)


# ---------------------------------------------------------------------------
# Grids and configs.
# ---------------------------------------------------------------------------


# ---------------------------------------------------------------------------
# Running points.
# ---------------------------------------------------------------------------


def point_command(workdir: str) -> List[str]:
  """The child process that trains one point."""
  # launch.sweep in a checkout, fedjax_metric.launch.sweep when installed.
  module = __spec__.name if __spec__ else 'launch.sweep'
  return [sys.executable, '-m', module, 'point', f'--workdir={workdir}']


def sort_points(points: Sequence[Point], say: Callable[[str], None]):
  """``(outcomes, todo)``: finished points 'skipped' and conflicting ones
  'conflict' (said) in ``outcomes``, the rest in ``todo``."""
  outcomes, todo = {}, []
  for point in points:
    status = point_status(point)
    if status == 'done':
      outcomes[point.workdir] = 'skipped'
    elif status == 'conflict':
      outcomes[point.workdir] = 'conflict'
      say(
        f'CONFLICT {point.workdir}: it holds a run with another config; '
        'use another --root or delete it.'
      )
    else:
      todo.append(point)
  return outcomes, todo


def gpu_environments(gpus: Sequence[str], parallel: int):
  """Environment additions of the ``parallel`` process slots: slot i sees
  only GPU ``gpus[i % len(gpus)]``; where several slots share a GPU, JAX does
  not preallocate and each takes at most its share of the memory. [{}] per
  slot without ``gpus``."""
  if not gpus:
    return [{} for _ in range(parallel)]
  sharing = -(-parallel // len(gpus))
  environments = []
  for slot in range(parallel):
    env = {'CUDA_VISIBLE_DEVICES': str(gpus[slot % len(gpus)])}
    if sharing > 1:
      env['XLA_PYTHON_CLIENT_PREALLOCATE'] = 'false'
      env['XLA_PYTHON_CLIENT_MEM_FRACTION'] = f'{0.9 / sharing:.3f}'
    environments.append(env)
  return environments


def run_points(
  points: Sequence[Point],
  *,
  parallel: int = 1,
  command: Callable[[str], List[str]] = point_command,
  say: Callable[[str], None] = print,
  environment: Optional[Sequence[Dict[str, str]]] = None,
) -> Dict[str, str]:
  """Runs the unfinished points, ``parallel`` processes at a time.

  ``environment``: per process slot (``parallel`` of them), variables added
  to that slot's children's environment (`gpu_environments`).

  Returns ``{workdir: outcome}`` with outcome 'skipped' (already finished),
  'done', 'stopped (SIGTERM)' (its process was stopped by a signal after
  saving a checkpoint: unfinished), 'failed (rc=...)' or 'conflict' (the
  workdir holds another experiment; left untouched).
  """
  if parallel < 1:
    raise ValueError(f'parallel must be >= 1, got {parallel}.')
  outcomes, todo = sort_points(points, say)
  say(
    f'{len(points)} points: {len(points) - len(todo)} finished or in '
    f'conflict, {len(todo)} to run, {parallel} at a time.'
  )
  running = {}  # Popen -> (point, start time, log file)
  queue = collections.deque(todo)
  finished = 0
  with _ForwardedStop(running) as stop:
    while (queue or running) and not stop.signals:
      finished = _poll_points(
        running,
        queue,
        parallel,
        command,
        say,
        outcomes,
        finished,
        len(todo),
        environment or [{} for _ in range(parallel)],
      )
  if stop.signals:
    name = signal.Signals(stop.signals[0]).name
    say(
      f'{name}: stopped; {len(todo) - finished} point(s) not finished (the '
      'running ones saved a checkpoint after their round in progress). Run '
      'the same command again to resume.'
    )
    sys.exit(128 + stop.signals[0])
  return outcomes


def train_points(
  points: Sequence[Point],
  *,
  backend: str,
  root: str,
  parallel: int = 1,
  gpus: Sequence[str] = (),
  slurm: str = '',
  retries: int = 1,
) -> Dict[str, str]:
  """Trains the unfinished points on ``backend``: 'local' (`run_points`,
  ``parallel`` processes, one GPU of ``gpus`` per process slot) or 'slurm'
  (one job array through submitit, its logs under ``<root>/slurm``, failed
  tasks resubmitted ``retries`` times). Returns ``{workdir: outcome}``."""
  if backend == 'slurm':
    executor = sweep_slurm.make_executor(
      sweep_slurm.slurm_folder(root), sweep_slurm.parse_parameters(slurm)
    )
    outcomes, todo = sort_points(points, print)
    print(f'{len(points)} points: {len(todo)} to submit.')
    for point in todo:
      write_point_file(point)
    outcomes.update(sweep_slurm.submit_points(todo, executor, retries=retries))
    return outcomes
  return run_points(
    points, parallel=parallel, environment=gpu_environments(gpus, parallel)
  )


class _ForwardedStop:
  """SIGTERM / SIGINT to the sweep stop it and reach its running points.

  The children share the sweep's process group, so a terminal's Ctrl-C
  reaches them directly; a ``kill`` of the sweep's PID does not. Either
  way each running point is sent SIGTERM (a point stops after its round in
  progress with a checkpoint; one already stopping by Ctrl-C just stops), no
  new point starts, and the sweep waits for them before it exits: no child
  keeps training after its sweep is gone.
  """

  def __init__(self, running):
    self.running = running
    self.signals = []
    self._signaled = set()
    self._previous = {}

  def _forward(self):
    # Once per child: a second SIGTERM would stop it at once, mid-round.
    for process in self.running:
      if process.poll() is None and process not in self._signaled:
        process.send_signal(signal.SIGTERM)
        self._signaled.add(process)

  def _handle(self, signum, frame):
    del frame
    self.signals.append(signum)
    self._forward()

  def __enter__(self):
    if threading.current_thread() is threading.main_thread():
      for signum in (signal.SIGTERM, signal.SIGINT):
        self._previous[signum] = signal.signal(signum, self._handle)
    return self

  def __exit__(self, *exc_info):
    try:
      if self.signals:  # Also a point started while the signal came.
        self._forward()
      for process, (_, _, log, _) in list(self.running.items()):
        process.wait()
        log.close()
    finally:
      for signum, previous in self._previous.items():
        signal.signal(signum, previous)
    return False


def _poll_points(
  running, queue, parallel, command, say, outcomes, finished, total, slots_env
):
  """Starts points up to ``parallel`` (each in a free process slot, with
  that slot's ``slots_env``) and records the ones that ended; returns the
  count of finished points."""
  while queue and len(running) < parallel:
    point = queue.popleft()
    write_point_file(point)
    log = open(os.path.join(point.workdir, LOG_FILE), 'a')
    slot = min(set(range(parallel)) - {v[3] for v in running.values()})
    process = subprocess.Popen(
      command(point.workdir),
      stdout=log,
      stderr=subprocess.STDOUT,
      env={**os.environ, **slots_env[slot]},
    )
    running[process] = (point, time.time(), log, slot)
    say(f'start {point.workdir}')
  for process in list(running):
    if process.poll() is None:
      continue
    point, start, log, _ = running.pop(process)
    log.close()
    finished += 1
    seconds = time.time() - start
    if process.returncode == 0:
      outcomes[point.workdir] = 'done'
      summary = read_json(os.path.join(point.workdir, 'summary.json')) or {}
      shown = {
        k: round(v, 4)
        for k, v in summary.items()
        if k.startswith('test_') and 'accuracy' in k
      }
      say(
        f'[{finished}/{total}] done in {seconds:.0f} s {point.workdir} {shown}'
      )
    elif process.returncode - 128 in STOP_SIGNALS:
      # `launch.sweep point` after SIGTERM / SIGINT: checkpoint saved.
      name = signal.Signals(process.returncode - 128).name
      outcomes[point.workdir] = f'stopped ({name})'
      say(
        f'[{finished}/{total}] STOPPED by {name} {point.workdir}: '
        'unfinished, its checkpoint kept; run the same command again to '
        'resume it.'
      )
    else:
      outcomes[point.workdir] = f'failed (rc={process.returncode})'
      say(
        f'[{finished}/{total}] FAILED rc={process.returncode} '
        f'{point.workdir}; see {LOG_FILE} there.'
      )
  if running:
    time.sleep(0.2)
  return finished


# ---------------------------------------------------------------------------
# Reading finished workdirs.
# ---------------------------------------------------------------------------


class Run(NamedTuple):
  workdir: str
  config: Dict[str, Any]  # flattened config.json
  evaluations: List[Dict[str, Any]]  # metrics.jsonl rows, by round
  summary: Optional[Dict[str, Any]]

  @property
  def finished(self) -> bool:
    return self.summary is not None and self.summary.get(
      'rounds_completed'
    ) == self.config.get('num_rounds')


def read_run(workdir: str) -> Run:
  config = read_json(os.path.join(workdir, 'config.json'))
  if config is None:
    raise FileNotFoundError(f'{workdir}/config.json not found.')
  rows = []
  path = os.path.join(workdir, 'metrics.jsonl')
  if os.path.exists(path):
    with open(path) as f:
      rows = [json.loads(line) for line in f if line.strip()]
  rows.sort(key=lambda r: r['round'])
  return Run(
    workdir,
    flatten(config, hashable=True),
    rows,
    read_json(os.path.join(workdir, 'summary.json')),
  )


def find_runs(
  roots: Sequence[str], *, include_unfinished: bool = False
) -> List[Run]:
  """Every workdir (a directory holding config.json) under the roots.

  Only finished runs, unless ``include_unfinished`` (then also runs with at
  least one evaluation).
  """
  runs = []
  for root in roots:
    if not os.path.isdir(root):
      raise FileNotFoundError(f'--root {root!r} is not a directory.')
    for directory, subdirs, files in sorted(os.walk(root)):
      subdirs.sort()
      if 'config.json' in files:
        subdirs[:] = []  # A workdir's checkpoints are not workdirs.
        run = read_run(directory)
        if run.finished or (include_unfinished and run.evaluations):
          runs.append(run)
  return runs


def matches(run: Run, where: Dict[str, str]) -> bool:
  """True when every ``key=value`` of ``where`` holds (values as text)."""
  return all(_label_value(run.config.get(k)) == v for k, v in where.items())


def ema(values: Sequence[float], decay: float) -> np.ndarray:
  """Bias-corrected exponential moving average of a series.

  ``s_t = decay * s_{t-1} + (1 - decay) * x_t``, ``s_0 = 0``, reported as
  ``s_t / (1 - decay**t)`` (t = 1, 2, ...): a weighted mean of x_1..x_t with
  weights ``decay**(t - i)``, so the first value is x_1 itself. The same
  statistic as the ``<headline>_ema`` runs log (fedjax_metric.evaluation.
  statistics, not imported here: the sweep's parent process stays free of
  JAX).
  """
  if not 0 <= decay < 1:
    raise ValueError(f'ema decay must be in [0, 1), got {decay}.')
  out, s = [], 0.0
  for t, x in enumerate(values, start=1):
    s = decay * s + (1 - decay) * x
    out.append(s / (1 - decay**t))
  return np.asarray(out, np.float64)


def series(run: Run, metric: str, *, ema_decay: float = 0.9):
  """(rounds [T], values [T]) of ``metric`` over the run's evaluations.

  ``<name>_ema`` is the EMA of ``<name>``'s series (`ema`). A metric only in
  summary.json (end-of-run evaluations such as a linear probe) is one point
  at the last round.
  """
  base = metric[: -len('_ema')] if metric.endswith('_ema') else metric
  rows = [r for r in run.evaluations if base in r]
  if rows:
    rounds = np.asarray([r['round'] for r in rows])
    values = np.asarray([r[base] for r in rows], np.float64)
  elif run.summary is not None and base in run.summary:
    rounds = np.asarray([run.summary.get('rounds_completed', 0)])
    values = np.asarray([run.summary[base]], np.float64)
  else:
    raise KeyError(f'{run.workdir} has no metric {base!r}.')
  if metric != base:
    values = ema(values, ema_decay)
  return rounds, values


def pick(rounds: np.ndarray, values: np.ndarray, at: str) -> float:
  """One number per run: 'final', 'best', 'last:K', 'top:K' (the mean of
  the K largest values: FedAU's and PMFL's "average of the top-5 accuracy
  values") or 'round:R'. A suffix '@T' first cuts the series at round T, so
  that a longer run is read as if it had stopped there ('top:5@1000')."""
  spec, _, cut = at.partition('@')
  if cut:
    if not cut.isdigit():
      raise ValueError(f'--at: the round after @ must be a number; got {at!r}.')
    keep = rounds <= int(cut)
    if int(cut) not in rounds.tolist():
      raise KeyError(
        f'No evaluation at round {cut} (evaluated: {rounds.tolist()}).'
      )
    rounds, values, at = rounds[keep], values[keep], spec
  if at == 'final':
    return float(values[-1])
  if at == 'best':
    return float(np.max(values))
  kind, _, number = at.partition(':')
  if kind == 'last' and number.isdigit() and int(number) > 0:
    return float(np.mean(values[-int(number) :]))
  if kind == 'top' and number.isdigit() and int(number) > 0:
    return float(np.mean(np.sort(values)[-int(number) :]))
  if kind == 'round' and number.isdigit():
    hit = np.flatnonzero(rounds == int(number))
    if not len(hit):
      raise KeyError(
        f'No evaluation at round {number} (evaluated: {rounds.tolist()}).'
      )
    return float(values[hit[0]])
  raise ValueError(
    f'--at must be final, best, last:K, top:K or round:R (each with an '
    f'optional @T); got {at!r}.'
  )


# ---------------------------------------------------------------------------
# Tables.
# ---------------------------------------------------------------------------


def _label_value(value: Any) -> str:
  if value is None:
    return '-'
  if isinstance(value, tuple):
    return '(' + ','.join(map(str, value)) + ')'
  return str(value)


def label(run: Run, keys: Sequence[str]) -> str:
  """The values of ``keys`` in the run's config, joined by spaces."""
  return ' '.join(_label_value(run.config.get(k)) for k in keys) or 'all'


class Cell(NamedTuple):
  values: List[float]
  workdirs: List[str]

  @property
  def n(self) -> int:
    return len(self.values)

  @property
  def mean(self) -> float:
    return float(np.mean(self.values))

  @property
  def std(self) -> float:
    """Sample standard deviation (ddof 1); nan for one run."""
    return float(np.std(self.values, ddof=1)) if self.n > 1 else math.nan


def group_runs(
  runs: Sequence[Run], rows: Sequence[str], cols: Sequence[str]
) -> Dict[tuple, List[Run]]:
  """``{(row label, col label): runs}``; a group's runs may differ in seed
  (and execution keys) only, and no seed may repeat."""
  known = set().union(*(run.config for run in runs)) if runs else set()
  unknown = [k for k in (*rows, *cols) if runs and k not in known]
  if unknown:
    close = {
      k: difflib.get_close_matches(k, sorted(known), n=1) for k in unknown
    }
    hints = '; '.join(
      f'{k!r}: did you mean {c[0]!r}?' for k, c in close.items() if c
    )
    raise ValueError(
      f'--rows/--cols {unknown}: no run has these config keys'
      + (f' ({hints})' if hints else '')
      + ' (keys are dotted paths: local.learning_rate, algorithm_kwargs.mu).'
    )
  groups = collections.defaultdict(list)
  for run in runs:
    groups[(label(run, rows), label(run, cols))].append(run)
  ignored = set(EXECUTION_KEYS) | set(rows) | set(cols)
  for key, members in groups.items():
    first = members[0].config
    for other in members[1:]:
      differs = sorted(differing_keys(first, other.config) - ignored)
      if differs:
        raise ValueError(
          f'Cell {key} mixes runs that differ in {differs} '
          f'({members[0].workdir} vs {other.workdir}): add those keys to '
          '--rows/--cols or select with --where.'
        )
    seeds = [m.config.get('seed') for m in members]
    if len(set(seeds)) != len(seeds):
      raise ValueError(
        f'Cell {key} holds the same seed twice: {[m.workdir for m in members]}.'
      )
  return dict(groups)


def default_scale(metric: str) -> float:
  return 100.0 if 'accuracy' in metric else 1.0


def _ordered(labels, order: Sequence[str]) -> List[str]:
  """Labels named in ``order`` first, in that order, then the rest sorted."""
  labels = set(labels)
  head = [x for x in order if x in labels]
  return head + sorted(labels - set(head))


class Table(NamedTuple):
  row_labels: List[str]
  columns: List[tuple]  # (col label, metric)
  cells: Dict[tuple, Optional[Cell]]  # (row label, col label, metric) -> Cell


def build_table(
  runs: Sequence[Run],
  *,
  rows: Sequence[str],
  cols: Sequence[str],
  metrics: Sequence[str],
  at: str,
  ema_decay: float = 0.9,
  order: Sequence[str] = (),
) -> Table:
  """Aggregates runs into cells of ``pick(series(run, metric), at)``."""
  groups = group_runs(runs, rows, cols)
  row_labels = _ordered({r for r, _ in groups}, order)
  col_labels = _ordered({c for _, c in groups}, order)
  columns = [(c, m) for c in col_labels for m in metrics]
  cells = {}
  for row in row_labels:
    for col, metric in columns:
      members = groups.get((row, col), [])
      values = [
        pick(*series(r, metric, ema_decay=ema_decay), at) for r in members
      ]
      cells[(row, col, metric)] = (
        Cell(values, [r.workdir for r in members]) if members else None
      )
  return Table(row_labels, columns, cells)


def format_cell(cell: Optional[Cell], scale: float, digits: int) -> str:
  if cell is None:
    return ''
  mean = f'{cell.mean * scale:.{digits}f}'
  if cell.n == 1:
    return f'{mean} (n=1)'
  return f'{mean} ± {cell.std * scale:.{digits}f} (n={cell.n})'


def _display(text: str, rename: Dict[str, str]) -> str:
  return rename.get(text, text)


def format_markdown(
  table: Table,
  *,
  rename: Dict[str, str] = None,
  digits: int = 2,
  scale: Optional[float] = None,
  row_header: str = '',
) -> str:
  """The table as GitHub markdown; cells ``mean ± std (n=...)``."""
  rename = rename or {}
  several = len({m for _, m in table.columns}) > 1
  headers = [row_header or 'run']
  for col, metric in table.columns:
    name = '' if col == 'all' else _display(col, rename)
    shown = _display(metric, rename)
    headers.append(f'{name} {shown}'.strip() if several else name or shown)
  lines = ['| ' + ' | '.join(headers) + ' |', '|' + '---|' * len(headers)]
  for row in table.row_labels:
    cells = [
      format_cell(
        table.cells[(row, col, metric)],
        default_scale(metric) if scale is None else scale,
        digits,
      )
      for col, metric in table.columns
    ]
    lines.append('| ' + ' | '.join([_display(row, rename)] + cells) + ' |')
  return '\n'.join(lines) + '\n'


def format_csv(
  table: Table, *, rename: Dict[str, str] = None, scale: Optional[float] = None
) -> str:
  """One CSV line per (row, column, metric): mean, std, n."""
  rename = rename or {}
  out = io.StringIO()
  writer = csv.writer(out, lineterminator='\n')
  writer.writerow(['row', 'column', 'metric', 'mean', 'std', 'n'])
  for row in table.row_labels:
    for col, metric in table.columns:
      cell = table.cells[(row, col, metric)]
      if cell is None:
        continue
      s = default_scale(metric) if scale is None else scale
      writer.writerow(
        [
          _display(row, rename),
          _display(col, rename),
          metric,
          f'{cell.mean * s:.6g}',
          f'{cell.std * s:.6g}',
          cell.n,
        ]
      )
  return out.getvalue()


# ---------------------------------------------------------------------------
# Curves.
# ---------------------------------------------------------------------------


def mean_curve(members: Sequence[Run], metric: str, *, ema_decay: float = 0.9):
  """(rounds, mean, std, n) over the runs, on the rounds all of them have."""
  curves = [series(r, metric, ema_decay=ema_decay) for r in members]
  common = sorted(set.intersection(*[set(r.tolist()) for r, _ in curves]))
  stack = np.stack([[v[list(r).index(x)] for x in common] for r, v in curves])
  std = (
    np.std(stack, axis=0, ddof=1) if len(members) > 1 else np.zeros(len(common))
  )
  return np.asarray(common), stack.mean(axis=0), std, len(members)


def plot_curves(
  runs: Sequence[Run],
  out: str,
  *,
  rows: Sequence[str],
  cols: Sequence[str],
  metric: str,
  ema_decay: float = 0.9,
  rename: Dict[str, str] = None,
  order: Sequence[str] = (),
  scale: Optional[float] = None,
  title: str = '',
) -> str:
  """One panel per column label, one line per row label: the mean over
  seeds with a shaded band of +-1 standard deviation. Returns ``out``."""
  groups = group_runs(runs, rows, cols)
  if not groups:
    raise ValueError('No finished runs to plot.')
  return plot_groups(
    groups,
    out,
    metric=metric,
    row_labels=_ordered({r for r, _ in groups}, order),
    col_labels=_ordered({c for _, c in groups}, order),
    ema_decay=ema_decay,
    rename=rename,
    scale=scale,
    title=title,
  )


def plot_groups(
  groups: Dict[tuple, List[Run]],
  out: str,
  *,
  metric: str,
  row_labels: Sequence[str],
  col_labels: Sequence[str],
  ema_decay: float = 0.9,
  rename: Dict[str, str] = None,
  scale: Optional[float] = None,
  title: str = '',
) -> str:
  """`plot_curves` of runs already grouped as ``{(row, col): runs}``."""
  from matplotlib.backends.backend_agg import FigureCanvasAgg  # pylint: disable=g-import-not-at-top
  from matplotlib.figure import Figure  # pylint: disable=g-import-not-at-top

  rename = rename or {}
  scale = default_scale(metric) if scale is None else scale
  col_labels = [c for c in col_labels if any(k[1] == c for k in groups)]
  fig = Figure(figsize=(max(4.6 * len(col_labels), 7.0), 4.0), dpi=110)
  axes = [
    fig.add_subplot(1, len(col_labels), i + 1) for i in range(len(col_labels))
  ]
  for ax, col in zip(axes, col_labels, strict=True):
    for row in row_labels:
      members = groups.get((row, col))
      if not members:
        continue
      rounds, mean, std, n = mean_curve(members, metric, ema_decay=ema_decay)
      (line,) = ax.plot(
        rounds, mean * scale, label=f'{_display(row, rename)} (n={n})'
      )
      ax.fill_between(
        rounds,
        (mean - std) * scale,
        (mean + std) * scale,
        color=line.get_color(),
        alpha=0.2,
        linewidth=0,
      )
    ax.set_title(_display(col, rename))
    ax.set_xlabel('round')
    ax.grid(True, alpha=0.3)
  axes[0].set_ylabel(metric + (' (%)' if scale == 100 else ''))
  axes[-1].legend(fontsize='x-small')
  if title:
    fig.suptitle(title, fontsize='medium')
  fig.tight_layout()
  os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
  FigureCanvasAgg(fig).print_png(out)
  return out


# ---------------------------------------------------------------------------
# Command line.
# ---------------------------------------------------------------------------

FLAGS = flags.FLAGS


def define_flags():
  """Defines the command-line flags; called only when run as a script.

  Defining them at import time would clash with launch.main's --config when
  both modules are imported in one process (absl DuplicateFlagError).
  """
  flags.DEFINE_multi_string(
    'root',
    None,
    'run: where the workdirs go; table/plot: directories '
    'searched for workdirs (repeatable).',
  )
  flags.DEFINE_multi_string(
    'config',
    [],
    'run: a config file with its argument, e.g. '
    'configs/fedquad.py:alpha=0.3 (repeatable).',
  )
  flags.DEFINE_string(
    'set', '', "run: overrides for every point, 'key=value;key=value'."
  )
  flags.DEFINE_string(
    'grid',
    '',
    "run: 'key=v1,v2;key2=v3,v4': every combination is a "
    'point (last key fastest).',
  )
  flags.DEFINE_integer('parallel', 1, 'run: points at once.')
  flags.DEFINE_enum(
    'backend',
    'local',
    ['local', 'slurm'],
    'run: local subprocesses, or one SLURM job-array task per point '
    '(submitit; launch/sweep_slurm.py).',
  )
  flags.DEFINE_string(
    'slurm', '', "run --backend=slurm: submitit's parameters, key=value,..."
  )
  flags.DEFINE_integer(
    'retries', 1, 'run --backend=slurm: resubmissions of a failed task.'
  )
  flags.DEFINE_list(
    'gpus',
    [],
    'run --backend=local: GPU ids; process slot i runs its points on GPU '
    'gpus[i mod len(gpus)] (CUDA_VISIBLE_DEVICES); slots sharing a GPU do '
    'not preallocate its memory.',
  )
  flags.DEFINE_bool('dry_run', False, 'run: list the points only.')
  flags.DEFINE_string('workdir', None, 'point: the workdir to train.')
  flags.DEFINE_list(
    'rows',
    ['algorithm'],
    'table/plot: config keys naming a row (plot: a line).',
  )
  flags.DEFINE_list(
    'cols', [], 'table/plot: config keys naming a column (plot: a panel).'
  )
  flags.DEFINE_list(
    'metric',
    ['test_accuracy'],
    'table: metrics (plot: the first); <name>_ema is the EMA of <name>.',
  )
  flags.DEFINE_string(
    'at',
    'final',
    'table: final | best | last:K | top:K | round:R, each with an optional '
    '@T (the series cut at round T).',
  )
  flags.DEFINE_float('ema_decay', 0.9, 'Decay of *_ema metrics.')
  flags.DEFINE_string(
    'where',
    '',
    "table/plot: keep runs with these config values, 'key=value;key=value'.",
  )
  flags.DEFINE_string(
    'rename', '', "table/plot: 'label=shown;...'; also orders rows and columns."
  )
  flags.DEFINE_enum(
    'format', 'markdown', ['markdown', 'csv'], 'table: output format.'
  )
  flags.DEFINE_integer('digits', 2, 'table: decimals.')
  flags.DEFINE_string('row_header', 'run', "table: the first column's header.")
  flags.DEFINE_float(
    'scale',
    None,
    'table/plot: multiply values (default 100 for *accuracy* metrics, else 1).',
  )
  flags.DEFINE_string('out', None, 'table: also write here; plot: PNG.')
  flags.DEFINE_bool(
    'include_unfinished',
    False,
    'table/plot: also runs without a final summary.json.',
  )
  flags.DEFINE_string('title', '', 'plot: figure title.')
  cli.define_verbose()


def _rename_map(text: str) -> Dict[str, str]:
  out = {}
  for item in filter(None, (s.strip() for s in text.split(';'))):
    old, eq, new = item.partition('=')
    if not eq:
      raise ValueError(f'Bad --rename item {item!r}: write label=shown.')
    out[old.strip()] = new.strip()
  return out


def _selected_runs() -> List[Run]:
  if not FLAGS.root:
    raise app.UsageError('--root is required.')
  where = assignments(FLAGS.where)
  runs = [
    r
    for r in find_runs(FLAGS.root, include_unfinished=FLAGS.include_unfinished)
    if matches(r, where)
  ]
  if not runs:
    raise app.UsageError(f'No finished runs under {FLAGS.root} match.')
  return runs


@cli.one_line_errors
def main(argv):
  if len(argv) != 2 or argv[1] not in ('run', 'point', 'table', 'plot'):
    raise app.UsageError(
      'Usage: python -m launch.sweep run|point|table|plot '
      '[flags]; see the module docstring.'
    )
  command = argv[1]
  if command == 'point':
    if not FLAGS.workdir:
      raise app.UsageError('point needs --workdir.')
    if not flags.FLAGS['verbosity'].present:
      logging.set_verbosity(logging.WARNING)  # orbax logs every save at INFO.
    try:
      run_point(FLAGS.workdir)
    except PointStopped as e:
      if cli.verbose():
        raise
      print(str(e), file=sys.stderr)
      sys.exit(128 + e.signum)
    return
  if command == 'run':
    if not FLAGS.root or len(FLAGS.root) != 1 or not FLAGS.config:
      raise app.UsageError('run needs one --root and at least one --config.')
    points = make_points(
      FLAGS.root[0],
      FLAGS.config,
      parse_set(FLAGS.set),
      parse_grid(FLAGS.grid, given=FLAGS['grid'].present),
    )
    if FLAGS.dry_run:
      for p in points:
        print(point_status(p), p.workdir)
      return
    outcomes = train_points(
      points,
      backend=FLAGS.backend,
      root=FLAGS.root[0],
      parallel=FLAGS.parallel,
      gpus=FLAGS.gpus,
      slurm=FLAGS.slurm,
      retries=FLAGS.retries,
    )
    bad = [w for w, o in outcomes.items() if o not in ('done', 'skipped')]
    if bad:
      sys.exit(f'{len(bad)} point(s) failed, stopped or conflicted: {bad}')
    return
  rename = _rename_map(FLAGS.rename)
  runs = _selected_runs()
  if command == 'table':
    table = build_table(
      runs,
      rows=FLAGS.rows,
      cols=FLAGS.cols,
      metrics=FLAGS.metric,
      at=FLAGS.at,
      ema_decay=FLAGS.ema_decay,
      order=list(rename),
    )
    text = (
      format_markdown(
        table,
        rename=rename,
        digits=FLAGS.digits,
        scale=FLAGS.scale,
        row_header=FLAGS.row_header,
      )
      if FLAGS.format == 'markdown'
      else format_csv(table, rename=rename, scale=FLAGS.scale)
    )
    print(text, end='')
    if FLAGS.out:
      with open(FLAGS.out, 'w') as f:
        f.write(text)
    return
  if not FLAGS.out:
    raise app.UsageError('plot needs --out=path.png.')
  plot_curves(
    runs,
    FLAGS.out,
    rows=FLAGS.rows,
    cols=FLAGS.cols,
    metric=FLAGS.metric[0],
    ema_decay=FLAGS.ema_decay,
    rename=rename,
    order=list(rename),
    scale=FLAGS.scale,
    title=FLAGS.title,
  )
  print(f'wrote {FLAGS.out}')


if __name__ == '__main__':
  define_flags()
  app.run(main, flags_parser=cli.flags_parser(sys.modules[__name__]))
