"""A sweep's curves: the mean over seeds of a metric against round, with a
shaded band of one standard deviation; one panel per column label, one line
per row label (runs grouped as launch/sweep_table.py groups them). Drawn on
a `matplotlib.figure.Figure` with the Agg canvas (no pyplot backend).
"""

import os
from typing import Dict, List, Optional, Sequence

import numpy as np

from . import sweep_table
from .sweep_table import Run


def mean_curve(members: Sequence[Run], metric: str, *, ema_decay: float = 0.9):
  """(rounds, mean, std, n) over the runs, on the rounds all of them have."""
  curves = [sweep_table.series(r, metric, ema_decay=ema_decay) for r in members]
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
  groups = sweep_table.group_runs(runs, rows, cols)
  if not groups:
    raise ValueError('No finished runs to plot.')
  return plot_groups(
    groups,
    out,
    metric=metric,
    row_labels=sweep_table.ordered({r for r, _ in groups}, order),
    col_labels=sweep_table.ordered({c for _, c in groups}, order),
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
  scale = sweep_table.default_scale(metric) if scale is None else scale
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
        rounds,
        mean * scale,
        label=f'{sweep_table.display(row, rename)} (n={n})',
      )
      ax.fill_between(
        rounds,
        (mean - std) * scale,
        (mean + std) * scale,
        color=line.get_color(),
        alpha=0.2,
        linewidth=0,
      )
    ax.set_title(sweep_table.display(col, rename))
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
