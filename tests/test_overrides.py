"""fedjax_metric/overrides.py: the one parser of ``key=value`` text into
config fields, as launch.sweep (--set, --grid: `parse_assignments`,
`apply_overrides`), launch.evaluate (--set, through config_io.load_config)
and the configs' ``:arg`` strings (`parse_arg`) use it."""

import pickle

import pytest
from test_sweep import FEDAVG

from fedjax_metric import config_io, overrides, settings
from launch import sweep


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


def test_parse_assignments_and_grid_order():
  grid = sweep.parse_assignments(
    'partition.alpha=0.1,0.3; seed=0,1,2;model.widths=(8,16,32),(4,8,16)'
  )
  assert grid == [
    ('partition.alpha', ['0.1', '0.3']),
    ('seed', ['0', '1', '2']),
    ('model.widths', ['(8,16,32)', '(4,8,16)']),
  ]
  points = sweep.grid_points(grid[:2])
  assert len(points) == 6
  # The last key varies fastest.
  assert points[:3] == [
    {'partition.alpha': '0.1', 'seed': s} for s in ('0', '1', '2')
  ]
  assert sweep.parse_assignments('') == []
  for bad in ('seed', 'seed=', '=1', 'seed=1;seed=2'):
    with pytest.raises(ValueError):
      sweep.parse_assignments(bad)


def test_apply_overrides_types_and_unknown_keys():
  config = sweep.resolve(
    FEDAVG,
    {
      'seed': '3',
      'local.learning_rate': '0.5',
      'progress': 'false',
      'dataset.augmentation': 'flip',
      'partition.alpha': '1',
    },
  )
  assert config.seed == 3 and isinstance(config.seed, int)
  assert config.local.learning_rate == 0.5
  assert config.progress is False
  assert config.dataset.augmentation == 'flip'
  assert config.partition.alpha == 1.0 and isinstance(
    config.partition.alpha, float
  )
  with pytest.raises(KeyError, match='num_round'):
    sweep.resolve(FEDAVG, {'num_round': '3'})
  with pytest.raises(ValueError):
    sweep.resolve(FEDAVG, {'progress': 'maybe'})
