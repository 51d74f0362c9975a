"""Reading a sweep's finished workdirs into tables: ``mean ± std (n=...)``.

`find_runs` reads every workdir under the roots (config.json, metrics.jsonl,
summary.json) as a `Run`; `series` is one metric over a run's evaluations
(``<name>_ema``: its bias-corrected moving average, `ema`) and `pick` one
number of it (``final``, ``best``, ``last:K``, ``top:K``, ``round:R``, each
with ``@T``); `group_runs` puts runs into (row, column) cells that may differ
only in seed and `EXECUTION_KEYS`; `build_table` and `format_markdown` /
`format_csv` make the table. No JAX (launch.sweep table starts without it).
"""

import collections
import csv
import difflib
import io
import json
import math
import os
from typing import Any, Dict, List, NamedTuple, Optional, Sequence

import numpy as np

from fedjax_metric.config_io import flatten

from .sweep_point import differing_keys, read_json

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
    found = []
    # Walked lazily, top down: emptying ``subdirs`` at a workdir keeps the
    # walk out of its checkpoints (a workdir's checkpoints are not workdirs).
    for directory, subdirs, files in os.walk(root):
      if 'config.json' in files:
        subdirs[:] = []
        found.append(directory)
    for directory in sorted(found):
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
  JAX): a value that is not finite is skipped (t counts the finite values),
  its entry is the EMA so far (NaN before the first finite one).
  """
  if not 0 <= decay < 1:
    raise ValueError(f'ema decay must be in [0, 1), got {decay}.')
  out, s, t = [], 0.0, 0
  for x in values:
    if np.isfinite(x):
      t += 1
      s = decay * s + (1 - decay) * x
    out.append(s / (1 - decay**t) if t else math.nan)
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
  finite = values[np.isfinite(values)]  # 'best' and 'top' skip NaN, as logged.
  if at == 'best':
    return float(np.max(finite)) if finite.size else math.nan
  kind, _, number = at.partition(':')
  if kind == 'last' and number.isdigit() and int(number) > 0:
    return float(np.mean(values[-int(number) :]))
  if kind == 'top' and number.isdigit() and int(number) > 0:
    if not finite.size:
      return math.nan
    return float(np.mean(np.sort(finite)[-int(number) :]))
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
  """100 for metrics logged as fractions and read as percentages
  (accuracies, AUROC), else 1."""
  return 100.0 if 'accuracy' in metric or 'auroc' in metric else 1.0


def ordered(labels, order: Sequence[str]) -> List[str]:
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
  row_labels = ordered({r for r, _ in groups}, order)
  col_labels = ordered({c for _, c in groups}, order)
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


def display(text: str, rename: Dict[str, str]) -> str:
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
    name = '' if col == 'all' else display(col, rename)
    shown = display(metric, rename)
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
    lines.append('| ' + ' | '.join([display(row, rename)] + cells) + ' |')
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
          display(row, rename),
          display(col, rename),
          metric,
          f'{cell.mean * s:.6g}',
          f'{cell.std * s:.6g}',
          cell.n,
        ]
      )
  return out.getvalue()
