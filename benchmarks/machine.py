"""What machine a benchmark ran on, and how much memory it used.

Shared by benchmarks/bench.py and benchmarks/scaling.py; no absl flags here, so both
(and notebooks) can import it.
"""

import datetime
import json
import os
import platform
import resource
import subprocess
import sys
import time
from typing import Any, Dict, List, NamedTuple, Optional, Sequence

import jax

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RESULT_PREFIX = 'BENCH_RESULT '


def device_name() -> str:
  """The CPU model and core count, or the accelerator's kind."""
  device = jax.devices()[0]
  if device.platform != 'cpu':
    return device.device_kind
  return cpu_name()


def cpu_name() -> str:
  """The host CPU's model and core count."""
  cpu = platform.processor() or 'cpu'
  try:
    with open('/proc/cpuinfo') as f:
      cpu = next(
        line.split(':', 1)[1].strip()
        for line in f
        if line.startswith('model name')
      )
  except (OSError, StopIteration):
    pass
  return f'{cpu}, {os.cpu_count()} cores'


def peak_rss_mb() -> float:
  """This process's peak resident memory (Linux reports kilobytes)."""
  return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def peak_device_mb() -> Optional[float]:
  """Largest XLA ``peak_bytes_in_use`` over local devices, in MiB; None where
  the backend does not report it (CPU, where device memory is host memory)."""
  peaks = [
    (device.memory_stats() or {}).get('peak_bytes_in_use')
    for device in jax.local_devices()
  ]
  peaks = [p for p in peaks if p is not None]
  return max(peaks) / 2**20 if peaks else None


def append_markdown(path: str, section: str, *, title: str, script: str):
  """Appends ``section`` to the markdown log at ``path``, creating it with
  ``title`` and a never-edit-by-hand line the first time."""
  os.makedirs(os.path.dirname(path) or '.', exist_ok=True)
  new = not os.path.exists(path)
  with open(path, 'a') as f:
    if new:
      f.write(f'# {title}\n\nAppended by {script}; never edited by hand.\n')
    f.write(section)


def print_result(result: Dict[str, Any]):
  """A child's answer to `run_child`: one prefixed JSON line on stdout."""
  print(RESULT_PREFIX + json.dumps(result), flush=True)


class ChildResult(NamedTuple):
  """What `run_child` saw: the child's result, or why there is none."""

  result: Optional[Dict[str, Any]]
  status: str  # 'ok' | 'timeout' | 'failed'
  note: str
  wall_seconds: float  # the child's whole life, start-up included


def child_env(**extra: str) -> Dict[str, str]:
  """This process's environment plus ``extra``, with the repo root on
  PYTHONPATH, so a child ``python -m benchmarks.<name>`` imports this
  checkout from any working directory."""
  env = dict(os.environ, **extra)
  env['PYTHONPATH'] = os.pathsep.join(
    p for p in (REPO_ROOT, env.get('PYTHONPATH')) if p
  )
  return env


def run_child(
  module: str, args: Sequence[str], *, timeout: Optional[float] = None
) -> ChildResult:
  """Runs ``python -m module *args`` in a fresh interpreter from the repo root.

  One measurement per process gives per-point peak memory (RSS and device)
  and keeps a crashing point (out of memory, a compiler error) from taking
  the whole benchmark with it. The child answers with `print_result`.
  """
  env = child_env()
  start = time.perf_counter()
  try:
    proc = subprocess.run(
      [sys.executable, '-m', module, *args],
      cwd=REPO_ROOT,
      env=env,
      capture_output=True,
      text=True,
      timeout=timeout,
      check=False,
    )
  except subprocess.TimeoutExpired:
    return ChildResult(
      None,
      'timeout',
      f'stopped after {timeout:g} s',
      time.perf_counter() - start,
    )
  wall = time.perf_counter() - start
  result = None
  for line in reversed(proc.stdout.splitlines()):
    if line.startswith(RESULT_PREFIX):
      result = json.loads(line[len(RESULT_PREFIX) :])
      break
  if proc.returncode < 0:
    return ChildResult(
      None,
      'failed',
      f'killed by signal {-proc.returncode} (out of memory?)',
      wall,
    )
  if proc.returncode != 0 or result is None:
    lines = (proc.stderr or proc.stdout).strip().splitlines() or ['no output']
    return ChildResult(
      None, 'failed', f'exit {proc.returncode}: {lines[-1][:200]}', wall
    )
  return ChildResult(result, 'ok', '', wall)


def markdown_section(
  heading: str,
  notes: Sequence[str],
  columns: List[str],
  rows: Sequence[Sequence[Any]],
) -> str:
  """A dated markdown section: heading, note lines, then a table.

  Args:
    heading: what was measured (the date is prepended).
    notes: lines under the heading (device, settings, the command).
    columns: table column names.
    rows: one sequence of cell values (already formatted) per row.
  """
  head = [f'\n## {datetime.date.today()} - {heading}', '', *notes, '']
  return '\n'.join(head) + '\n' + markdown_table(columns, rows)


def markdown_table(columns: List[str], rows: Sequence[Sequence[Any]]) -> str:
  """A markdown table of already formatted cells."""
  lines = ['| ' + ' | '.join(columns) + ' |', '|' + '---|' * len(columns)]
  lines += ['| ' + ' | '.join(str(cell) for cell in row) + ' |' for row in rows]
  return '\n'.join(lines) + '\n'


def describe_backend() -> Dict[str, str]:
  """``{'backend', 'device'}`` of JAX's default backend, asked of a child.

  A benchmark's orchestrating process must not start a GPU backend itself:
  JAX would reserve most of the device's memory, which the children measuring
  each point need.
  """
  child = run_child('benchmarks.machine', [])
  if child.status != 'ok':
    raise RuntimeError(f'Could not start a JAX child process: {child.note}')
  return child.result


if __name__ == '__main__':
  print_result({'backend': jax.default_backend(), 'device': device_name()})
