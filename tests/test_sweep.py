"""launch/sweep.py: grids, resumable runs, tables and curves.

Most tests work on hand-written workdirs (config.json, metrics.jsonl,
summary.json) and fake child processes, so they take milliseconds; one trains
a real ``:runlocal`` point in-process and one calls the command line.
"""

import glob
import json
import math
import os
import signal
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

from launch import sweep

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FEDAVG = os.path.join(REPO, 'configs', 'fedavg.py') + ':runlocal'


# ---------------------------------------------------------------------------
# Grids, overrides, workdirs.
# ---------------------------------------------------------------------------


def test_points_get_distinct_workdirs(tmp_path):
  points = sweep.make_points(
    str(tmp_path),
    [FEDAVG, FEDAVG.replace('runlocal', 'runlocal,dataset=digits')],
    {'num_rounds': '1'},
    sweep.parse_assignments('seed=0,1'),
  )
  assert len(points) == 4
  assert len({p.workdir for p in points}) == 4
  assert all(p.overrides['num_rounds'] == '1' for p in points)
  assert points[1].workdir.endswith(os.path.join('num_rounds=1__seed=1'))


def test_long_override_lists_give_valid_distinct_workdir_names(tmp_path):
  """Twelve overrides made a 330-character directory name, which the file
  system refused (OSError: File name too long); long names are now cut and
  end in a hash of the whole, so they stay distinct and stable."""
  base = {f'ssl_eval.setting_number_{i}': '10000' for i in range(12)}
  names = [
    sweep.workdir_for(str(tmp_path), FEDAVG, {**base, 'seed': str(seed)})
    for seed in (0, 1)
  ]
  assert len(set(names)) == 2
  assert names[0] == sweep.workdir_for(
    str(tmp_path), FEDAVG, {**base, 'seed': '0'}
  )
  for name in names:
    assert all(
      len(part) <= sweep.MAX_NAME
      for part in os.path.relpath(name, tmp_path).split(os.sep)
    )
    os.makedirs(name)  # the file system takes it
  short = sweep.workdir_for(str(tmp_path), FEDAVG, {'seed': '0'})
  assert short.endswith('seed=0')  # short names are unchanged


def _finish_fake(point, rounds=None, drop=(), **config_changes):
  """Writes what experiment.run leaves in a workdir, without training."""
  config = sweep.config_dict(sweep.resolve(point.spec, point.overrides))
  config.update(config_changes)
  for key in drop:  # A field the library did not have when the run ran.
    parent, _, leaf = key.rpartition('.')
    (config[parent] if parent else config).pop(leaf)
  os.makedirs(point.workdir, exist_ok=True)
  with open(os.path.join(point.workdir, 'config.json'), 'w') as f:
    json.dump(config, f)
  if rounds is not None:
    with open(os.path.join(point.workdir, 'summary.json'), 'w') as f:
      json.dump({'rounds_completed': rounds}, f)


def test_point_status(tmp_path):
  [point] = sweep.make_points(str(tmp_path), [FEDAVG], {'seed': '1'}, [])
  assert sweep.point_status(point) == 'todo'  # Nothing there.
  _finish_fake(point)  # Started, no summary.
  assert sweep.point_status(point) == 'todo'
  _finish_fake(point, rounds=1)  # Stopped early.
  assert sweep.point_status(point) == 'todo'
  _finish_fake(point, rounds=2)
  assert sweep.point_status(point) == 'done'
  _finish_fake(point, rounds=2, progress=False)  # Logging differs only.
  assert sweep.point_status(point) == 'done'
  _finish_fake(point, rounds=2, drop=('precision', 'local.epoch_decay'))
  assert sweep.point_status(point) == 'done'
  _finish_fake(point, rounds=2, num_rounds=1)  # More rounds asked for.
  assert sweep.point_status(point) == 'todo'
  _finish_fake(point, rounds=2, seed=7)  # Another experiment.
  assert sweep.point_status(point) == 'conflict'


