"""A sweep's points: the grid, each point's config and workdir, its status,
and the training of one point (launch/sweep.py's ``point`` command, a SLURM
task).

A point is a config file with its ``:arg`` (``spec``) and its overrides
(--set, then one combination of --grid), trained into
``<root>/<config>/<overrides>``; `point_status` tells a finished point from
one to (re)run and from a workdir that holds another experiment. Both
backends (local processes in launch/sweep.py, SLURM tasks in
launch/sweep_slurm.py) train a point with `run_point`; neither is imported
here.
"""

import ast
import hashlib
import itertools
import json
import os
import re
import signal
from typing import Any, Dict, List, NamedTuple, Optional, Sequence

from fedjax_metric.config_io import flatten, load_config
from fedjax_metric.overrides import parse_assignments

POINT_FILE = 'sweep_point.json'
# Keys whose change between a run and its resumption experiment.run accepts
# (fedjax_metric/workdir.py, RESUMABLE_CHANGES; this module stays JAX-free).
RESUMABLE_KEYS = (
  'num_rounds',
  'eval_every',
  'checkpoint_every',
  'progress',
  'logging.per_client',
  'logging.wandb',
  'client_table.placement',
  'client_table.prefetch',
  'client_table.host_budget_gb',
  'federated_eval.clients',
  'federated_eval.every',
)


def grid_points(grid: Sequence[tuple]) -> List[Dict[str, str]]:
  """The cartesian product of a parsed grid, the last key varying fastest."""
  keys = [k for k, _ in grid]
  return [
    dict(zip(keys, combo, strict=True))
    for combo in itertools.product(*[v for _, v in grid])
  ]


def resolve(spec: str, overrides: Dict[str, str]):
  """The config a point trains: the file's config, then the overrides
  (`config_io.load_config`)."""
  return load_config(spec, overrides)


def config_dict(config) -> Dict[str, Any]:
  """The JSON form experiment.run writes to ``config.json``."""
  return json.loads(config.to_json_best_effort())


# File systems refuse names over 255 bytes (ext4, APFS, NTFS); longer
# ones are cut and told apart by a hash of the whole name.
MAX_NAME = 200


def _slug(text: str) -> str:
  name = re.sub(r'[^A-Za-z0-9_.,=+-]', '_', text)
  if len(name) <= MAX_NAME:
    return name
  digest = hashlib.sha1(name.encode()).hexdigest()[:12]
  return f'{name[: MAX_NAME - len(digest) - 2]}__{digest}'


def workdir_for(root: str, spec: str, overrides: Dict[str, str]) -> str:
  """``<root>/<config file stem>[:arg]/<k=v>__<k=v>``, filesystem-safe:
  a name longer than MAX_NAME keeps its start and ends in a hash of the
  whole (the point's file in the workdir records every override)."""
  path, _, arg = spec.partition(':')
  stem = os.path.splitext(os.path.basename(path))[0]
  config_part = _slug(stem + (f'_{arg}' if arg else ''))
  override_part = '__'.join(f'{k}={v}' for k, v in overrides.items())
  return os.path.join(root, config_part, _slug(override_part or 'default'))


class Point(NamedTuple):
  spec: str  # 'configs/x.py[:arg]'
  overrides: Dict[str, str]  # --set then --grid values
  workdir: str


def parse_set(text: str) -> Dict[str, str]:
  """--set: ``'a=1;b=2'`` -> ``{'a': '1', 'b': '2'}``, one value per key (a
  tuple value in brackets: ``model.widths=(8,16)``)."""
  fixed = {}
  for key, values in parse_assignments(text):
    if len(values) > 1:
      raise ValueError(
        f'--set: {key} has {len(values)} values {tuple(values)}; --set takes '
        f"one (a tuple in brackets: '{key}=({','.join(values)})'); values to "
        'sweep over go in --grid.'
      )
    fixed[key] = values[0]
  return fixed


def parse_grid(text: str, given: bool = False) -> List[tuple]:
  """--grid, parsed; each key's values distinct. ``given``: the flag was on
  the command line (then it must name at least one key)."""
  grid = parse_assignments(text)
  if given and not grid:
    raise ValueError(
      "--grid is empty: write --grid='key=v1,v2;key2=v3' (or leave it out "
      'for one point per --config).'
    )
  for key, values in grid:
    # By value, not text: 0.1 and 0.10 (or 1e-3 and 0.001) are one point,
    # whose two spellings would name two workdirs and train it twice.
    same = [_as_value(v) for v in values]
    twice = next((v for i, v in enumerate(values) if same[i] in same[:i]), None)
    if twice is not None:
      raise ValueError(
        f'--grid: {key} lists {twice!r} twice ({",".join(values)}, by '
        'value): each value is one point; give it once.'
      )
  return grid


