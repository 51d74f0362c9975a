"""Fixed-size rows in one file, and the undo journal that makes it crash-safe.

The storage under the client table's 'disk' and 'host' placements
(fedjax_metric/client_table.py, whose docstring gives the protocol):

  * `RowFile`: N records of ``row_bytes`` bytes in one flat file, read and
    written by row id with ``os.pread`` / ``os.pwrite`` (runs of consecutive
    ids in one call).
  * `Journal`: append-only undo records of the rows about to be overwritten,
    each fsynced before the rows it protects are written: ``header (magic,
    round, k) | ids int64 [k] | old rows uint8 [k, row_bytes] | crc32``.
    One journal per checkpoint round (`journal_path`).
  * `roll_back`: undoes every journal of a round at or after the restored
    checkpoint's, newest record first, so the file is as it was then.
  * `drop_journals_before`: the journals no kept checkpoint can roll back to.

No JAX here: bytes in, bytes out.
"""

import errno
import os
import struct
from typing import List
import zlib

import numpy as np

_JOURNAL_PREFIX = 'undo_'
_RECORD_MAGIC = 0x464A4D55  # 'UMJF': one undo record.
_HEADER = struct.Struct('<IqQ')  # magic, round, row count.


def fsync_dir(path):
  fd = os.open(path, os.O_RDONLY)
  try:
    os.fsync(fd)
  finally:
    os.close(fd)


class RowFile:
  """N fixed-size records in one file, read and written by row id."""

  def __init__(self, path: str, num_rows: int, row_bytes: int):
    self.path, self.num_rows, self.row_bytes = path, num_rows, row_bytes
    self.fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    size = num_rows * row_bytes
    if os.fstat(self.fd).st_size != size:
      os.ftruncate(self.fd, size)
    # Reserve the blocks now: a disk that cannot hold the rows fails here
    # (OSError ENOSPC), before round 1, not at some row in round 10,000.
    try:
      os.posix_fallocate(self.fd, 0, size)
    except OSError as e:
      if e.errno == errno.ENOSPC:
        os.close(self.fd)
        raise
      # Filesystems without fallocate: the caller checked the size.

  def read(self, ids: np.ndarray) -> np.ndarray:
    """uint8 [len(ids), row_bytes] of rows ``ids`` (any order, no repeats
    needed); runs of consecutive ids are read in one call."""
    out = np.empty((len(ids), self.row_bytes), np.uint8)
    order = np.argsort(ids, kind='stable')
    sorted_ids = np.asarray(ids, np.int64)[order]
    for start, stop in _runs(sorted_ids):
      first = int(sorted_ids[start])
      data = os.pread(
        self.fd, (stop - start) * self.row_bytes, first * self.row_bytes
      )
      out[order[start:stop]] = np.frombuffer(data, np.uint8).reshape(
        stop - start, self.row_bytes
      )
    return out

  def write(self, ids: np.ndarray, packed: np.ndarray):
    order = np.argsort(ids, kind='stable')
    sorted_ids = np.asarray(ids, np.int64)[order]
    for start, stop in _runs(sorted_ids):
      block = np.ascontiguousarray(packed[order[start:stop]])
      offset = int(sorted_ids[start]) * self.row_bytes
      view = memoryview(block).cast('B')
      while view:  # pwrite may write less than asked.
        written = os.pwrite(self.fd, view, offset)
        view, offset = view[written:], offset + written

  def read_all(self, chunk_rows: int = 1 << 16):
    """Yields ``(first_row, uint8 [k, row_bytes])`` over the whole file."""
    for first in range(0, self.num_rows, chunk_rows):
      k = min(chunk_rows, self.num_rows - first)
      data = os.pread(self.fd, k * self.row_bytes, first * self.row_bytes)
      yield first, np.frombuffer(data, np.uint8).reshape(k, self.row_bytes)

  def sync(self):
    os.fsync(self.fd)

  def close(self):
    if self.fd is not None:
      os.close(self.fd)
      self.fd = None


