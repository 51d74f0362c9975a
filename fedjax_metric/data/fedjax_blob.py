"""FedJAX's serialised client examples, decoded without fedjax or msgpack.

FedJAX's SQLite files (github.com/google/fedjax,
fedjax/core/serialization.py and sqlite_federated_data.py) store each
client's examples as one ``data`` blob: the zlib-compressed msgpack
(https://github.com/msgpack/msgpack/blob/master/spec.md) of a dict of
arrays, each array a msgpack extension (type 1; type 3 for a NumPy scalar)
holding the msgpack of ``(shape, dtype name, C-order bytes)``.
`decode_fedjax_examples` turns a blob into that dict of NumPy arrays, the
result of fedjax's ``decompress_and_deserialize``. A small decoder of the
msgpack subset such blobs use (every marker of the spec is read; extension
values other than arrays are refused) keeps the package free of the
msgpack dependency; tests/test_fedjax_blob.py checks it against the msgpack
library where that is installed.

NumPy and the standard library only.
"""

import struct
from typing import Dict
import zlib

import numpy as np


class _Corrupt(Exception):
  """A msgpack stream that does not decode."""


class _ExtValue(tuple):
  """A msgpack extension: (code, payload bytes)."""


def _unpack(data: bytes, raw: bool):
  """Decodes one msgpack value (https://github.com/msgpack/msgpack/blob/
  master/spec.md) that spans all of ``data``; extension values come back
  as `_ExtValue` (code, bytes) pairs. ``raw``: str values stay bytes."""
  view = memoryview(data)
  value, end = _unpack_at(view, 0, raw, 0)
  if end != len(view):
    raise _Corrupt(f'{len(view) - end} trailing bytes')
  return value


_FIXED = {  # marker -> (struct format, size) of numbers.
  0xCA: ('>f', 4),
  0xCB: ('>d', 8),
  0xCC: ('>B', 1),
  0xCD: ('>H', 2),
  0xCE: ('>I', 4),
  0xCF: ('>Q', 8),
  0xD0: ('>b', 1),
  0xD1: ('>h', 2),
  0xD2: ('>i', 4),
  0xD3: ('>q', 8),
}
_LENGTH = {1: '>B', 2: '>H', 4: '>I'}


def _take(view, pos: int, size: int):
  if pos + size > len(view):
    raise _Corrupt('truncated')
  return view[pos : pos + size], pos + size


def _number(view, pos: int, fmt: str, size: int):
  chunk, pos = _take(view, pos, size)
  return struct.unpack(fmt, chunk)[0], pos


def _unpack_at(view, pos: int, raw: bool, depth: int):
  if depth > 64:
    raise _Corrupt('nested too deeply')
  marker, pos = _number(view, pos, '>B', 1)
  if marker <= 0x7F:
    return marker, pos
  if marker >= 0xE0:
    return marker - 0x100, pos
  if 0x80 <= marker <= 0x8F:
    return _map(view, pos, marker & 0x0F, raw, depth)
  if 0x90 <= marker <= 0x9F:
    return _array(view, pos, marker & 0x0F, raw, depth)
  if 0xA0 <= marker <= 0xBF:
    return _str(view, pos, marker & 0x1F, raw)
  if marker in (0xC0, 0xC2, 0xC3):
    return {0xC0: None, 0xC2: False, 0xC3: True}[marker], pos
  if marker in _FIXED:
    return _number(view, pos, *_FIXED[marker])
  if marker in (0xC4, 0xC5, 0xC6):  # bin 8/16/32.
    size = 1 << (marker - 0xC4)
    n, pos = _number(view, pos, _LENGTH[size], size)
    chunk, pos = _take(view, pos, n)
    return bytes(chunk), pos
  if marker in (0xD9, 0xDA, 0xDB):  # str 8/16/32.
    size = 1 << (marker - 0xD9)
    n, pos = _number(view, pos, _LENGTH[size], size)
    return _str(view, pos, n, raw)
  if marker in (0xDC, 0xDD):  # array 16/32.
    size = 2 if marker == 0xDC else 4
    n, pos = _number(view, pos, _LENGTH[size], size)
    return _array(view, pos, n, raw, depth)
  if marker in (0xDE, 0xDF):  # map 16/32.
    size = 2 if marker == 0xDE else 4
    n, pos = _number(view, pos, _LENGTH[size], size)
    return _map(view, pos, n, raw, depth)
  if 0xD4 <= marker <= 0xD8:  # fixext 1/2/4/8/16.
    return _ext(view, pos, 1 << (marker - 0xD4))
  if marker in (0xC7, 0xC8, 0xC9):  # ext 8/16/32.
    size = 1 << (marker - 0xC7)
    n, pos = _number(view, pos, _LENGTH[size], size)
    return _ext(view, pos, n)
  raise _Corrupt(f'invalid marker 0x{marker:02x}')


