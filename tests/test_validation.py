"""validation.validate: every config field is checked before a run writes
anything, and a bad one is named in a one-line error."""

import os

import ml_collections
import pytest
from test_faults import _set, load_config

from fedjax_metric import assemble, experiment, validation
from fedjax_metric.data import sources


def test_failed_starts_write_nothing(tmp_path):
  workdir = str(tmp_path / 'run')

  def attempt(change, error, match):
    config = load_config('fedavg')
    change(config)
    with pytest.raises(error, match=match):
      experiment.run(config, workdir, stop_after_round=1)

  attempt(
    lambda c: (
      setattr(c.dataset, 'name', 'mnist'),
      setattr(c.dataset, 'data_dir', str(tmp_path / 'no')),
    ),
    sources.DatasetNotFoundError,
    'train-images',
  )
  attempt(
    lambda c: setattr(c, 'executor', 'vmapp'),
    validation.ConfigError,
    'executor',
  )
  attempt(
    lambda c: setattr(c.local, 'learning_rate', -0.1),
    validation.ConfigError,
    'local.learning_rate',
  )
  attempt(
    lambda c: setattr(c, 'clients_per_round', 9),
    validation.ConfigError,
    'clients_per_round=9',
  )
  # Checks that need the data, the model or the devices: still before any
  # file (they used to fail after partition.json / .png were written).
  attempt(
    lambda c: (
      setattr(c, 'algorithm', 'fedprox'),
      setattr(c, 'algorithm_kwargs', ml_collections.ConfigDict({'mu': -1.0})),
    ),
    ValueError,
    'mu',
  )
  attempt(
    lambda c: (setattr(c, 'executor', 'vmap'), setattr(c, 'num_devices', 8)),
    ValueError,
    '8',
  )
  assert not os.path.exists(workdir)  # Refused before anything was written.


@pytest.mark.parametrize(
  'change, match',
  [
    (_set('clients_per_round', 5), 'clients_per_round=5 is more than'),
    (_set('num_clients', 5000), 'digits has 1438 training examples'),
    (_set('local.momentum', 1.5), r'local.momentum must be < 1.0'),
    (_set('local.learning_rate', float('nan')), 'must be finite'),
    (_set('local.optimizer', 'sgdd'), "local.optimizer is not usable.*'adam'"),
    (_set('server.optimizer', 'adm'), 'server.optimizer'),
    (_set('local.schedule', 'cosin'), 'local.schedule'),
    (_set('partition.method', 'dirichet'), 'partition.method must be one of'),
    (_set('model.name', 'resnet19'), "model.name must be one of .*'resnet18'"),
    (_set('algorithm', 'fedavgm'), "algorithm must be one of .*'fedprox'"),
    (_set('num_rounds', 0), 'num_rounds must be >= 1'),
    (_set('participation.floor', 0.0), r'participation.floor must be > 0'),
    (_set('eval_every', 0), 'eval_every must be >= 1'),
    (
      _set('cohort_sampler', 'fast'),
      "cohort_sampler must be one of .*'vectorized'",
    ),
    (_set('local.steps', 0), 'trains nothing'),
    (_set('dataset.name', 'fashion-mnist'), "Did you mean 'fashion_mnist'"),
    (_set('dataset.name', 'cifar_10'), "Did you mean 'cifar10'"),
  ],
)
def test_bad_values_are_refused_with_the_field_named(change, match):
  config = load_config('fedavg')
  change(config)
  if match == 'trains nothing':
    config.local.epochs = 0
  error = (
    sources.DatasetNotFoundError
    if 'Did you mean' in match
    else validation.ConfigError
  )
  with pytest.raises(error, match=match):
    validation.validate(config)


def test_a_mistyped_algorithm_gets_a_did_you_mean():
  config = load_config('fedavg')
  config.algorithm = 'fedavgg'
  with pytest.raises(validation.ConfigError) as error:
    validation.validate(config)
  message = str(error.value)
  assert 'algorithm must be one of' in message
  assert "got 'fedavgg'; did you mean 'fedavg'?" in message
  assert len(message.splitlines()) == 1
  config.algorithm = 'zzzzzz'  # Nothing close: no guess.
  with pytest.raises(validation.ConfigError) as error:
    validation.validate(config)
  assert 'did you mean' not in str(error.value)


def test_the_tfds_install_hint_is_a_package_install(monkeypatch):
  """Wheel users have no checkout: the hint is `pip install
  'fedjax_metric[tfds]'`, not `pip install -e .[tfds]`."""
  import importlib.util  # pylint: disable=g-import-not-at-top

  from fedjax_metric.data import tfds_source  # pylint: disable=g-import-not-at-top

  find_spec = importlib.util.find_spec
  monkeypatch.setattr(
    importlib.util,
    'find_spec',
    lambda name, *a: (
      None
      if name in ('tensorflow_datasets', 'tensorflow')
      else find_spec(name, *a)
    ),
  )
  with pytest.raises(sources.DatasetNotFoundError) as error:
    sources.check_available('no_such_dataset')
  messages = [str(error.value)]
  with pytest.raises(ImportError) as error:
    tfds_source._read_with_tensorflow(None, 'my_set', 'train', 'tfrecord')
  messages.append(str(error.value))
  for message in messages:
    assert "pip install 'fedjax_metric[tfds]'" in message, message
    assert '-e .' not in message, message


