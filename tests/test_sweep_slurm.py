"""launch.sweep's SLURM backend (submitit): parameters, submission and
resubmission with a stand-in executor, and a real point trained by
submitit's local executor (the code path a SLURM task runs, without SLURM).
"""

import contextlib
import json
import os

import pytest

from launch import sweep, sweep_slurm

RUNLOCAL = 'configs/fedavg.py:runlocal'
FIXED = {'num_rounds': '1', 'progress': 'False', 'plot_partition': 'False'}


def test_parameters_parse_as_literals_or_strings():
  assert sweep_slurm.parse_parameters(
    'partition=gpu,timeout_min=60,gpus_per_node=1,exclusive=True'
  ) == {
    'partition': 'gpu',
    'timeout_min': 60,
    'gpus_per_node': 1,
    'exclusive': True,
  }
  assert sweep_slurm.parse_parameters('') == {}
  with pytest.raises(ValueError, match='not key=value'):
    sweep_slurm.parse_parameters('partition')


class FakeJob:
  def __init__(self, job_id, error):
    self.job_id = job_id
    self._error = error

  def result(self):
    if self._error:
      raise RuntimeError(f'Traceback ...\n{self._error}')
    return 'ok'


class FakeExecutor:
  """Fails the tasks of the workdirs in ``flaky`` on their first attempt."""

  def __init__(self, flaky):
    self.flaky = set(flaky)
    self.arrays = []
    self.attempts = {}

  @contextlib.contextmanager
  def batch(self):
    self.arrays.append([])
    yield

  def submit(self, fn, workdir, cache_dir):
    assert fn is sweep_slurm.train_point
    assert cache_dir == '/shared/cache'
    self.attempts[workdir] = self.attempts.get(workdir, 0) + 1
    self.arrays[-1].append(workdir)
    first = self.attempts[workdir] == 1
    error = 'OOM on the node' if workdir in self.flaky and first else None
    return FakeJob(f'{len(self.arrays)}_{len(self.arrays[-1])}', error)


def test_failed_tasks_are_resubmitted_as_one_array(tmp_path):
  points = sweep.make_points(
    str(tmp_path), [RUNLOCAL], FIXED, sweep.parse_assignments('seed=0,1')
  )
  flaky, steady = (p.workdir for p in points)
  executor = FakeExecutor(flaky=[flaky])
  outcomes = sweep_slurm.submit_points(
    points, executor, retries=1, say=lambda _: None, cache_dir='/shared/cache'
  )
  assert outcomes == {flaky: 'done', steady: 'done'}
  assert executor.arrays == [[flaky, steady], [flaky]]
  # Without retries the failure is reported with the task's last line.
  executor = FakeExecutor(flaky=[flaky])
  outcomes = sweep_slurm.submit_points(
    points, executor, retries=0, say=lambda _: None, cache_dir='/shared/cache'
  )
  assert outcomes == {flaky: 'failed (OOM on the node)', steady: 'done'}


def test_a_point_trains_as_a_submitit_task(tmp_path):
  """submitit's local executor runs the task in its own process, as a SLURM
  node would; the point's workdir then holds a finished run."""
  submitit = pytest.importorskip('submitit')
  (point,) = sweep.make_points(str(tmp_path / 'grid'), [RUNLOCAL], FIXED, [])
  executor = submitit.AutoExecutor(
    folder=str(tmp_path / 'slurm' / '%j'), cluster='local'
  )
  executor.update_parameters(timeout_min=10)
  sweep.write_point_file(point)
  outcomes = sweep_slurm.submit_points([point], executor, say=lambda _: None)
  assert outcomes == {point.workdir: 'done'}
  with open(os.path.join(point.workdir, 'summary.json')) as f:
    assert json.load(f)['rounds_completed'] == 1
  assert sweep.point_status(point) == 'done'


@pytest.mark.parametrize(
  'text, match',
  [
    ('partiton=gpu', "--slurm: Parameter 'partiton' need to be prefixed"),
    ('timeout_min=abc', '--slurm: Parameter "timeout_min" expected type'),
  ],
)
def test_a_bad_slurm_parameter_is_one_line_and_creates_nothing(
  tmp_path, text, match
):
  pytest.importorskip('submitit')
  folder = sweep_slurm.slurm_folder(str(tmp_path))
  with pytest.raises(ValueError, match=match) as raised:
    sweep_slurm.make_executor(folder, sweep_slurm.parse_parameters(text))
  assert '\n' not in str(raised.value)
  assert not os.path.exists(tmp_path / 'slurm')
