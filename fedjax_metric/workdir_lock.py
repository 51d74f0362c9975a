"""One writer per workdir: an exclusive lock file held for a run's lifetime.

``<workdir>/.lock`` holds the holder's host, PID and start time (JSON). It is
created with ``O_CREAT | O_EXCL``, so of two runs started together on one
workdir exactly one gets it; the other is refused in one line that names the
holder. A lock whose process is gone from this host (a run killed with
SIGKILL, a machine that lost power) is stale: the next run takes it over and
says so. So is a lock that stays empty or unparsable (a run killed between
creating the file and writing it): it is read again for up to
`WRITE_GRACE_SECONDS` after it was last written, in case its writer is
still at it, then taken over with a note. A lock that names this very
process but that this process does not hold is stale too: a container
restarted after a kill often runs its job under the same PID again. A lock
held from another host cannot be checked from here; the error says which
file to delete once that run is known to be gone.

`check_free` is the same judgement without taking the lock: experiment.run calls
it before building anything, so that a busy workdir is refused at once and
nothing is written before every check has passed.
"""

import contextlib
import json
import os
import socket
import time

LOCK_NAME = '.lock'
# A holder writes its lock within microseconds of creating it; one still
# empty or unparsable this long after its last write was left so by a kill.
WRITE_GRACE_SECONDS = 2.0


# Real paths of the locks this process holds (a run of the Python API in a
# thread holds one while another thread may ask for it).
_HELD = set()


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
      holder = json.load(f)
  except (OSError, ValueError):
    return None  # Being written, or damaged.
  return holder if isinstance(holder, dict) else None


def _read_settled(path):
  """``(exists, holder)``: the lock's record, read again while it is empty
  or unparsable and younger than `WRITE_GRACE_SECONDS` (its writer may be
  between creating and writing it). ``holder`` None with ``exists``: the
  file stayed unreadable (its writer was killed, or it is damaged)."""
  while True:
    holder = _read(path)
    if holder is not None:
      return True, holder
    try:
      age = time.time() - os.path.getmtime(path)
    except FileNotFoundError:
      return False, None  # Released meanwhile.
    if age >= WRITE_GRACE_SECONDS:
      return True, None
    time.sleep(0.05)


def _stale(holder, host, path) -> bool:
  """A lock no live run holds: unreadable, or its process gone from this
  host, or naming this process without this process holding it. One from
  another host cannot be checked: not stale."""
  if holder is None:
    return True
  if holder.get('host') != host:
    return False
  try:
    pid = int(holder.get('pid', -1))
  except (TypeError, ValueError):
    return True  # A record without a usable PID: unreadable.
  if pid == os.getpid():
    return os.path.realpath(path) not in _HELD
  return not _alive(pid)


def _describe(holder) -> str:
  if not holder:
    return 'a run whose lock file cannot be read (empty or damaged)'
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
    _HELD.add(os.path.realpath(self.path))
    return True

  def __enter__(self):
    if self._create():
      return self
    exists, holder = _read_settled(self.path)
    if not exists or _stale(holder, self.record['host'], self.path):
      if exists:
        self.report(
          f'{self.path}: taking over the lock of {_describe(holder)}, '
          'which is no longer running.'
          if holder
          else f'{self.path}: taking over a lock file that cannot be read '
          '(empty or damaged: a run killed while taking it).'
        )
        with contextlib.suppress(FileNotFoundError):
          os.remove(self.path)
      if self._create():
        return self
      holder = _read(self.path)  # Another run took it first.
    raise in_use_error(self.path, holder)

  def __exit__(self, *exc):
    _HELD.discard(os.path.realpath(self.path))
    holder = _read(self.path)
    if holder is not None and holder.get('pid') == self.record['pid']:
      os.remove(self.path)
    return False


def in_use_error(path, holder) -> WorkdirInUseError:
  return WorkdirInUseError(
    f'{os.path.dirname(path)} is in use by {_describe(holder)}. Wait for '
    f'it, or use another --workdir; if that run is gone, delete {path}.'
  )


def check_free(workdir) -> None:
  """Raises `WorkdirInUseError` when a live run holds ``workdir``'s lock,
  as `WorkdirLock` would; takes nothing and writes nothing (a stale lock is
  left for `WorkdirLock` to take over, with its note)."""
  path = os.path.join(workdir, LOCK_NAME)
  exists, holder = _read_settled(path)
  if exists and not _stale(holder, socket.gethostname(), path):
    raise in_use_error(path, holder)
