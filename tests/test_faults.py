"""Faults and user errors, with real processes and damaged files.

Runs that must be interrupted are `launch.main` subprocesses paused at a
known round by the test hook (faults.PAUSE_ENV_VAR), then sent SIGTERM,
SIGINT or SIGKILL. Subprocesses share one JAX compilation cache so that only
the first compiles. Everything else runs in-process on :runlocal configs.
"""

import gc
import glob
import json
import math
import os
import shutil
import signal
import subprocess
import sys
import time

import conftest
import jax
import numpy as np
import orbax.checkpoint as ocp
import pytest
import test_experiment
from test_experiment import final_params, jax_leaves, read_metrics

from fedjax_metric import event_log, faults
from fedjax_metric import experiment as experiment_lib

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# No partition plot: matplotlib would add a second to every run.
RUNLOCAL = [
  '--config=configs/fedavg.py:runlocal',
  '--config.progress=False',
  '--config.plot_partition=False',
]


def load_config(name):
  """The in-process twin of RUNLOCAL (same config.json)."""
  config = test_experiment.load_config(name)
  config.plot_partition = False
  return config


@pytest.fixture(scope='module')
def jax_cache(tmp_path_factory):
  return str(tmp_path_factory.mktemp('jax_cache'))


def launch(workdir, *flags, cache, pause=None):
  """`python -m launch.main` in the background; ``pause``: the round after
  which it waits for a signal (marker file faults.PAUSE_MARKER)."""
  # conftest's JAX settings: results are compared with in-process runs.
  env = dict(
    os.environ,
    **conftest.JAX_ENV,
    JAX_COMPILATION_CACHE_DIR=cache,
    JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS='0',
    JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES='0',
  )
  env.pop(faults.PAUSE_ENV_VAR, None)
  if pause is not None:
    env[faults.PAUSE_ENV_VAR] = str(pause)
  return subprocess.Popen(
    [
      sys.executable,
      '-m',
      'launch.main',
      *RUNLOCAL,
      *flags,
      f'--workdir={workdir}',
    ],
    cwd=ROOT,
    env=env,
    stdout=subprocess.PIPE,
    stderr=subprocess.PIPE,
    text=True,
  )


def wait_for_pause(process, workdir, timeout=300):
  marker = os.path.join(workdir, faults.PAUSE_MARKER)
  deadline = time.time() + timeout
  while not os.path.exists(marker):
    if process.poll() is not None:
      pytest.fail(
        f'exited {process.returncode} before pausing: {process.communicate()}'
      )
    assert time.time() < deadline, 'no pause'
    time.sleep(0.05)
  os.remove(marker)


def finish(process):
  out, err = process.communicate(timeout=120)
  return process.returncode, out, err


def run_cli(*flags, workdir, cache):
  return finish(launch(workdir, *flags, cache=cache))


def logged_rounds(workdir, tag='test_accuracy'):
  """Steps of ``tag`` over every event file, sorted, duplicates kept."""
  return sorted(
    step for _, step, t, _ in event_log.scalars(workdir) if t == tag
  )


def checkpoint_dirs(workdir):
  return sorted(os.listdir(os.path.join(workdir, 'checkpoints')))


# ---------------------------------------------------------------------------
# Signals and kill -9.
# ---------------------------------------------------------------------------


def four_rounds():
  """:runlocal, 4 rounds, checkpoints only at the end (and on signals)."""
  config = load_config('fedavg')
  config.num_rounds = 4
  config.checkpoint_every = 100
  return config


@pytest.fixture(scope='module')
def straight(tmp_path_factory):
  """An uninterrupted, finished run of `four_rounds`."""
  workdir = str(tmp_path_factory.mktemp('straight'))
  return workdir, experiment_lib.run(four_rounds(), workdir)