def test_run_points_parallel_skips_finished_and_reports_failures(tmp_path):
  points = sweep.make_points(
    str(tmp_path), [FEDAVG], {}, sweep.parse_assignments('seed=0,1,2')
  )
  expected = {
    p.workdir: sweep.config_dict(sweep.resolve(p.spec, p.overrides))
    for p in points
  }
  for workdir, config in expected.items():
    os.makedirs(workdir)
    with open(os.path.join(workdir, 'expected.json'), 'w') as f:
      json.dump(config, f)
  child = (
    'import json, os, sys, time; w = sys.argv[1]; time.sleep(0.3); '
    'c = json.load(open(os.path.join(w, "expected.json"))); '
    'json.dump(c, open(os.path.join(w, "config.json"), "w")); '
    'json.dump({"rounds_completed": c["num_rounds"]}, '
    'open(os.path.join(w, "summary.json"), "w")); '
    'print(json.load(open(os.path.join(w, "sweep_point.json"))))'
  )
  command = lambda w: [sys.executable, '-c', child, w]
  messages = []
  outcomes = sweep.run_points(
    points, parallel=2, command=command, say=messages.append
  )
  assert set(outcomes.values()) == {'done'}
  assert sum(m.startswith('start') for m in messages) == 3
  # The child saw its point file; its output went to the log.
  with open(os.path.join(points[0].workdir, sweep.LOG_FILE)) as f:
    assert "'seed': '0'" in f.read()
  again = sweep.run_points(
    points, command=lambda w: ['false'], say=messages.append
  )
  assert set(again.values()) == {'skipped'}
  os.remove(os.path.join(points[1].workdir, 'summary.json'))
  failed = sweep.run_points(
    points,
    command=lambda w: [sys.executable, '-c', 'raise SystemExit(3)'],
    say=messages.append,
  )
  assert failed[points[1].workdir] == 'failed (rc=3)'
  assert failed[points[0].workdir] == 'skipped'
  with pytest.raises(ValueError):
    sweep.run_points(points, parallel=0)


def test_gpu_slots_pin_one_gpu_each_and_share_memory_when_crowded():
  assert sweep.gpu_environments([], 2) == [{}, {}]
  alone = sweep.gpu_environments(['0', '1'], 2)
  assert alone == [{'CUDA_VISIBLE_DEVICES': '0'}, {'CUDA_VISIBLE_DEVICES': '1'}]
  crowded = sweep.gpu_environments(['3', '5'], 4)
  assert [e['CUDA_VISIBLE_DEVICES'] for e in crowded] == ['3', '5', '3', '5']
  assert all(e['XLA_PYTHON_CLIENT_PREALLOCATE'] == 'false' for e in crowded)
  assert all(e['XLA_PYTHON_CLIENT_MEM_FRACTION'] == '0.450' for e in crowded)


def test_each_running_point_gets_its_process_slots_environment(tmp_path):
  """Two slots pinned to GPUs 7 and 9: at most one point per slot at a time,
  so the three points see 7, 9 and 7 or 9, never a slot already in use."""
  points = sweep.make_points(
    str(tmp_path), [FEDAVG], {}, sweep.parse_assignments('seed=0,1,2')
  )
  child = (
    'import os, sys, time; time.sleep(0.3); '
    'open(os.path.join(sys.argv[1], "gpu"), "w").write('
    'os.environ.get("CUDA_VISIBLE_DEVICES", "none"))'
  )
  sweep.run_points(
    points,
    parallel=2,
    command=lambda w: [sys.executable, '-c', child, w],
    say=lambda _: None,
    environment=sweep.gpu_environments(['7', '9'], 2),
  )
  seen = []
  for point in points:
    with open(os.path.join(point.workdir, 'gpu')) as f:
      seen.append(f.read())
  assert seen[:2] == ['7', '9'] and seen[2] in ('7', '9')


def test_points_share_a_compilation_cache_under_the_root_unless_told(
  tmp_path, monkeypatch
):
  root = str(tmp_path / 'grid')
  monkeypatch.delenv('JAX_COMPILATION_CACHE_DIR', raising=False)
  assert sweep.compilation_cache_dir(root) == os.path.join(root, 'jax_cache')
  assert sweep.compilation_cache_dir(root, 'off') == ''
  assert sweep.compilation_cache_dir(root, '/big/disk') == '/big/disk'
  monkeypatch.setenv('JAX_COMPILATION_CACHE_DIR', '/mine')  # The user's wins.
  assert sweep.compilation_cache_dir(root) == '/mine'
  assert sweep.compilation_cache_environment('') == {
    'JAX_ENABLE_COMPILATION_CACHE': 'false'
  }
  monkeypatch.chdir(tmp_path)  # A relative path reaches children whole.
  assert sweep.compilation_cache_environment('c') == {
    'JAX_COMPILATION_CACHE_DIR': str(tmp_path / 'c')
  }


def _without_times(rows):
  return [
    {
      k: v
      for k, v in r.items()
      if not k.endswith(('time', 'seconds', '_per_second'))
    }
    for r in rows
  ]


