"""What a run does when things go wrong: preemption signals, unreadable
checkpoints and non-finite state (train.run uses each).

* `StopSignals`: SIGTERM (a scheduler preempting the job) and SIGINT
  (Ctrl-C) ask the round loop to stop after the round in progress; it saves
  a checkpoint and returns. A second signal acts at once, except while that
  checkpoint is being written: the save finishes first (a third kills).
* `restore_newest_readable`: restores the newest checkpoint that can be read
  and holds finite values; newer ones that cannot are moved aside.
* `all_finite`: checked before every save, so no checkpoint holds NaN.
"""

import asyncio
import contextlib
import hashlib
import json
import os
import shutil
import signal
import sys
import threading
import time
from typing import Any, Callable, List, Optional, Tuple

import jax
from jax.experimental import multihost_utils
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp

# Test hook: the run pauses after this round (once its checkpoint, if due,
# is on disk) and writes PAUSE_MARKER into the workdir, so that a test can
# signal or kill it at a known point. Unset in normal use.
PAUSE_ENV_VAR = 'FEDJAX_METRIC_PAUSE_AFTER_ROUND'
PAUSE_MARKER = '.paused'
UNREADABLE_DIR = 'checkpoints_unreadable'


class CheckpointError(RuntimeError):
  """No checkpoint of the workdir can be restored; the message says why."""


class StopSignals:
  """Context manager: SIGTERM / SIGINT become a request to stop.

  Inside it, the first SIGTERM or SIGINT only sets `signal_name`; the round
  loop checks `agreed` after every round. The handler then steps aside, so
  a second SIGINT raises KeyboardInterrupt and a second SIGTERM terminates.
  Outside the main thread (where Python delivers no signals) it does
  nothing.
  """

  SIGNALS = (signal.SIGTERM, signal.SIGINT)

  def __init__(self):
    self.signal_name: Optional[str] = None
    self._previous = {}

  def _handle(self, signum, frame):
    del frame
    self.signal_name = signal.Signals(signum).name
    previous = self._previous.get(signum)
    signal.signal(signum, signal.SIG_DFL if previous is None else previous)
    sys.stderr.write(
      f'{self.signal_name}: stopping after the round in '
      'progress, with a checkpoint (again: stop at once).\n'
    )

  def agreed(self) -> Optional[str]:
    """The signal's name if any process of the run got one, else None.

    With several processes all must stop after the same round (the
    checkpoint is saved by all together), so they agree on it every round;
    one process needs no collective.
    """
    if jax.process_count() == 1:
      return self.signal_name
    got = multihost_utils.process_allgather(
      np.int32(
        0
        if self.signal_name is None
        else signal.Signals[self.signal_name].value
      )
    )
    got = [int(g) for g in np.ravel(got) if g]
    return signal.Signals(got[0]).name if got else None

  @contextlib.contextmanager
  def finishing_save(self):
    """While the stop's checkpoint is written and waited for, a further
    SIGTERM / SIGINT does not interrupt the save (orbax would log a
    traceback, and its writer thread finishes before the process can exit
    anyway): it is acknowledged, the stop goes on once the checkpoint is on
    disk, and the next signal after it acts with the default action (kills).
    """

    def acknowledge(signum, frame):
      del frame
      signal.signal(signum, signal.SIG_DFL)
      sys.stderr.write(
        f'{signal.Signals(signum).name}: the checkpoint is being written; '
        'stopping once it is on disk (again: kill at once).\n'
      )

    previous = _set_handlers(self.SIGNALS, acknowledge)
    try:
      yield
    finally:
      _restore_handlers(previous)

  def __enter__(self):
    self._previous = _set_handlers(self.SIGNALS, self._handle)
    return self

  def __exit__(self, *exc_info):
    _restore_handlers(self._previous)
    return False


def _set_handlers(signums, handler):
  """Installs ``handler`` for each signal; returns the handlers it replaced.
  Outside the main thread, where Python delivers no signals, it does
  nothing and returns {}."""
  if threading.current_thread() is not threading.main_thread():
    return {}
  return {signum: signal.signal(signum, handler) for signum in signums}


def _restore_handlers(previous):
  """Puts back the handlers `_set_handlers` replaced."""
  for signum, handler in previous.items():
    signal.signal(signum, handler)


