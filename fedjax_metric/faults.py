"""What a run does when things go wrong: preemption signals, unreadable
checkpoints and non-finite state (experiment.run uses each).

* `StopSignals`: SIGTERM (a scheduler preempting the job) and SIGINT
  (Ctrl-C) ask the round loop to stop after the round in progress; it saves
  a checkpoint and returns. A second signal acts at once, except while that
  checkpoint is being written: the save finishes first (a third kills).
* `restore_newest_readable`: restores the newest checkpoint that can be read,
  matches the checksum saved with it and holds a good state; newer ones that
  cannot are moved aside.
* `state_problem`: what makes a state not good (NaN / infinite values, or
  values of magnitude 2^64 or more); checked before every save, so no
  checkpoint holds one. experiment.run also refuses to save a round whose
  evaluation loss is not finite (`nonfinite_losses`).
"""

import asyncio
import contextlib
import hashlib
import json
import logging
import os
import re
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


def _float_leaves(tree):
  return [
    x
    for x in jax.tree.leaves(tree)
    if jnp.issubdtype(jnp.result_type(x), jnp.inexact) and np.size(x)
  ]


def all_finite(tree) -> bool:
  """Whether every floating-point value in ``tree`` is finite."""
  leaves = _float_leaves(tree)
  return not leaves or bool(np.asarray(_finite(leaves)))


# The magnitude from which a value is not a trained model's: its square
# overflows float32 (3.4e38), so every squared norm, weight decay or gradient
# clip computed from it is infinite, and the next round is NaN. (The fault
# trial's diverging run held 9e33 after round 1, NaN after round 2; a
# healthy model's values are many orders of magnitude smaller.)
LARGEST_GOOD_MAGNITUDE = 2.0**64  # 1.8e19


@jax.jit
def _finite_and_largest(leaves):
  """(all finite, largest magnitude as float32): one program per state."""
  largest = jnp.stack([jnp.max(jnp.abs(x)).astype(jnp.float32) for x in leaves])
  return _finite(leaves), jnp.max(largest)


def state_problem(tree) -> Optional[str]:
  """None when ``tree`` is a good state to checkpoint, else why not.

  Good: every floating-point value is finite and of magnitude below
  `LARGEST_GOOD_MAGNITUDE` (2^64). The reasons read after "it holds" / "The
  model holds": 'NaN or infinite values', 'values of magnitude ...'.
  """
  leaves = _float_leaves(tree)
  if not leaves:
    return None
  finite, largest = _finite_and_largest(leaves)
  if not bool(np.asarray(finite)):
    return 'NaN or infinite values'
  largest = float(np.asarray(largest))
  if largest >= LARGEST_GOOD_MAGNITUDE:
    return (
      f'values of magnitude 2^64 or more (up to {largest:.1e}; their squares '
      'overflow float32)'
    )
  return None


def nonfinite_losses(evaluation) -> List[str]:
  """``'name is value'`` for each loss column (a name ending in ``loss``:
  test_loss, train_eval_loss, val_ ones) of an evaluation row that is not
  finite. Other columns may be NaN by design (a statistic of no samples)."""
  bad = []
  for name, value in evaluation.items():
    if not name.endswith('loss'):
      continue
    try:
      number = float(value)
    except (TypeError, ValueError):
      continue
    if not np.isfinite(number):
      bad.append(f'{name} is {number}')
  return bad


# orbax wraps TensorStore's read error in one that ends with a method's repr
# ("See full TensorStore details: <bound method ...>"); the cause says what
# is wrong, and names the checkpoint's own path, which the report gives.
_NOISE = (
  re.compile(r'\s*See full TensorStore details: <bound method.*$'),
  re.compile(r' in OCDBT database at local file "[^"]*"'),
)


def _reason(error: BaseException) -> str:
  """One line: an orbax / TensorStore error's root cause, its first line,
  cut short."""
  while error.__cause__ is not None and str(error.__cause__).strip():
    error = error.__cause__
  text = str(error).strip().splitlines()
  line = text[0] if text else ''
  for noise in _NOISE:
    line = noise.sub('', line)
  line = line if len(line) <= 200 else line[:197] + '...'
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


METADATA_FILE = '_CHECKPOINT_METADATA'


class UnverifiedError(ValueError):
  """A checkpoint whose checksum file is missing or unreadable."""


def saved_digest(step_dir) -> Optional[str]:
  """The digest saved in a step's orbax metadata file; None for a
  checkpoint written before the digest existed (the file, without it).

  Raises:
    UnverifiedError: the file is missing or cannot be parsed. orbax writes
      it with every step (it also holds total_wall_time), so its absence is
      damage, and the arrays cannot be verified.
  """
  path = os.path.join(step_dir, METADATA_FILE)
  try:
    with open(path) as f:
      metadata = json.load(f)
    if not isinstance(metadata, dict):
      raise ValueError(f'{METADATA_FILE} is not a JSON object')
  except FileNotFoundError:
    raise UnverifiedError(
      f'its checksum file {METADATA_FILE} is missing, so its arrays '
      'cannot be verified'
    ) from None
  except (OSError, ValueError) as e:
    raise UnverifiedError(
      f'its checksum file {METADATA_FILE} cannot be read ({e}), so its '
      'arrays cannot be verified'
    ) from None
  return (metadata.get('custom_metadata') or {}).get('sha256')


class _DropOrbaxNotes(logging.Filter):
  """Drops orbax's absl warnings about a step's metadata that say nothing
  to a user: restore_newest_readable checks every step it restores and
  reports what is wrong in its own words."""

  NOTES = (
    'Metadata file does not exist',
    'was found in the checkpoint, but could not be restored',
  )

  def filter(self, record):
    message = record.getMessage()
    return not any(note in message for note in self.NOTES)


@contextlib.contextmanager
def quiet_orbax_notes():
  """Inside, `_DropOrbaxNotes` filters absl's logger (orbax logs there);
  every other record, warnings and errors included, passes."""
  logger = logging.getLogger('absl')
  note_filter = _DropOrbaxNotes()
  logger.addFilter(note_filter)
  try:
    yield
  finally:
    logger.removeFilter(note_filter)


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
  structure, it holds a good state (`state_problem`: finite, of sane
  magnitude) and its arrays match the checksum saved with them
  (`state_digest`; a flipped bit is caught, not loaded). A checkpoint whose
  metadata file (which holds the checksum) is missing or unparsable cannot
  be verified and is not usable either. One whose metadata file has no
  checksum was written before checksums existed: it is restored, and
  ``report`` says that it was not verified. Newer unusable ones are moved to
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
      # First: nothing is read from a checkpoint that cannot be verified.
      saved = saved_digest(os.path.join(directory, str(step)))
      with (
        quiet_orbax_notes(),
        orbax_reads_drained(),
        ocp.StandardCheckpointer() as checkpointer,
      ):
        restored = checkpointer.restore(
          os.path.join(directory, str(step), 'default'), template
        )
      problem = state_problem(restored)
      if problem is not None:
        raise FloatingPointError(f'it holds {problem}')
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
    if saved is None:
      report(
        f'The checkpoint of round {step} predates checksums (an older '
        'version wrote it): restored, not verified.'
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
