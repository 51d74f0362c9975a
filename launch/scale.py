r"""The population-scale study: seconds per round, the client table's share
and peak memory, against the population N and the clients per round C.

  fedjax-metric scale --out=runs/scale                  # the default study
  python -m fedjax_metric.launch.scale --out=runs/scale \
      --populations=1000,1000000 --cohorts=1000 --algorithms=scaffold \
      --placements=disk --rounds=12
  fedjax-metric scale --out=/tmp/s --dry_run            # tiny shapes, seconds

Every point is a real run (`experiment.run`) of Synthetic(1, 1) (data/synthetic.py:
each client's examples are made from (seed, client id) when it is sampled,
so a population costs no storage) with logistic regression or a small MLP,
in its own child process so that its peak RSS is its own. FedAU runs under
Bernoulli participation with mean C / N, so that about C clients train a
round. Per point:

  * seconds per round: the wall time of the evaluation intervals after the
    first (which holds the compilation), divided by their rounds, evaluation
    excluded;
  * the client table's cost per round: the time spent reading and writing
    its rows (``table_io_seconds`` of metrics.jsonl; hidden behind the
    round where it ran in the read-ahead thread), the time the loop spent
    on them itself (patching, placing, packing: ``table_seconds``), and the
    time the loop waited for a call's inputs (cohorts, examples, rows) that
    the read ahead did not have ready (``cohort_wait_seconds``);
  * peak RSS of the process (``getrusage``), and the table's bytes.

Batches are drawn by the vectorized cohort sampler (`cohort.make_cohort`:
the same distribution as the per-client one, far less host time for
thousands of clients).

Results go to ``<out>/scale.json`` (one entry per point; a point already
there is not run again, so an interrupted study resumes), a markdown table
``<out>/scale.md`` and a two-panel plot ``<out>/scale.png``. `study` and
`run_point` are the same from Python (notebooks/scaling.ipynb).
"""

import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from typing import Dict, List, NamedTuple, Optional, Sequence

from absl import app, flags
import numpy as np

ALGORITHMS = ('fedavg', 'scaffold', 'fedau')
PLACEMENTS = ('auto', 'device', 'host', 'disk')
MODELS = ('logistic_regression', 'mlp')


class Point(NamedTuple):
  """One run of the study.

  Attributes:
    algorithm: 'fedavg', 'scaffold' or 'fedau' (Bernoulli participation).
    num_clients: N.
    clients_per_round: C (FedAU: the expected number, mean C / N).
    placement: the client table's placement (`client_table.PLACEMENTS`).
    model: 'logistic_regression' or 'mlp'.
    rounds: rounds run (the first evaluation interval is not timed).
    eval_every: the evaluation and checkpoint interval.
    local_steps, batch_size: each client's work per round.
    executor: the round executor ('vmap': one program per round).
    prefetch: read the next call's rows during the current call.
    seed: the run's seed.
  """

  algorithm: str
  num_clients: int
  clients_per_round: int
  placement: str = 'auto'
  model: str = 'logistic_regression'
  rounds: int = 12
  eval_every: int = 4
  local_steps: int = 10
  batch_size: int = 10
  executor: str = 'vmap'
  prefetch: bool = True
  seed: int = 0

  def key(self) -> str:
    """The point's name in scale.json."""
    return json.dumps(self._asdict(), sort_keys=True)


def point_config(point: Point):
  """The run's config: the packaged config of the algorithm on Synthetic(1,
  1), N clients, C per round, the point's model, work and placement."""
  from fedjax_metric import config_io  # pylint: disable=g-import-not-at-top

  config = config_io.load_config(point.algorithm)
  with config.unlocked():
    config.seed = point.seed
    config.dataset.name = 'synthetic'
    config.dataset.alpha = 1.0
    config.dataset.beta = 1.0
    config.num_clients = point.num_clients
    config.clients_per_round = min(point.clients_per_round, point.num_clients)
    config.num_rounds = point.rounds
    config.model = type(config.model)({'name': point.model})
    config.local.steps = point.local_steps
    config.local.batch_size = point.batch_size
    config.local.learning_rate = 0.01  # the FedProx paper's for Synthetic
    config.executor = point.executor
    config.client_table.placement = point.placement
    config.client_table.prefetch = point.prefetch
    config.eval_every = point.eval_every
    config.checkpoint_every = point.eval_every
    config.rounds_per_call = 1
    config.cohort_sampler = 'vectorized'
    config.progress = False
    config.plot_partition = False
    if point.algorithm == 'fedau':
      config.participation.pattern = 'bernoulli'
      config.participation.mean = point.clients_per_round / point.num_clients
      config.participation.floor = min(
        config.participation.floor, config.participation.mean
      )
  return config