def pause_if_asked(
  workdir: str, done: int, stop: StopSignals, manager: ocp.CheckpointManager
) -> None:
  """The test hook (PAUSE_ENV_VAR): waits for a signal after round ``done``."""
  if os.environ.get(PAUSE_ENV_VAR) != str(done):
    return
  manager.wait_until_finished()
  with open(os.path.join(workdir, PAUSE_MARKER), 'w') as f:
    f.write(str(done))
  deadline = time.time() + 120  # Never hang a test run for good.
  while stop.signal_name is None and time.time() < deadline:
    time.sleep(0.02)


@jax.jit
def _finite(leaves):
  return jnp.all(jnp.stack([jnp.all(jnp.isfinite(x)) for x in leaves]))


def all_finite(tree) -> bool:
  """Whether every floating-point value in ``tree`` is finite."""
  leaves = [
    x
    for x in jax.tree.leaves(tree)
    if jnp.issubdtype(jnp.result_type(x), jnp.inexact)
  ]
  return not leaves or bool(np.asarray(_finite(leaves)))


def _reason(error: BaseException) -> str:
  """One line: an orbax / TensorStore error's first line, cut short."""
  text = str(error).strip().splitlines()
  line = text[0] if text else ''
  line = line if len(line) <= 160 else line[:157] + '...'
  return f'{type(error).__name__}: {line}' if line else type(error).__name__


def state_digest(tree) -> str:
  """SHA-256 over the arrays of ``tree`` (each one's dtype, shape and bytes),
  saved with each checkpoint so that a restore detects a damaged file
  instead of loading changed numbers. The per-array digests are sorted
  before they are combined: a checkpoint restored without a template comes
  back in other containers (a NamedTuple as a dict), in another leaf order.

  With several processes every process calls it (saves and restores are
  collective) and gets the digest of the global arrays: a replicated array
  is read from a local copy, any other is gathered from all processes."""
  digests = []
  for leaf in jax.tree.leaves(tree):
    dtype = getattr(leaf, 'dtype', None)
    if dtype is not None and jnp.issubdtype(dtype, jax.dtypes.prng_key):
      leaf = jax.random.key_data(leaf)
    if isinstance(leaf, jax.Array) and not leaf.is_fully_addressable:
      leaf = (
        leaf.addressable_data(0)
        if leaf.is_fully_replicated
        else multihost_utils.process_allgather(leaf, tiled=True)
      )
    array = np.ascontiguousarray(np.asarray(jax.device_get(leaf)))
    one = hashlib.sha256(f'{array.dtype}{array.shape}'.encode())
    one.update(array.tobytes())
    digests.append(one.hexdigest())
  return hashlib.sha256(''.join(sorted(digests)).encode()).hexdigest()


def _saved_digest(step_dir) -> Optional[str]:
  """The digest saved in a step's orbax metadata, if any."""
  try:
    with open(os.path.join(step_dir, '_CHECKPOINT_METADATA')) as f:
      return (json.load(f).get('custom_metadata') or {}).get('sha256')
  except (OSError, ValueError):
    return None


def _run_coroutine_then_drain(coroutine):
  """Runs ``coroutine`` on a fresh event loop, as orbax does, but before
  closing the loop waits for every task still pending on it.

  orbax (0.12) reads a checkpoint's arrays as concurrent tasks and closes
  the loop as soon as the first read fails. The abandoned reads finish later
  in TensorStore's threads and post their results to the closed loop; each
  prints a "RuntimeError: Event loop is closed" traceback (about 190 lines
  after the one-line error of a workdir with no readable checkpoint).
  Waiting for them here leaves nothing in flight."""
  loop = asyncio.new_event_loop()
  try:
    asyncio.set_event_loop(loop)
    return loop.run_until_complete(coroutine)
  finally:
    pending = asyncio.all_tasks(loop)
    if pending:  # Only after a failure; their own errors are not news.
      loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
    asyncio.set_event_loop(None)
    loop.close()