@pytest.mark.slow
def test_a_point_finding_its_programs_cached_compiles_none_and_matches(
  tmp_path, monkeypatch
):
  """The same ``:runlocal`` point swept into two roots that share one cache:
  the first sweep fills the cache, the second adds no entry (every program
  it needs was there, so nothing was compiled) and writes the same metrics,
  bit for bit. 'off' wins over the caller's $JAX_COMPILATION_CACHE_DIR:
  nothing is written to the cache it names."""
  monkeypatch.setenv('JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS', '0')
  cache = tmp_path / 'cache'
  monkeypatch.setenv('JAX_COMPILATION_CACHE_DIR', str(cache))
  listings, metrics = [], []
  for name, setting in (('off', 'off'), ('cold', 'auto'), ('warm', 'auto')):
    root = str(tmp_path / name)
    points = sweep.make_points(
      root, [FEDAVG], {'num_rounds': '1', 'plot_partition': 'False'}, []
    )
    outcomes = sweep.train_points(
      points, backend='local', root=root, compilation_cache=str(setting)
    )
    assert outcomes == {points[0].workdir: 'done'}
    listings.append(sorted(os.listdir(cache)) if cache.exists() else [])
    with open(os.path.join(points[0].workdir, 'metrics.jsonl')) as f:
      metrics.append(_without_times(json.loads(line) for line in f))
  assert listings[0] == [] and listings[1], listings
  assert listings[2] == listings[1]
  assert metrics[0] == metrics[1] == metrics[2]
  assert 'test_accuracy' in metrics[2][-1]


def test_run_point_trains_a_runlocal_config(tmp_path):
  [point] = sweep.make_points(
    str(tmp_path), [FEDAVG], {'num_rounds': '1', 'seed': '4'}, []
  )
  assert sweep.point_status(point) == 'todo'
  sweep.write_point_file(point)
  summary = sweep.run_point(point.workdir)
  assert summary['rounds_completed'] == 1
  assert sweep.point_status(point) == 'done'
  run = sweep.read_run(point.workdir)
  assert run.finished and run.config['seed'] == 4
  assert 0.0 <= sweep.series(run, 'test_accuracy')[1][-1] <= 1.0


# ---------------------------------------------------------------------------
# Tables and curves on hand-written workdirs.
# ---------------------------------------------------------------------------


def _fake_run(
  root,
  name,
  *,
  algorithm,
  alpha,
  seed,
  accuracies,
  finished=True,
  lr=0.1,
  extra_summary=None,
):
  workdir = os.path.join(root, name)
  os.makedirs(workdir)
  config = {
    'algorithm': algorithm,
    'seed': seed,
    'num_rounds': len(accuracies),
    'partition': {'alpha': alpha, 'method': 'dirichlet'},
    'local': {'learning_rate': lr},
    'progress': True,
  }
  with open(os.path.join(workdir, 'config.json'), 'w') as f:
    json.dump(config, f)
  with open(os.path.join(workdir, 'metrics.jsonl'), 'w') as f:
    for r, a in enumerate(accuracies, start=1):
      f.write(json.dumps({'round': r, 'test_accuracy': a}) + '\n')
  if finished:
    with open(os.path.join(workdir, 'summary.json'), 'w') as f:
      json.dump(
        {
          'rounds_completed': len(accuracies),
          'test_accuracy': accuracies[-1],
          **(extra_summary or {}),
        },
        f,
      )
  return workdir


ACCURACIES = {  # (algorithm, alpha) -> per-seed curves over 4 rounds
  ('fedavg', 0.1): [
    [0.50, 0.60, 0.70, 0.72],
    [0.40, 0.55, 0.65, 0.70],
    [0.45, 0.65, 0.60, 0.74],
  ],
  ('fedrcl', 0.1): [
    [0.52, 0.62, 0.75, 0.80],
    [0.48, 0.60, 0.72, 0.78],
    [0.50, 0.61, 0.70, 0.79],
  ],
  ('fedavg', 0.3): [
    [0.60, 0.70, 0.80, 0.81],
    [0.62, 0.72, 0.79, 0.83],
    [0.61, 0.70, 0.81, 0.80],
  ],
}


@pytest.fixture
def fake_root(tmp_path):
  for (algorithm, alpha), curves in ACCURACIES.items():
    for seed, curve in enumerate(curves):
      _fake_run(
        str(tmp_path),
        f'{algorithm}_{alpha}_{seed}',
        algorithm=algorithm,
        alpha=alpha,
        seed=seed,
        accuracies=curve,
        extra_summary={'test_probe': 0.5 + seed / 10},
      )
  _fake_run(
    str(tmp_path),
    'unfinished',
    algorithm='fedavg',
    alpha=0.1,
    seed=9,
    accuracies=[0.1, 0.2],
    finished=False,
  )
  return str(tmp_path)


