"""One writer per workdir (fedjax_metric/workdir_lock.py)."""

import json
import os
import socket
import subprocess
import sys
import threading
import time

import pytest
from test_experiment import ROOT, load_config, read_metrics

from fedjax_metric import experiment
from fedjax_metric.workdir_lock import LOCK_NAME, WorkdirInUseError, WorkdirLock


def write_lock(workdir, pid, host=None):
  os.makedirs(workdir, exist_ok=True)
  with open(os.path.join(workdir, LOCK_NAME), 'w') as f:
    json.dump(
      {'host': host or socket.gethostname(), 'pid': pid, 'started': 0.0}, f
    )


@pytest.fixture
def live_pid():
  proc = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'])
  yield proc.pid
  proc.kill()
  proc.wait()


def dead_pid():
  proc = subprocess.Popen([sys.executable, '-c', 'pass'])
  proc.wait()
  return proc.pid


def test_a_live_holder_is_refused_in_one_line_naming_it(tmp_path, live_pid):
  write_lock(tmp_path, live_pid)
  with pytest.raises(WorkdirInUseError) as info:
    with WorkdirLock(str(tmp_path)):
      pass
  message = str(info.value)
  assert f'PID {live_pid} on {socket.gethostname()}' in message
  assert '\n' not in message
  # The holder's lock is left alone.
  with open(tmp_path / LOCK_NAME) as f:
    assert json.load(f)['pid'] == live_pid


def test_a_stale_lock_is_taken_over_with_a_note_and_released(tmp_path):
  pid = dead_pid()
  write_lock(tmp_path, pid)
  notes = []
  with WorkdirLock(str(tmp_path), report=notes.append):
    with open(tmp_path / LOCK_NAME) as f:
      assert json.load(f)['pid'] == os.getpid()
  assert len(notes) == 1 and f'PID {pid}' in notes[0]
  assert not (tmp_path / LOCK_NAME).exists()


def test_a_lock_naming_this_process_that_it_does_not_hold_is_stale(tmp_path):
  """A container restarted after a kill often gets its old PID back: the
  left-behind lock names the new process itself. Taken over with a note;
  one this process does hold is still refused to a second run in it."""
  write_lock(tmp_path, os.getpid())
  notes = []
  with WorkdirLock(str(tmp_path), report=notes.append):
    assert len(notes) == 1 and f'PID {os.getpid()}' in notes[0]
    with pytest.raises(WorkdirInUseError, match='is in use by PID'):
      with WorkdirLock(str(tmp_path)):
        pass
    assert (tmp_path / LOCK_NAME).exists()  # The refusal left it alone.
  assert not (tmp_path / LOCK_NAME).exists()


def test_another_hosts_lock_is_not_guessed_stale(tmp_path):
  write_lock(tmp_path, dead_pid(), host='elsewhere')
  with pytest.raises(WorkdirInUseError, match='delete'):
    with WorkdirLock(str(tmp_path)):
      pass


def test_train_run_refuses_a_held_workdir_and_writes_nothing(
  tmp_path, live_pid
):
  write_lock(tmp_path, live_pid)
  with pytest.raises(WorkdirInUseError, match=f'PID {live_pid}'):
    experiment.run(load_config('fedavg'), str(tmp_path))
  assert sorted(os.listdir(tmp_path)) == [LOCK_NAME]
  # Once the holder is gone the same workdir runs, and keeps no lock.
  write_lock(tmp_path, dead_pid())
  experiment.run(load_config('fedavg'), str(tmp_path))
  assert not (tmp_path / LOCK_NAME).exists()
  assert [r['round'] for r in read_metrics(tmp_path)] == [1, 2]