@contextlib.contextmanager
def orbax_reads_drained():
  """Inside, orbax's synchronous calls run on `_run_coroutine_then_drain`.

  orbax has no option for this, so its private loop runner is replaced for
  the duration: ``_run_sync_via_new_loop`` where it exists (orbax 0.12), else
  ``run_sync`` itself, which in the older versions only calls
  ``asyncio.run`` (whose teardown cancels the pending reads but still leaves
  TensorStore posting to the closed loop). Other orbax layouts are left as
  they are: the noise stays, the results are the same.
  """
  try:
    from orbax.checkpoint._src import asyncio_utils  # pylint: disable=g-import-not-at-top
  except ImportError:
    yield
    return
  if hasattr(asyncio_utils, '_run_sync_via_new_loop'):
    name, replacement = '_run_sync_via_new_loop', _run_coroutine_then_drain
  else:
    original_run_sync = asyncio_utils.run_sync

    def replacement(coroutine, *args, **kwargs):
      try:
        asyncio.get_running_loop()
      except RuntimeError:  # No loop running: the case that closes one.
        return _run_coroutine_then_drain(coroutine)
      return original_run_sync(coroutine, *args, **kwargs)

    name = 'run_sync'
  original = getattr(asyncio_utils, name)
  setattr(asyncio_utils, name, replacement)
  try:
    yield
  finally:
    setattr(asyncio_utils, name, original)


def restore_newest_readable(
  directory: str,
  template: Any,
  *,
  workdir: str,
  chief: bool,
  report: Callable[[str], None],
) -> Tuple[Optional[int], Any]:
  """``(step, restored)`` of the newest usable checkpoint in ``directory``
  (an orbax `CheckpointManager`'s, one unnamed item per step); ``(None,
  None)`` when there is none.

  A checkpoint is usable when orbax restores it into ``template``'s
  structure, every value is finite and the arrays match the checksum saved
  with them (`state_digest`; a flipped bit is caught, not loaded). Newer unusable ones are moved to
  ``workdir/checkpoints_unreadable/`` (so that their rounds can be saved
  again) and ``report`` says which and why. Call it before the directory's
  `CheckpointManager` is made: the manager reads the newest step to decide
  its layout, and a damaged one misleads it.

  Raises:
    CheckpointError: checkpoints exist but none is usable (nothing is
      moved: the cause may be a code change rather than the files).
  """
  failures: List[Tuple[int, str]] = []
  steps = (
    sorted((int(n) for n in os.listdir(directory) if n.isdigit()), reverse=True)
    if os.path.isdir(directory)
    else []
  )
  for step in steps:
    try:
      with orbax_reads_drained(), ocp.StandardCheckpointer() as checkpointer:
        restored = checkpointer.restore(
          os.path.join(directory, str(step), 'default'), template
        )
      if not all_finite(restored):
        raise FloatingPointError('it holds NaN or infinite values')
      saved = _saved_digest(os.path.join(directory, str(step)))
      if saved is not None and saved != state_digest(restored):
        raise ValueError(
          'its arrays do not match the checksum saved with them (the '
          'files changed on disk)'
        )
    except Exception as e:  # pylint: disable=broad-except
      # orbax and TensorStore raise many types for a damaged checkpoint.
      failures.append((step, _reason(e)))
      continue
    if failures:
      _move_aside(directory, [s for s, _ in failures], workdir, chief)
      why = '; '.join(f'round {s}: {r}' for s, r in failures)
      rounds = ', '.join(str(s) for s, _ in failures)
      report(
        f'Checkpoint(s) of round(s) {rounds} cannot be restored ({why}); '
        'moved to '
        f'{os.path.join(workdir, UNREADABLE_DIR)}. Resuming from the '
        f'newest readable one, round {step}.'
      )
    return step, restored
  if failures:
    why = '; '.join(f'round {s}: {r}' for s, r in failures)
    raise CheckpointError(
      f'No checkpoint in {directory} can be restored ({why}). Delete that '
      'directory to start the run over, or use a new --workdir.'
    )
  return None, None


def _move_aside(directory, steps, workdir, chief):
  if chief:
    target = os.path.join(workdir, UNREADABLE_DIR)
    os.makedirs(target, exist_ok=True)
    for step in steps:
      destination = os.path.join(target, f'{step}.{int(time.time())}')
      shutil.move(os.path.join(directory, str(step)), destination)
  if jax.process_count() > 1:
    multihost_utils.sync_global_devices('fedjax_metric: checkpoints moved')