def run_point(point: Point, workdir: str) -> Dict:
  """Runs ``point`` in this process into ``workdir`` and measures it.

  Returns a dict: the point's fields, ``seconds_per_round``,
  ``table_io_per_round``, ``table_loop_per_round``, ``wait_per_round`` (all
  seconds), ``peak_rss_gb``, ``table_bytes``, ``placement_used``,
  ``test_accuracy`` and ``wall_seconds``.
  """
  from fedjax_metric import experiment, metrics_log  # pylint: disable=g-import-not-at-top

  start = time.time()
  summary = experiment.run(point_config(point), workdir)
  rows = metrics_log.read_metrics(os.path.join(workdir, 'metrics.jsonl'))
  timed = rows[1:] or rows  # The first interval holds the compilation.
  rounds = (
    sum(b['round'] - a['round'] for a, b in zip(rows[:-1], rows[1:]))
    or rows[-1]['round']
  )
  seconds = sum(
    1.0 / r['rounds_per_second'] * _rounds_in(rows, r) for r in timed
  )

  def total(name):
    return sum(r.get(name, 0.0) for r in timed)

  meta_path = os.path.join(workdir, 'client_table', 'meta.json')
  placement, table_bytes = 'device', None
  if os.path.exists(meta_path):
    with open(meta_path) as f:
      meta = json.load(f)
    placement = meta['placement']
    table_bytes = meta['row_bytes'] * meta['num_clients']
  return {
    **point._asdict(),
    'placement_used': placement,
    'seconds_per_round': seconds / rounds,
    'table_io_per_round': total('table_io_seconds') / rounds,
    'table_loop_per_round': total('table_seconds') / rounds,
    'wait_per_round': total('cohort_wait_seconds') / rounds,
    'peak_rss_gb': _peak_rss_bytes() / 1024**3,
    'table_bytes': table_bytes,
    'test_accuracy': summary.get('test_accuracy'),
    'wall_seconds': time.time() - start,
  }


def _rounds_in(rows, row):
  """The rounds of the evaluation interval ending at ``row``."""
  i = rows.index(row)
  return row['round'] - (rows[i - 1]['round'] if i else 0)


def _peak_rss_bytes() -> int:
  # Linux reports kilobytes.
  return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def _run_child(point: Point, workdir: str, timeout: float) -> Dict:
  """`run_point` in a child process (its own peak RSS)."""
  command = [
    sys.executable,
    '-m',
    'fedjax_metric.launch.scale',
    f'--point={point.key()}',
    f'--workdir={workdir}',
  ]
  try:
    done = subprocess.run(
      command,
      capture_output=True,
      text=True,
      timeout=timeout or None,
      stdin=subprocess.DEVNULL,
    )
  except subprocess.TimeoutExpired:
    return {**point._asdict(), 'error': f'stopped after {timeout:.0f} s'}
  lines = [l for l in done.stdout.splitlines() if l.startswith('{')]
  if done.returncode or not lines:
    tail = (done.stderr.strip().splitlines() or ['no output'])[-1]
    return {**point._asdict(), 'error': tail[:300]}
  return json.loads(lines[-1])


def make_grid(
  populations: Sequence[int],
  cohorts: Sequence[int],
  algorithms: Sequence[str],
  placements: Sequence[str],
  seeds: Sequence[int] = (0,),
  **fields,
) -> List[Point]:
  """Every (algorithm, placement, N, C, seed) with C <= N; FedAvg keeps no
  client table, so it runs once per (N, C, seed), with placement 'auto'.
  Seeds are repeats: the table and plot show their median."""
  points = []
  for algorithm in algorithms:
    for placement in placements if algorithm != 'fedavg' else ('auto',):
      for n in populations:
        for c in cohorts:
          for seed in seeds:
            if c <= n:
              points.append(
                Point(algorithm, n, c, placement, seed=seed, **fields)
              )
  return points