def test_ema_is_bias_corrected_moving_average():
  x = [0.2, 0.6, 0.4, 0.9]
  # By hand: weights 0.9^(t-i) over x_1..x_t, normalised.
  want = [
    sum(0.9 ** (t - i) * x[i] for i in range(t + 1))
    / sum(0.9 ** (t - i) for i in range(t + 1))
    for t in range(4)
  ]
  np.testing.assert_allclose(sweep.ema(x, 0.9), want, rtol=1e-12)
  assert sweep.ema(x, 0.0).tolist() == x
  with pytest.raises(ValueError):
    sweep.ema(x, 1.0)


def test_ema_best_and_top_skip_nan_as_the_runs_log_them():
  """The table's EMA, 'best' and 'top:K' skip a NaN evaluation, as the
  logged <headline>_ema and top-k do (evaluation/statistics.py)."""
  from fedjax_metric.evaluation import statistics

  x = [0.5, 0.7, math.nan, 0.8, 0.9]
  np.testing.assert_allclose(
    sweep.ema(x, 0.9), statistics.debiased_ema_series(x, 0.9), rtol=1e-12
  )
  assert sweep.ema(x, 0.9)[-1] == pytest.approx(0.7419, abs=1e-4)
  assert math.isnan(sweep.ema([math.nan, 0.5], 0.9)[0])
  rounds, values = np.arange(1, 6), np.array(x)
  assert sweep.pick(rounds, values, 'best') == 0.9
  assert sweep.pick(rounds, values, 'top:2') == pytest.approx(0.85)
  assert sweep.default_scale('auroc_mean') == 100.0
  assert sweep.default_scale('test_uniformity') == 1.0


def test_pick_final_best_last_round():
  rounds, values = np.array([10, 20, 30]), np.array([0.3, 0.9, 0.6])
  assert sweep.pick(rounds, values, 'final') == 0.6
  assert sweep.pick(rounds, values, 'best') == 0.9
  assert sweep.pick(rounds, values, 'last:2') == pytest.approx(0.75)
  assert sweep.pick(rounds, values, 'round:20') == 0.9
  with pytest.raises(KeyError):
    sweep.pick(rounds, values, 'round:25')
  for bad in ('last', 'last:0', 'median', 'top:0', 'final@x'):
    with pytest.raises(ValueError):
      sweep.pick(rounds, values, bad)


def test_pick_top_k_and_a_run_cut_at_round_t():
  rounds = np.array([10, 20, 30, 40, 50])
  values = np.array([0.3, 0.9, 0.6, 0.95, 0.1])
  assert sweep.pick(rounds, values, 'top:2') == pytest.approx(0.925)
  assert sweep.pick(rounds, values, 'top:9') == pytest.approx(0.57)
  # Read as if the run had stopped at round 30.
  assert sweep.pick(rounds, values, 'top:2@30') == pytest.approx(0.75)
  assert sweep.pick(rounds, values, 'final@30') == 0.6
  assert sweep.pick(rounds, values, 'last:2@40') == pytest.approx(0.775)
  with pytest.raises(KeyError):
    sweep.pick(rounds, values, 'top:2@35')  # no evaluation there


@pytest.mark.parametrize(
  'at,reduce',
  [
    ('final', lambda c: c[-1]),
    ('best', max),
    ('last:2', lambda c: (c[-1] + c[-2]) / 2),
  ],
)
def test_table_mean_std_n_per_cell(fake_root, at, reduce):
  runs = sweep.find_runs([fake_root])
  assert len(runs) == 9  # The unfinished run is left out...
  assert len(sweep.find_runs([fake_root], include_unfinished=True)) == 10
  table = sweep.build_table(
    runs,
    rows=['algorithm'],
    cols=['partition.alpha'],
    metrics=['test_accuracy'],
    at=at,
  )
  assert table.row_labels == ['fedavg', 'fedrcl']
  assert table.columns == [('0.1', 'test_accuracy'), ('0.3', 'test_accuracy')]
  for (algorithm, alpha), curves in ACCURACIES.items():
    cell = table.cells[(algorithm, str(alpha), 'test_accuracy')]
    values = [reduce(c) for c in curves]
    assert cell.n == 3
    assert cell.mean == pytest.approx(np.mean(values))
    # Sample standard deviation, written out.
    m = sum(values) / 3
    assert cell.std == pytest.approx(
      math.sqrt(sum((v - m) ** 2 for v in values) / 2)
    )
  assert table.cells[('fedrcl', '0.3', 'test_accuracy')] is None


