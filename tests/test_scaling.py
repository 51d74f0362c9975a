"""benchmarks/scaling.py (per-client cost against the cohort size, data in
memory): its pure pieces and a tiny grid point. `run_cells` runs a
notebook's code cells in a Jupyter kernel (nbclient,
tests/notebook_runner.py); notebooks/scaling.ipynb, the population study of
launch/scale.py, is tested in test_scale.py."""

import dataclasses
import json
import math
import os

from absl import flags
import jax
import notebook_runner
import numpy as np
import pytest

from benchmarks import cohort_bench, scaling
from fedjax_metric.data import cohort as cohort_lib

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NOTEBOOK = os.path.join(REPO, 'notebooks', 'scaling.ipynb')

# Tiny work: compile time dominates, rounds take milliseconds.
TINY = dict(
  local_steps=1,
  batch_size=2,
  examples_per_client=4,
  image_shape=(8, 8, 1),
  rounds=1,
)


def ok_result(
  algorithm='fedavg',
  clients=10,
  factor=1,
  seconds=0.5,
  peak_device_mb=None,
  **overrides,
):
  """A result row as `measure_point` returns it, with made-up numbers."""
  point = scaling.Point(algorithm, clients, clients * factor)
  row = {
    **dataclasses.asdict(point),
    'executor': 'host',
    'unroll': True,
    'status': 'ok',
    'note': '',
    'backend': 'cpu',
    'device': 'Test CPU, 2 cores',
    'jax_version': '0.0',
    'seconds_per_round': seconds,
    'seconds_min': seconds,
    'seconds_max': seconds,
    'cohort_seconds': 0.01,
    'compile_seconds': 1.0,
    'client_steps_per_second': clients / seconds,
    'peak_rss_mb': 400.0 + clients,
    'peak_device_mb': peak_device_mb,
    'data_mb': 0.1 * factor * clients,
    'client_table_mb': 0.0,
    'train_loss': 2.3,
    'wall_seconds': 5.0 + 2 * seconds,
  }
  row.update(overrides)
  return row


# ---------------------------------------------------------------------------
# Pure pieces.
# ---------------------------------------------------------------------------


def test_import_registers_no_flags():
  # Other launch/ modules (bench, main) define --local_steps, --point, ...; a
  # test process that imports several of them must not see a clash.
  assert 'clients_per_round' not in flags.FLAGS
  assert 'max_seconds' not in flags.FLAGS


def test_synthetic_federation_shapes_and_partition():
  images, labels, partition = scaling.synthetic_federation(
    5, 3, image_shape=(4, 4, 1), num_classes=10, seed=1
  )
  assert images.shape == (15, 4, 4, 1) and images.dtype == np.uint8
  assert labels.shape == (15,) and labels.dtype == np.int32
  assert labels.min() >= 0 and labels.max() < 10
  assert len(partition) == 5
  # Every example belongs to exactly one client, E per client.
  np.testing.assert_array_equal(
    np.sort(np.concatenate(list(partition))), np.arange(15)
  )
  assert all(len(p) == 3 for p in partition)


def test_make_grid_order_populations_and_cap():
  points = scaling.make_grid(
    [100, 10], [10, 1], ['fedavg', 'fedquad'], max_total_clients=500, rounds=2
  )
  keys = [(p.algorithm, p.clients_per_round, p.num_clients) for p in points]
  assert keys == [
    ('fedavg', 10, 10),
    ('fedavg', 10, 100),
    ('fedavg', 100, 100),
    ('fedquad', 10, 10),
    ('fedquad', 10, 100),
    ('fedquad', 100, 100),
  ]  # 100 x 10 > 500 is left out.
  assert all(p.rounds == 2 for p in points)


def test_point_json_round_trip():
  point = scaling.Point('fedquad', 7, 70, image_shape=(8, 8, 1), unroll=False)
  assert scaling.Point.from_json(point.to_json()) == point


