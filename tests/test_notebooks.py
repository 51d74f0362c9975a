"""Every notebook but scaling.ipynb (tested in test_scaling.py) runs.

A notebook's code cells run in order in a fresh Jupyter kernel (nbclient;
test_scaling's `run_cells`), with QUICKSTART_TINY=1,
which every notebook's parameter cell reads to shrink the runs, and its output
directory (QUICKSTART_OUTPUT_DIR) in the test's tmp_path. A broken cell fails
the script (checked once, on the quickstart).
"""

import json
import os

from conftest import JAX_ENV
import numpy as np
import pytest
from test_scaling import run_cells

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def notebook_path(name):
  return os.path.join(REPO, 'notebooks', f'{name}.ipynb')


QUICKSTART = notebook_path('quickstart')


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
  """The kernel inherits os.environ: the quickstart's tiny settings, its
  output directory, and the test suite's JAX settings (faster compiles)."""
  monkeypatch.setenv('QUICKSTART_TINY', '1')
  monkeypatch.setenv('QUICKSTART_OUTPUT_DIR', str(tmp_path / 'out'))
  for key, value in JAX_ENV.items():
    monkeypatch.setenv(key, value)
  return tmp_path / 'out'


def run_notebook(name, tmp_path):
  """Runs notebooks/<name>.ipynb's code cells (under `tiny_env`); returns the
  finished process, failing with its stderr if a cell failed."""
  proc = run_cells(code_cells(notebook_path(name)), tmp_path)
  assert proc.returncode == 0, proc.stderr[-3000:]
  return proc


def read_run(workdir, algorithm):
  """(config, metric rows, summary) of a run that `experiment.run` finished in
  ``workdir``; checks that it ran ``algorithm``."""
  with open(workdir / 'config.json') as f:
    config = json.load(f)
  assert config['algorithm'] == algorithm
  with open(workdir / 'metrics.jsonl') as f:
    rows = [json.loads(line) for line in f if line.strip()]
  with open(workdir / 'summary.json') as f:
    summary = json.load(f)
  return config, rows, summary


def assert_png(path):
  assert path.read_bytes()[:4] == b'\x89PNG', path


def test_quickstart_colab_cell_installs_only_in_colab(monkeypatch, tmp_path):
  """The first cell, executed: outside Colab, or in Colab with the package
  installed, it runs nothing; in Colab (a stand-in google.colab module)
  without the package it pip-installs an uploaded wheel, else the
  repository at REPO_URL, else says what to set."""
  import subprocess  # pylint: disable=g-import-not-at-top
  import sys  # pylint: disable=g-import-not-at-top
  import types  # pylint: disable=g-import-not-at-top

  first = code_cells(QUICKSTART)[0]
  calls = []
  monkeypatch.chdir(tmp_path)
  monkeypatch.setattr(subprocess, 'run', lambda cmd, **_: calls.append(cmd))
  monkeypatch.delitem(sys.modules, 'google.colab', raising=False)
  exec(first, {})  # pylint: disable=exec-used
  monkeypatch.setitem(sys.modules, 'google.colab', types.ModuleType('colab'))
  exec(first, {})  # pylint: disable=exec-used  (installed: nothing to do)
  assert not calls

  monkeypatch.setitem(sys.modules, 'fedjax_metric', None)  # not installed
  monkeypatch.delenv('FEDJAX_METRIC_REPO_URL', raising=False)
  with pytest.raises(ValueError, match='REPO_URL'):
    exec(first, {})  # pylint: disable=exec-used
  monkeypatch.setenv('FEDJAX_METRIC_REPO_URL', 'https://example.org/r.git')
  exec(first, {})  # pylint: disable=exec-used
  assert calls[-1][1:4] == ['-m', 'pip', 'install']
  assert calls[-1][-1] == 'fedjax_metric @ git+https://example.org/r.git'
  (tmp_path / 'fedjax_metric-0.1-py3-none-any.whl').write_bytes(b'')
  exec(first, {})  # pylint: disable=exec-used
  assert calls[-1][-1] == 'fedjax_metric-0.1-py3-none-any.whl'


@pytest.mark.parametrize('name', ['one_class', 'participation', 'unsupervised'])
def test_notebook_starts_with_the_quickstart_colab_cell(name):
  assert code_cells(notebook_path(name))[0] == code_cells(QUICKSTART)[0]


def test_quickstart_runs_on_tiny_settings(tiny_env, tmp_path):
  proc = run_notebook('quickstart', tmp_path)
  for name in ('fedavg', 'fedquad'):
    _, rows, _ = read_run(tiny_env / name, name)
    assert [r['round'] for r in rows if 'test_accuracy' in r][-1] == 2
    assert all(0 <= r['test_accuracy'] <= 1 for r in rows)
    assert_png(tiny_env / name / 'partition.png')
  for png in ('curves.png', 'fedquad_embedding.png'):
    assert_png(tiny_env / png)
  assert 'fedquad: 4 clients, 2 rounds' in proc.stdout