def test_table_ema_metric_and_summary_only_metric(fake_root):
  runs = sweep.find_runs([fake_root])
  table = sweep.build_table(
    runs,
    rows=['algorithm'],
    cols=['partition.alpha'],
    metrics=['test_accuracy_ema', 'test_probe'],
    at='final',
    ema_decay=0.5,
  )
  cell = table.cells[('fedrcl', '0.1', 'test_accuracy_ema')]
  finals = []
  for c in ACCURACIES[('fedrcl', 0.1)]:
    s = 0.0
    for x in c:
      s = 0.5 * s + 0.5 * x
    finals.append(s / (1 - 0.5 ** len(c)))
  assert cell.mean == pytest.approx(np.mean(finals))
  probe = table.cells[('fedavg', '0.3', 'test_probe')]
  assert probe.mean == pytest.approx(0.6)


def test_table_refuses_mixed_cells_and_repeated_seeds(fake_root, tmp_path):
  runs = sweep.find_runs([fake_root])
  with pytest.raises(ValueError, match='partition.alpha'):
    sweep.build_table(
      runs, rows=['algorithm'], cols=[], metrics=['test_accuracy'], at='final'
    )
  _fake_run(
    fake_root,
    'other_lr',
    algorithm='fedavg',
    alpha=0.3,
    seed=5,
    accuracies=[0.5, 0.5, 0.5, 0.5],
    lr=0.01,
  )
  runs = sweep.find_runs([fake_root])
  with pytest.raises(ValueError, match='local.learning_rate'):
    sweep.build_table(
      runs,
      rows=['algorithm'],
      cols=['partition.alpha'],
      metrics=['test_accuracy'],
      at='final',
    )
  selected = [
    r for r in runs if sweep.matches(r, {'local.learning_rate': '0.1'})
  ]
  assert len(selected) == 9
  # A field only one run's config.json has (added in between) is ignored.
  newer = [
    r._replace(config={**r.config, 'new.field': 1})
    if r.config['seed'] == 0
    else r
    for r in selected
  ]
  sweep.group_runs(newer, ['algorithm'], ['partition.alpha'])
  twin = str(tmp_path / 'twin')
  _fake_run(twin, 'a', algorithm='fedavg', alpha=0.3, seed=0, accuracies=[0.5])
  _fake_run(twin, 'b', algorithm='fedavg', alpha=0.3, seed=0, accuracies=[0.6])
  with pytest.raises(ValueError, match='same seed'):
    sweep.group_runs(sweep.find_runs([twin]), ['algorithm'], [])


def test_markdown_and_csv(fake_root):
  runs = sweep.find_runs([fake_root])
  table = sweep.build_table(
    runs,
    rows=['algorithm'],
    cols=['partition.alpha'],
    metrics=['test_accuracy'],
    at='final',
    order=['fedrcl'],
  )
  text = sweep.format_markdown(
    table, rename={'fedrcl': 'FedRCL', '0.1': 'alpha 0.1'}
  )
  lines = text.strip().split('\n')
  assert lines[0] == '| run | alpha 0.1 | 0.3 |'
  assert lines[2].startswith('| FedRCL | 79.00 ± 1.00 (n=3) |')  # order first
  mean = np.mean([0.72, 0.70, 0.74]) * 100
  std = np.std([0.72, 0.70, 0.74], ddof=1) * 100
  assert f'{mean:.2f} ± {std:.2f} (n=3)' in lines[3]
  text = sweep.format_csv(table).strip()
  rows = [line.split(',') for line in text.split('\n')]
  assert rows[0] == ['row', 'column', 'metric', 'mean', 'std', 'n']
  assert ['fedrcl', '0.1', 'test_accuracy', '79', '1', '3'] in rows
  assert len(rows) == 1 + 3  # No line for the empty cell.


def test_mean_curve_and_plot(fake_root, tmp_path):
  runs = sweep.find_runs([fake_root])
  groups = sweep.group_runs(runs, ['algorithm'], ['partition.alpha'])
  rounds, mean, std, n = sweep.mean_curve(
    groups[('fedavg', '0.1')], 'test_accuracy'
  )
  curves = np.array(ACCURACIES[('fedavg', 0.1)])
  np.testing.assert_array_equal(rounds, [1, 2, 3, 4])
  np.testing.assert_allclose(mean, curves.mean(0))
  np.testing.assert_allclose(std, curves.std(0, ddof=1))
  assert n == 3
  out = sweep.plot_curves(
    runs,
    str(tmp_path / 'plots' / 'c.png'),
    rows=['algorithm'],
    cols=['partition.alpha'],
    metric='test_accuracy',
  )
  with open(out, 'rb') as f:
    assert f.read(8) == b'\x89PNG\r\n\x1a\n'


