"""Where the client table lives: on the device, in host memory, or on disk.

A stateful algorithm keeps one row per client (SCAFFOLD's control variate,
MIFA's last update, PMFL's past local models). With N = 10^6 clients a
model-sized row makes the table gigabytes, more than a device may hold, so
the table lives where it fits (``config.client_table.placement``):

  * 'device': the whole [N, ...] table is an argument of every round
    program (what every run did before populations grew).
  * 'host': the rows are one [N, row_bytes] array in host memory.
  * 'disk': the rows are a file in the workdir, read and written a row at a
    time (``os.pread`` / ``os.pwrite``): the process holds only the rows in
    flight, so its memory does not grow with N.

Off the device, a call of R rounds is given only its cohorts' rows: the
union U of the R cohorts' clients is gathered into a [R * C, ...] table,
each slot's ``Cohort.row_ids`` points into it, the call runs as one program
as before, and the U updated rows are scattered back. A client in two
rounds of one call reads its own update, as with the whole table. The
next call's cohorts are functions of (seed, round), so its rows are read
while the current call runs (`RowPrefetcher`); rows of clients in both
calls are then taken from the current call's output. The results are
bit-identical to the device table (tests/test_client_table.py).

Why ``pread`` / ``pwrite`` on one flat file and not a memory map or a zarr
array (TensorStore, which orbax brings): a memory map counts every row it
has touched in the process's resident memory until the kernel reclaims it
(over a long run, the whole table), and a zarr chunk per row adds a
metadata read and a codec per row for rows of a few kilobytes. A flat file
of fixed-size records needs one system call per row, and the page cache
(not this process) keeps what the kernel decides to keep.

Crash safety without copying the table at a checkpoint (docs/scale.md; the
rows file and its journal are fedjax_metric/row_file.py):

  * The rows file is written only by `OffDeviceTable.scatter` (disk) or
    at a checkpoint (host: the rows written since the last one).
  * Before rows are overwritten, their previous values are appended to an
    undo journal and fsynced; rows never written before are not journaled
    (their old value is their initial value, which the bitmap below
    restores).
  * A checkpoint saves the server state and a bitmap of the rows written so
    far (N / 8 bytes) through orbax, after the rows file is fsynced; the
    journal then starts again, named by the checkpoint's round.
  * On resume from round r, every journal of a round >= r is undone, newest
    record first: the rows file is exactly as at round r, and the rounds
    after r are run again, as with the device table. Journals are kept as
    long as their checkpoint is, so a fallback to an older checkpoint rolls
    back too.

Rows never written hold their initial value ``init_client(variables,
fold_in(key, k))``, computed when first read: a population of 10^7 costs
no time or disk before its clients are sampled.

Public API: `PLACEMENTS`, `RowLayout`, `OffDeviceTable`, `Placement`,
`choose_placement`, `call_rows`, `RowPrefetcher`.
"""

import concurrent.futures
import errno
import json
import os
import shutil
import time
from typing import Any, Callable, NamedTuple, Optional, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from fedjax_metric import memory, row_file

PLACEMENTS = ('auto', 'device', 'host', 'disk')
TABLE_DIR = 'client_table'
_ROWS_FILE = 'rows.bin'
_META_FILE = 'meta.json'


# The test hook of the kill tests (tests/test_client_table_faults.py):
# 'point@round' makes the process exit at once, as kill -9 would, at that
# point of that round (`crash_point`).
CRASH_ENV_VAR = 'FEDJAX_METRIC_CRASH_AT'


def crash_point(point: str, round_idx: int) -> None:
  """Exits the process without any cleanup if CRASH_ENV_VAR names this
  point and round (the kill tests' hook; a no-op otherwise)."""
  if os.environ.get(CRASH_ENV_VAR) == f'{point}@{round_idx}':
    os._exit(137)


class TableError(ValueError):
  """A client table placement that cannot be used; one line says why."""


class TableSizeError(memory.MemoryBudgetError):
  """A client table that fits nowhere it may go; one line says what to
  change."""


# ---------------------------------------------------------------------------
# Rows as fixed-size byte records.
# ---------------------------------------------------------------------------