def test_predict_scales_rounds_linearly_and_keeps_fixed_cost():
  finished = [ok_result(clients=10, seconds=1.0, wall_seconds=6.0, rounds=3)]
  point = scaling.Point('fedavg', 100, 100, rounds=3)
  # Fixed: 6 - 4 rounds x 1 s = 2 s; then 4 rounds x 10 s.
  assert scaling.predict_wall_seconds(point, finished) == pytest.approx(42.0)
  other = scaling.Point('fedquad', 100, 100)
  assert scaling.predict_wall_seconds(other, finished) is None


def test_run_grid_skips_points_predicted_too_long(monkeypatch):
  points = [
    scaling.Point('fedavg', 10, 10),
    scaling.Point('fedavg', 1000, 1000),
  ]
  calls = []

  def fake_measure(point, *, timeout=None):
    calls.append((point.clients_per_round, timeout))
    return ok_result(clients=point.clients_per_round, seconds=1.0)

  monkeypatch.setattr(scaling, 'measure_in_subprocess', fake_measure)
  results = scaling.run_grid(points, max_seconds=60, log=lambda line: None)
  assert calls == [(10, 60)]
  assert [r['status'] for r in results] == ['ok', 'skipped']
  assert 'max_seconds=60' in results[1]['note']


def test_table_rows_for_measured_and_skipped_points():
  skipped = scaling.not_measured(
    scaling.Point('fedquad', 10000, 100000),
    'skipped',
    'predicted 2000 s > --max_seconds=900',
  )
  section = scaling.format_section(
    [
      ok_result(clients=10),
      ok_result(clients=10, peak_device_mb=123.4),
      skipped,
    ],
    device='Test CPU, 2 cores',
    backend='cpu',
    command='python -m benchmarks.scaling',
  )
  lines = section.strip().splitlines()
  columns = len(scaling.COLUMNS) + 1
  rows = [line for line in lines if line.startswith('| fed')]
  assert len(rows) == 3
  assert all(row.count('|') == columns for row in rows)
  assert '| fedavg | 10 | 10 | 0.500 |' in rows[0]
  assert '| - |' in rows[0] and '| 123 |' in rows[1]  # device memory or '-'
  assert rows[2].endswith('skipped: predicted 2000 s > --max_seconds=900 |')
  assert 'Device: Test CPU, 2 cores (cpu)' in section
  assert 'Command: `python -m benchmarks.scaling`' in section


def test_save_outputs_writes_json_markdown_and_png(tmp_path):
  results = [
    ok_result(a, c, f, seconds=0.01 * c, peak_device_mb=50.0 * c)
    for a in ('fedavg', 'fedquad')
    for c in (10, 100)
    for f in (1, 10)
  ]
  paths = dict(
    results_path=str(tmp_path / 'r.json'),
    table_path=str(tmp_path / 'sub' / 't.md'),
    plot_path=str(tmp_path / 'p.png'),
  )
  for _ in range(2):  # The markdown is appended to, the header written once.
    scaling.save_outputs(
      results, device='Test CPU', backend='cpu', command='x', **paths
    )
  with open(paths['results_path']) as f:
    assert json.load(f) == json.loads(json.dumps(results))
  markdown = open(paths['table_path']).read()
  assert markdown.count('# Scaling on cpu') == 1
  assert markdown.count('| fedquad | 100 | 1000 |') == 2
  with open(paths['plot_path'], 'rb') as f:
    assert f.read(8) == b'\x89PNG\r\n\x1a\n'
  # --plot='' draws nothing (it once fell back to the docs figure).
  os.remove(paths['plot_path'])
  scaling.save_outputs(
    results,
    device='Test CPU',
    backend='cpu',
    command='x',
    **{**paths, 'plot_path': ''},
  )
  assert not os.path.exists(paths['plot_path'])
  assert not any(p.suffix == '.png' for p in tmp_path.rglob('*'))


# ---------------------------------------------------------------------------
# Real (tiny) points.
# ---------------------------------------------------------------------------