def _table_csv(root, *flags):
  """``launch.sweep table --cols=partition.alpha --format=csv`` on
  ``root`` with ``flags``, as a child process."""
  return subprocess.run(
    [
      sys.executable,
      '-m',
      'launch.sweep',
      'table',
      f'--root={root}',
      '--cols=partition.alpha',
      '--format=csv',
      *flags,
    ],
    cwd=REPO,
    capture_output=True,
    text=True,
  )


def test_table_command_line(fake_root, tmp_path):
  out = tmp_path / 't.csv'
  result = _table_csv(fake_root, '--where=partition.alpha=0.3', f'--out={out}')
  assert result.returncode == 0, result.stderr
  assert result.stdout == out.read_text()
  assert result.stdout.strip().split('\n')[1].startswith('fedavg,0.3,')


def test_where_keeps_any_of_a_keys_values_and_names_an_unknown_key(
  fake_root,
):
  def table(where):
    return _table_csv(fake_root, f'--where={where}')

  kept = table('algorithm=fedrcl,fedavg;partition.alpha=0.1')
  assert kept.returncode == 0, kept.stderr
  rows = sorted(
    line.split(',')[0] for line in kept.stdout.split('\n')[1:] if line
  )
  assert rows == ['fedavg', 'fedrcl'] and ',0.3,' not in kept.stdout
  typo = table('partiton.alpha=0.1')
  assert typo.returncode != 0
  assert typo.stderr.strip().splitlines() == [
    f'error: --where: no run under {[fake_root]} has partiton.alpha (a '
    'flattened config key, e.g. partition.alpha). (--help lists the flags)'
  ]


SWEEP_WITH_SLOW_POINTS = r"""
import sys
import time
sys.path.insert(0, {root!r})
from launch import sweep

child = (
  "import os, signal, sys, time; w = sys.argv[1]\n"
  "open(os.path.join(w, 'pid'), 'w').write(str(os.getpid()))\n"
  "def stop(signum, frame):\n"
  "  time.sleep(0.5)  # The round in progress, then its checkpoint.\n"
  "  open(os.path.join(w, 'stopped_by'), 'w').write(str(signum))\n"
  "  sys.exit(128 + signum)\n"
  "signal.signal(signal.SIGTERM, stop)\n"
  "time.sleep(120)\n"
)
points = sweep.make_points(
  {tmp!r}, [{config!r}], {{}}, sweep.parse_assignments('seed=0,1,2')
)
sweep.run_points(
  points, parallel=2, command=lambda w: [sys.executable, '-c', child, w]
)
"""


def test_sigterm_to_the_sweep_stops_its_points_and_leaves_none_behind(
  tmp_path,
):
  """`kill <sweep pid>` reaches only the sweep: it must pass SIGTERM to its
  running points, start no other, wait for them and exit 128 + 15."""
  script = SWEEP_WITH_SLOW_POINTS.format(
    root=os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
    tmp=str(tmp_path),
    config=FEDAVG,
  )
  parent = subprocess.Popen(
    [sys.executable, '-c', script],
    stdout=subprocess.PIPE,
    stderr=subprocess.PIPE,
    text=True,
  )
  deadline = time.time() + 60
  while len(glob.glob(str(tmp_path / '**' / 'pid'), recursive=True)) < 2:
    assert time.time() < deadline and parent.poll() is None, parent.stderr
    time.sleep(0.1)
  parent.send_signal(signal.SIGTERM)
  out, err = parent.communicate(timeout=60)
  assert parent.returncode == 128 + signal.SIGTERM, err
  assert 'SIGTERM: stopped; 3 point(s) not finished' in out
  assert 'Traceback' not in err
  pids = [
    int(open(p).read())
    for p in glob.glob(str(tmp_path / '**' / 'pid'), recursive=True)
  ]
  assert len(pids) == 2  # The third point never started.
  for pid in pids:
    with pytest.raises(ProcessLookupError):
      os.kill(pid, 0)
  stopped = glob.glob(str(tmp_path / '**' / 'stopped_by'), recursive=True)
  assert len(stopped) == 2
  assert {open(p).read() for p in stopped} == {str(int(signal.SIGTERM))}


# The point's own process, under a wrapper that records its pid first (exec:
# the same process), so that the test can signal the point alone.
POINT_WITH_PID = (
  'import os, sys; w = sys.argv[1]; '
  'open(os.path.join(w, "pid"), "w").write(str(os.getpid())); '
  'os.chdir({root!r}); '
  'os.execv(sys.executable, '
  '[sys.executable, "-m", "launch.sweep", "point", "--workdir=" + w])'
)


