r"""One command per paper table: run its sweep, then write the table.

  fedjax-metric reproduce fedrcl table1 --seeds=3            # installed
  python -m launch.reproduce fedrcl table1 --seeds=3         # a checkout
  fedjax-metric reproduce --list                             # what exists
  fedjax-metric reproduce pmfl table1 --scale=paper --backend=slurm \
      --slurm='partition=gpu,gpus_per_node=1,timeout_min=600'

A table (launch/paper_tables.py) is a set of methods x columns x seeds, each
point one run of a packaged config (launch.sweep's points: the same
workdirs, skip and resume rules, the same local and SLURM backends). Running
the command again skips finished runs and resumes unfinished ones, so a
sweep cut short by a session's end is picked up where it stopped.

When the runs are done (or with ``--table_only``, from whatever has
finished), it writes into ``--root``:

- ``table.md``: what ran (paper, scale, protocol, seeds, command), then one
  row per method: ``mean ± std (n)`` over seeds for each column, metric
  and reading, and the paper's printed numbers beside them (on the paper's
  dataset, which the header names);
- ``table.csv``: one line per (method, column, metric, reading) with mean,
  std, n, and the seeds' values;
- in ``table.md`` below the table, the paired differences: for each
  (method, baseline) pair of the table (by default every method against the
  first) and each cell, the runs paired by seed, the mean difference with its
  95% interval and the verdict: the ordering holds when the interval
  excludes 0, else a tie (launch/paired.py);
- ``curves.png``: the first metric over rounds, one panel per column, the
  mean over seeds with a band of one standard deviation.

``--scale=cpu`` runs the protocol of docs/results on a CPU (Fashion-MNIST,
small models, rounds cut where the paper's are out of reach);
``--scale=paper`` the paper's models and round counts (a dataset the
configs do not default to goes in with ``--set='dataset.name=cifar10;
dataset.data_dir=...'``).
"""

import csv
import io
import os
import shlex
import sys
from typing import Dict, List, NamedTuple, Optional, Sequence

from absl import app, flags

from fedjax_metric import overrides as overrides_lib

from . import (
  cli,
  paired,
  paper_tables,
  sweep_plot,
  sweep_point,
  sweep_run,
  sweep_table,
)

FLAGS = flags.FLAGS


class Entry(NamedTuple):
  """One (method, column, seed) point of a table."""

  method: str
  column: str
  seed: int
  point: sweep_point.Point


def _join_args(*parts: str) -> str:
  return ','.join(p for p in parts if p)


def _spec(config: str, *args: str) -> str:
  """'name:arg' with more ':arg' items appended (a later key wins)."""
  name, _, own = config.partition(':')
  merged = _join_args(own, *args)
  return f'{name}:{merged}' if merged else name


def _assignments(*texts: str) -> Dict[str, str]:
  out = {}
  for text in texts:
    out.update(overrides_lib.assignments(text))
  return out


def entries(
  table: paper_tables.PaperTable,
  scale: str,
  *,
  root: str,
  seeds: int,
  extra: str = '',
  methods: Sequence[str] = (),
  columns: Sequence[str] = (),
) -> List[Entry]:
  """Every point of ``table`` at ``scale``: methods x columns x seeds, or
  only the ``methods`` and ``columns`` named (all when empty)."""
  _check_names('method', methods, [m.name for m in table.methods])
  _check_names('column', columns, [c.name for c in table.columns])
  if scale not in table.scales:
    raise ValueError(
      f'{table.paper} {table.table} has no scale {scale!r}; it has '
      f'{sorted(table.scales)}.'
    )
  if seeds < 1:
    raise ValueError(f'--seeds must be >= 1, got {seeds}.')
  s = table.scales[scale]
  out = []
  for method in table.methods:
    if methods and method.name not in methods:
      continue
    for column in table.columns:
      if columns and column.name not in columns:
        continue
      spec = _spec(method.config, s.config_args, column.config_args)
      for seed in range(seeds):
        overrides = _assignments(
          s.overrides,
          method.overrides,
          s.method_overrides.get(method.name, ''),
          column.overrides,
          extra,
        )
        overrides['seed'] = str(seed)
        workdir = sweep_point.workdir_for(root, spec, overrides)
        out.append(
          Entry(
            method.name,
            column.name,
            seed,
            sweep_point.Point(spec, overrides, workdir),
          )
        )
  return out


def _check_names(kind: str, given: Sequence[str], known: Sequence[str]):
  unknown = [g for g in given if g not in known]
  if unknown:
    raise ValueError(
      f'Unknown {kind}(s) {unknown}; this table has: {"; ".join(known)}.'
    )