def _as_value(text: str):
  """A grid value as Python reads it (``0.10`` -> 0.1), else its text."""
  try:
    value = ast.literal_eval(text.strip())
  except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
    return ('text', text.strip())
  return ('value', repr(value))


def make_points(
  root: str, specs: Sequence[str], fixed: Dict[str, str], grid: Sequence[tuple]
) -> List[Point]:
  """Every (config, grid point) with its workdir; --set applies to all.

  Raises:
    ValueError: two points would share a workdir (a --config given twice).
  """
  twice = next((s for i, s in enumerate(specs) if s in specs[:i]), None)
  if twice is not None:
    raise ValueError(f'--config {twice!r} is given twice; give it once.')
  both = [k for k, _ in grid if k in fixed]
  if both:
    raise ValueError(
      f'{", ".join(both)} in both --set and --grid (--grid would win); give '
      'each key in one of them.'
    )
  points, seen = [], {}
  for spec in specs:
    for values in grid_points(grid) or [{}]:
      overrides = {**fixed, **values}
      point = Point(spec, overrides, workdir_for(root, spec, overrides))
      if point.workdir in seen:
        raise ValueError(
          f'{seen[point.workdir]} and {spec} {overrides} would share the '
          f'workdir {point.workdir}; give each point once.'
        )
      seen[point.workdir] = f'{spec} {overrides}'
      points.append(point)
  return points


def read_json(path: str) -> Optional[Any]:
  if not os.path.exists(path):
    return None
  with open(path) as f:
    return json.load(f)


def differing_keys(a: Dict[str, Any], b: Dict[str, Any]) -> set:
  """Flattened keys whose values differ, among the keys both configs have.

  A key only one side has is a field added to (or removed from) the library
  between two runs: it did not exist for the older run, so it is not held
  against it.
  """
  return {k for k in set(a) & set(b) if a[k] != b[k]}


def point_status(point: Point, config=None) -> str:
  """'done', 'todo' (new or unfinished) or 'conflict' (another experiment).

  ``config`` is the resolved config (resolved here when None). Fields that
  the workdir's config.json lacks (added to the library since) are ignored.
  """
  config = resolve(point.spec, point.overrides) if config is None else config
  wanted = config_dict(config)
  stored = read_json(os.path.join(point.workdir, 'config.json'))
  if stored is None:
    return 'todo'
  differs = differing_keys(
    flatten(stored, hashable=True), flatten(wanted, hashable=True)
  )
  if differs - set(RESUMABLE_KEYS):
    return 'conflict'
  summary = read_json(os.path.join(point.workdir, 'summary.json'))
  if (
    summary is not None
    and 'num_rounds' not in differs
    and summary.get('rounds_completed') == wanted['num_rounds']
  ):
    return 'done'
  return 'todo'


def write_point_file(point: Point) -> None:
  os.makedirs(point.workdir, exist_ok=True)
  with open(os.path.join(point.workdir, POINT_FILE), 'w') as f:
    json.dump({'config': point.spec, 'overrides': point.overrides}, f, indent=2)


class PointStopped(RuntimeError):
  """A point's training stopped by SIGTERM / SIGINT: its checkpoint is saved,
  the point is unfinished (the next sweep resumes it)."""

  def __init__(self, workdir: str, signal_name: str, done, num_rounds):
    self.signum = int(signal.Signals[signal_name])
    super().__init__(
      f'point {workdir} stopped by {signal_name} after round {done} of '
      f'{num_rounds}: unfinished, its checkpoint kept; run the same sweep '
      'again to resume it.'
    )


def run_point(workdir: str) -> Dict[str, Any]:
  """Trains the point stored in ``workdir`` (this process); the summary.

  Raises:
    PointStopped: a signal stopped the training before its last round.
  """
  from fedjax_metric import experiment  # pylint: disable=g-import-not-at-top

  stored = read_json(os.path.join(workdir, POINT_FILE))
  if stored is None:
    raise FileNotFoundError(
      f'{workdir}/{POINT_FILE} not found: not a sweep point.'
    )
  config = resolve(stored['config'], stored['overrides'])
  config.progress = False  # A log file, not a terminal.
  summary = experiment.run(config, workdir)
  if 'stopped_by' in summary:
    raise PointStopped(
      workdir,
      summary['stopped_by'],
      summary.get('rounds_completed'),
      config.num_rounds,
    )
  return summary