# Slow (several killed subprocesses): make test-all.
@pytest.mark.slow
def test_signals_kill_and_a_truncated_checkpoint_resume_to_the_same_run(
  tmp_path, jax_cache, capsys, straight
):
  """4 rounds, no scheduled checkpoint before the end: SIGTERM after round
  1, SIGINT after round 2 (each saves one), kill -9 after round 3 (loses
  round 3, whose events and metrics were flushed); then round 2's array data
  is cut in half. The rerun falls back to round 1 and ends with the model,
  metrics and TensorBoard stream of an uninterrupted run."""
  workdir = str(tmp_path / 'interrupted')
  flags = ('--config.num_rounds=4', '--config.checkpoint_every=100')

  for done, sig in ((1, signal.SIGTERM), (2, signal.SIGINT)):
    process = launch(workdir, *flags, cache=jax_cache, pause=done)
    wait_for_pause(process, workdir)
    process.send_signal(sig)
    code, out, err = finish(process)
    assert code == 128 + sig, (out, err)
    assert f'Stopped by {sig.name} after round {done}' in out, (out, err)
    assert 'Traceback' not in out + err
    assert checkpoint_dirs(workdir) == [str(r) for r in range(1, done + 1)]
    assert not os.path.exists(os.path.join(workdir, 'summary.json'))
    # Flushed at every evaluation, each round once.
    assert logged_rounds(workdir) == list(range(1, done + 1))

  process = launch(workdir, *flags, cache=jax_cache, pause=3)
  wait_for_pause(process, workdir)
  process.kill()
  assert finish(process)[0] == -signal.SIGKILL
  assert checkpoint_dirs(workdir) == ['1', '2']  # Round 3 is lost...
  assert [r['round'] for r in read_metrics(workdir)] == [1, 2, 3]
  assert logged_rounds(workdir) == [1, 2, 3]  # ... but was logged.

  truncate_array_data(os.path.join(workdir, 'checkpoints', '2'))
  summary = experiment_lib.run(four_rounds(), workdir)
  out = capsys.readouterr().out
  assert 'round(s) 2 cannot be restored' in out
  assert 'Resuming from the newest readable one, round 1' in out
  assert f'Resuming {workdir} from round 1' in out
  moved = glob.glob(os.path.join(workdir, faults.UNREADABLE_DIR, '2.*'))
  assert len(moved) == 1
  assert summary['rounds_completed'] == 4
  for x, y in zip(
    jax_leaves(final_params(straight[0])), jax_leaves(final_params(workdir))
  ):
    np.testing.assert_array_equal(x, y)
  rows = read_metrics(workdir)
  assert [r['round'] for r in rows] == [1, 2, 3, 4]
  assert rows[-1]['test_loss'] == read_metrics(straight[0])[-1]['test_loss']
  assert logged_rounds(workdir) == [1, 2, 3, 4]
  assert logged_rounds(workdir, 'train_loss') == [1, 2, 3, 4]
  # wall_time restarts with each session; total_wall_time goes on.
  totals = [r['total_wall_time'] for r in rows]
  assert all(a < b for a, b in zip(totals, totals[1:]))
  assert rows[-1]['total_wall_time'] > rows[-1]['wall_time'] + 0.01
  assert logged_rounds(workdir, 'total_wall_time') == [1, 2, 3, 4]


def test_a_signal_between_calls_of_two_rounds_resumes_to_the_same_run(
  tmp_path, jax_cache
):
  """The rounds-in-one-program path (`sequential`, 2 rounds per call): a
  SIGTERM at the call boundary after round 2 saves round 2 and stops; the
  rerun ends with the model of an uninterrupted in-process run."""
  flags = (
    '--config.executor=sequential',
    '--config.num_rounds=4',
    '--config.eval_every=2',
    '--config.checkpoint_every=100',
  )
  workdir = str(tmp_path / 'interrupted')
  process = launch(workdir, *flags, cache=jax_cache, pause=2)
  wait_for_pause(process, workdir)
  process.send_signal(signal.SIGTERM)
  code, out, err = finish(process)
  assert code == 128 + signal.SIGTERM, (out, err)
  assert '2 rounds per call' in out
  assert 'Stopped by SIGTERM after round 2' in out, (out, err)
  assert checkpoint_dirs(workdir) == ['2']
  assert finish(launch(workdir, *flags, cache=jax_cache))[0] == 0
  config = four_rounds()
  config.executor, config.eval_every = 'sequential', 2
  straight_dir = str(tmp_path / 'straight')
  assert experiment_lib.run(config, straight_dir)['rounds_per_call'] == 2
  for x, y in zip(
    jax_leaves(final_params(straight_dir)), jax_leaves(final_params(workdir))
  ):
    np.testing.assert_array_equal(x, y)
  assert [r['round'] for r in read_metrics(workdir)] == [2, 4]


