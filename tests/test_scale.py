"""The population-scale study (launch/scale.py) and its notebook.

The command runs its whole grid on tiny shapes (``--dry_run``), each point
a real run in its own process; a second call skips the finished points.
The notebook (notebooks/scaling.ipynb) runs in a Jupyter kernel with
SCALING_TINY=1 and its output directory in the test's tmp_path.
"""

import json
import os
import subprocess
import sys

from absl import flags
import pytest
from test_scaling import notebook_code_cells, run_cells

from launch import scale

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_import_registers_no_flags():
  assert 'populations' not in flags.FLAGS


def test_grid_skips_cohorts_over_the_population_and_runs_fedavg_once():
  points = scale.make_grid(
    [100, 10_000], [1_000], ['fedavg', 'scaffold'], ['host', 'disk']
  )
  assert [(p.algorithm, p.placement, p.num_clients) for p in points] == [
    ('fedavg', 'auto', 10_000),
    ('scaffold', 'host', 10_000),
    ('scaffold', 'disk', 10_000),
  ]


def test_fedau_gets_the_participation_mean_of_c_over_n():
  config = scale.point_config(scale.Point('fedau', 10_000, 50, 'disk'))
  assert config.participation.pattern == 'bernoulli'
  assert config.participation.mean == pytest.approx(0.005)
  assert config.participation.floor <= 0.005
  assert config.dataset.name == 'synthetic'
  assert config.model.name == 'logistic_regression'


# Slow (a study of real runs in subprocesses): make test-all.
@pytest.mark.slow
def test_the_dry_run_study_runs_resumes_and_writes_its_outputs(tmp_path):
  out = tmp_path / 'out'
  command = [
    sys.executable,
    '-m',
    'launch.scale',
    f'--out={out}',
    '--dry_run',
    '--populations=100,1000000',
    '--cohorts=1000',
    '--algorithms=fedavg,scaffold',
    '--placements=disk',
  ]
  done = subprocess.run(
    command,
    cwd=REPO,
    capture_output=True,
    text=True,
    timeout=900,
    stdin=subprocess.DEVNULL,
  )
  assert done.returncode == 0, done.stderr[-3000:]
  results = json.loads((out / 'scale.json').read_text())
  # --dry_run: N capped at 300, C at 30; fedavg and scaffold on disk.
  assert sorted((r['algorithm'], r['num_clients']) for r in results) == [
    ('fedavg', 100),
    ('fedavg', 300),
    ('scaffold', 100),
    ('scaffold', 300),
  ]
  assert all('error' not in r for r in results), results
  scaffold = [r for r in results if r['algorithm'] == 'scaffold']
  assert all(r['placement_used'] == 'disk' for r in scaffold)
  assert all(r['table_bytes'] > 0 for r in scaffold)
  assert all(r['seconds_per_round'] > 0 for r in results)
  assert all(r['table_io_per_round'] > 0 for r in scaffold)
  assert all(r['table_io_per_round'] == 0 for r in results if r not in scaffold)
  assert all(
    r['table_loop_per_round'] < r['seconds_per_round'] for r in results
  )
  assert (out / 'scale.png').read_bytes()[:4] == b'\x89PNG'
  assert (
    '| scaffold | logistic_regression | 300 | 30 | disk |'
    in (out / 'scale.md').read_text()
  )
  # Run again: every point is there, nothing runs.
  again = subprocess.run(
    command,
    cwd=REPO,
    capture_output=True,
    text=True,
    timeout=300,
    stdin=subprocess.DEVNULL,
  )
  assert again.returncode == 0
  assert 'running' not in again.stdout
  assert len(json.loads((out / 'scale.json').read_text())) == 4


def test_a_failing_point_is_reported_not_raised(tmp_path):
  point = scale.Point('scaffold', 100, 10, 'disk', rounds=3, eval_every=2)
  # A workdir that is a file: the child cannot write its run there.
  blocker = tmp_path / 'file'
  blocker.write_text('')
  result = scale._run_child(point, str(blocker), timeout=300)
  assert 'error' in result and result['algorithm'] == 'scaffold'
  assert '|' in scale.table([result], device='d', command='c')


# Slow (the whole notebook): make test-all.
@pytest.mark.slow
def test_notebook_runs_on_tiny_settings(tmp_path):
  proc = run_cells(notebook_code_cells(), tmp_path)
  assert proc.returncode == 0, proc.stderr[-3000:]
  out = tmp_path / 'out'
  results = json.loads((out / 'scale.json').read_text())
  assert len(results) == 4  # fedavg and scaffold (disk) x N in {50, 200}
  assert all('error' not in r for r in results), results
  assert (out / 'scale.png').read_bytes()[:4] == b'\x89PNG'
  assert '| scaffold | logistic_regression | 200 | 10 | disk |' in proc.stdout


def test_broken_notebook_cell_fails(tmp_path):
  cells = notebook_code_cells()
  broken = cells[:2] + ['raise RuntimeError("broken cell")'] + cells[2:]
  proc = run_cells(broken, tmp_path)
  assert proc.returncode != 0
  assert 'broken cell' in proc.stderr


def test_repeats_show_as_their_median_and_range():
  base = dict(
    algorithm='scaffold',
    model='mlp',
    placement='disk',
    placement_used='disk',
    prefetch=True,
    num_clients=10,
    clients_per_round=5,
    table_io_per_round=0.01,
    table_loop_per_round=0.0,
    wait_per_round=0.0,
    peak_rss_gb=1.0,
    table_bytes=100,
    test_accuracy=0.5,
  )
  results = [
    dict(base, seed=s, seconds_per_round=t) for s, t in enumerate((3, 1, 2))
  ]
  (merged,) = scale.medians(results)
  assert merged['seconds_per_round'] == 2
  assert (merged['seconds_min'], merged['seconds_max'], merged['seeds']) == (
    1,
    3,
    3,
  )
  assert '2.000 [1.000, 3.000]' in scale.table(results, device='d', command='c')
  seeds = scale.make_grid([10], [5], ['scaffold'], ['disk'], seeds=(0, 1))
  assert [p.seed for p in seeds] == [0, 1]


@pytest.mark.parametrize(
  'populations, cohorts, panels',
  [
    ((10, 100), (5,), ['population N']),
    ((100,), (5, 50), ['clients per round C']),
    ((10, 100), (5, 50), ['population N', 'clients per round C']),
  ],
)
def test_plot_draws_only_panels_with_lines(
  tmp_path, populations, cohorts, panels
):
  results = [
    dict(
      algorithm='fedavg',
      model='mlp',
      placement='auto',
      placement_used='device',
      prefetch=True,
      num_clients=n,
      clients_per_round=c,
      seed=0,
      seconds_per_round=0.001 * n + c,
      table_io_per_round=0.0,
      table_loop_per_round=0.0,
      wait_per_round=0.0,
      peak_rss_gb=1.0,
      table_bytes=None,
      test_accuracy=0.5,
    )
    for n in populations
    for c in cohorts
  ]
  fig = scale.plot(results, str(tmp_path / 'p.png'), title='t')
  assert [ax.get_xlabel() for ax in fig.axes] == panels
  assert all(ax.lines for ax in fig.axes)
  assert (tmp_path / 'p.png').stat().st_size > 0
