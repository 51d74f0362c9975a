"""fedjax_metric/settings.py: the config schema (`base_config`), the shared
``:arg`` options every config takes (central, model, dataset, server,
runlocal) and the locked config `finalize` returns, whose mistyped field is
a one-line error."""

import glob
import os
import re

import ml_collections
import pytest
from test_faults import _config_names, _supervised_config_names

from fedjax_metric import settings, validation
from fedjax_metric import settings as common

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# ``--config.<key>`` as README.md and docs/ cite it.
CITED_KEY = re.compile(r'--config\.([a-z_][a-z0-9_]*(?:\.[a-z_][a-z0-9_]*)*)')
# Cited as what is not a field: the README's example of a mistyped override
# and docs/written_by_hand.md's placeholder (``--config.x=y``).
NOT_FIELDS = {'num_round', 'x'}
# Blocks whose fields are the algorithm's or the model's own (a config
# replaces them): the docs may cite a field base_config's block lacks.
OPEN_BLOCKS = {'algorithm_kwargs', 'model'}


def finalized_base_config():
  arg = settings.parse_arg('', **settings.BASE_ARGS)
  return settings.finalize(settings.base_setting(arg), arg)


@pytest.mark.parametrize('name', _config_names())
def test_every_config_rejects_an_unknown_argument_naming_the_known(name):
  import importlib  # pylint: disable=g-import-not-at-top

  module = importlib.import_module(f'configs.{name}')
  with pytest.raises(ValueError, match="Unknown config argument 'no_such'"):
    module.get_config('runlocal,no_such=1')


@pytest.mark.parametrize('name', _supervised_config_names())
def test_every_config_takes_central_model_and_dataset(name):
  import importlib  # pylint: disable=g-import-not-at-top

  module = importlib.import_module(f'configs.{name}')
  config = module.get_config('runlocal,central,model=small_cnn')
  assert (config.num_clients, config.clients_per_round) == (1, 1)
  assert config.partition.method == 'iid'
  assert config.model.name == 'small_cnn'
  validation.validate(config)
  explicit = module.get_config('runlocal,dataset=fashion_mnist')
  assert explicit.dataset.name == 'fashion_mnist'
  assert module.get_config('runlocal').dataset.name == 'digits'


@pytest.mark.parametrize(
  'block, typo, expected',
  [
    ('', 'num_round', 'num_rounds'),
    ('local', 'learnin_rate', 'learning_rate'),
    ('dataset', 'nmae', 'name'),
  ],
)
def test_a_mistyped_field_set_from_python_is_one_short_line(
  block, typo, expected
):
  """ml_collections' message for a new key on a locked config dumps the
  whole config (2,400 characters for ``config.num_round = 5``), with the
  suggestion at its end."""
  import fedjax_metric as fm  # pylint: disable=g-import-not-at-top

  config = fm.get_config('fedavg', 'runlocal')
  node = config[block] if block else config
  for assign in (
    lambda: setattr(node, typo, 5),
    lambda: node.__setitem__(typo, 5),
  ):
    with pytest.raises((AttributeError, KeyError)) as info:
      assign()
    message = str(info.value)
    assert len(message) < 200 and '\n' not in message, message
    name = f'config.{block}.{typo}' if block else f'config.{typo}'
    assert name in message, message
    assert f"did you mean '{expected}'?" in message, message
  # Reading a mistyped field keeps its error; the config is still usable.
  with pytest.raises(AttributeError, match=expected):
    getattr(node, typo)
  node[expected] = node[expected]
  assert config.is_locked


def test_defaults_leave_existing_configs_unchanged():
  p = common.base_config().partition
  assert p.method == 'dirichlet' and p.variant == 'niid_bench'
  assert p.size_distribution == 'dirichlet' and p.power_law_exponent == 1.0


def test_base_config_holds_every_field_the_docs_name():
  paths = [os.path.join(REPO, 'README.md')]
  paths += glob.glob(os.path.join(REPO, 'docs', '**', '*.md'), recursive=True)
  cited = set()
  for path in paths:
    with open(path) as f:
      cited |= set(CITED_KEY.findall(f.read()))
  assert len(cited) > 20 and 'federated_eval.clients' in cited
  config = settings.base_config()
  missing = []
  for key in sorted(cited - NOT_FIELDS):
    block, *rest = key.split('.')
    if block not in config:
      missing.append(key)
    elif rest and block not in OPEN_BLOCKS:
      node = config
      for name in key.split('.'):
        if not isinstance(node, ml_collections.ConfigDict) or name not in node:
          missing.append(key)
          break
        node = node[name]
  assert not missing, missing
  assert not NOT_FIELDS & set(config)


def test_a_finalized_config_is_locked_in_every_block():
  config = finalized_base_config()
  blocks = [config] + [
    v for v in config.values() if isinstance(v, ml_collections.ConfigDict)
  ]
  assert len(blocks) > 10
  for block in blocks:
    assert block.is_locked
    with pytest.raises((AttributeError, KeyError)):
      block.no_such_field = 1
  config.local.learning_rate = 0.5  # A field it has still takes a value.
  assert config.local.learning_rate == 0.5


def test_every_server_method_sets_fields_the_server_block_has():
  fields = set(settings.base_config().server)
  for name, values in settings.SERVER_METHODS.items():
    assert set(values) <= fields, name
    config = settings.base_config()
    settings.apply_server_method(config, name)
    assert {k: config.server[k] for k in values} == values, name
  with pytest.raises(ValueError, match="Unknown server method 'adamw'"):
    settings.apply_server_method(settings.base_config(), 'adamw')


def test_runlocal_shrinks_a_config_to_a_smoke_run():
  config = settings.base_config()
  config.num_clients, config.clients_per_round = 100, 10
  config.dataset.name = 'cifar10'
  settings.shrink_for_runlocal(config)
  assert (config.num_rounds, config.num_clients) == (2, 4)
  assert config.clients_per_round == 4 and config.local.steps == 2
  assert config.dataset.name == 'digits' and config.model.width == 8
  # One class per client: the population is the classes, kept.
  one_class = settings.base_config()
  one_class.partition.method = 'one_class'
  settings.shrink_for_runlocal(one_class)
  assert one_class.num_clients == settings.base_config().num_clients


def test_each_model_argument_gets_its_papers_normalisation():
  """FedQuad's CNN with BatchNorm, FedRCL's ResNet-18 with GroupNorm; the
  small CNN keeps base_config's none (MOON's CNN has no normalisation)."""
  want = {
    'small_cnn': 'none',
    'fedquad_cnn': 'batch',
    'resnet18': 'group',
    'moon_cnn': None,
  }
  assert set(settings.BASE_NORMS) == set(want)
  for name, norm in want.items():
    arg = settings.parse_arg(f'model={name}', **settings.BASE_ARGS)
    model = settings.base_setting(arg).model
    assert (model.name, model.get('norm')) == (name, norm)
  with pytest.raises(ValueError, match="Unknown model argument 'vgg'"):
    settings.model_block('vgg', norm='none')