# Slow (two real runs race): make test-all.
@pytest.mark.slow
def test_two_runs_started_together_have_one_writer(tmp_path):
  """The fault trial's case: two runs 0.5 s apart on one workdir."""
  command = [
    sys.executable,
    '-m',
    'launch.main',
    '--config=configs/fedavg.py:runlocal',
    '--config.num_rounds=4',
    f'--workdir={tmp_path}',
  ]
  first = subprocess.Popen(
    command, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
  )
  time.sleep(0.5)
  second = subprocess.run(
    command, cwd=ROOT, capture_output=True, text=True, timeout=300
  )
  _, first_err = first.communicate(timeout=300)
  codes = sorted([first.returncode, second.returncode])
  refused_err = second.stderr if second.returncode else first_err
  # The second either ran after the first finished (it found nothing to do)
  # or was refused in one line; never two writers.
  if codes == [0, 1]:
    lines = refused_err.strip().splitlines()
    assert len(lines) == 1 and 'is in use by PID' in lines[0], refused_err
  else:
    assert codes == [0, 0], (first_err, second.stderr)
  rounds = [r['round'] for r in read_metrics(tmp_path)]
  assert rounds == sorted(set(rounds)) and rounds[-1] == 4


def age(path, seconds):
  """Sets ``path``'s modification time ``seconds`` into the past."""
  then = time.time() - seconds
  os.utime(path, (then, then))


@pytest.mark.parametrize('content', ['', '{"host": "vm", "pi'])
def test_an_empty_or_unparsable_lock_is_taken_over_with_a_note(
  tmp_path, content
):
  """A run killed between creating the lock and writing it leaves it empty
  (or torn): like a dead owner's, it must not block every later run."""
  (tmp_path / LOCK_NAME).write_text(content)
  age(tmp_path / LOCK_NAME, 60)
  notes = []
  with WorkdirLock(str(tmp_path), report=notes.append):
    with open(tmp_path / LOCK_NAME) as f:
      assert json.load(f)['pid'] == os.getpid()
  assert len(notes) == 1 and 'cannot be read' in notes[0], notes
  assert not (tmp_path / LOCK_NAME).exists()


def test_a_lock_being_written_is_read_once_written(tmp_path, live_pid):
  """A lock just created is empty for an instant: it is read again once its
  holder has written it, and that holder (alive) is named."""
  path = tmp_path / LOCK_NAME
  path.write_text('')

  def write_later():
    time.sleep(0.3)
    write_lock(tmp_path, live_pid)

  writer = threading.Thread(target=write_later)
  writer.start()
  try:
    with pytest.raises(WorkdirInUseError, match=f'PID {live_pid}'):
      with WorkdirLock(str(tmp_path)):
        pass
  finally:
    writer.join()


def test_a_held_workdir_is_refused_before_any_setup(
  tmp_path, live_pid, monkeypatch, capsys
):
  """The fault trial's second run on a busy workdir was refused only after
  10-19 s of data and model setup, after printing its header."""
  from fedjax_metric import assemble  # pylint: disable=g-import-not-at-top

  def build(*args, **kwargs):
    raise AssertionError('the data and model were built')

  monkeypatch.setattr(assemble, 'build', build)
  write_lock(tmp_path, live_pid)
  with pytest.raises(WorkdirInUseError, match=f'PID {live_pid}'):
    experiment.run(load_config('fedavg'), str(tmp_path))
  assert not capsys.readouterr().out
  assert sorted(os.listdir(tmp_path)) == [LOCK_NAME]


def test_a_run_finished_meanwhile_is_not_overwritten(tmp_path, monkeypatch):
  """Between a run's checks and its taking the lock, another run may finish
  the workdir (it held the lock then). The checks are made again under the
  lock: the finished run's files stay as they were."""
  from fedjax_metric import validation
  from fedjax_metric import workdir as workdir_lib

  config = load_config('fedavg')
  workdir = str(tmp_path)
  real_lock = workdir_lib.lock

  def lock_after_another_run_finished(path):
    with open(os.path.join(path, 'config.json'), 'w') as f:
      f.write(config.to_json_best_effort())
    with open(os.path.join(path, 'summary.json'), 'w') as f:
      json.dump({'rounds_completed': config.num_rounds, 'by': 'the other'}, f)
    return real_lock(path)

  monkeypatch.setattr(workdir_lib, 'lock', lock_after_another_run_finished)
  with pytest.raises(validation.ConfigError, match='finished by another run'):
    experiment.run(config, workdir)
  with open(tmp_path / 'summary.json') as f:
    assert json.load(f)['by'] == 'the other'
  assert not (tmp_path / 'metrics.jsonl').exists()
