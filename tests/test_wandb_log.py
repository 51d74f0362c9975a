"""Weights & Biases logging (``logging.wandb``), an optional extra.

A stand-in ``wandb`` module records the calls a run makes: the run is
initialised once per workdir (the same id on resume) with the flattened
config, every evaluation row is logged at its round, the run is finished at
the end. Without the package a run that asks for W&B is refused before
anything starts, and a run that does not ask never imports it. The real
package, in offline mode, is exercised when it is installed.
"""

import os
import sys
import types

import pytest

from fedjax_metric import assemble, metrics_log, settings, validation, wandb_log


class FakeRun:
  def __init__(self, calls):
    self.calls = calls

  def log(self, data, step):
    self.calls.append(('log', data, step))

  def finish(self):
    self.calls.append(('finish',))


@pytest.fixture
def fake_wandb(monkeypatch):
  calls = []
  module = types.ModuleType('wandb')

  def init(**kwargs):
    calls.append(('init', kwargs))
    return FakeRun(calls)

  module.init = init
  monkeypatch.setitem(sys.modules, 'wandb', module)
  return calls


def config_with(project):
  config = settings.base_config()
  config.logging.wandb = project
  return config


def test_a_run_logs_its_config_and_rows_and_resumes_the_same_run(
  fake_wandb, tmp_path
):
  config = config_with('fl-study')
  log = metrics_log.MetricsLog(
    str(tmp_path), 0, 'test_accuracy', assemble.log_settings(config), True
  )
  row = log.append({'round': 2, 'test_accuracy': 0.5, 'train_loss': 1.25})
  log.close()
  log.close()  # safe twice
  (_, init), logged, finished = fake_wandb
  assert init['project'] == 'fl-study'
  assert init['resume'] == 'allow'
  assert init['config']['local.learning_rate'] == config.local.learning_rate
  assert logged == (
    'log',
    {k: v for k, v in row.items() if k != 'round'},
    2,
  )
  assert 'test_accuracy_ema' in logged[1]
  assert finished == ('finish',)
  # A resumed session continues the same W&B run.
  resumed = metrics_log.MetricsLog(
    str(tmp_path), 2, 'test_accuracy', assemble.log_settings(config), True
  )
  resumed.close()
  assert fake_wandb[3][1]['id'] == init['id'] == wandb_log.run_id(tmp_path)
  assert wandb_log.run_id(tmp_path / 'other') != init['id']


def test_without_the_package_a_wandb_run_is_refused_and_others_run(
  monkeypatch, tmp_path
):
  monkeypatch.setitem(sys.modules, 'wandb', None)  # import wandb fails
  with pytest.raises(validation.ConfigError, match=r'fedjax_metric\[wandb\]'):
    validation.validate(config_with('fl-study'))
  validation.validate(config_with(''))
  log = metrics_log.MetricsLog(
    str(tmp_path),
    0,
    'test_accuracy',
    assemble.log_settings(config_with('')),
    True,
  )
  log.append({'round': 1, 'test_accuracy': 0.5})
  log.close()
  assert log.wandb is None


def test_the_real_package_in_offline_mode(monkeypatch, tmp_path):
  pytest.importorskip('wandb')
  monkeypatch.setenv('WANDB_MODE', 'offline')
  monkeypatch.setenv('WANDB_SILENT', 'true')
  log = metrics_log.MetricsLog(
    str(tmp_path),
    0,
    'test_accuracy',
    assemble.log_settings(config_with('fl-study')),
    True,
  )
  log.append({'round': 1, 'test_accuracy': 0.5, 'train_loss': 1.0})
  log.close()
  runs = [d for d in os.listdir(tmp_path / 'wandb') if 'offline-run' in d]
  assert len(runs) == 1 and wandb_log.run_id(tmp_path) in runs[0]
