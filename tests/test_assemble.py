"""assemble.py: the typed settings it makes from a config for the pieces
below it (executors, the metrics log, the evaluation), which never read the
config themselves (tests/test_imports.py checks that)."""

import pytest

from fedjax_metric import assemble, executors, metrics_log, settings
from fedjax_metric.evaluation import protocols
from fedjax_metric.evaluation import ssl as ssl_eval


def a_config():
  config = settings.base_config()
  with config.unlocked():
    config.algorithm = 'fedau'
    config.eval_protocol = 'classification'
    config.eval_every = 4
    config.checkpoint_every = 6
    config.rounds_per_call = 3
    config.steps_per_call = 7
    config.unroll = 2
    config.eval_batch_size = 250
    config.seed = 11
    config.eval_train_examples = 50
    config.representation_examples = 40
    config.one_class_center_examples = 30
    config.federated_eval.clients = 5
    config.federated_eval.every = 2
    config.eval_ema_weight = 0.8
    config.eval_top_k = 3
    config.logging.per_client = True
    config.ssl_eval.knn_k = 20
  return config


def test_call_settings_carry_the_cadence_and_the_call_shape():
  got = assemble.call_settings(a_config())
  assert got == executors.CallSettings(
    cadence=(4, 6), rounds_per_call=3, steps_per_call=7, unroll=2
  )


def test_eval_settings_carry_every_evaluation_field():
  got = assemble.eval_settings(a_config())
  assert got._replace(ssl=None) == protocols.EvalSettings(
    protocol='classification',
    algorithm='fedau',
    model_name=settings.base_config().model.get('name', '?'),
    dataset_name=settings.base_config().dataset.name,
    batch_size=250,
    seed=11,
    train_examples=50,
    representation_examples=40,
    one_class_center_examples=30,
    federated_clients=5,
    federated_every=2,
  )
  assert got.ssl.knn_k == 20


def test_log_settings_carry_the_statistics_and_the_flat_config():
  got = assemble.log_settings(a_config())
  assert (got.ema_weight, got.top_k, got.per_client, got.wandb) == (
    0.8,
    3,
    True,
    '',
  )
  assert got.hparams['algorithm'] == 'fedau'
  assert got.hparams['federated_eval.clients'] == 5


def test_the_ssl_settings_defaults_are_the_configs():
  """SslEvalSettings' defaults (a call without a config) and the config's
  ssl_eval block (settings.py) are the same numbers."""
  from_config = ssl_eval.SslEvalSettings(**settings.base_config().ssl_eval)
  assert from_config == ssl_eval.SslEvalSettings()


def test_an_ssl_field_the_settings_lack_is_refused():
  config = settings.base_config()
  with config.unlocked():
    config.ssl_eval.knn_neighbours = 3
  with pytest.raises(TypeError, match='knn_neighbours'):
    assemble.eval_settings(config)


def test_the_log_writes_no_config_it_was_not_given(tmp_path):
  log = metrics_log.MetricsLog(
    str(tmp_path), 0, 'test_accuracy', metrics_log.LogSettings(), True
  )
  row = log.append({'round': 1, 'test_accuracy': 0.5})
  log.close()
  assert row['test_accuracy_ema'] == pytest.approx(0.5)
  assert log.per_client_path is None and log.wandb is None