def test_model_and_algorithm_fields_are_checked_without_building(tmp_path):
  config = load_config('fedavg')
  config.model.unlock()
  config.model.depth = 50
  with pytest.raises(validation.ConfigError, match='depth'):
    validation.validate(config)
  config = load_config('fedprox')
  config.algorithm_kwargs.nu = 0.1
  with pytest.raises(validation.ConfigError, match=r"\['nu'\].*'mu'"):
    validation.validate(config)


def test_a_field_without_a_rule_is_not_range_checked():
  config = load_config('fedavg')
  config.brand_new_field = -12345  # A field added after this validator.
  config.local.brand_new_knob = 'anything'
  validation.validate(config)  # Raises on any field it checks.
  # The fields that have a rule are still checked beside the new ones.
  config.local.learning_rate = -1.0
  with pytest.raises(validation.ConfigError, match='local.learning_rate'):
    validation.validate(config)


def _server(**values):
  def change(config):
    config.server.update(values)

  return change


@pytest.mark.parametrize(
  'change, match',
  [
    (_server(form='keras'), "server.form must be one of 'optax', 'fedopt'"),
    (
      _server(form='fedopt'),  # fedavg's server is sgd
      "server.form='fedopt' is a form of FedAdam and FedYogi, not of "
      "server.optimizer='sgd'; set --config.server.optimizer=adam or yogi",
    ),
    (
      _server(optimizer='fedhyper', form='fedopt'),
      'not of server.optimizer=.fedhyper.',
    ),
    (
      _server(optimizer='yogi', initial_accumulator=1.0),
      r"read only by FedYogi in form 'fedopt' .*form='optax'",
    ),
    (
      _server(optimizer='adam', form='fedopt', initial_accumulator=1.0),
      "read only by FedYogi.*optimizer='adam'",
    ),
    (
      _server(optimizer='yogi', form='fedopt', initial_accumulator=-1.0),
      'server.initial_accumulator must be >= 0.0',
    ),
    (
      _server(optimizer='fedhyper', momentum=0.9),
      'set --config.server.momentum=0',
    ),
  ],
)
def test_server_options_its_optimizer_does_not_read_are_refused(change, match):
  """server.form and server.initial_accumulator: refused, in one line that
  names the field and the fix, unless the optimizer reads them."""
  config = load_config('fedavg')
  change(config)
  with pytest.raises(validation.ConfigError, match=match) as error:
    validation.validate(config)
  assert len(str(error.value).splitlines()) == 1


@pytest.mark.parametrize(
  'values',
  [
    dict(optimizer='adam', form='fedopt'),
    dict(optimizer='yogi', form='fedopt', initial_accumulator=1.0),
    dict(optimizer='yogi', form='optax'),
  ],
)
def test_the_authors_fedadam_and_fedyogi_are_accepted(values):
  config = load_config('fedavg')
  config.server.update(values)
  validation.validate(config)


def test_the_start_line_notes_a_gpu_jax_does_not_use():
  gpu = lambda path: path == '/dev/nvidiactl'
  none = lambda path: False
  note = assemble.unused_gpu_note('cpu', exists=gpu, environ={})
  assert "pip install 'fedjax_metric[cuda]'" in note
  assert 'JAX_PLATFORMS=cpu' in note
  # No GPU, a GPU in use, or a platform the user chose: nothing to say.
  assert assemble.unused_gpu_note('cpu', exists=none, environ={}) == ''
  assert assemble.unused_gpu_note('gpu', exists=gpu, environ={}) == ''
  chosen = {'JAX_PLATFORMS': 'cpu'}
  assert assemble.unused_gpu_note('cpu', exists=gpu, environ=chosen) == ''


def test_the_partition_size_check_counts_what_the_validation_split_leaves():
  """digits: 1,438 examples. 100 clients of at least 10 fit the whole set
  (1,000) but not the 719 a validation_fraction of 0.5 leaves."""
  config = load_config('fedavg')
  config.num_clients = 100
  config.clients_per_round = 10
  config.partition.method = 'dirichlet'
  config.partition.variant = 'niid_bench'
  config.partition.min_size = 10
  validation.validate(config)
  config.dataset.validation_fraction = 0.5
  with pytest.raises(
    validation.ConfigError,
    match=r'digits has 719 training examples left after holding out 719 '
    r'\(--config.dataset.validation_fraction=0.5\): too few',
  ):
    validation.validate(config)
