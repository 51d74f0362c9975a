"""fedjax_metric.event_log: synchronous TensorBoard scalars, read back and
pruned for a resumed run.

The record framing is checked against a CRC-32C written here from its
definition (Castagnoli polynomial, reflected 0x82F63B78; TFRecord's mask
((crc >> 15) | (crc << 17)) + 0xa282ead8), not against tensorboardX's.
"""

import glob
import os
import struct

from fedjax_metric import event_log


def _crc32c(data: bytes) -> int:
  crc = 0xFFFFFFFF
  for byte in data:
    crc ^= byte
    for _ in range(8):
      crc = (crc >> 1) ^ (0x82F63B78 if crc & 1 else 0)
  return crc ^ 0xFFFFFFFF


def _masked(crc: int) -> int:
  return ((((crc >> 15) | (crc << 17)) & 0xFFFFFFFF) + 0xA282EAD8) & 0xFFFFFFFF


def _frames(path):
  """(offset, payload) of every record, checking both checksums by hand."""
  data = open(path, 'rb').read()
  frames, offset = [], 0
  while offset < len(data):
    (length,) = struct.unpack_from('<Q', data, offset)
    (length_crc,) = struct.unpack_from('<I', data, offset + 8)
    assert length_crc == _masked(_crc32c(data[offset : offset + 8]))
    payload = data[offset + 12 : offset + 12 + length]
    (payload_crc,) = struct.unpack_from('<I', data, offset + 12 + length)
    assert payload_crc == _masked(_crc32c(payload))
    frames.append((offset, payload))
    offset += 12 + length + 4
  assert offset == len(data)
  return frames


def _write(workdir, steps, suffix='', tag='test_accuracy'):
  writer = event_log.ScalarWriter(str(workdir), suffix)
  for step in steps:
    writer.add_scalar(tag, step / 10, step)
  writer.flush()
  writer.close()
  writer.close()  # A second close is allowed.
  (path,) = [
    p
    for p in glob.glob(os.path.join(workdir, event_log.PATTERN))
    if p.endswith(suffix)
  ]
  return path


def test_flushed_scalars_are_on_disk_in_tfrecord_framing(tmp_path):
  writer = event_log.ScalarWriter(str(tmp_path), '.a')
  writer.add_scalar('loss', 0.5, 1)
  writer.add_scalar('loss', 0.25, 2)
  writer.flush()  # Not closed: a run killed now keeps both.
  (path,) = glob.glob(str(tmp_path / event_log.PATTERN))
  frames = _frames(path)
  # tensorboardX's file_version event, then one record per scalar.
  assert len(frames) == 3
  assert [(s, t, v) for _, s, t, v in event_log.scalars(str(tmp_path))] == [
    (1, 'loss', 0.5),
    (2, 'loss', 0.25),
  ]
  writer.close()


def test_a_torn_tail_ends_the_reading_and_is_reported(tmp_path):
  path = _write(tmp_path, [1, 2, 3])
  data = open(path, 'rb').read()
  last_record_start = _frames(path)[-1][0]
  with open(path, 'wb') as f:
    f.write(data[:-5])  # the last record loses part of its payload
  records, intact = event_log.read_records(path)
  assert not intact
  assert [r.event.step for r in records if r.event.HasField('summary')] == [
    1,
    2,
  ]
  assert b''.join(r.raw for r in records) == data[:last_record_start]


def test_a_flipped_byte_stops_the_reading_at_its_record(tmp_path):
  path = _write(tmp_path, [1, 2, 3])
  offset, payload = _frames(path)[2]  # the record of step 2
  data = bytearray(open(path, 'rb').read())
  data[offset + 12 + len(payload) // 2] ^= 0xFF
  open(path, 'wb').write(bytes(data))
  records, intact = event_log.read_records(path)
  assert not intact
  assert [r.event.step for r in records if r.event.HasField('summary')] == [1]


def test_prune_keeps_rounds_up_to_the_resume_point_in_every_file(tmp_path):
  first = _write(tmp_path, [1, 2, 3, 4, 5], '.session1')
  later = _write(tmp_path, [4, 5, 6], '.session2')
  event_log.prune(str(tmp_path), 3)
  assert os.path.exists(first)
  # The second session's file held only rounds past 3: it is gone.
  assert not os.path.exists(later)
  assert [s for _, s, _, _ in event_log.scalars(str(tmp_path))] == [1, 2, 3]
  _frames(first)  # still well framed
  assert sorted(os.listdir(tmp_path)) == [os.path.basename(first)]


def test_prune_drops_a_torn_tail_and_leaves_an_intact_file_untouched(
  tmp_path,
):
  path = _write(tmp_path, [1, 2])
  before = open(path, 'rb').read()
  event_log.prune(str(tmp_path), 2)
  assert open(path, 'rb').read() == before  # nothing to drop
  with open(path, 'ab') as f:
    f.write(before[-7:])  # a partial record, as a kill leaves it
  event_log.prune(str(tmp_path), 2)
  assert open(path, 'rb').read() == before


def test_scalars_read_every_session_file_in_name_order(tmp_path):
  second = _write(tmp_path, [2], '.s2', tag='b')
  first = _write(tmp_path, [1], '.s1', tag='a')
  rows = list(event_log.scalars(str(tmp_path)))
  names = sorted(os.path.basename(p) for p in (first, second))
  assert [r[0] for r in rows] == names
  by_file = {
    os.path.basename(first): ('a', 1),
    os.path.basename(second): ('b', 2),
  }
  assert [(t, s) for _, s, t, _ in rows] == [by_file[n] for n in names]
