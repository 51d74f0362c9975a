"""The package as a user outside a checkout meets it.

A wheel built from this repository is installed (``--no-deps``: the test
environment has the dependencies) into a temporary target, and everything
below runs from a directory outside the checkout with only that target on
the path: the ``fedjax-metric`` console command on a packaged config by
name, and the API's get_config / run / load_run / algorithms / datasets.
"""

import json
import os
import shutil
import subprocess
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# What a clean clone does not hold (and a wheel must not be built from).
NOT_SOURCE = shutil.ignore_patterns(
  '.venv', '.git', 'runs', 'build', '*.egg-info', '__pycache__', '.ruff_cache'
)


@pytest.fixture(scope='module')
def installed(tmp_path_factory):
  """``(target, cwd, env)``: the installed package, a directory outside the
  checkout, and an environment whose path holds the target and none of the
  checkout."""
  tmp = tmp_path_factory.mktemp('package')
  source = tmp / 'source'
  shutil.copytree(REPO, source, ignore=NOT_SOURCE)
  pip = [sys.executable, '-m', 'pip', '--disable-pip-version-check', '-q']
  subprocess.run(
    pip
    + ['wheel', '--no-deps', '--no-build-isolation', '-w', str(tmp / 'w')]
    + [str(source)],
    check=True,
    cwd=tmp,
  )
  (wheel,) = (tmp / 'w').glob('fedjax_metric-*.whl')
  target = tmp / 'target'
  subprocess.run(
    pip + ['install', '--no-deps', '--target', str(target), str(wheel)],
    check=True,
  )
  cwd = tmp / 'elsewhere'
  cwd.mkdir()
  # The caller's own PYTHONPATH entries stay (where the dependencies come
  # from on a machine that carries them that way, as the GPU image does for
  # ml_collections); entries inside the checkout go, so the package can only
  # come from the target.
  kept = [
    entry
    for entry in os.environ.get('PYTHONPATH', '').split(os.pathsep)
    if entry and not os.path.realpath(entry).startswith(os.path.realpath(REPO))
  ]
  env = dict(
    os.environ,
    PYTHONPATH=os.pathsep.join([str(target), *kept]),
    JAX_PLATFORMS='cpu',
  )
  return target, cwd, env


def test_console_command_runs_a_packaged_config_by_name(installed):
  target, cwd, env = installed
  command = [
    str(target / 'bin' / 'fedjax-metric'),
    '--config=fedavg:runlocal',
    '--config.num_rounds=1',
    '--config.progress=False',
    '--workdir=runs/x',
  ]
  done = subprocess.run(command, cwd=cwd, env=env, capture_output=True)
  assert done.returncode == 0, done.stderr.decode()[-2000:]
  assert 'after 1 rounds' in done.stdout.decode()
  with open(cwd / 'runs' / 'x' / 'summary.json') as f:
    assert json.load(f)['rounds_completed'] == 1
  # An unknown name is one line naming the packaged configs.
  bad = subprocess.run(
    command[:1] + ['--config=fedavgg', '--workdir=runs/y'],
    cwd=cwd,
    env=env,
    capture_output=True,
  )
  assert bad.returncode == 1
  assert "No packaged config 'fedavgg'" in bad.stderr.decode()
  assert 'fedquad' in bad.stderr.decode()
  # The paper tables ship too: the reproduce subcommand plans one by name.
  planned = subprocess.run(
    command[:1] + ['reproduce', 'pmfl', 'table1', '--seeds=1', '--dry_run'],
    cwd=cwd,
    env=env,
    capture_output=True,
    text=True,
  )
  assert planned.returncode == 0, planned.stderr[-2000:]
  assert len(planned.stdout.splitlines()) == 7 * 3  # methods x patterns
  assert 'runs/reproduce/pmfl_table1_cpu/pmfl_' in planned.stdout


API_SCRIPT = """
import json, os, sys
import numpy as np
import fedjax_metric as fm

assert fm.__file__.startswith(sys.argv[1]), fm.__file__
assert 'pmfl' in fm.algorithms() and 'fashion_mnist' in fm.datasets()
config = fm.get_config('fedavg', 'runlocal')
config.num_rounds = 2
config.eval_every = 1
config.progress = False
result = fm.run(config)
loaded = fm.load_run(result.workdir)
leaves = [np.asarray(x) for x in __import__('jax').tree.leaves(result.variables)]
print(json.dumps({
  'rounds': [row['round'] for row in result.history],
  'final': result.final['test_accuracy'],
  'loaded_final': loaded.final['test_accuracy'],
  'same_variables': all(
    np.array_equal(a, np.asarray(b))
    for a, b in zip(leaves, __import__('jax').tree.leaves(loaded.variables))
  ),
  'num_leaves': len(leaves),
  'workdir_exists': os.path.isdir(result.workdir),
}))
"""


def test_api_gets_runs_and_loads_outside_the_checkout(installed):
  target, cwd, env = installed
  done = subprocess.run(
    [sys.executable, '-c', API_SCRIPT, str(target)],
    cwd=cwd,
    env=env,
    capture_output=True,
  )
  assert done.returncode == 0, done.stderr.decode()[-2000:]
  out = json.loads(done.stdout.decode().strip().splitlines()[-1])
  assert out['rounds'] == [1, 2]
  assert out['final'] == out['loaded_final']
  assert out['same_variables'] and out['num_leaves'] > 0
  assert out['workdir_exists']
