"""Running a sweep's points: local processes, or a SLURM job array.

`train_points` trains the unfinished points of a grid (launch/sweep_point.py)
on a backend: 'local' runs ``python -m launch.sweep point`` children,
``parallel`` at a time, each process slot pinned to one GPU of ``gpus``
(`run_points`, `gpu_environments`); 'slurm' submits one job array through
submitit (launch/sweep_slurm.py). A point whose process a signal stops
(SIGTERM: preemption, a ``kill``) saves its checkpoint and exits 128 + the
signal; it is reported 'stopped', not done. SIGTERM / SIGINT to the sweep
reach its running points (`_ForwardedStop`) and the sweep waits for them.

The points of a sweep share one persistent JAX compilation cache
(`compilation_cache_environment`, ``<root>/jax_cache`` by default): most
points compile the same programs (only the seed or a scalar differs), and a
point that finds them there skips XLA's compilation. On a shared 2-core
CPU, 8-round FedQuad points took 185 s on average with no cache and
147-155 s with a warm one (benchmarks/compilation_cache.md). A cached
program is the program XLA would compile again, so results are unchanged
(tests/test_sweep.py).
"""

import collections
import os
import signal
import subprocess
import sys
import threading
import time
from typing import Callable, Dict, List, Optional, Sequence

from fedjax_metric import workdir_lock

from . import sweep_slurm
from .sweep_point import (
  Point,
  point_status,
  read_json,
  resolve,
  write_point_file,
)

LOG_FILE = 'sweep.log'
# Under the sweep's root: removed with its runs, shared by its points.
CACHE_DIR = 'jax_cache'
# A point's process exits 128 + one of these after it saved its checkpoint.
STOP_SIGNALS = (int(signal.SIGTERM), int(signal.SIGINT))


def point_command(workdir: str) -> List[str]:
  """The child process that trains one point."""
  # launch.sweep in a checkout, fedjax_metric.launch.sweep when installed.
  module = f'{__package__}.sweep' if __package__ else 'launch.sweep'
  return [sys.executable, '-m', module, 'point', f'--workdir={workdir}']


def sort_points(points: Sequence[Point], say: Callable[[str], None]):
  """``(outcomes, todo)``: finished points 'skipped', conflicting ones
  'conflict' and ones a live run holds 'busy' (both said) in ``outcomes``,
  the rest in ``todo``."""
  outcomes, todo = {}, []
  for point in points:
    status = point_status(point)
    if status == 'done':
      outcomes[point.workdir] = 'skipped'
    elif status == 'conflict':
      outcomes[point.workdir] = 'conflict'
      say(
        f'CONFLICT {point.workdir}: it holds a run with another config; '
        'use another --root or delete it.'
      )
    elif _held_by_a_live_run(point.workdir):
      # Another sweep (or launch.main) is training it: not this sweep's
      # failure, and not to be started twice.
      outcomes[point.workdir] = 'busy'
      say(f'BUSY {point.workdir}: a live run holds it; left to that run.')
    else:
      todo.append(point)
  return outcomes, todo


def _last_line(path: str, limit: int = 300) -> str:
  """The last non-empty line of a child's log (its one-line error), cut
  to ``limit`` characters; '' when there is none."""
  try:
    with open(path, 'rb') as f:
      f.seek(0, os.SEEK_END)
      f.seek(max(0, f.tell() - 8192))
      lines = f.read().decode('utf-8', errors='replace').splitlines()
  except OSError:
    return ''
  last = next((line.strip() for line in reversed(lines) if line.strip()), '')
  return last[:limit]


def _held_by_a_live_run(workdir: str) -> bool:
  if not os.path.isdir(workdir):
    return False
  try:
    workdir_lock.check_free(workdir)
  except workdir_lock.WorkdirInUseError:
    return True
  return False