def _line(r):
  """What a result is a repeat of: every field but the seed."""
  return (
    r['algorithm'],
    r['model'],
    r['placement_used'],
    r['prefetch'],
    r['num_clients'],
    r['clients_per_round'],
  )


def medians(results: Sequence[Dict]) -> List[Dict]:
  """One result per repeated point: the median of its seeds' numbers, with
  ``seeds`` (how many) and ``seconds_min`` / ``seconds_max`` per round."""
  groups: Dict[tuple, List[Dict]] = {}
  for r in results:
    if 'error' not in r:
      groups.setdefault(_line(r), []).append(r)
  out = []
  for group in groups.values():
    merged = dict(group[0])
    for name in (
      'seconds_per_round',
      'table_io_per_round',
      'table_loop_per_round',
      'wait_per_round',
      'peak_rss_gb',
      'test_accuracy',
    ):
      merged[name] = float(np.median([r[name] for r in group]))
    seconds = [r['seconds_per_round'] for r in group]
    merged.update(
      seeds=len(group), seconds_min=min(seconds), seconds_max=max(seconds)
    )
    out.append(merged)
  return out


def study(
  points: Sequence[Point],
  out_dir: str,
  *,
  timeout: float = 0,
  keep_workdirs: bool = False,
  report=print,
) -> List[Dict]:
  """Runs every point not already in ``out_dir/scale.json`` (each in its
  own process and temporary workdir), appending each result as it ends."""
  os.makedirs(out_dir, exist_ok=True)
  path = os.path.join(out_dir, 'scale.json')
  results = load_results(path)
  done = {r['key'] for r in results}
  for point in points:
    if point.key() in done:
      continue
    workdir = tempfile.mkdtemp(prefix='scale_', dir=out_dir)
    report(
      f'running {point.algorithm} N={point.num_clients:,} '
      f'C={point.clients_per_round:,} table={point.placement}'
    )
    result = _run_child(point, workdir, timeout)
    result['key'] = point.key()
    if not keep_workdirs:
      shutil.rmtree(workdir, ignore_errors=True)
    results.append(result)
    _write_json(path, results)
    report('  ' + describe(result))
  return results


def load_results(path: str) -> List[Dict]:
  if not os.path.exists(path):
    return []
  with open(path) as f:
    return json.load(f)


def _write_json(path, obj):
  with open(path + '.tmp', 'w') as f:
    json.dump(obj, f, indent=1)
  os.replace(path + '.tmp', path)


def describe(result: Dict) -> str:
  if 'error' in result:
    return f'error: {result["error"]}'
  return (
    f'{result["seconds_per_round"]:.3f} s/round, rows read/written '
    f'{1e3 * result["table_io_per_round"]:.0f} ms/round, peak RSS '
    f'{result["peak_rss_gb"]:.2f} GB'
  )


def table(results: Sequence[Dict], *, device: str, command: str) -> str:
  """A markdown section of the results (repeats as their median; the
  seconds' range over them in brackets)."""
  lines = [
    f'### {time.strftime("%Y-%m-%d")}: {device}',
    '',
    f'`{command}`',
    '',
    '| algorithm | model | N | C | table | seeds | s / round [min, max] | '
    'rows I/O ms | loop on rows ms | wait ms | peak RSS (GB) | table (GB) | '
    'test acc |',
    '|---|---|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|',
  ]
  for r in results:
    if 'error' in r:
      lines.append(
        f'| {r["algorithm"]} | {r["model"]} | {r["num_clients"]:,} | '
        f'{r["clients_per_round"]:,} | {r["placement"]} | '
        f'{r.get("seed", 0)} | {r["error"]} | | | | | | |'
      )
  for r in medians(results):
    gb = '' if r['table_bytes'] is None else f'{r["table_bytes"] / 1024**3:.3f}'
    lines.append(
      f'| {r["algorithm"]} | {r["model"]} | {r["num_clients"]:,} | '
      f'{r["clients_per_round"]:,} | {r["placement_used"]}'
      f'{"" if r["prefetch"] else " (no prefetch)"} | {r["seeds"]} | '
      f'{r["seconds_per_round"]:.3f} [{r["seconds_min"]:.3f}, '
      f'{r["seconds_max"]:.3f}] | {1e3 * r["table_io_per_round"]:.0f} | '
      f'{1e3 * r["table_loop_per_round"]:.0f} | '
      f'{1e3 * r["wait_per_round"]:.0f} | '
      f'{r["peak_rss_gb"]:.2f} | {gb} | {r["test_accuracy"]:.3f} |'
    )
  return '\n'.join(lines) + '\n'


