"""One writer per workdir: an exclusive lock file held for a run's lifetime.

``<workdir>/.lock`` holds the holder's host, PID and start time (JSON). It is
created with ``O_CREAT | O_EXCL``, so of two runs started together on one
workdir exactly one gets it; the other is refused in one line that names the
holder. A lock whose process is gone from this host (a run killed with
SIGKILL, a machine that lost power) is stale: the next run takes it over and
says so. A lock held from another host cannot be checked from here; the error
says which file to delete once that run is known to be gone.
"""

import json
import os
import socket
import time

LOCK_NAME = '.lock'


class WorkdirInUseError(OSError):
  """Another live run holds the workdir; the message names it."""


def _alive(pid: int) -> bool:
  try:
    os.kill(pid, 0)
  except ProcessLookupError:
    return False
  except PermissionError:
    return True  # Someone else's process: alive.
  return True


def _read(path):
  try:
    with open(path) as f:
      return json.load(f)
  except (OSError, ValueError):
    return None  # Being written, or damaged: treated as held.


def _describe(holder) -> str:
  if not holder:
    return 'a run whose lock file cannot be read'
  started = time.strftime(
    '%Y-%m-%d %H:%M:%S', time.localtime(holder.get('started', 0))
  )
  return f'PID {holder.get("pid")} on {holder.get("host")}, started {started}'


class WorkdirLock:
  """Context manager: holds ``<workdir>/.lock`` from enter to exit.

  Args:
    workdir: an existing directory.
    report: prints the one-line note when a stale lock is taken over.
  """

  def __init__(self, workdir, report=print):
    self.path = os.path.join(workdir, LOCK_NAME)
    self.report = report
    self.record = {
      'host': socket.gethostname(),
      'pid': os.getpid(),
      'started': time.time(),
    }

  def _create(self) -> bool:
    try:
      fd = os.open(self.path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
    except FileExistsError:
      return False
    with os.fdopen(fd, 'w') as f:
      json.dump(self.record, f)
    return True

  def __enter__(self):
    if self._create():
      return self
    holder = _read(self.path)
    stale = (
      holder is not None
      and holder.get('host') == self.record['host']
      and not _alive(int(holder.get('pid', -1)))
    )
    if stale:
      self.report(
        f'{self.path}: taking over the lock of {_describe(holder)}, which '
        'is no longer running.'
      )
      os.remove(self.path)
      if self._create():
        return self
      holder = _read(self.path)  # Another run took it first.
    raise WorkdirInUseError(
      f'{os.path.dirname(self.path)} is in use by {_describe(holder)}. Wait '
      f'for it, or use another --workdir; if that run is gone, delete '
      f'{self.path}.'
    )

  def __exit__(self, *exc):
    holder = _read(self.path)
    if holder is not None and holder.get('pid') == self.record['pid']:
      os.remove(self.path)
    return False