def gpu_environments(gpus: Sequence[str], parallel: int):
  """Environment additions of the ``parallel`` process slots: slot i sees
  only GPU ``gpus[i % len(gpus)]``; where several slots share a GPU, JAX does
  not preallocate and each takes at most its share of the memory. [{}] per
  slot without ``gpus``."""
  if not gpus:
    return [{} for _ in range(parallel)]
  sharing = -(-parallel // len(gpus))
  environments = []
  for slot in range(parallel):
    env = {'CUDA_VISIBLE_DEVICES': str(gpus[slot % len(gpus)])}
    if sharing > 1:
      env['XLA_PYTHON_CLIENT_PREALLOCATE'] = 'false'
      env['XLA_PYTHON_CLIENT_MEM_FRACTION'] = f'{0.9 / sharing:.3f}'
    environments.append(env)
  return environments


def compilation_cache_dir(root: str, setting: str = 'auto') -> str:
  """Where the points keep compiled programs: 'auto' is the caller's
  $JAX_COMPILATION_CACHE_DIR where set, else ``<root>/jax_cache``; 'off' is
  '' (no cache); anything else is the path to use."""
  if setting == 'off':
    return ''
  if setting == 'auto':
    return os.environ.get('JAX_COMPILATION_CACHE_DIR') or os.path.join(
      root, CACHE_DIR
    )
  return setting


def compilation_cache_environment(cache_dir: str) -> Dict[str, str]:
  """The environment that gives a point's process the cache ``cache_dir``
  ('' turns JAX's cache off, whatever the caller's environment says)."""
  if not cache_dir:
    return {'JAX_ENABLE_COMPILATION_CACHE': 'false'}
  return {'JAX_COMPILATION_CACHE_DIR': os.path.abspath(cache_dir)}


def run_points(
  points: Sequence[Point],
  *,
  parallel: int = 1,
  command: Callable[[str], List[str]] = point_command,
  say: Callable[[str], None] = print,
  environment: Optional[Sequence[Dict[str, str]]] = None,
) -> Dict[str, str]:
  """Runs the unfinished points, ``parallel`` processes at a time.

  ``environment``: per process slot (``parallel`` of them), variables added
  to that slot's children's environment (`gpu_environments`).

  Returns ``{workdir: outcome}`` with outcome 'skipped' (already finished),
  'done', 'stopped (SIGTERM)' (its process was stopped by a signal after
  saving a checkpoint: unfinished), 'failed (rc=...)', 'conflict' (the
  workdir holds another experiment; left untouched) or 'busy' (a live run
  holds it: another sweep on the same root).
  """
  if parallel < 1:
    raise ValueError(f'parallel must be >= 1, got {parallel}.')
  outcomes, todo = sort_points(points, say)
  say(
    f'{len(points)} points: {len(points) - len(todo)} finished or in '
    f'conflict, {len(todo)} to run, {parallel} at a time.'
  )
  running = {}  # Popen -> (point, start time, log file)
  queue = collections.deque(todo)
  finished = 0
  with _ForwardedStop(running) as stop:
    while (queue or running) and not stop.signals:
      finished = _poll_points(
        running,
        queue,
        parallel,
        command,
        say,
        outcomes,
        finished,
        len(todo),
        environment or [{} for _ in range(parallel)],
      )
  if stop.signals:
    name = signal.Signals(stop.signals[0]).name
    say(
      f'{name}: stopped; {len(todo) - finished} point(s) not finished (the '
      'running ones saved a checkpoint after their round in progress). Run '
      'the same command again to resume.'
    )
    sys.exit(128 + stop.signals[0])
  return outcomes


def check_points(points: Sequence[Point]) -> None:
  """Validates every point still to run (`validation.validate`) before any
  starts, so a bad value in a grid stops the sweep with one line instead of
  failing in its own child after the others have written workdirs.

  Raises:
    ValueError: the first point that cannot run, with the problem and the
      fix (a `validation.ConfigError` or a missing dataset's error).
  """
  from fedjax_metric import validation  # pylint: disable=g-import-not-at-top

  for point in points:
    config = resolve(point.spec, point.overrides)
    if point_status(point, config) != 'todo':
      continue
    try:
      validation.validate(config)
    except ValueError as e:
      raise ValueError(
        f'point {point.workdir}: {e} Nothing was started.'
      ) from e
    except FileNotFoundError as e:  # A dataset not on disk.
      raise FileNotFoundError(
        f'point {point.workdir}: {e} Nothing was started.'
      ) from e


def train_points(
  points: Sequence[Point],
  *,
  backend: str,
  root: str,
  parallel: int = 1,
  gpus: Sequence[str] = (),
  slurm: str = '',
  retries: int = 1,
  compilation_cache: str = 'auto',
) -> Dict[str, str]:
  """Trains the unfinished points on ``backend``: 'local' (`run_points`,
  ``parallel`` processes, one GPU of ``gpus`` per process slot) or 'slurm'
  (one job array through submitit, its logs under ``<root>/slurm``, failed
  tasks resubmitted ``retries`` times), every point with the compilation
  cache ``compilation_cache`` (`compilation_cache_dir`: 'auto', 'off' or a
  path). Every point to run is validated first (`check_points`). Returns
  ``{workdir: outcome}``."""
  check_points(points)
  cache_dir = compilation_cache_dir(root, compilation_cache)
  if backend == 'slurm':
    executor = sweep_slurm.make_executor(
      sweep_slurm.slurm_folder(root), sweep_slurm.parse_parameters(slurm)
    )
    outcomes, todo = sort_points(points, print)
    print(f'{len(points)} points: {len(todo)} to submit.')
    for point in todo:
      write_point_file(point)
    outcomes.update(
      sweep_slurm.submit_points(
        todo, executor, retries=retries, cache_dir=cache_dir
      )
    )
    return outcomes
  cache_environment = compilation_cache_environment(cache_dir)
  return run_points(
    points,
    parallel=parallel,
    environment=[
      {**cache_environment, **slot} for slot in gpu_environments(gpus, parallel)
    ],
  )


class _ForwardedStop:
  """SIGTERM / SIGINT to the sweep stop it and reach its running points.

  The children share the sweep's process group, so a terminal's Ctrl-C
  reaches them directly; a ``kill`` of the sweep's PID does not. Either
  way each running point is sent SIGTERM (a point stops after its round in
  progress with a checkpoint; one already stopping by Ctrl-C just stops), no
  new point starts, and the sweep waits for them before it exits: no child
  keeps training after its sweep is gone.
  """

  def __init__(self, running):
    self.running = running
    self.signals = []
    self._signaled = set()
    self._previous = {}

  def _forward(self):
    # Once per child: a second SIGTERM would stop it at once, mid-round.
    for process in self.running:
      if process.poll() is None and process not in self._signaled:
        process.send_signal(signal.SIGTERM)
        self._signaled.add(process)

  def _handle(self, signum, frame):
    del frame
    self.signals.append(signum)
    self._forward()

  def __enter__(self):
    if threading.current_thread() is threading.main_thread():
      for signum in (signal.SIGTERM, signal.SIGINT):
        self._previous[signum] = signal.signal(signum, self._handle)
    return self

  def __exit__(self, *exc_info):
    try:
      if self.signals:  # Also a point started while the signal came.
        self._forward()
      for process, (_, _, log, _) in list(self.running.items()):
        process.wait()
        log.close()
    finally:
      for signum, previous in self._previous.items():
        signal.signal(signum, previous)
    return False


def _poll_points(
  running, queue, parallel, command, say, outcomes, finished, total, slots_env
):
  """Starts points up to ``parallel`` (each in a free process slot, with
  that slot's ``slots_env``) and records the ones that ended; returns the
  count of finished points."""
  while queue and len(running) < parallel:
    point = queue.popleft()
    write_point_file(point)
    log = open(os.path.join(point.workdir, LOG_FILE), 'a')
    slot = min(set(range(parallel)) - {v[3] for v in running.values()})
    process = subprocess.Popen(
      command(point.workdir),
      stdout=log,
      stderr=subprocess.STDOUT,
      env={**os.environ, **slots_env[slot]},
    )
    running[process] = (point, time.time(), log, slot)
    say(f'start {point.workdir}')
  for process in list(running):
    if process.poll() is None:
      continue
    point, start, log, _ = running.pop(process)
    log.close()
    finished += 1
    seconds = time.time() - start
    if process.returncode == 0:
      outcomes[point.workdir] = 'done'
      summary = read_json(os.path.join(point.workdir, 'summary.json')) or {}
      shown = {
        k: round(v, 4)
        for k, v in summary.items()
        if k.startswith('test_') and 'accuracy' in k
      }
      say(
        f'[{finished}/{total}] done in {seconds:.0f} s {point.workdir} {shown}'
      )
    elif process.returncode - 128 in STOP_SIGNALS:
      # `launch.sweep point` after SIGTERM / SIGINT: checkpoint saved.
      name = signal.Signals(process.returncode - 128).name
      outcomes[point.workdir] = f'stopped ({name})'
      say(
        f'[{finished}/{total}] STOPPED by {name} {point.workdir}: '
        'unfinished, its checkpoint kept; run the same command again to '
        'resume it.'
      )
    else:
      outcomes[point.workdir] = f'failed (rc={process.returncode})'
      cause = _last_line(os.path.join(point.workdir, LOG_FILE))
      say(
        f'[{finished}/{total}] FAILED rc={process.returncode} '
        f'{point.workdir}: {cause} (all of it in {LOG_FILE} there).'
      )
  if running:
    time.sleep(0.2)
  return finished
