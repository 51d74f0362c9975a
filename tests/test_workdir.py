"""fedjax_metric/workdir.py: the files a run keeps in its workdir and reads
back: the resume checks (`check_resume_config`, `check_rounds`,
`rounds_dependence`), the workdir check before any setup (`check_workdir`),
checkpoints reopened with fallback and pruning (`open_checkpoints`,
`previous_wall_time`) and the divergence message (`diverged_error`).

Most tests run :runlocal configs in-process (test_faults.load_config: no
partition plot); the checkpointed workdirs are test_faults' fixtures."""

import json
import logging
import os
import shutil

import ml_collections
import pytest
from test_experiment import read_metrics
import test_faults
from test_faults import (
  checkpoint_dirs,
  copy_of_two_checkpoints,
  four_rounds,
  load_config,
)

from fedjax_metric import experiment, validation
from fedjax_metric import experiment as experiment_lib
from fedjax_metric import workdir as workdir_lib

# test_faults' module-scoped fixtures: an uninterrupted 4-round run, and a
# run stopped after round 2 of 3 over a failed attempt's leftovers.
straight = test_faults.straight
two_checkpoints = test_faults.two_checkpoints


def no_setup(monkeypatch):
  """Makes building the data and model fail the test."""
  from fedjax_metric import assemble  # pylint: disable=g-import-not-at-top

  def build(*args, **kwargs):
    raise AssertionError('the data and model were built')

  monkeypatch.setattr(assemble, 'build', build)


@pytest.mark.parametrize(
  'change, field',
  [
    (dict(schedule='cosine'), 'local.schedule=cosine'),
    (dict(schedule='warmup_cosine', warmup_rounds=1), 'warmup_cosine'),
  ],
)
def test_extending_a_run_that_read_num_rounds_is_refused(
  tmp_path, change, field
):
  """The fault trial's case: a 4-round cosine run extended to 6 gave another
  model than a fresh 6-round run and a config.json claiming one."""
  config = load_config('fedavg')
  config.num_rounds = 4
  for key, value in change.items():
    config.local[key] = value
  experiment.run(config, str(tmp_path))
  config.num_rounds = 6
  with pytest.raises(validation.ConfigError, match=field) as info:
    experiment.run(config, str(tmp_path))
  assert 'num_rounds=4' in str(info.value)
  with open(tmp_path / 'config.json') as f:
    assert json.load(f)['num_rounds'] == 4  # Still the run it holds.


def test_extending_pmfl_is_refused():
  flat = {'algorithm': 'pmfl', 'local.schedule': 'constant'}
  assert 'psi' in workdir_lib.rounds_dependence(flat)
  assert workdir_lib.rounds_dependence({'algorithm': 'fedau'}) is None


def test_finished_run_is_not_redone_or_lost(tmp_path):
  config = load_config('fedavg')
  summary = experiment.run(config, str(tmp_path))
  stamp = os.path.getmtime(tmp_path / 'metrics.jsonl')
  again = experiment.run(config, str(tmp_path))
  assert again == summary
  assert os.path.getmtime(tmp_path / 'metrics.jsonl') == stamp
  # A config.json written before a field existed is not a different config.
  with open(tmp_path / 'config.json') as f:
    older = json.load(f)
  del older['precision'], older['partition']['min_size']
  with open(tmp_path / 'config.json', 'w') as f:
    json.dump(older, f)
  assert experiment.run(config, str(tmp_path)) == summary


def test_an_extension_past_a_finished_run_is_not_hidden_by_its_summary(
  tmp_path,
):
  """A finished 2-round run extended to more rounds and stopped at round
  3: asking for 2 rounds again must not answer 'nothing to do' with the old
  summary while the newest model is round 3's."""
  config = load_config('fedavg')
  config.num_rounds = 2
  with open(tmp_path / 'summary.json', 'w') as f:
    json.dump({'rounds_completed': 2}, f)
  (tmp_path / 'checkpoints' / '2').mkdir(parents=True)
  assert workdir_lib.check_rounds(str(tmp_path), config) == {
    'rounds_completed': 2
  }
  (tmp_path / 'checkpoints' / '3').mkdir()
  with pytest.raises(
    validation.ConfigError,
    match='finished after 2 rounds and extended to a checkpoint of round 3.*'
    'at least 3',
  ):
    workdir_lib.check_rounds(str(tmp_path), config)


