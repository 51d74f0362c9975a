"""fedjax_metric/config_io.py: the one config loader, as launch.sweep,
launch.evaluate and launch.main use it (the override parser it applies is
tests/test_overrides.py's)."""

import json
import os
import subprocess
import sys

import pytest

from fedjax_metric import config_io, settings

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_workdir_config_keeps_new_fields_defaults(tmp_path):
  """config.json written into the full schema: a field added since keeps
  its default; overrides apply on top."""
  saved = json.loads(
    config_io.load_config('fedavg:runlocal').to_json_best_effort()
  )
  del saved['local']['epoch_decay']
  saved['seed'] = 7
  with open(tmp_path / 'config.json', 'w') as f:
    json.dump(saved, f)
  config = config_io.load_config(
    overrides=['num_rounds=9'], workdir=str(tmp_path)
  )
  assert (config.seed, config.num_rounds) == (7, 9)
  assert config.local.epoch_decay == settings.base_config().local.epoch_decay
  with pytest.raises(FileNotFoundError, match="a run's workdir"):
    config_io.load_config(workdir=str(tmp_path / 'none'))
  with pytest.raises(TypeError, match='one of them'):
    config_io.load_config('fedavg', workdir=str(tmp_path))
  with pytest.raises(FileNotFoundError, match='Config file'):
    config_io.load_config('no/such.py')


def test_flatten():
  tree = {'b': {'y': [1, 2], 'x': 1}, 'a': 0, 'c': {}}
  assert config_io.flatten(tree) == {'a': 0, 'b.x': 1, 'b.y': [1, 2]}
  assert list(config_io.flatten(tree)) == ['a', 'b.x', 'b.y']
  assert config_io.flatten(tree, hashable=True)['b.y'] == (1, 2)


def test_sweep_tables_import_no_jax():
  """The package's front door loads JAX on first use, so launch.sweep's
  table and plot commands, which read configs with config_io, start
  without it."""
  code = (
    'import sys; import launch.sweep; '
    'from fedjax_metric import config_io, overrides; '
    "config_io.load_config('fedavg:runlocal', {'seed': '1'}); "
    "assert 'jax' not in sys.modules, 'jax imported'; "
    'import fedjax_metric as fm; fm.algorithms(); fm.get_config; '
    "assert 'jax' in sys.modules"
  )
  subprocess.run([sys.executable, '-c', code], cwd=REPO, check=True)