def _str(view, pos: int, n: int, raw: bool):
  chunk, pos = _take(view, pos, n)
  if raw:
    return bytes(chunk), pos
  try:
    return bytes(chunk).decode('utf-8'), pos
  except UnicodeDecodeError:
    raise _Corrupt('a string is not UTF-8') from None


def _array(view, pos: int, n: int, raw: bool, depth: int):
  out = []
  for _ in range(n):
    item, pos = _unpack_at(view, pos, raw, depth + 1)
    out.append(item)
  return out, pos


def _map(view, pos: int, n: int, raw: bool, depth: int):
  out = {}
  for _ in range(n):
    key, pos = _unpack_at(view, pos, raw, depth + 1)
    value, pos = _unpack_at(view, pos, raw, depth + 1)
    try:
      out[key] = value
    except TypeError:
      raise _Corrupt('a map key is not hashable') from None
  return out, pos


def _ext(view, pos: int, n: int):
  code, pos = _number(view, pos, '>b', 1)
  chunk, pos = _take(view, pos, n)
  return _ExtValue((code, bytes(chunk))), pos


_EXT_NDARRAY = 1  # fedjax/core/serialization.py `_MsgpackExtType`.
_EXT_NPSCALAR = 3


def _ndarray(payload: bytes) -> np.ndarray:
  """FedJAX's ndarray extension: msgpack (shape, dtype name, bytes)."""
  fields = _unpack(payload, raw=True)
  if not (isinstance(fields, list) and len(fields) == 3):
    raise _Corrupt('an array is not (shape, dtype, bytes)')
  shape, name, buffer = fields
  if not isinstance(shape, list) or not all(
    isinstance(d, int) and d >= 0 for d in shape
  ):
    raise _Corrupt(f'bad array shape {shape!r}')
  try:
    dtype = np.dtype(name.decode('ascii') if isinstance(name, bytes) else name)
  except (TypeError, ValueError, UnicodeDecodeError):
    raise _Corrupt(f'unknown dtype {name!r}') from None
  if dtype.kind not in 'biuf' or not isinstance(buffer, bytes):
    raise _Corrupt(f'unsupported dtype {dtype}')
  count = int(np.prod(shape, dtype=np.int64))
  if count * dtype.itemsize != len(buffer):
    raise _Corrupt(
      f'array of shape {tuple(shape)} {dtype} needs '
      f'{count * dtype.itemsize} bytes, has {len(buffer)}'
    )
  return np.frombuffer(buffer, dtype).reshape(shape)


def _arrays(value):
  """Replaces FedJAX's ndarray extensions in a decoded tree by arrays."""
  if isinstance(value, _ExtValue):
    code, payload = value
    if code == _EXT_NDARRAY:
      return _ndarray(payload)
    if code == _EXT_NPSCALAR:
      return _ndarray(payload)[()]
    raise _Corrupt(f'unsupported msgpack extension type {code}')
  if isinstance(value, dict):
    return {k: _arrays(v) for k, v in value.items()}
  if isinstance(value, list):
    return [_arrays(v) for v in value]
  return value


def decode_fedjax_examples(blob: bytes) -> Dict[str, np.ndarray]:
  """A ``data`` blob of FedJAX's SQLite layout -> its dict of arrays.

  Same result as fedjax's ``decompress_and_deserialize`` (zlib, then msgpack
  with ndarray extensions), without fedjax or msgpack.

  Raises:
    ValueError: the blob is not zlib-compressed msgpack of that form.
  """
  try:
    tree = _arrays(_unpack(zlib.decompress(blob), raw=False))
  except zlib.error as e:
    raise ValueError(f'not zlib-compressed ({e})') from None
  except _Corrupt as e:
    raise ValueError(f'not msgpack in FedJAX serialisation ({e})') from None
  if not isinstance(tree, dict):
    raise ValueError(f'decodes to a {type(tree).__name__}, not a dict')
  return tree