def test_broken_quickstart_cell_fails(tiny_env, tmp_path):
  cells = code_cells(QUICKSTART)
  broken = cells[:3] + ['raise RuntimeError("broken cell")'] + cells[3:]
  proc = run_cells(broken, tmp_path)
  assert proc.returncode != 0
  assert 'broken cell' in proc.stderr
  assert not (tiny_env / 'fedavg').exists()  # Nothing after it ran.


# Slow (the whole notebook; the quickstart stays in the quick tier): make test-all.
@pytest.mark.slow
def test_one_class_runs_on_tiny_settings(tiny_env, tmp_path):
  proc = run_notebook('one_class', tmp_path)
  for name in ('fedmetric', 'fedaws', 'feduv'):
    config, rows, summary = read_run(tiny_env / name, name)
    assert config['eval_protocol'] == 'one_class'
    assert config['dataset']['name'] == 'digits'
    assert config['num_clients'] == 10  # One per class, also when tiny.
    assert [r['round'] for r in rows] == [1, 2]
    for row in rows:
      per_class = [row[f'auroc_class_{c}'] for c in range(10)]
      assert all(0 <= v <= 1 for v in per_class)
      assert row['auroc_mean'] == pytest.approx(np.mean(per_class))
    assert summary['auroc_mean'] == rows[-1]['auroc_mean']
    # What the notebook printed is what the runs wrote.
    assert (
      f'{name}: mean AUROC {summary["auroc_mean"]:.3f} after 2 rounds'
    ) in proc.stdout
    per_class = ' '.join(
      f'{rows[-1][f"auroc_class_{c}"]:.3f}' for c in range(10)
    )
    assert f'{name:9} {per_class}' in proc.stdout
    assert_png(tiny_env / f'{name}_embedding.png')
  for png in ('auroc_curves.png', 'per_class_auroc.png'):
    assert_png(tiny_env / png)


# Slow (the whole notebook; the quickstart stays in the quick tier): make test-all.
@pytest.mark.slow
def test_participation_runs_on_tiny_settings(tiny_env, tmp_path):
  proc = run_notebook('participation', tmp_path)
  for pattern in ('bernoulli', 'markov', 'cyclic'):
    masks = []
    for name in ('fedavg', 'fedau', 'pmfl'):
      workdir = tiny_env / f'{pattern}_{name}'
      config, rows, _ = read_run(workdir, name)
      assert config['participation']['pattern'] == pattern
      assert config['num_clients'] == 4
      assert config['dataset']['name'] == 'digits'
      assert [r['round'] for r in rows] == [1, 2]
      for row in rows:
        assert 0 <= row['test_accuracy'] <= 1
        assert 0 <= row['train_accuracy'] <= 1
      with open(workdir / 'participation.json') as f:
        masks.append(json.load(f))
      assert_png(workdir / 'participation.png')
      if name != 'fedavg':  # FedAU's K and PMFL's C.
        assert config['algorithm_kwargs']['cutoff'] == 50
    # One seed: the three methods saw the same clients in the same rounds,
    # and the notebook's drawn mask (`assemble.participation_mask`) is theirs.
    assert masks[0] == masks[1] == masks[2]
    probs, active = masks[0]['probabilities'], masks[0]['active_per_round']
    assert (
      f'{pattern:9}: p_n in [{min(probs):.3f}, {max(probs):.3f}], '
      f'{min(active)}-{max(active)} active per round, '
      f'{active.count(0)} empty rounds'
    ) in proc.stdout
  for png in ('participation.png', 'curves.png'):
    assert_png(tiny_env / png)


# Slow (the whole notebook; the quickstart stays in the quick tier): make test-all.
@pytest.mark.slow
def test_unsupervised_runs_on_tiny_settings(tiny_env, tmp_path):
  proc = run_notebook('unsupervised', tmp_path)
  for name in ('fedalignuniform', 'ssd'):
    config, rows, summary = read_run(tiny_env / name, name)
    assert config['eval_protocol'] == 'ssl'
    assert config['dataset']['name'] == 'digits'
    assert [r['round'] for r in rows] == [1, 2]
    assert all(0 <= r['knn_accuracy'] <= 1 for r in rows)
    assert summary['knn_accuracy'] == rows[-1]['knn_accuracy']
    accuracies = ('linear_probe_accuracy', 'finetune_10pct_accuracy')
    assert all(0 <= summary[key] <= 1 for key in accuracies)
    # log mean exp(-2 ||x - y||^2) of unit vectors: ||x - y||^2 in [0, 4].
    assert -8 <= summary['test_uniformity'] <= 0
    assert 1 <= summary['test_effective_rank'] <= 16  # The tiny 16-d encoder.
    assert (
      f'{name}: kNN accuracy {summary["knn_accuracy"]:.3f} after 2 rounds'
    ) in proc.stdout
    scores = ', '.join(f'{key} {summary[key]:.3f}' for key in accuracies)
    assert (
      f'{name:15} {scores}, test_uniformity '
      f'{summary["test_uniformity"]:.3f}, test_effective_rank '
      f'{summary["test_effective_rank"]:.1f}'
    ) in proc.stdout
  for png in (
    'knn_curves.png',
    'final_metrics.png',
    'fedalignuniform_embedding.png',
    'ssd_embedding.png',
  ):
    assert_png(tiny_env / png)
