"""What machine a benchmark ran on, and how much memory it used.

Shared by launch/bench.py and launch/scaling.py; no absl flags here, so both
(and notebooks) can import it.
"""

import os
import platform
import resource
from typing import Optional

import jax


def device_name() -> str:
  """The CPU model and core count, or the accelerator's kind."""
  device = jax.devices()[0]
  if device.platform != 'cpu':
    return device.device_kind
  cpu = platform.processor() or 'cpu'
  try:
    with open('/proc/cpuinfo') as f:
      cpu = next(line.split(':', 1)[1].strip() for line in f
                 if line.startswith('model name'))
  except (OSError, StopIteration):
    pass
  return f'{cpu}, {os.cpu_count()} cores'


def peak_rss_mb() -> float:
  """This process's peak resident memory (Linux reports kilobytes)."""
  return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def peak_device_mb() -> Optional[float]:
  """Largest XLA ``peak_bytes_in_use`` over local devices, in MiB; None where
  the backend does not report it (CPU, where device memory is host memory)."""
  peaks = [(device.memory_stats() or {}).get('peak_bytes_in_use')
           for device in jax.local_devices()]
  peaks = [p for p in peaks if p is not None]
  return max(peaks) / 2 ** 20 if peaks else None


def append_markdown(path: str, section: str, *, title: str, script: str):
  """Appends ``section`` to the markdown log at ``path``, creating it with
  ``title`` and a never-edit-by-hand line the first time."""
  os.makedirs(os.path.dirname(path) or '.', exist_ok=True)
  new = not os.path.exists(path)
  with open(path, 'a') as f:
    if new:
      f.write(f'# {title}\n\nAppended by {script}; never edited by hand.\n')
    f.write(section)
