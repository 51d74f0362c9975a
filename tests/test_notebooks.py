"""Every notebook but scaling.ipynb (tested in test_scaling.py) runs.

A notebook's code cells, in order, are joined into one script and run by a
fresh Python process (test_scaling's `run_cells`), with QUICKSTART_TINY=1,
which the notebook's parameter cell reads to shrink the runs, and its output
directory in the test's tmp_path. A broken cell fails the script.
"""

import json
import os

from conftest import JAX_ENV
import pytest
from test_scaling import run_cells

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
QUICKSTART = os.path.join(REPO, 'notebooks', 'quickstart.ipynb')


def code_cells(path):
  """The code cells' sources; fails if the notebook was saved with outputs."""
  with open(path) as f:
    notebook = json.load(f)
  assert notebook['nbformat'] == 4
  code = [c for c in notebook['cells'] if c['cell_type'] == 'code']
  assert all(not c['outputs'] and c['execution_count'] is None for c in code), (
    f'commit {os.path.basename(path)} without outputs'
  )
  return [''.join(c['source']) for c in code]


@pytest.fixture
def tiny_env(monkeypatch, tmp_path):
  """`run_cells` passes os.environ on: the quickstart's tiny settings, its
  output directory, and the test suite's JAX settings (faster compiles)."""
  monkeypatch.setenv('QUICKSTART_TINY', '1')
  monkeypatch.setenv('QUICKSTART_OUTPUT_DIR', str(tmp_path / 'out'))
  for key, value in JAX_ENV.items():
    monkeypatch.setenv(key, value)
  return tmp_path / 'out'


def test_quickstart_colab_cell_does_nothing_locally():
  first = code_cells(QUICKSTART)[0]
  assert "'google.colab' in sys.modules" in first
  assert 'pip' in first and 'install' in first


def test_quickstart_runs_on_tiny_settings(tiny_env, tmp_path):
  proc = run_cells(code_cells(QUICKSTART), tmp_path)
  assert proc.returncode == 0, proc.stderr[-3000:]
  for name in ('fedavg', 'fedquad'):
    workdir = tiny_env / name
    with open(workdir / 'config.json') as f:
      assert json.load(f)['algorithm'] == name
    with open(workdir / 'metrics.jsonl') as f:
      rows = [json.loads(line) for line in f if line.strip()]
    assert [r['round'] for r in rows if 'test_accuracy' in r][-1] == 2
    assert all(0 <= r['test_accuracy'] <= 1 for r in rows)
    assert (workdir / 'partition.png').read_bytes()[:4] == b'\x89PNG'
  for png in ('curves.png', 'fedquad_embedding.png'):
    assert (tiny_env / png).read_bytes()[:4] == b'\x89PNG'
  assert 'fedquad: 4 clients, 2 rounds' in proc.stdout


def test_broken_quickstart_cell_fails(tiny_env, tmp_path):
  cells = code_cells(QUICKSTART)
  broken = cells[:3] + ['raise RuntimeError("broken cell")'] + cells[3:]
  proc = run_cells(broken, tmp_path)
  assert proc.returncode != 0
  assert 'broken cell' in proc.stderr
  assert not (tiny_env / 'fedavg').exists()  # Nothing after it ran.
