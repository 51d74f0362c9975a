"""fedjax_metric/overrides.py and config_io.py: the one override parser and
the one config loader, as launch.sweep, launch.evaluate, launch.main and the
configs' ``:arg`` strings use them."""

import json
import os
import pickle
import subprocess
import sys

import pytest

from fedjax_metric import config_io, overrides, settings

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_values_take_their_fields_type():
  assert overrides.parse_value('3', 0) == 3
  assert overrides.parse_value('1', 0.5) == 1.0
  for text, value in (('true', True), ('0', False), ('Yes', True), ('no', 0)):
    assert overrides.parse_value(text, False) is bool(value)
  assert overrides.parse_value('flip', 'none') == 'flip'
  assert overrides.parse_value("'flip'", 'none') == 'flip'  # A quoted str.
  assert overrides.parse_value('5', 'none') == '5'  # A string field's text.
  assert overrides.parse_value('(8,16)', (4,)) == (8, 16)
  for text, current in (('maybe', True), ('1.5', 1), ('x', 0.1), ('(1,', ())):
    with pytest.raises(ValueError):
      overrides.parse_value(text, current)


def test_both_override_forms_name_the_closest_field():
  """A mapping (launch.sweep's points) and 'key=value' items (launch.
  evaluate's --set) go through one walk; the messages keep each caller's
  wording."""
  with pytest.raises(overrides.FieldError) as error:
    config_io.load_config('fedavg', {'local.learning_rat': '0.1'})
  assert str(error.value) == (
    "Config has no field 'local.learning_rat'; did you mean "
    "'local.learning_rate'?"
  )
  with pytest.raises(ValueError, match='no field') as error:
    config_io.load_config('fedavg', ['local.learning_rat=0.1'])
  assert str(error.value).startswith(
    "--set='local.learning_rat=0.1': the config has no field "
  )
  with pytest.raises(ValueError, match=r"--set='seed=x': not an integer"):
    config_io.load_config('fedavg', ['seed=x'])
  with pytest.raises(ValueError, match='is not key.path=value'):
    config_io.load_config('fedavg', ['seed'])
  config = config_io.load_config('fedavg:runlocal', ['seed=4', 'progress=no'])
  assert (config.seed, config.progress) == (4, False)


def test_field_error_is_one_line_and_pickles():
  with pytest.raises(overrides.FieldError) as error:
    overrides.find_field(settings.base_config(), 'seed.x')
  e = error.value
  assert (e.block, e.is_value, e.value) == ('seed', True, 0)
  again = pickle.loads(pickle.dumps(e))  # A SLURM task's error comes back.
  assert str(again) == str(e) and again.key == 'seed.x' and again.is_value
  assert isinstance(e, KeyError) and isinstance(e, ValueError)


def test_arg_strings_parse_as_the_defaults_types():
  parsed = settings.parse_arg('runlocal, alpha=0.3,clients=5,model=x', **_ARGS)
  assert parsed.to_dict() == dict(
    runlocal=True, alpha=0.3, clients=5, model='x', iid=False
  )
  assert settings.parse_arg('iid=yes', **_ARGS).iid is True
  with pytest.raises(ValueError, match="Unknown config argument 'no_such'"):
    settings.parse_arg('no_such=1', **_ARGS)
  with pytest.raises(ValueError, match="clients='1.5': not an integer"):
    settings.parse_arg('clients=1.5', **_ARGS)
  with pytest.raises(ValueError, match="'maybe' is not a bool"):
    settings.parse_arg('iid=maybe', **_ARGS)  # Was silently False.
  assert settings.peek_arg('runlocal,setting=fedrcl', 'setting') == 'fedrcl'


_ARGS = dict(runlocal=False, alpha=0.5, clients=10, model='', iid=False)


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
