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
workdir that holds a different experiment. Every point still to run is
validated before any starts: a grid value that cannot run is one line
naming the point, and nothing is written. A point whose process a signal
stops (SIGTERM: preemption, a ``kill``) saves its checkpoint and exits 128 +
the signal; the sweep reports it 'stopped', not done, and exits non-zero.
``--parallel=N`` runs N points at
once; ``--gpus=0,1`` pins each process slot to one GPU. ``--backend=slurm``
submits the points as a SLURM job array instead (launch/sweep_slurm.py).
The points share one persistent JAX compilation cache, ``<root>/jax_cache``
(``--compilation_cache=off`` or another directory; $JAX_COMPILATION_CACHE_DIR
wins where set), so a program compiles once per sweep, not once per point.

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

import sys
from typing import Dict, List

from absl import app, flags, logging

from fedjax_metric.overrides import parse_assignments

from . import cli, sweep_slurm
from .sweep_plot import (
  mean_curve,
  plot_curves,
  plot_groups,
)
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
from .sweep_run import (
  LOG_FILE,
  STOP_SIGNALS,
  compilation_cache_dir,
  compilation_cache_environment,
  gpu_environments,
  point_command,
  run_points,
  sort_points,
  train_points,
)
from .sweep_table import (
  EXECUTION_KEYS,
  Cell,
  Run,
  Table,
  build_table,
  default_scale,
  ema,
  find_runs,
  format_cell,
  format_csv,
  format_markdown,
  group_runs,
  label,
  matches,
  pick,
  read_run,
  series,
)

# This module is the command line; the work is in sweep_point.py (grids,
# points, one point's training), sweep_run.py (local and SLURM backends),
# sweep_table.py (reading workdirs, tables) and sweep_plot.py (curves). Their
# names are re-exported for the modules and tests that use launch.sweep.
__all__ = [
  'build_table',
  'Cell',
  'compilation_cache_dir',
  'compilation_cache_environment',
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
  flags.DEFINE_string(
    'compilation_cache',
    'auto',
    "run: JAX's persistent compilation cache shared by the points: 'auto' "
    "($JAX_COMPILATION_CACHE_DIR where set, else <root>/jax_cache), 'off', "
    'or a directory.',
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
    "table/plot: keep runs with these config values, 'key=value;key=value' "
    "('key=v1,v2': any of them).",
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
  # key=v1,v2 keeps runs with any of the values.
  where = dict(parse_assignments(FLAGS.where))
  found = find_runs(FLAGS.root, include_unfinished=FLAGS.include_unfinished)
  unknown = sorted(k for k in where if not any(k in r.config for r in found))
  if found and unknown:
    raise app.UsageError(
      f'--where: no run under {FLAGS.root} has {", ".join(unknown)} (a '
      'flattened config key, e.g. partition.alpha).'
    )
  runs = [
    r
    for r in found
    if all(
      any(matches(r, {k: v}) for v in values) for k, values in where.items()
    )
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
      compilation_cache=FLAGS.compilation_cache,
    )
    bad = [
      w for w, o in outcomes.items() if o not in ('done', 'skipped', 'busy')
    ]
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