def check_datasets(todo: Sequence[Entry]) -> None:
  """Raises before anything trains if a dataset (or an out-of-distribution
  target) of the table is not where its runs will look: one error for the
  whole table instead of one failed run per point."""
  from fedjax_metric.data import sources  # pylint: disable=g-import-not-at-top

  needed = {}
  for entry in todo:
    config = sweep_point.resolve(entry.point.spec, entry.point.overrides)
    needed.setdefault(
      (config.dataset.name, config.dataset.data_dir or None), entry
    )
    target = config.get('ssl_eval', {}).get('target_dataset', '')
    if target:
      data_dir = config.ssl_eval.target_data_dir or None
      needed.setdefault((target, data_dir), entry)
  for (name, data_dir), entry in needed.items():
    try:
      sources.check_available(name, data_dir)
    except sources.DatasetNotFoundError as e:
      raise sources.DatasetNotFoundError(
        f'{entry.method} ({entry.column}) trains on {name!r}, which is not '
        f"available: {e} Point the table's runs at it with "
        "--set='dataset.data_dir=...' (or another dataset with "
        "--set='dataset.name=...')."
      ) from e


def finished_run(entry: Entry) -> Optional[sweep_table.Run]:
  """The point's run if it finished all its rounds, else None."""
  if not os.path.exists(os.path.join(entry.point.workdir, 'config.json')):
    return None
  run = sweep_table.read_run(entry.point.workdir)
  return run if run.finished else None


class Result(NamedTuple):
  """Cells over seeds: (method, column, metric, reading) -> Cell."""

  cells: Dict[tuple, sweep_table.Cell]
  runs: Dict[tuple, List[sweep_table.Run]]  # (method, column) -> finished runs
  planned: int  # runs the table asked for

  @property
  def finished(self) -> int:
    return sum(len(members) for members in self.runs.values())


def collect(
  table: paper_tables.PaperTable, scale: str, todo: Sequence[Entry]
) -> Result:
  readings = table.scales[scale].readings
  runs: Dict[tuple, List[sweep_table.Run]] = {}
  for entry in todo:
    run = finished_run(entry)
    if run is not None:
      runs.setdefault((entry.method, entry.column), []).append(run)
  cells = {}
  for (method, column), members in runs.items():
    for metric, _ in table.metrics:
      for _, at in readings:
        values = [
          sweep_table.pick(*sweep_table.series(r, metric), at) for r in members
        ]
        cells[(method, column, metric, at)] = sweep_table.Cell(
          values, [r.workdir for r in members]
        )
  return Result(cells, runs, len(todo))


def _our_columns(table, scale):
  """(column, metric, reading) in display order, with their headers."""
  readings = table.scales[scale].readings
  several_metrics = len(table.metrics) > 1
  several_readings = len(readings) > 1
  out = []
  for column in table.columns:
    for metric, shown in table.metrics:
      for reading_name, at in readings:
        parts = [column.name if len(table.columns) > 1 else '']
        parts += [shown if several_metrics else '']
        parts += [reading_name if several_readings else '']
        header = ', '.join(p for p in parts if p) or shown
        out.append(((column.name, metric, at), header))
  return out


def format_markdown(
  table: paper_tables.PaperTable,
  scale: str,
  result: Result,
  *,
  seeds: int,
  command: str,
) -> str:
  columns = _our_columns(table, scale)
  lines = [
    f'# {table.citation}: {table.table}',
    '',
    f'{table.caption}',
    '',
    f'- Scale `{scale}`: {table.scales[scale].note}',
    f'- Seeds 0-{seeds - 1}; each cell is mean ± sample std over the seeds '
    'that finished (n); empty: no finished run yet.',
    f"- The paper's numbers ({table.paper_note}) are as printed, on its "
    'own dataset and models: context for the ordering, not a target.',
    f'- Runs finished: {result.finished} of {result.planned}.',
    f'- Command: `{command}`',
    '',
  ]
  headers = [h for _, h in columns] + [
    f'paper: {c}' for c in table.paper_columns
  ]
  lines.append('| method | ' + ' | '.join(headers) + ' |')
  lines.append('|---|' + '---|' * len(headers))
  for method in table.methods:
    ours = []
    for (column, metric, at), _ in columns:
      cell = result.cells.get((method.name, column, metric, at))
      ours.append(
        sweep_table.format_cell(cell, sweep_table.default_scale(metric), 2)
      )
    theirs = table.paper_values.get(method.name) or ('',) * len(
      table.paper_columns
    )
    name = method.name if method.in_paper else f'{method.name} (not in paper)'
    lines.append('| ' + ' | '.join([name, *ours, *theirs]) + ' |')
  lines += ['', *format_paired(table, scale, result)]
  return '\n'.join(lines) + '\n'


def table_pairs(table: paper_tables.PaperTable) -> List[tuple]:
  """(method, baseline) names: the table's own, else all vs the first."""
  if table.pairs:
    names = [m.name for m in table.methods]
    for pair in table.pairs:
      _check_names('method', pair, names)
    return list(table.pairs)
  first = table.methods[0].name
  return [(m.name, first) for m in table.methods[1:]]