def test_different_config_in_same_workdir_is_refused(tmp_path):
  config = load_config('fedavg')
  experiment.run(config, str(tmp_path), stop_after_round=1)
  config.local.learning_rate = 0.5
  with pytest.raises(ValueError, match='different config.*learning_rate|local'):
    experiment.run(config, str(tmp_path))


def test_a_failed_start_does_not_block_the_next_config(two_checkpoints):
  _, workdir = two_checkpoints
  with open(os.path.join(workdir, 'config.json')) as f:
    assert json.load(f)['seed'] == 0
  rows = read_metrics(workdir)
  assert [r['round'] for r in rows] == [1, 2]
  assert rows[0]['test_accuracy'] != 0.5  # The new run's, not the leftover.
  assert not os.path.exists(os.path.join(workdir, 'participation.png'))
  assert checkpoint_dirs(workdir) == ['1', '2']


def test_starting_over_drops_the_failed_attempts_client_table(tmp_path):
  """A client table without a checkpoint holds nothing to resume; left
  behind, its placement would bind the corrected config's run."""
  old = load_config('fedavg')
  with open(tmp_path / 'config.json', 'w') as f:
    f.write(old.to_json_best_effort())
  table = tmp_path / 'client_table'
  table.mkdir()
  (table / 'meta.json').write_text('{"placement": "disk"}')
  new = load_config('fedavg')
  new.local.learning_rate = 0.5
  workdir_lib.check_resume_config(str(tmp_path), new)
  assert not table.exists()
  # With a checkpoint the workdir holds a run: refused, the table kept.
  table.mkdir()
  (tmp_path / 'checkpoints' / '1').mkdir(parents=True)
  with pytest.raises(validation.ConfigError, match='different config'):
    workdir_lib.check_resume_config(str(tmp_path), new)
  assert table.exists()


def test_a_finished_workdir_refuses_another_config_by_dotted_path(
  straight, tmp_path
):
  workdir, summary = straight
  for split in ('train', 't10k'):  # Present (empty: they are never read).
    for kind in ('images-idx3', 'labels-idx1'):
      (tmp_path / f'{split}-{kind}-ubyte').touch()
  before = {
    n: open(os.path.join(workdir, n), 'rb').read()
    for n in ('config.json', 'summary.json', 'metrics.jsonl')
  }

  def refused(change, *patterns):
    other = four_rounds()
    change(other)
    with pytest.raises(validation.ConfigError) as info:
      experiment_lib.run(other, workdir)
    for pattern in patterns:
      assert pattern in str(info.value), (pattern, str(info.value))
    return str(info.value)

  refused(lambda c: setattr(c, 'seed', 3), 'seed (0 -> 3)')
  message = refused(
    lambda c: setattr(c.local, 'learning_rate', 0.5),
    'local.learning_rate (0.05 -> 0.5)',
  )
  assert 'local (' not in message
  refused(
    lambda c: (
      setattr(c, 'algorithm', 'fedprox'),
      setattr(c.dataset, 'name', 'mnist'),
      setattr(c.dataset, 'data_dir', str(tmp_path)),
    ),
    'algorithm (fedavg -> fedprox)',
    'dataset.name (digits -> mnist)',
  )
  refused(
    lambda c: setattr(c, 'num_rounds', 1),
    'finished after 4 rounds',
    'num_rounds=1 asks for fewer',
  )
  for name, data in before.items():
    assert open(os.path.join(workdir, name), 'rb').read() == data, name
  # The same config still returns the finished summary.
  assert experiment_lib.run(four_rounds(), workdir) == summary


def test_the_divergence_message_names_the_server_only_when_it_can_diverge():
  config = load_config('fedavg')
  plain = str(workdir_lib.diverged_error('w', None, config)('NaN', 3))
  assert plain.startswith('NaN at round 3. Lower --config.local.learning_rate')
  assert 'server' not in plain and 'may be rerun' in plain
  config.server.optimizer = 'adam'
  config.server.learning_rate = 0.01
  with_server = str(workdir_lib.diverged_error('w', 2, config)('NaN', 3))
  assert 'server.learning_rate (now 0.01, optimizer adam)' in with_server
  assert 'last good checkpoint (round 2)' in with_server


