"""fedjax_metric/metrics_log.py: a run's evaluation rows (metrics.jsonl and
TensorBoard), the training columns of a row, and what a resumed session
keeps of an earlier one's rows."""

import glob
import json
import os

import numpy as np
import pytest

from fedjax_metric import event_log, metrics_log


def test_a_new_run_records_its_config_for_the_hparams_dashboard(tmp_path):
  """The experiment and the session start (TensorBoard's HParams plugin) at
  step 0, with every config field and the headline among the metrics; a
  resumed session does not write them again."""
  from tensorboardX.proto import plugin_hparams_pb2

  from fedjax_metric import assemble, metrics_log, settings

  config = settings.base_config()
  config.local.learning_rate = 0.037
  log = metrics_log.MetricsLog(
    str(tmp_path), 0, 'test_accuracy', assemble.log_settings(config), True
  )
  log.close()
  (path,) = glob.glob(os.path.join(tmp_path, event_log.PATTERN))
  records, intact = event_log.read_records(path)
  assert intact
  plugin = {}
  for record in records:
    assert record.event.step == 0
    for value in record.event.summary.value:
      data = plugin_hparams_pb2.HParamsPluginData()
      data.ParseFromString(value.metadata.plugin_data.content)
      plugin[value.tag] = data
  experiment = plugin['_hparams_/experiment'].experiment
  assert 'test_accuracy' in {m.name.tag for m in experiment.metric_infos}
  start = plugin['_hparams_/session_start_info'].session_start_info
  assert start.hparams['local.learning_rate'].number_value == 0.037
  assert start.hparams['algorithm'].string_value == 'fedavg'
  resumed = metrics_log.MetricsLog(
    str(tmp_path), 3, 'test_accuracy', assemble.log_settings(config), True
  )
  resumed.close()
  later = [
    p for p in glob.glob(os.path.join(tmp_path, event_log.PATTERN)) if p != path
  ]
  assert later  # the resumed session's own file
  tags = [
    value.tag
    for p in later
    for record in event_log.read_records(p)[0]
    for value in record.event.summary.value
  ]
  assert not [t for t in tags if t.startswith('_hparams_')]


def test_train_row_is_per_example_and_a_nan_names_its_round():
  """Two calls since the last evaluation (2 rounds, then 1): each column is
  the sum over the rounds divided by the examples trained; the first
  non-finite loss raises ``diverged`` with its round."""
  sums = [
    {
      'train_loss_sum': np.array([6.0, 2.0]),
      'train_ce_sum': np.array([3.0, 1.0]),
      'train_examples': np.array([3.0, 1.0]),
    },
    {
      'train_loss_sum': np.array([4.0]),
      'train_ce_sum': np.array([0.0]),
      'train_examples': np.array([4.0]),
    },
  ]
  row, examples, rounds = metrics_log.train_row(sums, 10, ValueError)
  assert row == {'train_loss': 12.0 / 8.0, 'train_ce': 4.0 / 8.0}
  assert (examples, rounds) == (8.0, 3)
  sums[0]['train_loss_sum'] = np.array([6.0, np.nan])

  def diverged(what, round_):
    return FloatingPointError(f'{what} at round {round_}')

  with pytest.raises(FloatingPointError, match='nan at round 9'):
    metrics_log.train_row(sums, 10, diverged)


def test_a_resumed_log_drops_later_rows_and_keeps_the_headlines_history(
  tmp_path,
):
  """A session resumed from round 2 drops the rows of rounds 3 and 4 (they
  are computed again) and its statistics continue from rounds 1 and 2."""
  path = tmp_path / 'metrics.jsonl'
  settings = metrics_log.LogSettings(ema_weight=0.0, top_k=2)
  first = metrics_log.MetricsLog(str(tmp_path), 0, 'acc', settings, True)
  for round_, acc in enumerate([0.2, 0.6, 0.9, 0.1], start=1):
    first.append({'round': round_, 'acc': acc})
  first.close()
  resumed = metrics_log.MetricsLog(str(tmp_path), 2, 'acc', settings, True)
  assert [r['round'] for r in metrics_log.read_metrics(str(path))] == [1, 2]
  row = resumed.append({'round': 3, 'acc': 0.4})
  resumed.close()
  assert row['acc_top2_mean'] == pytest.approx((0.6 + 0.4) / 2)
  assert row['acc_ema'] == pytest.approx(0.4)  # Weight 0: the last value.
  with open(path) as f:
    assert [json.loads(line)['round'] for line in f] == [1, 2, 3]
  assert metrics_log.metrics_row(str(path), 2)['acc'] == 0.6
  assert metrics_log.metrics_row(str(path), 4) == {}


def test_a_cut_off_last_line_is_left_out_and_a_damaged_one_named(tmp_path):
  """A kill or a full disk in the middle of an append leaves part of a
  line: resuming drops it (that evaluation is redone). A line in the middle
  that is not JSON is damage: one line naming the file and line."""
  path = str(tmp_path / 'metrics.jsonl')
  with open(path, 'w') as f:
    f.write(
      '{"round": 1, "acc": 0.5}\n{"round": 2, "acc": 0.6}\n{"round": 3, "ac'
    )
  assert [r['round'] for r in metrics_log.read_metrics(path)] == [1, 2]
  metrics_log.truncate_metrics(path, 2)
  with open(path) as f:
    assert f.read() == '{"round": 1, "acc": 0.5}\n{"round": 2, "acc": 0.6}\n'
  with open(path, 'w') as f:
    f.write('{"round": 1}\n{"rou\n{"round": 3}\n')
  with pytest.raises(ValueError, match=r'line 2, is not a JSON row') as raised:
    metrics_log.read_metrics(path)
  assert '\n' not in str(raised.value)


def test_dropping_rows_on_resume_never_shortens_the_file_it_fails_to_write(
  tmp_path, monkeypatch
):
  """The rewrite goes to a temporary file first: a failure before it
  replaces metrics.jsonl (or per_client.csv) leaves every earlier row."""
  path = str(tmp_path / 'metrics.jsonl')
  rows = ''.join(json.dumps({'round': r}) + '\n' for r in (1, 2, 3))
  with open(path, 'w') as f:
    f.write(rows)

  def full_disk(src, dst):
    raise OSError(28, 'No space left on device')

  monkeypatch.setattr(os, 'replace', full_disk)
  with pytest.raises(OSError, match='No space'):
    metrics_log.truncate_metrics(path, 1)
  with open(path) as f:
    assert f.read() == rows
  csv_path = str(tmp_path / 'per_client.csv')
  with open(csv_path, 'w') as f:
    f.write('round,client\r\n1,4\r\n2,5\r\n')
  with pytest.raises(OSError, match='No space'):
    metrics_log._keep_rounds(csv_path, 1, ['round', 'client'])
  with open(csv_path, newline='') as f:
    assert f.read() == 'round,client\r\n1,4\r\n2,5\r\n'
  monkeypatch.undo()
  metrics_log._keep_rounds(csv_path, 1, ['round', 'client'])
  with open(csv_path, newline='') as f:
    assert f.read() == 'round,client\r\n1,4\r\n'