class RowLayout(NamedTuple):
  """How one client's row (a pytree) packs into a fixed-size byte record.

  Leaves are laid out one after the other, each at an offset aligned to its
  item size, so that unpacking is a zero-copy view per leaf.
  """

  treedef: Any
  shapes: tuple
  dtypes: tuple
  offsets: tuple
  row_bytes: int

  @classmethod
  def of(cls, row) -> 'RowLayout':
    """The layout of ``row``: a pytree of arrays or ShapeDtypeStructs."""
    leaves, treedef = jax.tree.flatten(row)
    shapes, dtypes, offsets = [], [], []
    offset = 0
    for leaf in leaves:
      dtype = np.dtype(leaf.dtype)
      offset = -(-offset // dtype.itemsize) * dtype.itemsize
      shapes.append(tuple(leaf.shape))
      dtypes.append(dtype)
      offsets.append(offset)
      offset += int(np.prod(leaf.shape, dtype=np.int64)) * dtype.itemsize
    # Records aligned to 8 bytes: every leaf's offset stays aligned in a
    # [U, row_bytes] array.
    row_bytes = max(8, -(-offset // 8) * 8)
    return cls(treedef, tuple(shapes), tuple(dtypes), tuple(offsets), row_bytes)

  def pack(self, rows) -> np.ndarray:
    """A pytree of [U, ...] arrays -> uint8 [U, row_bytes]."""
    leaves = jax.tree.leaves(rows)
    count = leaves[0].shape[0] if leaves else 0
    packed = np.zeros((count, self.row_bytes), np.uint8)
    for leaf, dtype, offset in zip(leaves, self.dtypes, self.offsets):
      flat = np.ascontiguousarray(leaf, dtype=dtype).reshape(count, -1)
      width = flat.shape[1] * dtype.itemsize
      packed[:, offset : offset + width] = flat.view(np.uint8)
    return packed

  def unpack(self, packed: np.ndarray):
    """uint8 [U, row_bytes] -> the pytree of [U, ...] arrays (views)."""
    count = packed.shape[0]
    leaves = []
    for shape, dtype, offset in zip(self.shapes, self.dtypes, self.offsets):
      size = int(np.prod(shape, dtype=np.int64))
      width = size * dtype.itemsize
      leaf = packed[:, offset : offset + width].view(dtype)
      leaves.append(leaf.reshape((count,) + shape))
    return jax.tree.unflatten(self.treedef, leaves)


# ---------------------------------------------------------------------------
# The off-device table.
# ---------------------------------------------------------------------------


class OffDeviceTable:
  """The client table in host memory ('host') or in a file ('disk').

  Args:
    placement: 'host' or 'disk'.
    directory: the workdir's ``client_table/`` (the rows file and journals).
    layout: the `RowLayout` of one row.
    num_clients: N.
    init_rows: ``ids int [K] -> pytree of [K, ...] arrays``: the rows'
      initial values (`engine.init_rows`); K is always ``init_batch``.
    init_batch: the fixed size init_rows is called with (no recompiles).
  """

  def __init__(
    self,
    placement: str,
    directory: str,
    layout: RowLayout,
    num_clients: int,
    init_rows: Callable[[np.ndarray], Any],
    init_batch: int,
  ):
    if placement not in ('host', 'disk'):
      raise ValueError(f'OffDeviceTable placement {placement!r}.')
    self.placement, self.directory, self.layout = placement, directory, layout
    self.num_clients, self.init_batch = num_clients, init_batch
    self._init_rows = init_rows
    os.makedirs(directory, exist_ok=True)
    path = os.path.join(directory, _ROWS_FILE)
    try:
      self.rows_file = row_file.RowFile(path, num_clients, layout.row_bytes)
    except OSError as e:
      if e.errno != errno.ENOSPC:
        raise
      size = num_clients * layout.row_bytes
      raise TableSizeError(
        f'The client table needs {size / 1024**3:.2f} GiB at {path}, more '
        'than the free disk space there. Free space, use another '
        '--workdir, or fewer clients.'
      ) from None
    # Rows whose value is in the rows file (disk) / was flushed to it (host).
    self.written = np.zeros(num_clients, bool)
    self.memory = None  # host: every row, [N, row_bytes].
    self.dirty = None  # host: rows changed since the last checkpoint.
    self.journal: Optional[row_file.Journal] = None
    self.nonfinite_round: Optional[int] = None
    # Seconds spent reading and writing rows (gather, scatter, the
    # checkpoint's flush and sync), in whichever thread did it.
    self.io_seconds = 0.0

  # ----- Opening: fresh or at a checkpoint. -----

  def open(self, restored_round: Optional[int], written_bits=None):
    """Brings the rows to ``restored_round``'s state (None: round 0) and
    starts the journal. ``written_bits`` is the checkpoint's bitmap."""
    base = -1 if restored_round is None else int(restored_round)
    row_file.roll_back(self.directory, self.rows_file, base)
    if written_bits is not None:
      self.written = np.unpackbits(
        np.asarray(written_bits, np.uint8), count=self.num_clients
      ).astype(bool)
    else:
      self.written[:] = False
    if self.placement == 'host':
      self._load_memory()
    self.journal = row_file.Journal(
      self.directory, max(base, 0), self.layout.row_bytes
    )

  def _load_memory(self):
    """host: every row into memory, from the file where written, else its
    initial value."""
    rows = self.layout.row_bytes
    self.memory = np.zeros((self.num_clients, rows), np.uint8)
    self.dirty = np.zeros(self.num_clients, bool)
    for first, chunk in self.rows_file.read_all():
      keep = self.written[first : first + len(chunk)]
      self.memory[first : first + len(chunk)][keep] = chunk[keep]
    fresh = np.flatnonzero(~self.written)
    for start in range(0, len(fresh), self.init_batch):
      ids = fresh[start : start + self.init_batch]
      self.memory[ids] = self._initial(ids)

  def _initial(self, ids: np.ndarray) -> np.ndarray:
    """Packed initial rows of ``ids``, computed in batches of init_batch."""
    out = np.empty((len(ids), self.layout.row_bytes), np.uint8)
    for start in range(0, len(ids), self.init_batch):
      part = ids[start : start + self.init_batch]
      padded = np.zeros(self.init_batch, np.int64)
      padded[: len(part)] = part
      rows = jax.device_get(self._init_rows(padded))
      out[start : start + len(part)] = self.layout.pack(rows)[: len(part)]
    return out

  # ----- Rounds. -----

  def gather(self, ids: np.ndarray, round_idx: int = -1) -> np.ndarray:
    """Packed rows of ``ids`` [U] as the table holds them now (for the
    call that ends at ``round_idx``: the kill tests' label)."""
    start = time.perf_counter()
    ids = np.asarray(ids, np.int64)
    if self.placement == 'host':
      packed = self.memory[ids]
    else:
      packed = np.empty((len(ids), self.layout.row_bytes), np.uint8)
      written = self.written[ids]
      if written.any():  # A row never written is not read: its initial value.
        packed[written] = self.rows_file.read(ids[written])
      if not written.all():
        packed[~written] = self._initial(ids[~written])
    crash_point('gather', round_idx)
    self.io_seconds += time.perf_counter() - start
    return packed

  def scatter(self, round_idx: int, ids, new_rows, old_rows):
    """Writes packed ``new_rows`` at ``ids``; ``old_rows`` are their values
    before (what `gather` returned), journaled first where written."""
    start = time.perf_counter()
    ids = np.asarray(ids, np.int64)
    if self.nonfinite_round is None and not _finite_rows(self.layout, new_rows):
      self.nonfinite_round = round_idx
    if self.placement == 'host':
      self.memory[ids] = new_rows
      self.dirty[ids] = True
      self.io_seconds += time.perf_counter() - start
      return
    was_written = self.written[ids]
    self.journal.append(round_idx, ids[was_written], old_rows[was_written])
    if os.environ.get(CRASH_ENV_VAR) == f'scatter@{round_idx}':
      half = len(ids) // 2  # Killed halfway through the writes.
      self.rows_file.write(ids[:half], new_rows[:half])
      crash_point('scatter', round_idx)
    self.rows_file.write(ids, new_rows)
    self.written[ids] = True
    self.io_seconds += time.perf_counter() - start

  # ----- Checkpoints. -----

  def before_checkpoint(self, round_idx: int) -> np.ndarray:
    """Makes the rows file hold round ``round_idx``'s table durably, and
    returns the bitmap of written rows (uint8 [ceil(N / 8)]) to save with
    the checkpoint."""
    start = time.perf_counter()
    if self.placement == 'host':
      ids = np.flatnonzero(self.dirty)
      was_written = self.written[ids]
      old = self.rows_file.read(ids[was_written])
      self.journal.append(round_idx, ids[was_written], old)
      if os.environ.get(CRASH_ENV_VAR) == f'flush@{round_idx}':
        half = len(ids) // 2  # Killed halfway through the writes.
        self.rows_file.write(ids[:half], self.memory[ids[:half]])
        crash_point('flush', round_idx)
      self.rows_file.write(ids, self.memory[ids])
      self.written[ids] = True
      self.dirty[:] = False
    self.rows_file.sync()
    crash_point('before_checkpoint', round_idx)
    self.io_seconds += time.perf_counter() - start
    return np.packbits(self.written)

  def after_checkpoint(self, round_idx: int, kept_rounds: Sequence[int]):
    """Starts the journal of round ``round_idx``; drops journals older than
    every kept checkpoint (nothing can roll back to them)."""
    crash_point('checkpoint', round_idx)  # Saved, maybe not committed.
    self.journal.close()
    self.journal = row_file.Journal(
      self.directory, round_idx, self.layout.row_bytes
    )
    row_file.drop_journals_before(
      self.directory, min(list(kept_rounds) + [round_idx])
    )

  def arrays(self):
    """The whole table as a pytree of host [N, ...] arrays, for code that
    reads every row (Deep SVDD's evaluation): host: views of memory; disk:
    read in full (N rows in memory)."""
    if self.placement == 'host':
      return self.layout.unpack(self.memory)
    return self.layout.unpack(self.gather(np.arange(self.num_clients)))

  def close(self):
    if self.journal is not None:
      self.journal.close()
      self.journal = None
    self.rows_file.close()


# What faults.state_problem calls a good value: finite, below 2^64 in
# magnitude (its square overflows float32 beyond).
_LARGEST_GOOD = 2.0**64


def _finite_rows(layout: RowLayout, packed: np.ndarray) -> bool:
  """Whether every float of the packed rows is a good value to keep."""
  for leaf in jax.tree.leaves(layout.unpack(packed)):
    if np.issubdtype(leaf.dtype, np.inexact):
      values = np.abs(leaf.astype(np.float64))
      if not (np.isfinite(values).all() and (values < _LARGEST_GOOD).all()):
        return False
  return True


# ---------------------------------------------------------------------------
# A call's rows.
# ---------------------------------------------------------------------------


class CallRows(NamedTuple):
  """The clients a call of R rounds touches.

  Attributes:
    ids: int64 [U] distinct client ids, in order of first appearance.
    row_ids: int32 [R, C] each slot's position in ``ids``; padding slots
      hold R * C (out of range: gathers clip, scatters drop).
  """

  ids: np.ndarray
  row_ids: np.ndarray


def call_rows(cohorts, num_clients: int) -> CallRows:
  """`CallRows` of a call's cohorts (their client_ids [C] and slot_mask)."""
  client_ids = np.stack([np.asarray(c.client_ids) for c in cohorts])
  slot_mask = np.stack([np.asarray(c.slot_mask) for c in cohorts])
  capacity = client_ids.size
  real = client_ids[slot_mask].astype(np.int64)
  ids, first = np.unique(real, return_index=True)
  ids = ids[np.argsort(first, kind='stable')]
  position = np.full(capacity, capacity, np.int32)
  lookup = dict(zip(ids.tolist(), range(len(ids))))
  flat_ids, flat_mask = client_ids.reshape(-1), slot_mask.reshape(-1)
  position[flat_mask] = [lookup[int(k)] for k in flat_ids[flat_mask]]
  del num_clients
  return CallRows(ids, position.reshape(client_ids.shape))


# ---------------------------------------------------------------------------
# Choosing the placement.
# ---------------------------------------------------------------------------


class Placement(NamedTuple):
  """A resolved placement and why it was chosen (for the run's log)."""

  name: str
  table_bytes: int
  reason: str


def _gib(n):
  return f'{n / 1024**3:.2f} GiB'


def host_memory_budget() -> int:
  """Bytes the host table may take by default: half the memory the system
  has available now."""
  return int(0.5 * os.sysconf('SC_AVPHYS_PAGES') * os.sysconf('SC_PAGE_SIZE'))


def disk_free(directory: str) -> int:
  """Free bytes on the filesystem that holds ``directory`` (or its nearest
  existing parent)."""
  path = os.path.abspath(directory)
  while not os.path.exists(path):
    path = os.path.dirname(path)
  return shutil.disk_usage(path).free


def stored_placement(workdir: str) -> Optional[str]:
  """The placement an earlier start of this workdir used, or None."""
  path = os.path.join(workdir, TABLE_DIR, _META_FILE)
  if not os.path.exists(path):
    return None
  with open(path) as f:
    return json.load(f).get('placement')


def write_meta(workdir: str, placement: str, layout: RowLayout, n: int):
  directory = os.path.join(workdir, TABLE_DIR)
  os.makedirs(directory, exist_ok=True)
  path = os.path.join(directory, _META_FILE)
  with open(path + '.tmp', 'w') as f:
    json.dump(
      {'placement': placement, 'num_clients': n, 'row_bytes': layout.row_bytes},
      f,
    )
  os.replace(path + '.tmp', path)


def choose_placement(
  requested: str,
  *,
  row_bytes: int,
  num_clients: int,
  device_budget: int,
  host_budget: int,
  free_disk: int,
  workdir: str,
  has_checkpoints: bool = False,
  stored: Optional[str] = None,
  process_count: int = 1,
) -> Placement:
  """Where the table of N rows of ``row_bytes`` lives.

  'auto': the device while it fits ``device_budget`` (one device's bytes),
  else host memory within ``host_budget``, else a file in the workdir if
  the disk has the room. A workdir resumed keeps the placement its run
  started with (``stored``; a workdir with checkpoints and no stored
  placement kept the table on the device). A table that fits nowhere is
  refused before anything is written, with one line saying its size and
  what to change.
  """
  if requested not in PLACEMENTS:
    raise TableError(
      f'Unknown client_table.placement {requested!r}; use one of '
      f'{PLACEMENTS} (--config.client_table.placement).'
    )
  table_bytes = row_bytes * num_clients
  if row_bytes == 0:
    return Placement('device', 0, 'the algorithm keeps no per-client state')
  previous = stored or ('device' if has_checkpoints else None)
  if previous is not None:
    if requested not in ('auto', previous):
      raise TableError(
        f'This workdir kept its client table on {previous!r}; it cannot '
        f'resume with client_table.placement={requested!r}. Use '
        f'--config.client_table.placement=auto (or {previous}), or a new '
        '--workdir.'
      )
    return Placement(previous, table_bytes, f'{previous}, as this run began')
  size = (
    f'{_gib(table_bytes)} ({num_clients:,} clients x '
    f'{row_bytes / 1024:.1f} KiB)'
  )
  if process_count > 1 and requested in ('host', 'disk'):
    raise TableError(
      f'client_table.placement={requested} holds the table in one '
      f'process; this run has {process_count}. Use placement=device.'
    )
  if requested == 'device' or (
    requested == 'auto' and (table_bytes <= device_budget or process_count > 1)
  ):
    if table_bytes > device_budget:
      raise TableSizeError(
        f'The client table needs {size}, over the device memory budget of '
        f'{_gib(device_budget)}. Use --config.client_table.placement=auto '
        '(host memory or disk), fewer clients, or a smaller model.'
      )
    return Placement('device', table_bytes, f'{size} fits the device')
  if requested == 'host' or (
    requested == 'auto' and table_bytes <= host_budget
  ):
    if table_bytes > host_budget:
      raise TableSizeError(
        f'The client table needs {size}, over the host memory budget of '
        f'{_gib(host_budget)} (--config.client_table.host_budget_gb). Use '
        'placement=disk or auto, or fewer clients.'
      )
    return Placement('host', table_bytes, f'{size} in host memory')
  # Disk: the rows file. The undo journals (the old rows of a few checkpoint
  # intervals) are not counted; a disk that fills up fails a row write,
  # which stops the run before its next checkpoint (`RowPrefetcher.wait`),
  # and the journals let it resume from the last one.
  if table_bytes > free_disk:
    raise TableSizeError(
      f'The client table needs {size}: over the device budget '
      f'({_gib(device_budget)}), the host memory budget '
      f'({_gib(host_budget)}) and the free disk space at {workdir} '
      f'({_gib(free_disk)}). Use fewer clients (--config.num_clients), a '
      'smaller model, or a --workdir on a larger disk.'
    )
  return Placement('disk', table_bytes, f'{size} in a file in the workdir')


# ---------------------------------------------------------------------------
# Reading the next call's rows while the current call runs.
# ---------------------------------------------------------------------------


class RowPrefetcher:
  """Gathers call i + 1's rows in a thread while call i runs.

  One worker runs reads and writes in submission order, so the read of
  call i + 1 precedes the write of call i: the rows of clients in both
  calls are stale when read and are replaced by call i's new rows in
  `take` (``patch_from``). With ``overlap`` False every read and write
  happens in the calling thread, at its turn (the measurement's baseline).
  """

  def __init__(self, table: OffDeviceTable, *, overlap: bool = True):
    self.table = table
    self.pool = (
      concurrent.futures.ThreadPoolExecutor(max_workers=1) if overlap else None
    )
    self.pending_writes = []

  def submit(self, fn, *args):
    """A future of ``fn(*args)``, run after everything submitted before."""
    if self.pool is None:
      future = concurrent.futures.Future()
      future.set_result(fn(*args))
      return future
    return self.pool.submit(fn, *args)

  def read(self, ids: np.ndarray):
    """A future of the packed rows of ``ids`` (as of the writes before)."""
    return self.submit(self.table.gather, ids)

  def write(self, round_idx, ids, new_rows, old_rows):
    # Every write's outcome is kept until `wait`: a failed one (a full disk)
    # followed by one that succeeds must still stop the next checkpoint.
    self._raise_a_failed_write()
    self.pending_writes.append(
      self.submit(self.table.scatter, round_idx, ids, new_rows, old_rows)
    )

  def _raise_a_failed_write(self):
    """Re-raises the error of a finished write; forgets the finished."""
    running = []
    for write in self.pending_writes:
      if write.done():
        write.result()
      else:
        running.append(write)
    self.pending_writes = running

  def wait(self):
    """Until every write submitted so far is done (before a checkpoint);
    raises the first failed write's error."""
    writes, self.pending_writes = self.pending_writes, []
    for write in writes:
      write.result()

  def close(self):
    if self.pool is not None:
      self.pool.shutdown(wait=True)


def patch_from(ids, packed, previous_ids, previous_rows):
  """``packed`` (rows of ``ids``) with the rows of clients also in the
  previous call replaced by that call's new rows."""
  if previous_ids is None or len(previous_ids) == 0:
    return packed
  common, here, there = np.intersect1d(
    ids, previous_ids, assume_unique=True, return_indices=True
  )
  if len(common):
    packed = packed.copy()
    packed[here] = previous_rows[there]
  return packed


def device_rows(layout: RowLayout, packed: np.ndarray, capacity: int, put):
  """The call's table on the device: [capacity, ...] leaves, the U rows of
  ``packed`` first (the rest are never read: row_ids point below U)."""
  padded = np.zeros((capacity, layout.row_bytes), np.uint8)
  padded[: len(packed)] = packed
  return put(jax.tree.map(jnp.asarray, layout.unpack(padded)))


# ---------------------------------------------------------------------------
# A run's calls over an off-device table.
# ---------------------------------------------------------------------------


class OffDeviceRounds:
  """Runs calls of R rounds against an `OffDeviceTable`.

  ``run(server_state, first)`` builds the call's inputs
  (``inputs_for_call(first)``: its cohorts and, for clients made on demand,
  their examples), takes their rows (read ahead during the previous call),
  runs ``rounds_fn`` on a [R * C, ...] table of them and writes the new rows
  back (in the background, in order). Returns the new server state, the
  call's metrics and its cohorts.

  Args:
    rounds_fn: ``(server_state, table, cohorts, call_data) -> (state,
      table, metrics)`` (`executors.make_rounds_fn`).
    table: the `OffDeviceTable`, opened.
    inputs_for_call: ``first round -> (R cohorts, call data or None)``.
    call_starts: the first round of every call this run makes, in order.
    rounds_per_call, num_slots: R and C.
    put: places the call's rows on the device(s).
    overlap: read ahead and write behind in a thread (`RowPrefetcher`).
  """

  def __init__(
    self,
    rounds_fn,
    table: OffDeviceTable,
    inputs_for_call: Callable[[int], Any],
    call_starts: Sequence[int],
    *,
    rounds_per_call: int,
    num_slots: int,
    put=jax.device_put,
    overlap: bool = True,
  ):
    self.rounds_fn, self.table = rounds_fn, table
    self.inputs_for_call = inputs_for_call
    starts = list(call_starts)
    self.following = dict(zip(starts, starts[1:]))
    self.capacity = rounds_per_call * num_slots
    self.rounds_per_call = rounds_per_call
    self.put = put
    self.io = RowPrefetcher(table, overlap=overlap)
    self.pending = {}
    self.previous = (None, None)  # (ids, new rows) of the last call.
    # Seconds the calling thread waited for a call's inputs (cohorts,
    # examples and rows that the read ahead did not have ready), and spent
    # on the rows itself (patching, placing, packing, queueing the write):
    # metrics.jsonl's cohort_wait_seconds and table_seconds.
    self.wait_seconds = 0.0
    self.table_seconds = 0.0

  def _prepare(self, first):
    cohorts, call_data = self.inputs_for_call(first)
    # Made before the rows are read: JAX dispatches asynchronously, and the
    # initial values of fresh rows would otherwise wait for the examples
    # in the device's queue and be timed as the table's.
    jax.block_until_ready(call_data)
    rows = call_rows(cohorts, self.table.num_clients)
    last = first + self.rounds_per_call - 1
    return cohorts, call_data, rows, self.table.gather(rows.ids, last)

  def run(self, server_state, first):
    start = time.perf_counter()
    future = self.pending.pop(first, None)
    if future is None:
      future = self.io.submit(self._prepare, first)
    following = self.following.get(first)
    if following is not None:
      # Queued after the previous call's write and before this call's.
      self.pending[following] = self.io.submit(self._prepare, following)
    cohorts, call_data, rows, packed = future.result()
    ready = time.perf_counter()
    self.wait_seconds += ready - start
    packed = patch_from(rows.ids, packed, *self.previous)
    cohorts = [
      c._replace(row_ids=rows.row_ids[r]) for r, c in enumerate(cohorts)
    ]
    table_rows = device_rows(self.table.layout, packed, self.capacity, self.put)
    self.table_seconds += time.perf_counter() - ready
    server_state, table_rows, metrics = self.rounds_fn(
      server_state, table_rows, cohorts, call_data
    )
    new_rows = jax.device_get(table_rows)  # Waits for the call.
    start = time.perf_counter()
    new = self.table.layout.pack(new_rows)[: len(rows.ids)]
    last_round = first + self.rounds_per_call - 1
    self.io.write(last_round, rows.ids, new, packed)
    self.previous = (rows.ids, new)
    self.table_seconds += time.perf_counter() - start
    return server_state, metrics, cohorts

  def settle(self):
    """Waits for every write so far (before a checkpoint or evaluation)."""
    self.io.wait()

  def close(self):
    self.io.close()


def checkpoint_template(num_clients: int):
  """What a checkpoint holds of an off-device table: the bitmap of rows
  written to the rows file (uint8 [ceil(N / 8)])."""
  return {'written': np.zeros((num_clients + 7) // 8, np.uint8)}


def rows_template(layout: RowLayout, num_rows: int):
  """Abstract [num_rows, ...] leaves of the layout (for compiling only)."""
  return jax.tree.unflatten(
    layout.treedef,
    [
      jax.ShapeDtypeStruct((num_rows,) + shape, dtype)
      for shape, dtype in zip(layout.shapes, layout.dtypes)
    ],
  )