def test_a_resume_at_the_very_end_keeps_only_keep_checkpoints(tmp_path):
  """A run killed right after a save, before orbax pruned the oldest
  checkpoint and before summary.json: the rerun has no round left to save,
  and still leaves keep_checkpoints checkpoints."""
  config = load_config('fedavg')
  config.num_rounds = 3
  config.checkpoint_every = 1
  config.keep_checkpoints = 2
  workdir = str(tmp_path / 'run')
  experiment_lib.run(config, workdir)
  assert checkpoint_dirs(workdir) == ['2', '3']
  # What the kill left: round 1's checkpoint not yet pruned, no summary.
  shutil.copytree(
    os.path.join(workdir, 'checkpoints', '2'),
    os.path.join(workdir, 'checkpoints', '1'),
  )
  os.remove(os.path.join(workdir, 'summary.json'))
  summary = experiment_lib.run(config, workdir)
  assert summary['rounds_completed'] == 3
  assert checkpoint_dirs(workdir) == ['2', '3']


def test_resuming_past_a_checkpoint_without_metadata_logs_no_orbax_warnings(
  two_checkpoints, tmp_path, caplog
):
  """The fault trial's resume printed two absl warnings of orbax's
  ("Metadata file does not exist: ...") beside the run's own report."""
  config, _ = two_checkpoints
  workdir, directory, template = copy_of_two_checkpoints(
    two_checkpoints, tmp_path
  )
  os.remove(os.path.join(directory, '2', '_CHECKPOINT_METADATA'))
  import contextlib  # pylint: disable=g-import-not-at-top

  with contextlib.ExitStack() as cleanup:
    checkpoints, restored_round, _ = workdir_lib.open_checkpoints(
      config,
      workdir,
      (template['server_state'], template['client_table']),
      True,
      cleanup,
    )
    assert restored_round == 1
    workdir_lib.previous_wall_time(
      checkpoints, restored_round, os.path.join(workdir, 'metrics.jsonl')
    )
  warnings = [
    r.getMessage()
    for r in caplog.records
    if r.name == 'absl' and r.levelno >= logging.WARNING
  ]
  assert not warnings, warnings


def test_a_workdir_that_is_a_file_is_refused_before_any_setup(
  tmp_path, monkeypatch, capsys
):
  no_setup(monkeypatch)
  path = tmp_path / 'file'
  path.write_text('not a directory')
  for workdir in (path, path / 'below'):
    with pytest.raises(NotADirectoryError, match='not a directory') as info:
      experiment_lib.run(load_config('fedavg'), str(workdir))
    assert '\n' not in str(info.value) and 'Errno' not in str(info.value)
  assert path.read_text() == 'not a directory'
  assert not capsys.readouterr().out  # No header either.


def test_a_failed_start_on_a_used_workdir_adds_no_file(tmp_path):
  """A refused config adds no file to a finished workdir (no TensorBoard event
  file, no lock left behind); a start that fails while building (an algorithm
  option out of range) on a workdir left by a failed attempt adds none."""
  workdir = tmp_path / 'run'
  config = load_config('fedavg')
  config.num_rounds = 1
  experiment.run(config, str(workdir))
  before = sorted(str(p) for p in workdir.rglob('*'))
  changed = load_config('fedavg')
  changed.num_rounds = 1
  changed.local.learning_rate = 0.5
  with pytest.raises(validation.ConfigError, match='local.learning_rate'):
    experiment.run(changed, str(workdir))
  assert sorted(str(p) for p in workdir.rglob('*')) == before
  # A workdir where an earlier attempt failed before any checkpoint.
  attempt = tmp_path / 'attempt'
  attempt.mkdir()
  (attempt / 'config.json').write_text(config.to_json_best_effort())
  bad = load_config('fedavg')
  bad.num_rounds = 1
  bad.algorithm = 'fedprox'
  bad.algorithm_kwargs = ml_collections.ConfigDict({'mu': -1.0})
  with pytest.raises(ValueError, match='mu'):
    experiment.run(bad, str(attempt))
  assert sorted(os.listdir(attempt)) == ['config.json']