# ---------------------------------------------------------------------------
# Non-finite state.
# ---------------------------------------------------------------------------

# A server step of 1e20 x the mean update: round 1 ends with large finite
# weights (up to 5.5e17, below faults.LARGEST_GOOD_MAGNITUDE: a good state),
# round 2 with NaN, which is due to be saved (every round) but not evaluated
# (every 4) -- FedRCL's eval_every > checkpoint_every. Only the server step
# differs from RUNLOCAL: the clients' programs come from the compilation
# cache. (At 1e38, round 1 already holds 5e35: not a good state either,
# test_a_state_of_absurd_magnitude_is_not_saved.)
DIVERGING = {
  'num_rounds': 4,
  'eval_every': 4,
  'checkpoint_every': 1,
  'keep_checkpoints': 5,
  'server.learning_rate': 1e20,
}


def save_as_an_older_version(directory, step, tree):
  """A checkpoint as versions before the checksum wrote them: by orbax's
  manager (so with its _CHECKPOINT_METADATA), without 'sha256'."""
  with ocp.CheckpointManager(
    directory, item_handlers=ocp.StandardCheckpointHandler()
  ) as manager:
    manager.save(step, args=ocp.args.StandardSave(tree), force=True)


def test_nan_is_never_checkpointed_and_the_error_is_one_line(
  tmp_path, jax_cache
):
  workdir = str(tmp_path / 'run')
  code, out, err = run_cli(
    *[f'--config.{k}={v}' for k, v in DIVERGING.items()],
    workdir=workdir,
    cache=jax_cache,
  )
  assert code == 1, (out, err)
  lines = [line for line in err.splitlines() if line.strip()]
  assert len(lines) == 1 and lines[0].startswith('error: '), err
  assert 'NaN or infinite values at round 2' in err
  assert 'last good checkpoint (round 1)' in err
  # The server's step diverged here, and the message names it.
  assert 'lower --config.server.learning_rate (now 1e+20, optimizer sgd)' in err
  # Round 1's save was in flight when round 2 failed: it completed cleanly
  # (no temporary directory, no orbax traceback after the error).
  assert checkpoint_dirs(workdir) == ['1']
  round_1 = os.path.join(workdir, 'checkpoints', '1', 'default')
  with ocp.StandardCheckpointer() as checkpointer:
    state = checkpointer.restore(round_1)
  assert faults.all_finite(state)

  # A NaN checkpoint of round 2, as the code before this check saved them
  # (eval_every > checkpoint_every): a rerun must not resume from it.
  poisoned = jax.tree.map(
    lambda x: (
      np.full_like(x, np.nan)
      if np.issubdtype(np.asarray(x).dtype, np.floating)
      else x
    ),
    state,
  )
  save_as_an_older_version(os.path.join(workdir, 'checkpoints'), 2, poisoned)
  said = []
  step, restored = faults.restore_newest_readable(
    os.path.join(workdir, 'checkpoints'),
    state,
    workdir=workdir,
    chief=True,
    report=said.append,
  )
  assert step == 1 and faults.all_finite(restored)
  assert 'round 2: FloatingPointError: it holds NaN' in said[0]
  assert checkpoint_dirs(workdir) == ['1']
  assert glob.glob(os.path.join(workdir, faults.UNREADABLE_DIR, '2.*'))


# ---------------------------------------------------------------------------
# Damaged checkpoints.
# ---------------------------------------------------------------------------


