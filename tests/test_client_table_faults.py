"""kill -9 at every point of a client table's life off the device.

One workdir is killed again and again, each time at another point, each
time resumed, and must end bit for bit where an uninterrupted run ends:
the server state, the metrics and every written row of the table. The
points (client_table.CRASH_ENV_VAR: the process exits at once, as kill -9
would, with whatever it wrote on disk):

  * 'gather': while reading the next call's rows (during a call);
  * 'scatter' (disk): halfway through writing a call's rows, after their
    undo record is on disk;
  * 'flush' (host): halfway through writing the rows changed since the last
    checkpoint into the rows file, at a checkpoint;
  * 'before_checkpoint': rows file synced, checkpoint not yet saved;
  * 'checkpoint': checkpoint saved (maybe not committed), journal not yet
    started again;
  * and a real SIGKILL between two checkpoints (the pause hook).

SCAFFOLD on Synthetic(1, 1), 60 clients, 6 a round, 10 rounds, a checkpoint
every 2: `launch.main` subprocesses sharing one compilation cache.
"""

import json
import os
import signal
import subprocess
import sys
import time

import conftest
import numpy as np
import orbax.checkpoint as ocp
import pytest

from fedjax_metric import client_table, faults

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def flags(placement):
  return [
    '--config=configs/scaffold.py',
    '--config.dataset.name=synthetic',
    '--config.num_clients=60',
    '--config.clients_per_round=6',
    '--config.num_rounds=10',
    '--config.local.steps=2',
    '--config.local.batch_size=4',
    '--config.local.learning_rate=0.01',
    '--config.eval_every=2',
    '--config.checkpoint_every=2',
    '--config.executor=host',
    '--config.progress=False',
    f'--config.client_table.placement={placement}',
  ]


@pytest.fixture(scope='module')
def jax_cache(tmp_path_factory):
  return str(tmp_path_factory.mktemp('jax_cache'))


def launch(workdir, placement, cache, *, crash=None, pause=None):
  env = dict(
    os.environ,
    **conftest.JAX_ENV,
    JAX_COMPILATION_CACHE_DIR=cache,
    JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS='0',
  )
  env.pop(client_table.CRASH_ENV_VAR, None)
  env.pop(faults.PAUSE_ENV_VAR, None)
  if crash:
    env[client_table.CRASH_ENV_VAR] = crash
  if pause is not None:
    env[faults.PAUSE_ENV_VAR] = str(pause)
  return subprocess.Popen(
    [
      sys.executable,
      '-m',
      'launch.main',
      *flags(placement),
      f'--workdir={workdir}',
    ],
    cwd=ROOT,
    env=env,
    stdin=subprocess.DEVNULL,
    stdout=subprocess.PIPE,
    stderr=subprocess.PIPE,
    text=True,
  )


def run(workdir, placement, cache, **kwargs):
  process = launch(workdir, placement, cache, **kwargs)
  out, err = process.communicate(timeout=600)
  return process.returncode, out + err


def final_state(workdir):
  """The last checkpoint (server state and written-rows bitmap), the rows
  file's written rows, and the metrics rows."""
  directory = os.path.join(workdir, 'checkpoints')
  steps = sorted(int(s) for s in os.listdir(directory) if s.isdigit())
  with ocp.StandardCheckpointer() as checkpointer:
    item = checkpointer.restore(
      os.path.join(directory, str(steps[-1]), 'default')
    )
  with open(os.path.join(workdir, 'client_table', 'meta.json')) as f:
    meta = json.load(f)
  written = np.unpackbits(
    np.asarray(item['client_table']['written']), count=meta['num_clients']
  ).astype(bool)
  rows = np.fromfile(
    os.path.join(workdir, 'client_table', 'rows.bin'), np.uint8
  ).reshape(meta['num_clients'], meta['row_bytes'])
  with open(os.path.join(workdir, 'metrics.jsonl')) as f:
    metrics = [json.loads(line) for line in f]
  return steps[-1], item['server_state'], written, rows[written], metrics


def assert_same(a, b):
  step_a, state_a, written_a, rows_a, metrics_a = a
  step_b, state_b, written_b, rows_b, metrics_b = b
  assert step_a == step_b == 10
  np.testing.assert_array_equal(written_a, written_b)
  np.testing.assert_array_equal(rows_a, rows_b)
  import jax

  for x, y in zip(jax.tree.leaves(state_a), jax.tree.leaves(state_b)):
    np.testing.assert_array_equal(np.asarray(x), np.asarray(y))
  for row_a, row_b in zip(metrics_a, metrics_b):
    assert row_a['round'] == row_b['round']
    assert row_a['test_accuracy'] == row_b['test_accuracy']
    assert row_a['train_loss'] == row_b['train_loss']


# Kill points in order (each one's round comes after the last checkpoint
# the one before left): a call is labelled by its round index (first round
# 0), a checkpoint by the rounds done.
KILLS = {
  'host': ['gather@4', 'flush@6', 'before_checkpoint@6', 'checkpoint@8'],
  'disk': ['gather@4', 'scatter@4', 'before_checkpoint@6', 'checkpoint@8'],
}


# The host table's kills are the slow half (make test-all); the disk's,
# which cover the scatter too, stay in the quick tier.
@pytest.mark.parametrize(
  'placement', [pytest.param('host', marks=pytest.mark.slow), 'disk']
)
def test_killed_anywhere_it_resumes_bit_identical(
  tmp_path, jax_cache, placement
):
  reference = str(tmp_path / 'reference')
  code, output = run(reference, placement, jax_cache)
  assert code == 0, output[-3000:]
  killed = str(tmp_path / 'killed')
  for point in KILLS[placement]:
    code, output = run(killed, placement, jax_cache, crash=point)
    assert code == 137, (point, output[-3000:])
    assert not os.path.exists(os.path.join(killed, 'summary.json'))
  # A real SIGKILL between checkpoints 8 and 10, after round 9's writes.
  process = launch(killed, placement, jax_cache, pause=9)
  marker = os.path.join(killed, faults.PAUSE_MARKER)
  deadline = time.time() + 300
  while not os.path.exists(marker):
    assert process.poll() is None, process.communicate()
    assert time.time() < deadline
    time.sleep(0.05)
  os.remove(marker)
  process.send_signal(signal.SIGKILL)
  process.communicate(timeout=60)
  journals = [
    name
    for name in os.listdir(os.path.join(killed, 'client_table'))
    if name.startswith('undo_')
  ]
  assert journals  # what the resume below must undo
  code, output = run(killed, placement, jax_cache)
  assert code == 0, output[-3000:]
  assert 'Resuming' in output
  assert_same(final_state(killed), final_state(reference))
