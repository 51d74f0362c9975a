"""Multi-process runs: two local CPU processes equal one process.

Both runs use 4 CPU devices in all: two `launch.main` processes with 2 each
(jax.distributed over localhost, gloo collectives), and one `launch.main`
process with 4. Same mesh size, same cohorts and keys, so
the same model up to float reduction order.
"""

import json
import os
import socket
import subprocess
import sys

import conftest
import jax
import numpy as np
import orbax.checkpoint as ocp
import pytest

from fedjax_metric import executors, faults
from launch import main as launch_main

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# A hung collective fails the test instead of hanging the suite.
TIMEOUT_S = 240
RUN_FLAGS = (
  '--config=configs/fedavg.py:runlocal',
  '--config.executor=vmap',
  '--config.num_rounds=2',
  '--config.progress=False',
  '--config.plot_partition=False',
)


def free_port():
  with socket.socket() as s:
    s.bind(('127.0.0.1', 0))
    return s.getsockname()[1]


def start(workdir, num_devices, *flags, run_flags=RUN_FLAGS):
  env = dict(
    os.environ,
    JAX_PLATFORMS='cpu',
    JAX_NUM_CPU_DEVICES=str(num_devices),
    PYTHONPATH=os.pathsep.join(
      filter(None, [ROOT, os.environ.get('PYTHONPATH')])
    ),
  )
  # Only the suite's compile flags: a user's could force another device count.
  env['XLA_FLAGS'] = conftest.SUITE_XLA_FLAGS
  # Programs of a 2-process run are not shared with one-process ones.
  env.pop('JAX_COMPILATION_CACHE_DIR', None)
  return subprocess.Popen(
    [
      sys.executable,
      '-m',
      'launch.main',
      *run_flags,
      f'--workdir={workdir}',
      *flags,
    ],
    cwd=ROOT,
    env=env,
    stdout=subprocess.PIPE,
    stderr=subprocess.PIPE,
    text=True,
  )


def finish(procs):
  """Waits for every process; on a timeout kills all (a peer may be hung)."""
  try:
    return [p.communicate(timeout=TIMEOUT_S) for p in procs]
  except subprocess.TimeoutExpired:
    for p in procs:
      p.kill()
    outputs = [p.communicate() for p in procs]
    pytest.fail(
      f'Timed out after {TIMEOUT_S}s; stderr tails: '
      f'{[err[-2000:] for _, err in outputs]}'
    )


def final_server_state(workdir):
  """The last checkpoint's server state as NumPy, whatever devices wrote it."""
  return whole_checkpoint(workdir)['server_state']


def whole_checkpoint(workdir):
  """The last checkpoint's whole item as NumPy arrays."""
  path = os.path.join(workdir, 'checkpoints', '2', 'default')
  checkpointer = ocp.PyTreeCheckpointer()
  tree = checkpointer.metadata(path).item_metadata.tree
  numpy_args = jax.tree.map(
    lambda _: ocp.RestoreArgs(restore_type=np.ndarray), tree
  )
  return checkpointer.restore(path, restore_args=numpy_args)


def read(workdir, name):
  with open(os.path.join(workdir, name)) as f:
    return f.read()


def two_processes_and_one(multi, single, run_flags=RUN_FLAGS):
  """Runs ``run_flags`` as two processes of 2 CPU devices each into
  ``multi`` and, the reference, as one process of 4 into ``single`` (also a
  child process, so the test compares CPU runs on any machine, a GPU one
  included); returns the three processes' (stdout, stderr), each checked to
  have succeeded."""
  address = f'127.0.0.1:{free_port()}'
  procs = [
    start(
      multi,
      2,
      f'--coordinator_address={address}',
      '--num_processes=2',
      f'--process_id={i}',
      run_flags=run_flags,
    )
    for i in (0, 1)
  ]
  procs.append(start(single, 4, run_flags=run_flags))
  outputs = finish(procs)
  for p, (_, err) in zip(procs, outputs):
    assert p.returncode == 0, err[-3000:]
  return outputs


def test_two_processes_equal_one(tmp_path):
  multi, single = str(tmp_path / 'multi'), str(tmp_path / 'single')
  (out0, _), (out1, _), _ = two_processes_and_one(multi, single)
  # One mesh over both processes' devices; process 0 alone reports and writes.
  assert 'executor=vmap on 4 cpu device(s)' in out0
  assert 'test_accuracy=' in out0 and 'test_accuracy=' not in out1
  assert len(read(multi, 'metrics.jsonl').splitlines()) == 2

  summaries = [json.loads(read(w, 'summary.json')) for w in (multi, single)]
  for key in ('test_accuracy', 'test_loss', 'train_loss'):
    np.testing.assert_allclose(summaries[0][key], summaries[1][key], atol=1e-5)
  assert summaries[0]['rounds_completed'] == 2
  states = [final_server_state(w) for w in (multi, single)]
  leaves = [jax.tree.leaves(s) for s in states]
  assert jax.tree.structure(states[0]) == jax.tree.structure(states[1])
  for x, y in zip(*leaves):
    np.testing.assert_allclose(x, y, atol=1e-5)
  assert int(states[0]['round']) == 2
  # The two processes saved the checksum of the global arrays: the digest
  # of the checkpoint as read back here in one process.
  saved = faults.saved_digest(os.path.join(multi, 'checkpoints', '2'))
  assert saved == faults.state_digest(whole_checkpoint(multi))


def test_examples_made_per_call_in_two_processes_equal_one(tmp_path):
  """A population made on demand (synthetic) brings each call's examples
  with it; on one call per round the cohort's indices are re-based on the
  host before the cohort is sharded, since a sharded index array spans the
  other process's devices and cannot be read back."""
  flags = (
    '--config=configs/fedavg.py:runlocal,dataset=synthetic',
    '--config.executor=vmap',
    '--config.rounds_per_call=1',
    '--config.num_rounds=2',
    '--config.progress=False',
    '--config.plot_partition=False',
  )
  multi, single = str(tmp_path / 'multi'), str(tmp_path / 'single')
  two_processes_and_one(multi, single, flags)
  states = [final_server_state(w) for w in (multi, single)]
  for x, y in zip(*map(jax.tree.leaves, states)):
    np.testing.assert_allclose(x, y, atol=1e-5)


@pytest.mark.parametrize(
  'flags, match',
  [
    (('127.0.0.1:1234', 2, None), 'all three'),
    ((None, None, 0), 'all three'),
    (('127.0.0.1', 2, 0), 'host:port'),
    (('127.0.0.1:1234', 2, 2), r'\[0, 2\)'),
    (('127.0.0.1:1234', 0, 0), '>= 1'),
  ],
)
def test_bad_distributed_flags_are_clear_errors(flags, match):
  with pytest.raises(launch_main.app.UsageError, match=match):
    launch_main.distributed_args(*flags)


def test_distributed_flags():
  assert launch_main.distributed_args(None, None, None) is None
  assert launch_main.distributed_args('h:1', 2, 1) == dict(
    coordinator_address='h:1', num_processes=2, process_id=1
  )


def test_host_executor_does_not_span_processes(monkeypatch):
  monkeypatch.setattr(jax, 'process_count', lambda: 2)
  with pytest.raises(ValueError, match='executor=host cannot span 2'):
    executors.choose_executor('host')
  assert executors.choose_executor('auto', backend='cpu').name == 'vmap'
