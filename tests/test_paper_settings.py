"""fedjax_metric/paper_settings.py: the five papers' settings as config
builders, their ``:arg`` keys, and `setting_config`'s choice of a setting
by name. Pure Python (ml_collections): nothing is built or run."""

import pytest

from fedjax_metric import config_io, paper_settings, settings

# Each setting with the ``:arg`` keys its configs accept.
SETTINGS = {
  'fedquad': (paper_settings.fedquad_setting, paper_settings.FEDQUAD_ARGS),
  'fedrcl': (paper_settings.fedrcl_setting, paper_settings.FEDRCL_ARGS),
  'one_class': (
    paper_settings.one_class_setting,
    paper_settings.ONE_CLASS_ARGS,
  ),
  'participation': (
    paper_settings.participation_setting,
    paper_settings.PARTICIPATION_ARGS,
  ),
  'ssl': (paper_settings.ssl_setting, paper_settings.SSL_ARGS),
}


def build(name, arg=''):
  setting, args = SETTINGS[name]
  return setting(settings.parse_arg(arg, **args))


def schema(config):
  """The dotted fields of ``config`` outside the blocks a setting replaces
  (the model's fields and the algorithm's options are its own)."""
  flat = config_io.flatten(config.to_dict())
  return {
    k for k in flat if k.split('.')[0] not in ('model', 'algorithm_kwargs')
  }


@pytest.mark.parametrize('name', sorted(SETTINGS))
def test_a_setting_changes_values_never_fields(name):
  """settings.py: method configs change values, never add fields (a field
  added here would escape the schema's lock and its checks)."""
  assert schema(build(name)) == schema(settings.base_config())


def test_setting_config_picks_the_named_settings_protocol():
  quad, arg = paper_settings.setting_config('setting=fedquad,clients=50')
  assert (arg.setting, quad.dataset.name) == ('fedquad', 'cifar10')
  assert (quad.num_clients, quad.clients_per_round) == (50, 50)
  assert (quad.local.optimizer, quad.local.learning_rate) == ('adam', 1e-3)
  assert (quad.model.name, quad.model.norm) == ('fedquad_cnn', 'batch')
  rcl, _ = paper_settings.setting_config('setting=fedrcl,alpha=0.1')
  assert (rcl.num_clients, rcl.clients_per_round) == (100, 5)
  assert (rcl.partition.variant, rcl.partition.alpha) == ('balanced', 0.1)
  assert (rcl.model.name, rcl.model.norm) == ('resnet18', 'group')
  base, _ = paper_settings.setting_config('central')
  assert (base.num_clients, base.partition.method) == (1, 'iid')
  assert base.dataset.name == settings.base_config().dataset.name
  # Each setting takes its own arguments only.
  with pytest.raises(ValueError, match="Unknown config argument 'clients'"):
    paper_settings.setting_config('setting=fedrcl,clients=50')
  with pytest.raises(ValueError, match="setting must be 'fedquad' or"):
    paper_settings.setting_config('setting=moon')


def test_one_class_clients_are_the_classes_times_clients_per_class():
  config = build('one_class', 'clients_per_class=3')
  assert (config.dataset.name, config.model.name) == ('fashion_mnist', 'lenet')
  assert config.num_clients == config.clients_per_round == 30
  assert config.partition.clients_per_class == 3
  cifar = build('one_class', 'dataset=cifar100')
  assert (cifar.num_clients, cifar.model.name) == (100, 'resnet32')
  with pytest.raises(ValueError, match="Unknown one-class model 'vgg'"):
    paper_settings.one_class_model_block('vgg')


def test_participation_and_ssl_settings_derive_their_sizes():
  pmfl = build('participation', 'rounds=100,width=8')
  assert (pmfl.model.width, pmfl.model.embedding_dim) == (8, 32)
  assert pmfl.checkpoint_every == 100  # min(250, rounds)
  assert build('participation').checkpoint_every == 250
  cross_device = build('ssl', 'clients=50,join=0.2')
  assert cross_device.clients_per_round == 10
  with pytest.raises(ValueError, match="model must be 'ssl_cnn'"):
    build('ssl', 'model=vgg')
  # A whole 'ssl' config: locked, projector as wide as the encoder.
  config = paper_settings.ssl_config(
    'runlocal', 'ssd', drop_last_cross_silo=True, tau=0.5
  )
  assert config.is_locked and config.algorithm == 'ssd'
  assert config.model.projection_dim == config.model.embedding_dim
  assert config.model.projector_hidden == 2 * config.model.projection_dim
  assert config.algorithm_kwargs.to_dict() == dict(
    view_order='ssd', drop_last=True, tau=0.5
  )
  # The ResNet-18 encoder too: its runlocal projector is as wide (8 x width)
  # as its output, not shrunk again to 16 by the shared runlocal step.
  resnet = paper_settings.ssl_config('runlocal,model=ssl_resnet18', 'ssd')
  assert resnet.model.projection_dim == 8 * resnet.model.width == 64
  assert resnet.model.projector_hidden == 2 * resnet.model.projection_dim