def plot(results: Sequence[Dict], path: str, *, title: str = ''):
  """Seconds per round against N (at each C) and against C (at the largest
  N), one line per algorithm and placement; a panel with no line (a study
  of one C, or of one N) is left out. Returns the figure."""
  from matplotlib import figure  # pylint: disable=g-import-not-at-top
  from matplotlib.backends import backend_agg  # pylint: disable=g-import-not-at-top

  ok = medians(results)
  cohorts = sorted({r['clients_per_round'] for r in ok})
  largest = max((r['num_clients'] for r in ok), default=0)
  by_n, by_c = [], []  # (label, points) of each panel's lines
  for algorithm, placement, prefetch in sorted(
    {(r['algorithm'], r['placement_used'], r['prefetch']) for r in ok}
  ):
    name = f'{algorithm}, {placement}' + ('' if prefetch else ', no prefetch')
    mine = [
      r
      for r in ok
      if (r['algorithm'], r['placement_used'], r['prefetch'])
      == (algorithm, placement, prefetch)
    ]
    for c in cohorts:
      pts = sorted(
        (r['num_clients'], r['seconds_per_round'])
        for r in mine
        if r['clients_per_round'] == c
      )
      if len(pts) > 1:
        by_n.append((f'{name}, C={c:,}', pts))
    pts = sorted(
      (r['clients_per_round'], r['seconds_per_round'])
      for r in mine
      if r['num_clients'] == largest
    )
    if len(pts) > 1:
      by_c.append((name, pts))
  panels = [
    (lines, xlabel, panel_title)
    for lines, xlabel, panel_title in (
      (by_n, 'population N', ''),
      (by_c, 'clients per round C', f'N = {largest:,}'),
    )
    if lines
  ] or [([], 'population N', '')]
  fig = figure.Figure(figsize=(5.5 * len(panels), 4.2))
  backend_agg.FigureCanvasAgg(fig)
  for i, (lines, xlabel, panel_title) in enumerate(panels):
    ax = fig.add_subplot(1, len(panels), i + 1)
    for label, pts in lines:
      ax.plot(*zip(*pts), marker='o', label=label)
    ax.set_xscale('log')
    ax.set_yscale('log')
    ax.set_xlabel(xlabel)
    ax.set_ylabel('seconds per round')
    ax.set_title(panel_title)
    ax.grid(True, which='both', alpha=0.3)
    if lines:
      ax.legend(fontsize=7)
  if title:
    fig.suptitle(title)
  fig.tight_layout()
  fig.savefig(path, dpi=110)
  return fig


def save_outputs(results, out_dir, *, device, command):
  """``<out_dir>/scale.md`` (the section appended) and ``scale.png``."""
  section = table(results, device=device, command=command)
  with open(os.path.join(out_dir, 'scale.md'), 'a') as f:
    f.write(section + '\n')
  plot(results, os.path.join(out_dir, 'scale.png'), title=device)
  return section


def describe_device() -> str:
  """The device the study ran on, in words: an accelerator's kind, or the
  CPU's model and core count."""
  import jax  # pylint: disable=g-import-not-at-top

  if jax.default_backend() != 'cpu':
    return f'{jax.devices()[0].device_kind} ({jax.default_backend()})'
  model = 'CPU'
  try:
    with open('/proc/cpuinfo') as f:
      for line in f:
        if line.startswith('model name'):
          model = line.split(':', 1)[1].strip()
          break
  except OSError:
    pass
  return f'{model}, {os.cpu_count()} cores (cpu)'