def test_a_point_stopped_by_sigterm_is_unfinished_not_done(
  tmp_path, monkeypatch
):
  """SIGTERM to a point's process (a preemption, a `kill` of the child):
  `launch.sweep point` saves its checkpoint and exits 128 + 15 saying the
  point is unfinished, and the sweep reports it stopped, not done."""
  from fedjax_metric import faults

  [point] = sweep.make_points(
    str(tmp_path), [FEDAVG], {'num_rounds': '2', 'plot_partition': 'false'}, []
  )
  # The point waits for a signal after round 1 (the test hook).
  monkeypatch.setenv(faults.PAUSE_ENV_VAR, '1')
  errors = []

  def stop_when_paused():
    marker = os.path.join(point.workdir, faults.PAUSE_MARKER)
    deadline = time.time() + 300
    while not os.path.exists(marker):
      if time.time() > deadline:
        errors.append('the point never paused')
        return
      time.sleep(0.05)
    with open(os.path.join(point.workdir, 'pid')) as f:
      os.kill(int(f.read()), signal.SIGTERM)

  stopper = threading.Thread(target=stop_when_paused, daemon=True)
  stopper.start()
  messages = []
  wrapper = POINT_WITH_PID.format(root=REPO)
  outcomes = sweep.run_points(
    [point],
    command=lambda w: [sys.executable, '-c', wrapper, w],
    say=messages.append,
  )
  stopper.join(timeout=10)
  with open(os.path.join(point.workdir, sweep.LOG_FILE)) as f:
    log = f.read()
  assert not errors, log
  assert outcomes == {point.workdir: 'stopped (SIGTERM)'}, (messages, log)
  assert any('STOPPED by SIGTERM' in m for m in messages), messages
  assert 'unfinished' in log and 'Traceback' not in log, log
  assert sweep.point_status(point) == 'todo'  # Resumed by the next sweep.
  assert not os.path.exists(os.path.join(point.workdir, 'summary.json'))


@pytest.mark.parametrize(
  'args, expected',
  [
    (
      ['table', '--root={root}', '--cols=partition.alpha', '--at=round:7'],
      'No evaluation at round 7',
    ),
    (['table', '--root=/missing'], "--root '/missing' is not a directory."),
    (
      ['table', '--root={root}', '--cols=partition.alph'],
      "did you mean 'partition.alpha'?",
    ),
    (
      ['run', '--root={root}/new', f'--config={FEDAVG}', '--grid=sed=0,1'],
      "Config has no field 'sed'; did you mean 'seed'?",
    ),
    (
      ['run', '--root={root}/new', f'--config={FEDAVG}', '--set=num_round=3'],
      "Config has no field 'num_round'; did you mean 'num_rounds'?",
    ),
    (
      [
        'run',
        '--root={root}/new',
        f'--config={FEDAVG}',
        '--set=local.learning_rat=0.1',
      ],
      "did you mean 'local.learning_rate'?",
    ),
    (
      ['run', '--root={root}/new', f'--config={FEDAVG}', '--set=seed.x=1'],
      "'seed' is a value (0), not a block of fields",
    ),
    (
      [
        'run',
        '--root={root}/new',
        f'--config={FEDAVG}',
        '--grid=num_rounds=abc',
        '--dry_run',
      ],
      "num_rounds='abc': not an integer",
    ),
    (
      [
        'run',
        '--root={root}/new',
        f'--config={FEDAVG}',
        '--grid=ssl_eval.finetune_fractions=(0.5,',
        '--dry_run',
      ],
      "ssl_eval.finetune_fractions='(0.5,': not a Python literal",
    ),
    (
      [
        'run',
        '--root={root}/new',
        f'--config={FEDAVG}',
        '--grid=',
        '--dry_run',
      ],
      '--grid is empty',
    ),
    (
      [
        'run',
        '--root={root}/new',
        f'--config={FEDAVG}',
        '--grid=seed=0,0',
        '--dry_run',
      ],
      "--grid: seed lists '0' twice",
    ),
    (
      [
        'run',
        '--root={root}/new',
        f'--config={FEDAVG}',
        '--grid=local.learning_rate=0.1,1e-3,0.10',
        '--dry_run',
      ],
      "--grid: local.learning_rate lists '0.10' twice (0.1,1e-3,0.10, by value)",
    ),
    (
      [
        'run',
        '--root={root}/new',
        f'--config={FEDAVG}',
        f'--config={FEDAVG}',
        '--dry_run',
      ],
      f'--config {FEDAVG!r} is given twice',
    ),
    (
      [
        'run',
        '--root={root}/new',
        f'--config={FEDAVG}',
        '--set=num_rounds=3,5',
        '--dry_run',
      ],
      "--set: num_rounds has 2 values ('3', '5')",
    ),
    (
      [
        'run',
        '--root={root}/new',
        f'--config={FEDAVG}',
        '--grid=seed=0',
        '--grid=seed=1',
      ],
      '--grid is given twice',
    ),
    (['point', '--workdir=/no/such/point'], 'not a sweep point'),
    (['bogus'], 'Usage: python -m launch.sweep run|point|table|plot'),
  ],
)
def test_sweep_mistakes_are_one_line(fake_root, args, expected):
  result = subprocess.run(
    [sys.executable, '-m', 'launch.sweep']
    + [a.format(root=fake_root) for a in args],
    cwd=REPO,
    capture_output=True,
    text=True,
  )
  assert result.returncode == 1
  lines = result.stderr.strip().splitlines()
  assert len(lines) == 1 and lines[0].startswith('error: '), result.stderr
  assert expected in lines[0]


