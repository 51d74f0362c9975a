"""assemble.py: the typed settings it makes from a config for the pieces
below it (executors, the metrics log, the evaluation), which never read the
config themselves (tests/test_imports.py checks that)."""

import numpy as np
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


def test_a_participation_pattern_refuses_clients_without_data_in_one_line():
  config = a_config()
  with config.unlocked():
    config.num_clients = 4
    config.participation.pattern = 'bernoulli'
  counts = np.array([[3, 1], [0, 0], [2, 2], [0, 0]])
  with pytest.raises(ValueError) as raised:
    assemble.participation_plan(config, counts)
  message = str(raised.value)
  assert '\n' not in message
  assert '2 of 4 clients without examples (first: [1, 3])' in message
  assert "participation.pattern='uniform'" in message
  # Every client with data: a plan, one probability each.
  counts[[1, 3]] = 1
  assert assemble.participation_plan(config, counts).probabilities.shape == (4,)


@pytest.mark.parametrize('pattern', ['markov', 'cyclic', 'bernoulli'])
def test_a_streamed_plan_answers_any_order_of_rounds_like_the_mask(
  pattern, monkeypatch
):
  """Over `MASK_LIMIT` the plan streams its rows; a run asks for its first
  round several times and a resumed one starts anywhere: every answer is
  that round's row of `participation.sample`, repeated asks included."""
  config = a_config()
  with config.unlocked():
    config.num_clients = 30
    config.num_rounds = 12
    config.participation.pattern = pattern
  counts = np.random.default_rng(0).integers(1, 5, (30, 3))
  whole = assemble.participation_plan(config, counts)
  assert whole.mask is not None
  monkeypatch.setattr(assemble, 'MASK_LIMIT', 0)
  streamed = assemble.participation_plan(config, counts)
  assert streamed.mask is None
  assert streamed.most_active == whole.most_active
  for round_idx in [5, 5, 6, 6, 2, 11, 11, 0, 7, 7, 7]:
    ids = streamed.clients_at(round_idx)
    np.testing.assert_array_equal(ids, np.flatnonzero(whole.mask[round_idx]))
    ids[:] = -1  # The caller's copy: the plan's next answer is unharmed.