def define_flags():
  """The command's flags (defined only when it runs as the program)."""
  flags.DEFINE_string('out', None, 'Folder of scale.json / .md / .png.')
  flags.DEFINE_list('populations', ['1000', '10000', '100000', '1000000'], 'N.')
  flags.DEFINE_list('cohorts', ['1000'], 'C: clients per round.')
  flags.DEFINE_list('algorithms', ['fedavg', 'scaffold'], str(ALGORITHMS))
  flags.DEFINE_list('placements', ['host', 'disk'], str(PLACEMENTS))
  flags.DEFINE_enum('model', 'logistic_regression', list(MODELS), 'Model.')
  flags.DEFINE_integer('rounds', 12, 'Rounds per point.')
  flags.DEFINE_integer('eval_every', 4, 'Evaluation and checkpoint interval.')
  flags.DEFINE_integer('local_steps', 10, 'Local steps per client per round.')
  flags.DEFINE_integer('batch_size', 10, 'Examples per local step.')
  flags.DEFINE_string('executor', 'vmap', 'The round executor.')
  flags.DEFINE_bool('prefetch', True, 'Read rows during the previous call.')
  flags.DEFINE_list('seeds', ['0'], 'Repeats of every point (median shown).')
  flags.DEFINE_float('timeout', 0, 'Seconds per point (0: none).')
  flags.DEFINE_bool(
    'dry_run', False, 'The same study on tiny shapes (N <= 300, C <= 30).'
  )
  flags.DEFINE_string('point', None, 'Internal: run one point (JSON).')
  flags.DEFINE_string('workdir', None, "Internal: the point's workdir.")


def grid_from_flags() -> List[Point]:
  """The study's points from the flags (tiny shapes with --dry_run)."""
  f = flags.FLAGS
  for name in f.algorithms:
    if name not in ALGORITHMS:
      raise SystemExit(
        f'error: --algorithms: {name!r} is not one of {ALGORITHMS}.'
      )
  for name in f.placements:
    if name not in PLACEMENTS:
      raise SystemExit(
        f'error: --placements: {name!r} is not one of {PLACEMENTS}.'
      )
  populations = [int(float(x)) for x in f.populations]
  cohorts = [int(float(x)) for x in f.cohorts]
  fields = dict(
    model=f.model,
    rounds=f.rounds,
    eval_every=f.eval_every,
    local_steps=f.local_steps,
    batch_size=f.batch_size,
    executor=f.executor,
    prefetch=f.prefetch,
    seeds=[int(x) for x in f.seeds],
  )
  if f.dry_run:
    populations = sorted({min(n, 300) for n in populations})
    cohorts = sorted({min(c, 30) for c in cohorts})
    fields.update(rounds=4, eval_every=2, local_steps=2, batch_size=4)
  return make_grid(populations, cohorts, f.algorithms, f.placements, **fields)


def main(argv):
  if len(argv) > 1:
    raise SystemExit(f'error: unexpected argument(s) {" ".join(argv[1:])}.')
  f = flags.FLAGS
  if f.point is not None:
    point = Point(**json.loads(f.point))
    print(json.dumps(run_point(point, f.workdir)))
    return
  if not f.out:
    raise SystemExit('error: --out is required: where the results go.')
  results = study(grid_from_flags(), f.out, timeout=f.timeout)
  given = [a for a in sys.argv[1:] if a.startswith('--')]
  command = ' '.join(['fedjax-metric scale', *given])
  print(save_outputs(results, f.out, device=describe_device(), command=command))


def run_main(argv: Optional[Sequence[str]] = None, flags_parser=None):
  """The command; ``flags_parser``: absl's, or the console's (its --help)."""
  define_flags()
  app.run(
    main,
    argv=list(argv) if argv is not None else None,
    **({'flags_parser': flags_parser} if flags_parser else {}),
  )


if __name__ == '__main__':
  run_main()