@pytest.mark.parametrize(
  'algorithm, sampler',
  [('fedavg', 'per_client'), ('fedquad', 'vectorized')],
)
def test_tiny_point_in_process(algorithm, sampler):
  point = scaling.Point(algorithm, 3, 6, cohort_sampler=sampler, **TINY)
  result = scaling.measure_point(point)
  assert result['cohort_sampler'] == sampler
  # auto: the host loop on CPU, one vmapped program on an accelerator.
  expected = 'host' if jax.default_backend() == 'cpu' else 'vmap'
  assert result['status'] == 'ok' and result['executor'] == expected
  for key in (
    'seconds_per_round',
    'cohort_seconds',
    'overlapped_seconds_per_round',
    'peak_rss_mb',
    'data_mb',
    'client_steps_per_second',
  ):
    assert math.isfinite(result[key]) and result[key] > 0, key
  assert result['compile_seconds'] >= 0
  assert result['client_table_mb'] == 0  # No per-client state in either.
  if jax.default_backend() == 'cpu':  # CPU reports no memory stats.
    assert result['peak_device_mb'] is None
  assert result['data_mb'] == pytest.approx(6 * 4 * (64 + 4) / 2**20)
  assert math.isfinite(result['train_loss'])
  json.dumps(result)  # What a child process prints must be JSON.


def test_tiny_point_in_subprocess_reports_its_own_peak():
  result = scaling.measure_in_subprocess(
    scaling.Point('fedavg', 2, 4, overlap=False, **TINY), timeout=120
  )
  assert result['status'] == 'ok', result.get('note')
  assert result['peak_rss_mb'] > 0 and result['wall_seconds'] > 0
  assert result['seconds_per_round'] > 0
  assert result['overlapped_seconds_per_round'] is None  # not asked for


def test_failing_child_is_reported_not_raised():
  result = scaling.measure_in_subprocess(
    scaling.Point('no_such_algorithm', 2, 2, **TINY), timeout=120
  )
  assert result['status'] == 'failed'
  assert "ValueError: Unknown algorithm 'no_such_algorithm'" in result['note']


# ---------------------------------------------------------------------------
# The notebook.
# ---------------------------------------------------------------------------


def notebook_code_cells():
  with open(NOTEBOOK) as f:
    notebook = json.load(f)
  assert notebook['nbformat'] == 4
  code = [c for c in notebook['cells'] if c['cell_type'] == 'code']
  assert all(not c['outputs'] for c in code), (
    'commit the notebook without outputs'
  )
  return [''.join(c['source']) for c in code]


def run_cells(cells, tmp_path):
  """Runs code cells in a fresh Jupyter kernel (`notebook_runner.execute`)
  in the notebooks' directory, with the tiny-grid settings."""
  return notebook_runner.execute(
    cells,
    cwd=os.path.dirname(NOTEBOOK),
    env=dict(
      SCALING_TINY='1',
      MPLBACKEND='Agg',
      SCALING_OUTPUT_DIR=str(tmp_path / 'out'),
    ),
  )


# ---------------------------------------------------------------------------
# benchmarks/cohort_bench.py: host time of both cohort samplers.
# ---------------------------------------------------------------------------


def test_cohort_bench_times_both_samplers():
  assert 'repeats' not in flags.FLAGS  # flags only when it is the program
  times = cohort_bench.measure(
    'fedquad', 30, examples_per_client=6, local_steps=2, repeats=2
  )
  assert set(times) == set(cohort_lib.SAMPLERS)
  assert all(len(t) == 2 and min(t) > 0 for t in times.values())
  row = cohort_bench.format_row(
    'fedquad', 30, {'per_client': [0.4, 0.2], 'vectorized': [0.1, 0.1]}
  )
  assert row == [
    'fedquad',
    '30',
    '0.3000',
    '0.2000-0.4000',
    '0.1000',
    '0.1000-0.1000',
    '3.0x',
  ]