def _by_seed(runs: Sequence[sweep_table.Run], metric: str, at: str):
  """{seed: value} of the runs that record their seed."""
  return {
    int(r.config['seed']): sweep_table.pick(*sweep_table.series(r, metric), at)
    for r in runs
    if r.config.get('seed') is not None
  }


def paired_differences(table, scale, result) -> List[tuple]:
  """``(method, baseline, column, metric, at, interval, seeds, unpaired)``
  for every pair and cell where both sides have a finished run of a common
  seed; ``unpaired``: the seeds only one side has (left out, counted)."""
  out = []
  for method, baseline in table_pairs(table):
    for (column, metric, at), _ in _our_columns(table, scale):
      mine = result.runs.get((method, column), [])
      theirs = result.runs.get((baseline, column), [])
      a, b = _by_seed(mine, metric, at), _by_seed(theirs, metric, at)
      seeds = sorted(set(a) & set(b))
      if not seeds:
        continue
      interval = paired.paired_interval([a[s] - b[s] for s in seeds])
      unpaired = len(set(a) ^ set(b))
      out.append(
        (method, baseline, column, metric, at, interval, seeds, unpaired)
      )
  return out


def format_paired(table, scale, result) -> List[str]:
  """table.md's section of paired differences (lines)."""
  rows = paired_differences(table, scale, result)
  lines = [
    '## Paired differences over seeds',
    '',
    'Each method minus its baseline, seed by seed (the same seed gives both '
    'the same partition, cohorts and initial model): the mean difference and '
    "its 95% interval (Student's t, n - 1 degrees of freedom). An ordering "
    'holds when the interval excludes 0; otherwise it is a tie.',
    '',
  ]
  if not rows:
    return lines + ['No pair has a finished run of a common seed yet.']
  headers = dict(_our_columns(table, scale))
  verdicts = paired.VERDICTS
  lines += [
    '| method - baseline | cell | n | mean difference [95% interval] '
    '| verdict |',
    '|---|---|---:|---|---|',
  ]
  for method, baseline, column, metric, at, interval, _, unpaired in rows:
    s = sweep_table.default_scale(metric)
    if interval['n'] > 1:
      text = (
        f'{interval["mean"] * s:+.2f} [{interval["low"] * s:+.2f}, '
        f'{interval["high"] * s:+.2f}]'
      )
    else:
      text = f'{interval["mean"] * s:+.2f}'
    n = f'{interval["n"]}' + (f' ({unpaired} unpaired)' if unpaired else '')
    lines.append(
      f'| {method} - {baseline} | {headers[(column, metric, at)]} | '
      f'{n} | {text} | {verdicts[paired.verdict(interval)]} |'
    )
  return lines


def format_csv(table: paper_tables.PaperTable, scale: str, result: Result):
  out = io.StringIO()
  writer = csv.writer(out, lineterminator='\n')
  writer.writerow(
    ['method', 'column', 'metric', 'reading', 'mean', 'std', 'n', 'values']
  )
  for method in table.methods:
    for (column, metric, at), _ in _our_columns(table, scale):
      cell = result.cells.get((method.name, column, metric, at))
      if cell is None:
        continue
      s = sweep_table.default_scale(metric)
      writer.writerow(
        [
          method.name,
          column,
          metric,
          at,
          f'{cell.mean * s:.6g}',
          f'{cell.std * s:.6g}' if cell.n > 1 else '',
          cell.n,
          ' '.join(f'{v * s:.6g}' for v in cell.values),
        ]
      )
  return out.getvalue()


def plot(
  table: paper_tables.PaperTable, result: Result, out: str
) -> Optional[str]:
  """The first metric over rounds; None when nothing has finished."""
  groups = {
    key: members for key, members in result.runs.items() if len(members)
  }
  if not groups:
    return None
  metric = table.metrics[0][0]
  return sweep_plot.plot_groups(
    groups,
    out,
    metric=metric,
    row_labels=[m.name for m in table.methods],
    col_labels=[c.name for c in table.columns],
    title=f'{table.citation}: {table.table}',
  )


def write_outputs(table, scale, result, *, root, seeds, command) -> List[str]:
  os.makedirs(root, exist_ok=True)
  written = []
  for name, text in (
    (
      'table.md',
      format_markdown(table, scale, result, seeds=seeds, command=command),
    ),
    ('table.csv', format_csv(table, scale, result)),
  ):
    path = os.path.join(root, name)
    with open(path, 'w') as f:
      f.write(text)
    written.append(path)
  figure = plot(table, result, os.path.join(root, 'curves.png'))
  if figure:
    written.append(figure)
  return written


