"""The FedJAX blob decoder (fedjax_metric/data/fedjax_blob.py) against
hand-packed bytes and the msgpack library's encoding (skipped where msgpack
is not installed: the package itself never needs it)."""

import zlib

import numpy as np
import pytest

from fedjax_metric.data import fedjax_blob


def _msgpack():
  return pytest.importorskip('msgpack')


def _serialize(examples):
  """fedjax.core.serialization.msgpack_serialize, written out: an ndarray
  is msgpack extension 1 holding msgpack (shape, dtype name, C bytes)."""
  msgpack = _msgpack()

  def ext(x):
    if isinstance(x, np.ndarray):
      payload = (x.shape, x.dtype.name, x.tobytes('C'))
      return msgpack.ExtType(1, msgpack.packb(payload, use_bin_type=True))
    return x

  return msgpack.packb(examples, default=ext, strict_types=True)


def test_fedjax_blob_decodes_like_fedjax():
  """The reader's own msgpack decoder against hand-packed bytes."""
  pixels = np.arange(4, dtype=np.float32).reshape(1, 2, 2) / 4
  inner = (
    b'\x93\x93\x01\x02\x02'  # fixarray 3: shape fixarray [1, 2, 2]
    + b'\xa7float32'  # fixstr 'float32'
    + b'\xc4\x10'
    + pixels.tobytes()  # bin8, 16 bytes
  )
  label_inner = b'\x93\x91\x01\xa5int32\xc4\x04' + np.int32(7).tobytes()
  blob = (
    b'\x82'  # fixmap 2
    + b'\xa6pixels\xc7'
    + bytes([len(inner)])
    + b'\x01'
    + inner  # ext8 type 1
    + b'\xa5label\xc7'
    + bytes([len(label_inner)])
    + b'\x01'
    + label_inner
  )
  tree = fedjax_blob.decode_fedjax_examples(zlib.compress(blob))
  np.testing.assert_array_equal(tree['pixels'], pixels)
  np.testing.assert_array_equal(tree['label'], [7])
  assert tree['label'].dtype == np.int32
  # And the msgpack library's own encoding of the same dict.
  ours = _serialize({'pixels': pixels, 'label': np.array([7], np.int32)})
  assert ours == blob


def test_fedjax_decoder_agrees_with_msgpack_library():
  """Every msgpack form: maps and arrays of 0-20 and 70,000 entries,
  ints of every width, floats, str and bin of every length class."""
  msgpack = _msgpack()
  tree = {
    'ints': [0, 127, 128, 255, 256, 65535, 65536, 2**32, 2**63, -1, -32]
    + [-33, -128, -129, -32768, -32769, -(2**31) - 1, -(2**63)],
    'floats': [0.5, -1e300, float('inf')],
    'consts': [None, True, False],
    'strs': ['', 'a' * 31, 'é' * 40, 'b' * 300, 'c' * 70000],
    'bins': [b'', b'x' * 300, b'y' * 70000],
    'maps': [{}, {str(i): i for i in range(20)}, {'k': {'n': [[], [1]]}}],
    'long': list(range(20)) + [list(range(70000))],
    'pixels': np.arange(6, dtype=np.float32).reshape(2, 3),
  }
  blob = zlib.compress(_serialize(tree))
  ours = fedjax_blob.decode_fedjax_examples(blob)
  np.testing.assert_array_equal(ours.pop('pixels'), tree.pop('pixels'))
  assert ours == tree
  single = msgpack.packb(1.5, use_single_float=True)
  assert fedjax_blob.decode_fedjax_examples(
    zlib.compress(b'\x81\xa1f' + single)
  ) == {'f': 1.5}
