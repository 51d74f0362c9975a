r"""Paired differences over seeds: does an ordering hold, or is it a tie?

  python -m launch.paired --root=runs/rcl20 --rows=algorithm \
      --cols=partition.alpha --baseline=fedavg --metric=test_accuracy_ema \
      --at=final

For every row (a method) and column (a setting) against the baseline row of
the same column, the runs are paired by seed (the same seed gives both
methods the same partition, cohorts and initial model), and the table shows
the mean of the per-seed differences with its 95% interval (Student's t on
n - 1 degrees of freedom) and the verdict: an ordering **holds** when the
interval excludes 0 (``>`` or ``<``), otherwise it is a **tie** (``~``).
Seeds that only one of the two has are left out and counted.

Runs are read as ``launch.sweep table`` reads them (``--metric``, ``--at``):
launch/sweep_table.py. Both take comma lists (``--metric=test_accuracy,
test_accuracy_ema --at=round:100,round:500``): one table per metric and
reading, each under a ``### <metric> at <reading>`` line, the runs read
once (``--scale`` applies to every metric: effective rank wants
``--scale=1`` in a call of its own). ``fedjax-metric reproduce`` writes
the same intervals for a paper table's pairs below its table.
"""

import math
import sys
from typing import Dict, Optional, Sequence

from absl import app, flags
import numpy as np

from . import cli, sweep_table

FLAGS = flags.FLAGS


def paired_interval(
  differences: Sequence[float], level: float = 0.95
) -> Dict[str, float]:
  """Mean of paired differences [n] and its two-sided ``level`` interval:
  mean +- t_{(1 + level) / 2, n - 1} * sd / sqrt(n), sd with ddof 1.
  Needs n >= 2 (NaN bounds otherwise)."""
  d = np.asarray(differences, np.float64)
  n = d.size
  mean = float(d.mean()) if n else math.nan
  if n < 2:
    return {'n': n, 'mean': mean, 'low': math.nan, 'high': math.nan}
  from scipy import stats  # pylint: disable=g-import-not-at-top

  half = float(
    stats.t.ppf((1 + level) / 2, n - 1) * d.std(ddof=1) / math.sqrt(n)
  )
  return {'n': n, 'mean': mean, 'low': mean - half, 'high': mean + half}


def verdict(interval: Dict[str, float]) -> str:
  """'>' (holds: above 0), '<' (below 0), '~' (tie: contains 0), '?'
  (fewer than 2 pairs) or '!' (a difference is not a number)."""
  if interval['n'] < 2:
    return '?'
  if math.isnan(interval['mean']) or math.isnan(interval['low']):
    return '!'
  if interval['low'] > 0:
    return '>'
  if interval['high'] < 0:
    return '<'
  return '~'


VERDICTS = {
  '>': 'holds (>)',
  '<': 'holds (<)',
  '~': 'tie',
  '?': 'n < 2',
  '!': 'NaN in a run',
}


def _seed(run) -> Optional[int]:
  seed = run.config.get('seed')
  return None if seed is None else int(seed)


def paired_cells(
  runs: Sequence,
  rows: Sequence[str],
  cols: Sequence[str],
  baseline: str,
  metric: str,
  at: str,
  ema_decay: float = 0.9,
):
  """``{(row, col): (interval, unpaired seeds, values by seed)}`` of each
  non-baseline row against the baseline row of its column."""
  groups = sweep_table.group_runs(runs, rows, cols)
  by_seed = {}
  for key, members in groups.items():
    values = {}
    for run in members:
      rounds, series = sweep_table.series(run, metric, ema_decay=ema_decay)
      values[_seed(run)] = sweep_table.pick(rounds, series, at)
    by_seed[key] = values
  out = {}
  for (row, col), values in by_seed.items():
    if row == baseline:
      continue
    base = by_seed.get((baseline, col))
    if base is None:
      raise KeyError(
        f'No baseline row {baseline!r} in column {col!r}; rows: '
        f'{sorted({r for r, _ in by_seed})}.'
      )
    seeds = sorted(set(values) & set(base))
    unpaired = len(set(values) ^ set(base))
    interval = paired_interval([values[s] - base[s] for s in seeds])
    out[(row, col)] = (interval, unpaired, {s: values[s] for s in seeds})
  return out


def format_markdown(cells, *, scale: float, digits: int, baseline: str) -> str:
  lines = [
    f'| method - {baseline} | setting | n | mean difference [95% interval] '
    '| verdict |',
    '|---|---|---:|---|---|',
  ]
  names = VERDICTS
  for (row, col), (interval, unpaired, _) in sorted(cells.items()):
    f = f'{{:+.{digits}f}}'
    text = (
      f'{f.format(scale * interval["mean"])} '
      f'[{f.format(scale * interval["low"])}, '
      f'{f.format(scale * interval["high"])}]'
    )
    extra = f' ({unpaired} unpaired)' if unpaired else ''
    lines.append(
      f'| {row} | {col} | {interval["n"]}{extra} | {text} | '
      f'{names[verdict(interval)]} |'
    )
  return '\n'.join(lines)


def define_flags():
  flags.DEFINE_multi_string('root', [], 'Folders of workdirs (repeatable).')
  flags.DEFINE_list('rows', ['algorithm'], 'Config keys naming a method.')
  flags.DEFINE_list('cols', [], 'Config keys naming a setting.')
  flags.DEFINE_string('baseline', None, 'The row every other is paired with.')
  flags.DEFINE_list(
    'metric', ['test_accuracy'], 'Metrics (or <name>_ema), comma-separated.'
  )
  flags.DEFINE_list(
    'at', ['final'], "Readings as launch.sweep table's --at, comma-separated."
  )
  flags.DEFINE_float('ema_decay', 0.9, 'Decay of *_ema metrics.')
  flags.DEFINE_float('scale', 100.0, 'Multiply values by this (percent).')
  flags.DEFINE_integer('digits', 2, 'Decimals.')
  cli.define_verbose()


@cli.one_line_errors
def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f'unexpected argument(s) {" ".join(argv[1:])}')
  if not FLAGS.root or not FLAGS.baseline:
    raise app.UsageError('--root and --baseline are required.')
  runs = sweep_table.find_runs(FLAGS.root)
  if not runs:
    raise FileNotFoundError(f'No finished run under {FLAGS.root}.')
  if not FLAGS.metric or not FLAGS.at:
    raise app.UsageError('--metric and --at need at least one value each.')
  # Every table is computed before any is printed: a bad metric or reading
  # fails in one line, not after half the output.
  tables = []
  for metric in FLAGS.metric:
    for at in FLAGS.at:
      cells = paired_cells(
        runs,
        FLAGS.rows,
        FLAGS.cols,
        FLAGS.baseline,
        metric,
        at,
        FLAGS.ema_decay,
      )
      table = format_markdown(
        cells, scale=FLAGS.scale, digits=FLAGS.digits, baseline=FLAGS.baseline
      )
      tables.append((f'### {metric} at {at}', table))
  if len(tables) == 1:
    print(tables[0][1])
  else:
    print('\n\n'.join(f'{heading}\n\n{table}' for heading, table in tables))


if __name__ == '__main__':
  define_flags()
  app.run(main, flags_parser=cli.flags_parser(sys.modules[__name__]))
