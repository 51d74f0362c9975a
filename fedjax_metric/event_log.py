"""TensorBoard scalars that survive a killed run and a resumed one.

`ScalarWriter` writes each event straight to its file and `flush` puts it on
disk, so a run killed at any moment leaves every evaluation it flushed
(tensorboardX's `SummaryWriter` queues events to a thread that writes every
``flush_secs``: a killed run lost up to that much). `prune` drops the events
past the round a resumed run restarts from, so that every round appears once
in the workdir's event files, whichever sessions wrote them.

Event files are TFRecord files of `Event` protocol buffers: per record a
little-endian uint64 length, its masked CRC-32C, the bytes, their masked
CRC-32C. The protocol buffers and the checksum are tensorboardX's.
"""

import glob
import os
import struct
import time
from typing import Iterator, List, NamedTuple, Tuple

from tensorboardX import event_file_writer, record_writer, summary
from tensorboardX.proto import event_pb2

PATTERN = 'events.out.tfevents.*'
_HEADER = struct.Struct('<QI')
_FOOTER = struct.Struct('<I')


class ScalarWriter:
  """Synchronous scalar events in ``workdir/events.out.tfevents.*``.

  Args:
    workdir: the directory TensorBoard is pointed at.
    suffix: appended to the file name (tensorboardX's name holds the time
      in seconds and the host; the suffix keeps two sessions apart).
  """

  def __init__(self, workdir: str, suffix: str = ''):
    self._writer = event_file_writer.EventsWriter(
      os.path.join(workdir, 'events'), suffix
    )

  def add_scalar(self, tag: str, value: float, step: int) -> None:
    self._writer.write_event(
      event_pb2.Event(
        wall_time=time.time(),
        step=int(step),
        summary=summary.scalar(tag, float(value)),
      )
    )

  def add_hparams(self, hparams: dict, metric_names) -> None:
    """The run's hyper-parameters for TensorBoard's HParams dashboard: the
    experiment (``hparams`` and the ``metric_names`` it compares runs on)
    and this session's start, at step 0. Values are numbers, strings or
    booleans; anything else is written as its string."""
    clean = {
      name: value if isinstance(value, (bool, int, float, str)) else str(value)
      for name, value in hparams.items()
    }
    for s in summary.hparams(clean, dict.fromkeys(metric_names, 0.0)):
      self._writer.write_event(
        event_pb2.Event(wall_time=time.time(), step=0, summary=s)
      )

  def flush(self) -> None:
    if self._writer:
      self._writer.flush()

  def close(self) -> None:
    """Closes the file; safe to call again."""
    if self._writer:
      self._writer.close()
      self._writer = None


class Record(NamedTuple):
  raw: bytes  # The whole record as stored, checksums included.
  event: event_pb2.Event


def read_records(path: str) -> Tuple[List[Record], bool]:
  """The file's records in order, and whether the whole file was readable.

  A record cut short or failing its checksum (the tail of a killed writer)
  ends the reading: it and anything after it are not returned.
  """
  with open(path, 'rb') as f:
    data = f.read()
  records, offset = [], 0
  while offset + _HEADER.size <= len(data):
    length, length_crc = _HEADER.unpack_from(data, offset)
    start = offset + _HEADER.size
    end = start + length
    if (
      length_crc != record_writer.masked_crc32c(data[offset : offset + 8])
      or end + _FOOTER.size > len(data)
      or _FOOTER.unpack_from(data, end)[0]
      != record_writer.masked_crc32c(data[start:end])
    ):
      return records, False
    event = event_pb2.Event()
    event.ParseFromString(data[start:end])
    records.append(Record(data[offset : end + _FOOTER.size], event))
    offset = end + _FOOTER.size
  return records, offset == len(data)


def scalars(workdir: str) -> Iterator[Tuple[str, int, str, float]]:
  """``(file name, step, tag, value)`` of every scalar in the workdir."""
  for path in sorted(glob.glob(os.path.join(workdir, PATTERN))):
    for record in read_records(path)[0]:
      for value in record.event.summary.value:
        yield (
          os.path.basename(path),
          record.event.step,
          value.tag,
          (value.simple_value),
        )


def prune(workdir: str, last_round: int) -> None:
  """Keeps only the scalars of rounds <= ``last_round`` in the event files.

  A resumed run redoes the rounds after its checkpoint and logs them again;
  their earlier events (and any torn record a kill left) are dropped here
  first. Files left without scalars are deleted; each other changed file is
  replaced atomically, so a kill during pruning loses nothing.
  """
  for path in glob.glob(os.path.join(workdir, PATTERN)):
    records, intact = read_records(path)
    kept = [
      r
      for r in records
      if not (r.event.HasField('summary') and r.event.step > last_round)
    ]
    if intact and len(kept) == len(records):
      continue
    if not any(r.event.HasField('summary') for r in kept):
      os.remove(path)
      continue
    # The temporary name must not match PATTERN: TensorBoard would read it.
    tmp = os.path.join(workdir, '.pruning_events.tmp')
    with open(tmp, 'wb') as f:
      f.write(b''.join(r.raw for r in kept))
    os.replace(tmp, path)
