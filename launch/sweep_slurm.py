r"""Sweeps on a SLURM cluster: one job per point, as a job array (submitit).

  python -m launch.sweep run --backend=slurm --root=/shared/runs/grid \
      --config=configs/fedrcl.py:alpha=0.1 --grid='seed=0,1,2' \
      --slurm='partition=gpu,gpus_per_node=1,timeout_min=240,cpus_per_task=8'

Every unfinished point (the same points, workdirs and skip / resume rules as
the local backend) becomes one task of a job array submitted through
submitit (``pip install 'fedjax_metric[slurm]'``); a task trains its point
in its own process exactly as ``launch.sweep point`` does. The sweep then
waits for the tasks, resubmits a failed one up to ``--retries`` times (a
point resumes from its last checkpoint, so a preempted task loses at most
``checkpoint_every`` rounds; a task killed outright on another node, out of
memory or with its node, leaves its workdir's ``.lock`` naming that node,
which a retry elsewhere cannot check: the retry fails in one line naming
the file to delete) and reports each point as the
local backend does; the usual ``launch.sweep table`` reads the workdirs.
Job logs go to ``<root>/slurm/``. ``--slurm`` takes submitit's parameters
(``key=value``, comma-separated: partition, timeout_min, gpus_per_node,
cpus_per_task, mem_gb, slurm_array_parallelism, ...).

This backend imports the points' module (launch/sweep_point.py), never the
sweep that calls it.
"""

import ast
import os
import tempfile
from typing import Any, Callable, Dict, Sequence

from . import sweep_point


def parse_parameters(text: str) -> Dict[str, Any]:
  """``'partition=gpu,timeout_min=60'`` -> {'partition': 'gpu',
  'timeout_min': 60}: numbers and booleans as Python literals, the rest as
  strings."""
  parameters = {}
  for item in filter(None, (text or '').split(',')):
    key, sep, value = item.partition('=')
    if not sep or not key:
      raise ValueError(f'--slurm item {item!r} is not key=value.')
    try:
      parameters[key.strip()] = ast.literal_eval(value)
    except (ValueError, SyntaxError):
      parameters[key.strip()] = value
  return parameters


def train_point(workdir: str, cache_dir: str = '') -> str:
  """A task: trains the point stored in ``workdir`` (`sweep_point.run_point`,
  as ``launch.sweep point`` does), in the task's own process, with JAX's
  persistent compilation cache in ``cache_dir`` ('' for none); returns the
  workdir."""
  import jax  # pylint: disable=g-import-not-at-top

  if cache_dir:
    jax.config.update('jax_compilation_cache_dir', os.path.abspath(cache_dir))
  else:  # Off, whatever the node's environment says.
    jax.config.update('jax_enable_compilation_cache', False)
  sweep_point.run_point(workdir)
  return workdir


def make_executor(folder: str, parameters: Dict[str, Any]):
  """submitit's AutoExecutor (SLURM where ``sbatch`` exists, else local
  processes) with ``parameters``."""
  try:
    import submitit  # pylint: disable=g-import-not-at-top
  except ImportError as e:
    raise ImportError(
      "--backend=slurm needs submitit: pip install 'fedjax_metric[slurm]'."
    ) from e
  # The parameters are tried on a throwaway executor first, so that a
  # misspelt or mistyped one is one line and <root>/slurm is not created.
  with tempfile.TemporaryDirectory() as scratch:
    try:
      submitit.AutoExecutor(folder=scratch).update_parameters(**parameters)
    except (NameError, AssertionError, TypeError, ValueError) as e:
      first = (str(e).strip().splitlines() or [type(e).__name__])[0]
      raise ValueError(
        f'--slurm: {first} (submitit parameters: partition, timeout_min, '
        'gpus_per_node, cpus_per_task, mem_gb, ...).'
      ) from None
  executor = submitit.AutoExecutor(folder=folder)
  executor.update_parameters(**parameters)
  return executor


def submit_points(
  points: Sequence[Any],
  executor,
  *,
  retries: int = 1,
  say: Callable[[str], None] = print,
  cache_dir: str = '',
) -> Dict[str, str]:
  """Runs ``points`` (unfinished, their point files written) as one job
  array on ``executor``, the tasks sharing the compilation cache
  ``cache_dir`` ('' for none); a task that fails is submitted again, up to
  ``retries`` times, in one new array of all the failed ones.

  Returns:
    ``{workdir: outcome}``: 'done' or 'failed (<the task's error, last
    line>)'.
  """
  outcomes, todo = {}, list(points)
  for attempt in range(retries + 1):
    if not todo:
      break
    with executor.batch():
      jobs = [executor.submit(train_point, p.workdir, cache_dir) for p in todo]
    say(f'attempt {attempt + 1}: submitted {len(jobs)} task(s).')
    failed = []
    for point, job in zip(todo, jobs):
      try:
        job.result()
      except Exception as e:  # pylint: disable=broad-except
        last_line = (str(e).strip().splitlines() or [type(e).__name__])[-1]
        outcomes[point.workdir] = f'failed ({last_line})'
        failed.append(point)
        say(f'FAILED {point.workdir} (job {job.job_id}): {last_line}')
      else:
        outcomes[point.workdir] = 'done'
        say(f'done {point.workdir} (job {job.job_id})')
    todo = failed
  return outcomes


def slurm_folder(root: str) -> str:
  return os.path.join(root, 'slurm', '%j')