def list_tables() -> str:
  lines = []
  for (paper, name), table in sorted(paper_tables.TABLES.items()):
    lines.append(
      f'{paper} {name}: {table.caption} {len(table.methods)} methods x '
      f'{len(table.columns)} columns; scales {", ".join(table.scales)}.'
    )
  return '\n'.join(lines)


def define_flags():
  flags.DEFINE_integer('seeds', 3, 'Seeds 0..N-1 for every cell.')
  flags.DEFINE_enum(
    'scale',
    'cpu',
    ['cpu', 'cpu500', 'gpu500', 'paper'],
    "cpu: docs/results' CPU protocol; cpu500: FedRCL's 500-round CPU "
    'protocol (fedrcl table1); gpu500: the same with ResNet-18; paper: '
    "the paper's models and rounds.",
  )
  flags.DEFINE_enum(
    'backend', 'local', ['local', 'slurm'], 'local processes or SLURM.'
  )
  flags.DEFINE_string(
    'root', None, 'Workdirs and outputs (default runs/reproduce/...).'
  )
  flags.DEFINE_integer('parallel', 1, 'local: runs at once.')
  flags.DEFINE_list('gpus', [], 'local: one GPU id per process slot.')
  flags.DEFINE_string('slurm', '', "slurm: submitit's key=value,...")
  flags.DEFINE_integer('retries', 1, 'slurm: resubmissions of a failed run.')
  flags.DEFINE_string(
    'set', '', "More overrides for every run, 'key=value;key=value'."
  )
  flags.DEFINE_string(
    'methods', '', "Only these rows, by name: 'SSD;FedAlignUniform'."
  )
  flags.DEFINE_string('columns', '', "Only these columns, by name: 'cyclic'.")
  flags.DEFINE_string(
    'compilation_cache',
    'auto',
    "JAX's persistent compilation cache shared by the points: 'auto' "
    "($JAX_COMPILATION_CACHE_DIR where set, else <root>/jax_cache), 'off', "
    'or a directory.',
  )
  flags.DEFINE_bool('dry_run', False, 'List the runs and their state only.')
  flags.DEFINE_bool(
    'table_only', False, 'Write the table from finished runs; train nothing.'
  )
  flags.DEFINE_bool('list', False, 'List the known tables.')
  cli.define_verbose()


def _names(text: str) -> List[str]:
  return [n.strip() for n in text.split(';') if n.strip()]


@cli.one_line_errors
def main(argv):
  if FLAGS.list:
    print(list_tables())
    return
  if len(argv) != 3:
    raise app.UsageError(
      'Usage: fedjax-metric reproduce <paper> <table> [--seeds=3] '
      '[--scale=cpu|paper] [--backend=local|slurm]; --list names the tables.'
    )
  table = paper_tables.find(argv[1], argv[2])
  if 'seed' in sweep_point.parse_set(FLAGS.set):  # One value per key, checked.
    raise ValueError('--set: seed is set by --seeds (seeds 0..N-1).')
  root = FLAGS.root or os.path.join(
    'runs', 'reproduce', f'{table.paper}_{table.table}_{FLAGS.scale}'
  )
  todo = entries(
    table,
    FLAGS.scale,
    root=root,
    seeds=FLAGS.seeds,
    extra=FLAGS.set,
    methods=_names(FLAGS.methods),
    columns=_names(FLAGS.columns),
  )
  if FLAGS.dry_run:
    for entry in todo:
      print(sweep_point.point_status(entry.point), entry.point.workdir)
    return
  failed = []
  if not FLAGS.table_only:
    check_datasets(todo)
    outcomes = sweep_run.train_points(
      [e.point for e in todo],
      backend=FLAGS.backend,
      parallel=FLAGS.parallel,
      gpus=FLAGS.gpus,
      slurm=FLAGS.slurm,
      retries=FLAGS.retries,
      root=root,
      compilation_cache=FLAGS.compilation_cache,
    )
    failed = [w for w, o in outcomes.items() if o not in ('done', 'skipped')]
  command = ' '.join(['fedjax-metric reproduce', *map(shlex.quote, argv[1:])])
  given = [a for a in sys.argv[1:] if a.startswith('--')]
  command = ' '.join([command, *map(shlex.quote, given)])
  result = collect(table, FLAGS.scale, todo)
  for path in write_outputs(
    table, FLAGS.scale, result, root=root, seeds=FLAGS.seeds, command=command
  ):
    print(f'wrote {path}')
  if failed:
    sys.exit(f'{len(failed)} run(s) failed or conflicted: {failed}')


def run_main(argv: Optional[Sequence[str]] = None):
  define_flags()
  app.run(
    main,
    argv=list(argv) if argv is not None else None,
    flags_parser=cli.flags_parser(sys.modules[__name__]),
  )


if __name__ == '__main__':
  run_main()