def test_resumable_keys_match_what_train_run_accepts():
  """The sweep's flat key list is the JAX-free twin of workdir's
  RESUMABLE_CHANGES (top-level blocks): every key it lists is in one of
  those blocks, and every field of those blocks is listed."""
  from fedjax_metric import settings
  from fedjax_metric import workdir as workdir_lib

  config = settings.base_config()
  wanted = set()
  for block in workdir_lib.RESUMABLE_CHANGES:
    value = config[block]
    if hasattr(value, 'keys'):
      wanted |= {f'{block}.{field}' for field in value.keys()}
    else:
      wanted.add(block)
  assert set(sweep.RESUMABLE_KEYS) == wanted


def test_a_point_a_live_run_holds_is_busy_not_failed(tmp_path):
  """Two sweeps on one root: a point the other is training is left to it
  ('busy'), neither started again nor counted as this sweep's failure; a
  lock left by a dead process does not make a point busy."""
  import socket

  from launch import sweep_run
  from launch.sweep_point import Point

  holder = subprocess.Popen(
    [sys.executable, '-c', 'import time; time.sleep(60)']
  )
  gone = subprocess.Popen([sys.executable, '-c', 'pass'])
  gone.wait()
  try:
    points = []
    for name, pid in (('held', holder.pid), ('stale', gone.pid), ('new', None)):
      workdir = tmp_path / name
      if pid is not None:
        workdir.mkdir()
        (workdir / '.lock').write_text(
          json.dumps({'host': socket.gethostname(), 'pid': pid, 'started': 0})
        )
      points.append(Point(FEDAVG, {}, str(workdir)))
    said = []
    outcomes, todo = sweep_run.sort_points(points, said.append)
    assert outcomes == {str(tmp_path / 'held'): 'busy'}
    assert [p.workdir for p in todo] == [
      str(tmp_path / 'stale'),
      str(tmp_path / 'new'),
    ]
    assert len(said) == 1 and said[0].startswith('BUSY ')
  finally:
    holder.kill()
    holder.wait()


def test_a_point_validation_refuses_stops_the_sweep_before_any_starts(
  tmp_path,
):
  """A grid value that cannot run (here num_rounds 0 for one of two points)
  is one line naming the point and the fix, before any point is trained or
  any workdir written."""
  result = subprocess.run(
    [
      sys.executable,
      '-m',
      'launch.sweep',
      'run',
      f'--root={tmp_path}',
      f'--config={FEDAVG}',
      '--grid=num_rounds=1,0',
    ],
    cwd=REPO,
    capture_output=True,
    text=True,
    timeout=300,
  )
  assert result.returncode != 0
  (line,) = result.stderr.strip().splitlines()
  assert line.startswith('error: point ') and 'num_rounds=0' in line
  assert 'num_rounds must be >= 1' in line and 'Nothing was started' in line
  assert not glob.glob(os.path.join(str(tmp_path), '*', '*'))


def test_a_failed_point_is_reported_with_its_error(tmp_path):
  """A point whose child fails at run time is reported in the sweep's line
  with the child's own one-line error, not only as 'see sweep.log'."""
  (point,) = sweep.make_points(str(tmp_path), [FEDAVG], {}, {})
  child = (
    'import sys; print("step 1"); sys.exit("error: the reason, in one line")'
  )
  said = []
  outcomes = sweep.run_points(
    [point],
    command=lambda w: [sys.executable, '-c', child],
    say=said.append,
  )
  assert outcomes[point.workdir] == 'failed (rc=1)'
  failed = [line for line in said if 'FAILED' in line]
  assert len(failed) == 1, said
  assert 'error: the reason, in one line' in failed[0]
  assert failed[0].endswith('(all of it in sweep.log there).')