def _runs(sorted_ids: np.ndarray):
  """``(start, stop)`` positions of the runs of consecutive ids."""
  if len(sorted_ids) == 0:
    return []
  breaks = np.flatnonzero(np.diff(sorted_ids) != 1) + 1
  starts = np.concatenate([[0], breaks])
  stops = np.concatenate([breaks, [len(sorted_ids)]])
  return zip(starts.tolist(), stops.tolist())


def journal_path(directory, base_round):
  return os.path.join(directory, f'{_JOURNAL_PREFIX}{base_round:012d}.log')


def journal_rounds(directory) -> List[int]:
  names = os.listdir(directory) if os.path.isdir(directory) else []
  return sorted(
    int(n[len(_JOURNAL_PREFIX) : -len('.log')])
    for n in names
    if n.startswith(_JOURNAL_PREFIX) and n.endswith('.log')
  )


class Journal:
  """Append-only undo records of the rows overwritten since a checkpoint.

  A record is ``header (magic, round, k) | ids int64 [k] | old rows uint8
  [k, row_bytes] | crc32``; it is fsynced before the rows it protects are
  written, so a record cut short by a kill protects rows that were never
  written, and reading stops there.
  """

  def __init__(self, directory: str, base_round: int, row_bytes: int):
    self.directory, self.row_bytes = directory, row_bytes
    self.base_round = base_round
    self.file = open(journal_path(directory, base_round), 'ab')
    fsync_dir(directory)

  def append(self, round_idx: int, ids: np.ndarray, old_rows: np.ndarray):
    if len(ids) == 0:
      return
    ids = np.ascontiguousarray(ids, np.int64)
    body = ids.tobytes() + np.ascontiguousarray(old_rows).tobytes()
    header = _HEADER.pack(_RECORD_MAGIC, int(round_idx), len(ids))
    crc = zlib.crc32(body, zlib.crc32(header))
    self.file.write(header + body + struct.pack('<I', crc))
    self.file.flush()
    os.fsync(self.file.fileno())

  def close(self):
    self.file.close()


def read_records(path: str, row_bytes: int):
  """The complete, intact records of a journal file, in write order."""
  with open(path, 'rb') as f:
    data = f.read()
  records, pos = [], 0
  while pos + _HEADER.size <= len(data):
    magic, _, count = _HEADER.unpack_from(data, pos)
    end = pos + _HEADER.size + count * (8 + row_bytes) + 4
    if magic != _RECORD_MAGIC or end > len(data):
      break
    body = data[pos + _HEADER.size : end - 4]
    (crc,) = struct.unpack_from('<I', data, end - 4)
    if crc != zlib.crc32(body, zlib.crc32(data[pos : pos + _HEADER.size])):
      break
    ids = np.frombuffer(body[: 8 * count], np.int64)
    rows = np.frombuffer(body[8 * count :], np.uint8).reshape(count, row_bytes)
    records.append((ids, rows))
    pos = end
  return records


def roll_back(directory: str, rows: RowFile, restored_round: int) -> int:
  """Undoes every journal of a round >= ``restored_round`` (newest record
  first) and removes them; returns the number of rows written back. A
  fresh start (``restored_round`` -1) removes every journal: with no
  checkpoint, no row counts as written."""
  undone = 0
  for base in reversed(journal_rounds(directory)):
    if base < restored_round:
      break
    path = journal_path(directory, base)
    if restored_round >= 0:
      for ids, old in reversed(read_records(path, rows.row_bytes)):
        rows.write(ids, old)
        undone += len(ids)
      rows.sync()
    os.remove(path)
  fsync_dir(directory)
  return undone


def drop_journals_before(directory: str, oldest_round: int) -> None:
  """Removes the journals of rounds before ``oldest_round``: no checkpoint
  that is kept can roll back to them."""
  for base in journal_rounds(directory):
    if base < oldest_round:
      os.remove(journal_path(directory, base))