def truncate_array_data(step_dir):
  files = [
    f
    for f in glob.glob(os.path.join(step_dir, '**', 'd', '*'), recursive=True)
    if os.path.isfile(f)
  ]
  biggest = max(files, key=os.path.getsize)
  with open(biggest, 'r+b') as f:
    f.truncate(os.path.getsize(biggest) // 2)


def remove_item(step_dir):
  shutil.rmtree(os.path.join(step_dir, 'default'))


@pytest.fixture(scope='module')
def two_checkpoints(tmp_path_factory):
  """A run stopped after round 2 of 3, with checkpoints of rounds 1 and 2,
  in a workdir where an attempt with another config (seed 7) had failed
  before saving a checkpoint: its config.json, a metrics line and a
  participation plot are left over."""
  workdir = str(tmp_path_factory.mktemp('two_checkpoints'))
  config = load_config('fedavg')
  config.num_rounds = 3
  failed = load_config('fedavg')
  failed.seed = 7
  with open(os.path.join(workdir, 'config.json'), 'w') as f:
    f.write(failed.to_json_best_effort())
  with open(os.path.join(workdir, 'metrics.jsonl'), 'w') as f:
    f.write(json.dumps({'round': 1, 'wall_time': 1.0, 'test_accuracy': 0.5}))
    f.write('\n')
  open(os.path.join(workdir, 'participation.png'), 'w').close()
  experiment_lib.run(config, workdir, stop_after_round=2)
  return config, workdir


def test_a_checkpoint_missing_its_item_is_skipped(two_checkpoints, tmp_path):
  _, original = two_checkpoints
  workdir = str(tmp_path / 'run')
  shutil.copytree(original, workdir)
  directory = os.path.join(workdir, 'checkpoints')
  with ocp.StandardCheckpointer() as checkpointer:
    template = checkpointer.restore(os.path.join(directory, '1', 'default'))
  remove_item(os.path.join(directory, '2'))
  said = []
  step, _ = faults.restore_newest_readable(
    directory, template, workdir=workdir, chief=True, report=said.append
  )
  assert step == 1 and 'round 2: ' in said[0]
  assert checkpoint_dirs(workdir) == ['1']


def test_no_readable_checkpoint_is_a_clear_error_that_moves_nothing(
  two_checkpoints, tmp_path
):
  config, original = two_checkpoints
  workdir = str(tmp_path / 'run')
  shutil.copytree(original, workdir)
  for step in ('1', '2'):
    truncate_array_data(os.path.join(workdir, 'checkpoints', step))
  with pytest.raises(
    faults.CheckpointError, match='round 2: .*round 1: .*Delete that directory'
  ):
    experiment_lib.run(config, workdir)
  assert checkpoint_dirs(workdir) == ['1', '2']


def test_unreadable_checkpoints_leave_no_reads_in_flight(
  tmp_path, capfd, monkeypatch
):
  """orbax reads a checkpoint's arrays concurrently and, when one read
  fails, stops waiting for the others; they used to finish later, onto a
  closed event loop ("RuntimeError: Event loop is closed" tracebacks on
  stderr) or as coroutines garbage-collected unfinished ("Exception ignored
  in ..."): about 190 lines after the CLI's one-line error. Many arrays keep
  many reads in flight when the truncated one fails."""
  directory = str(tmp_path / 'checkpoints')
  rng = np.random.default_rng(0)  # Incompressible: the data file is big.
  tree = {
    f'w{i:02d}': rng.standard_normal(20_000, np.float32) for i in range(48)
  }
  with ocp.CheckpointManager(directory) as manager:
    for step in (1, 2):
      manager.save(step, args=ocp.args.StandardSave(tree))
  for step in ('1', '2'):
    truncate_array_data(os.path.join(directory, step))
  ignored = []  # What Python reports through sys.unraisablehook.
  monkeypatch.setattr(sys, 'unraisablehook', ignored.append)
  capfd.readouterr()
  with pytest.raises(faults.CheckpointError, match='round 2: .*round 1: '):
    faults.restore_newest_readable(
      directory, tree, workdir=str(tmp_path), chief=True, report=print
    )
  time.sleep(1.0)  # Abandoned reads, if any, report within milliseconds.
  gc.collect()
  err = capfd.readouterr().err
  assert 'Traceback' not in err and 'Exception ignored' not in err, err[:2000]
  assert not ignored, [(u.exc_value, u.object) for u in ignored[:3]]


# ---------------------------------------------------------------------------
# Finished runs and other configs.
# ---------------------------------------------------------------------------


def test_cli_refusal_is_one_line_without_a_nan_result(straight, jax_cache):
  workdir, _ = straight
  code, out, err = run_cli(
    '--config.num_rounds=1',
    '--config.checkpoint_every=100',
    workdir=workdir,
    cache=jax_cache,
  )
  assert code == 1
  assert 'nan' not in out + err and 'Traceback' not in err
  assert err.strip().startswith('error: ')
  assert len(err.strip().splitlines()) == 1
  assert 'num_rounds=1 asks for fewer' in err


# ---------------------------------------------------------------------------
# A failed start never blocks its fix.
# ---------------------------------------------------------------------------


# ---------------------------------------------------------------------------
# Validation: one clear line naming the field and the fix.
# ---------------------------------------------------------------------------


def _set(path, value):
  def change(config):
    *parents, leaf = path.split('.')
    node = config
    for p in parents:
      node = node[p]
    node[leaf] = value

  return change


# ---------------------------------------------------------------------------
# Config arguments the README documents.
# ---------------------------------------------------------------------------


def _config_names():
  return sorted(
    os.path.basename(p)[:-3]
    for p in glob.glob(os.path.join(ROOT, 'configs', '*.py'))
    if not os.path.basename(p).startswith(('_', 'common'))
  )


def _supervised_config_names():
  """Configs of the supervised settings, which document central, model and
  dataset; the one-class, participation and unsupervised families take their
  own arguments (each config's docstring lists them)."""
  import importlib  # pylint: disable=g-import-not-at-top

  return [
    n
    for n in _config_names()
    if 'central' in (importlib.import_module(f'configs.{n}').__doc__ or '')
  ]


def test_cli_errors_are_one_line_and_verbose_shows_the_traceback(
  tmp_path, jax_cache
):
  workdir = str(tmp_path / 'run')
  typo = '--config.dataset.name=fashion-mnist'
  code, out, err = run_cli(typo, workdir=workdir, cache=jax_cache)
  assert code == 1 and not out
  assert (
    err.strip().splitlines() == [err.strip()]
    and "Did you mean 'fashion_mnist'" in err
  )
  assert not os.path.exists(workdir)
  code, _, err = run_cli(typo, '--verbose', workdir=workdir, cache=jax_cache)
  assert code == 1 and 'Traceback' in err and 'check_available' in err


def _flip_metadata_digest(step_dir):
  path = os.path.join(step_dir, '_CHECKPOINT_METADATA')
  with open(path) as f:
    meta = json.load(f)
  digest = meta['custom_metadata']['sha256']
  meta['custom_metadata']['sha256'] = ('0' if digest[0] != '0' else '1') + (
    digest[1:]
  )
  with open(path, 'w') as f:
    json.dump(meta, f)


def test_a_checkpoint_that_fails_its_checksum_falls_back(tmp_path, capsys):
  """Arrays that differ from the checksum saved with them (a flipped bit on
  disk) are not loaded: the checkpoint is moved aside and the run resumes
  from the previous one, ending where a straight run ends."""
  config = load_config('fedavg')
  config.num_rounds = 3
  config.checkpoint_every = 1
  config.keep_checkpoints = 3
  straight = tmp_path / 'straight'
  experiment_lib.run(config, str(straight))
  damaged = tmp_path / 'damaged'
  experiment_lib.run(config, str(damaged), stop_after_round=2)
  # The digest is of the arrays as saved: an untouched checkpoint passes.
  step, _ = faults.restore_newest_readable(
    str(damaged / 'checkpoints'),
    faults_template(config),
    workdir=str(damaged),
    chief=True,
    report=print,
  )
  assert step == 2
  _flip_metadata_digest(str(damaged / 'checkpoints' / '2'))
  experiment_lib.run(config, str(damaged))
  out = capsys.readouterr().out
  assert 'round 2: ValueError: its arrays do not match the checksum' in out
  assert 'Resuming from the newest readable one, round 1' in out
  assert os.listdir(damaged / faults.UNREADABLE_DIR)
  for u, v in zip(
    jax_leaves(final_params(straight)), jax_leaves(final_params(damaged))
  ):
    np.testing.assert_array_equal(u, v)


def faults_template(config):
  from fedjax_metric import assemble  # pylint: disable=g-import-not-at-top

  experiment = assemble.build(config)
  server_state, client_table = assemble.initial_state(config, experiment)
  return {'server_state': server_state, 'client_table': client_table}


def test_a_signal_while_the_stop_checkpoint_is_written_does_not_interrupt_it(
  capsys,
):
  """Inside `finishing_save` a second SIGINT neither raises nor stops the
  save: it is acknowledged in one line, and the handler it leaves behind is
  the default one (a third signal kills). On leaving, the previous handlers
  are back. (Without it, a second Ctrl-C during the save made orbax log a
  traceback from its writer thread: reproduced by hand with two SIGINTs
  0.05 s apart.)"""
  with faults.StopSignals() as stop:
    os.kill(os.getpid(), signal.SIGINT)  # The first: a stop is asked for.
    deadline = time.time() + 5
    while stop.signal_name is None and time.time() < deadline:
      time.sleep(0.01)
    assert stop.signal_name == 'SIGINT'
    after_first = signal.getsignal(signal.SIGINT)
    with stop.finishing_save():
      os.kill(os.getpid(), signal.SIGINT)  # The second, during the save.
      time.sleep(0.05)  # Python runs handlers between bytecodes.
      assert signal.getsignal(signal.SIGINT) is signal.SIG_DFL
    assert signal.getsignal(signal.SIGINT) is after_first
  err = capsys.readouterr().err
  assert 'SIGINT: the checkpoint is being written' in err
  assert 'Traceback' not in err


# ---------------------------------------------------------------------------
# Checksums that are missing; what a damaged checkpoint's message says.
# ---------------------------------------------------------------------------


def flip_a_byte(step_dir):
  """Flips one byte in the middle of the largest array data file."""
  files = [
    f
    for f in glob.glob(os.path.join(step_dir, '**', 'd', '*'), recursive=True)
    if os.path.isfile(f)
  ]
  biggest = max(files, key=os.path.getsize)
  with open(biggest, 'r+b') as f:
    f.seek(os.path.getsize(biggest) // 2)
    byte = f.read(1)
    f.seek(-1, os.SEEK_CUR)
    f.write(bytes([byte[0] ^ 0xFF]))


def copy_of_two_checkpoints(two_checkpoints, tmp_path):
  """A copy of the fixture's workdir, its checkpoints directory and the
  template round 1 restores into."""
  _, original = two_checkpoints
  workdir = str(tmp_path / 'run')
  shutil.copytree(original, workdir)
  directory = os.path.join(workdir, 'checkpoints')
  with ocp.StandardCheckpointer() as checkpointer:
    template = checkpointer.restore(os.path.join(directory, '1', 'default'))
  return workdir, directory, template


def test_a_checkpoint_without_its_checksums_is_not_loaded(
  two_checkpoints, tmp_path
):
  """The fault trial's case: round 2's _CHECKPOINT_METADATA (where the
  SHA-256 of its arrays is kept) is gone and a byte of its arrays flipped.
  Its arrays cannot be verified, so it is not loaded: the newest verified
  checkpoint (round 1) is."""
  workdir, directory, template = copy_of_two_checkpoints(
    two_checkpoints, tmp_path
  )
  os.remove(os.path.join(directory, '2', '_CHECKPOINT_METADATA'))
  flip_a_byte(os.path.join(directory, '2'))
  said = []
  step, restored = faults.restore_newest_readable(
    directory, template, workdir=workdir, chief=True, report=said.append
  )
  assert step == 1
  assert faults.saved_digest(os.path.join(directory, '1')) == (
    faults.state_digest(restored)
  )
  assert 'round 2: ' in said[0] and 'checksum' in said[0], said
  assert checkpoint_dirs(workdir) == ['1']
  # Unparsable metadata (a torn write) is the same: unverified.
  with open(os.path.join(directory, '1', '_CHECKPOINT_METADATA'), 'w') as f:
    f.write('{"item_handlers": {"default": ')
  with pytest.raises(faults.CheckpointError, match='round 1: .*checksum'):
    faults.restore_newest_readable(
      directory, template, workdir=workdir, chief=True, report=said.append
    )


def test_a_checkpoint_from_before_checksums_loads_with_a_note(
  two_checkpoints, tmp_path
):
  """A checkpoint written before the checksum existed has its metadata file,
  without 'sha256': it is restored (older workdirs resume), and the note
  says it was not verified."""
  workdir, directory, template = copy_of_two_checkpoints(
    two_checkpoints, tmp_path
  )
  path = os.path.join(directory, '2', '_CHECKPOINT_METADATA')
  with open(path) as f:
    meta = json.load(f)
  del meta['custom_metadata']['sha256']
  with open(path, 'w') as f:
    json.dump(meta, f)
  said = []
  step, _ = faults.restore_newest_readable(
    directory, template, workdir=workdir, chief=True, report=said.append
  )
  assert step == 2
  assert len(said) == 1 and 'round 2' in said[0] and 'not verified' in said[0]
  assert checkpoint_dirs(workdir) == ['1', '2']


def test_a_truncated_checkpoint_is_reported_by_its_cause(tmp_path):
  """orbax wraps TensorStore's read error in one whose message ends with a
  method's repr ("See full TensorStore details: <bound method ...>"): the
  report gives the cause instead."""
  directory = str(tmp_path / 'checkpoints')
  # jax arrays, as a run's: orbax reads numpy ones by another path.
  tree = {'w': jax.numpy.arange(20_000, dtype=np.float32)}
  with ocp.CheckpointManager(directory) as manager:
    for step in (1, 2):
      manager.save(step, args=ocp.args.StandardSave(tree))
  truncate_array_data(os.path.join(directory, '2'))
  said = []
  step, _ = faults.restore_newest_readable(
    directory, tree, workdir=str(tmp_path), chief=True, report=said.append
  )
  assert step == 1
  assert 'round 2: ' in said[0]
  assert 'bound method' not in said[0] and 'TensorStore details' not in said[0]
  assert 'Error reading' in said[0], said[0]


# ---------------------------------------------------------------------------
# What a good checkpoint is.
# ---------------------------------------------------------------------------


def test_a_round_whose_evaluation_is_not_finite_is_not_saved(
  tmp_path, monkeypatch
):
  """A finite state whose evaluation is NaN (here made so at round 2) is not
  a good checkpoint: the run stops there, keeping round 1's, and the row of
  round 2 stays in metrics.jsonl to show why."""
  from fedjax_metric.evaluation import protocols  # pylint: disable=g-import-not-at-top

  make = protocols.make_evaluator

  def nan_at_round_2(*args, **kwargs):
    evaluator = make(*args, **kwargs)
    calls = []

    def every(*state):
      calls.append(1)
      row = evaluator.every(*state)
      return {**row, 'test_loss': math.nan} if len(calls) == 2 else row

    return evaluator._replace(every=every)

  monkeypatch.setattr(protocols, 'make_evaluator', nan_at_round_2)
  config = load_config('fedavg')
  config.num_rounds = 3
  config.checkpoint_every = 1
  config.keep_checkpoints = 3
  workdir = str(tmp_path / 'run')
  with pytest.raises(FloatingPointError) as info:
    experiment_lib.run(config, workdir)
  message = str(info.value)
  assert 'test_loss is nan at round 2' in message, message
  assert 'last good checkpoint (round 1)' in message, message
  assert checkpoint_dirs(workdir) == ['1']
  rows = read_metrics(workdir)
  assert [r['round'] for r in rows] == [1, 2] and math.isnan(
    rows[-1]['test_loss']
  )


def test_a_state_of_absurd_magnitude_is_not_saved(tmp_path):
  """The fault trial's diverging run (a server step of 1e38 x the mean
  update) kept round 1's checkpoint, whose weights reached 5e35: finite, but
  every squared norm of them overflows float32, and the next round is NaN.
  Such a state is not a good checkpoint either."""
  config = load_config('fedavg')
  for key, value in DIVERGING.items():
    _set(key, value)(config)
  config.server.learning_rate = 1e38
  workdir = str(tmp_path / 'run')
  with pytest.raises(FloatingPointError) as info:
    experiment_lib.run(config, workdir)
  message = str(info.value)
  assert 'magnitude' in message and 'at round 1' in message, message
  assert 'no checkpoint was saved' in message, message
  assert not os.listdir(os.path.join(workdir, 'checkpoints'))
  # A checkpoint of such values (an older version's) is not resumed from.
  state = faults_template(config)
  save_as_an_older_version(
    os.path.join(workdir, 'checkpoints'),
    1,
    jax.tree.map(lambda x: x * 1e30 if x.dtype == np.float32 else x, state),
  )
  with pytest.raises(faults.CheckpointError, match='round 1: .*magnitude'):
    faults.restore_newest_readable(
      os.path.join(workdir, 'checkpoints'),
      state,
      workdir=workdir,
      chief=True,
      report=print,
    )
