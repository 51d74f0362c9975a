"""Readers for naturally partitioned data: LEAF's JSON and FedJAX's SQLite.

The examples of these datasets carry the id of the client that produced them
(the writer of a FEMNIST character), and `partition.natural` gives one client
per writer (Flower Datasets' `NaturalIdPartitioner` convention). Both readers
return a `catalog.ArrayDataset` whose `client_ids` ([N] int64) index its
`client_names` (the writers' names, sorted), so two splits with the same
writers number them alike; `reindex_clients` renumbers a split into another
split's names. NumPy and the standard library only; nothing is downloaded.

LEAF (github.com/TalwalkarLab/leaf, data/femnist/preprocess.sh): every JSON
file is ``{"users": [...], "num_samples": [...], "user_data": {user: {"x":
[[784 floats]], "y": [ints]}}}``; the split writes ``*_train_*.json`` to
data/train/ and ``*_test_*.json`` to data/test/. ``x`` is the 28x28 grey
image divided by 255 (data_to_json.py), NIST's dark ink on a white ground, so
the background is 1.0; labels are 0-9, A-Z, a-z (62 classes).

FedJAX (github.com/google/fedjax, fedjax/core/sqlite_federated_data.py and
fedjax/datasets/emnist.py): a table ``federated_data(client_id BLOB PRIMARY
KEY, data BLOB, num_examples INTEGER)``, one row per client, ``data`` the
serialised ``{'pixels': float32 [n, 28, 28], 'label': int32 [n]}`` (zlib and
msgpack, decoded by `fedjax_blob`). Pixels are in [0, 1] with a white
background (FedJAX feeds its models ``1 - pixels``).

Both are returned in MNIST's convention: uint8 [N, 28, 28, 1], 0 background
and 255 ink.
"""

import json
import os
import pathlib
import re
import sqlite3
from typing import List, Optional, Sequence, Tuple, Union

import numpy as np

from fedjax_metric.data import catalog, fedjax_blob

FEMNIST_CLASSES = 62
LEAF_URL = 'https://github.com/TalwalkarLab/leaf'
FEDJAX_EMNIST_URL = 'https://storage.googleapis.com/gresearch/fedjax/emnist/'
# FedJAX's EMNIST files (fedjax/datasets/emnist.py `load_split`):
# federated_emnist_{train,test}.sqlite, digits only with 'digitsonly_'.
_FEDJAX_FILES = {
  'emnist_fedjax': ('federated_emnist_{}.sqlite', FEMNIST_CLASSES),
  'emnist_fedjax_digits': ('federated_emnist_digitsonly_{}.sqlite', 10),
}
# The names `sources.load` reads with this module.
DATASETS = ('femnist',) + tuple(_FEDJAX_FILES)
_SIDE = 28
_MAX_ERRORS = 3  # Names listed in an error before '...'.


class NaturalDataError(ValueError):
  """A LEAF JSON or FedJAX SQLite file is damaged or not in its layout."""


PathOrPaths = Union[str, os.PathLike, Sequence[Union[str, os.PathLike]]]


# ------------------------------------------------------------------- LEAF ----


def _natural_key(path: str):
  """all_data_2 before all_data_10."""
  name = os.path.basename(path)
  return [int(t) if t.isdigit() else t for t in re.split(r'(\d+)', name)]


def _json_in(folder: str) -> List[str]:
  return sorted(
    (
      os.path.join(folder, f)
      for f in os.listdir(folder)
      if f.endswith('.json') and os.path.isfile(os.path.join(folder, f))
    ),
    key=_natural_key,
  )


def leaf_files(directory_or_files: PathOrPaths, split: str) -> List[str]:
  """The LEAF JSON files of ``split``, in name order; reads none of them.

  Args:
    directory_or_files: a JSON file, a list of them, or a folder: one with
      a ``<split>/`` (or ``data/<split>/``) subfolder as LEAF writes them
      (``leaf/data/femnist/data`` or ``leaf/data/femnist``), or one holding
      the files themselves, of which those named ``*_<split>_*.json`` are
      taken (a folder of unsplit all_data_*.json files is refused: pass
      the files to read them).
    split: 'train' or 'test' (only looked at for a folder).

  Raises:
    DatasetNotFoundError: no such file or folder, or no JSON file in it.
  """
  if not isinstance(directory_or_files, (str, os.PathLike)):
    files = [os.fspath(f) for f in directory_or_files]
    absent = [f for f in files if not os.path.isfile(f)]
    if absent or not files:
      raise catalog.DatasetNotFoundError(
        f'LEAF ({split}): no such file {absent[0]!r}.'
        if absent
        else f'LEAF ({split}): an empty list of JSON files.'
      )
    return files
  path = os.fspath(directory_or_files)
  if os.path.isfile(path):
    return [path]
  if not os.path.isdir(path):
    raise catalog.DatasetNotFoundError(
      f'LEAF ({split}): no folder {path!r}. {_leaf_hint(path)}'
    )
  for folder in (os.path.join(path, split), os.path.join(path, 'data', split)):
    if os.path.isdir(folder):
      files = _json_in(folder)
      if not files:
        raise catalog.DatasetNotFoundError(
          f'LEAF ({split}): no .json file in {folder!r}. {_leaf_hint(path)}'
        )
      return files
  files = _json_in(path)
  named = [f for f in files if f'_{split}_' in os.path.basename(f)]
  if named:
    return named
  raise catalog.DatasetNotFoundError(
    f'LEAF ({split}): found no {split}/ folder and no *_{split}_*.json file '
    f'in {path!r}. {_leaf_hint(path)}'
  )


def _leaf_hint(path: str) -> str:
  return (
    f"Run LEAF's data/femnist/preprocess.sh ({LEAF_URL}; e.g. "
    '`./preprocess.sh -s niid --sf 1.0 -k 0 -t sample`) on a machine with '
    f'internet and put its data/train and data/test folders in {path}; '
    'nothing is downloaded automatically.'
  )


def _load_json(path: str):
  try:
    with open(path, 'rb') as f:
      return json.loads(f.read())
  except json.JSONDecodeError as e:
    raise NaturalDataError(
      f'{path}: not valid JSON ({e.msg} at line {e.lineno} column '
      f'{e.colno}); the file may be truncated.'
    ) from None
  except UnicodeDecodeError as e:
    raise NaturalDataError(
      f'{path}: not valid JSON (not UTF-8 text: {e.reason} at byte {e.start}).'
    ) from None
  except RecursionError:
    raise NaturalDataError(f'{path}: JSON nested too deeply.') from None
  except OSError as e:
    raise NaturalDataError(f'{path}: cannot read file ({e}).') from None


def _to_uint8(pixels: np.ndarray, inverted: bool, source: str) -> np.ndarray:
  """[0, 1] floats -> uint8 0..255, 255 - that where the ground is 1."""
  if pixels.size:
    if not np.isfinite(pixels).all():
      raise NaturalDataError(f'{source}: pixels include NaN or infinity.')
    low, high = float(pixels.min()), float(pixels.max())
    if low < -1e-6 or high > 1 + 1e-6:
      raise NaturalDataError(
        f'{source}: pixel values span [{low:g}, {high:g}], expected floats '
        'in [0, 1].'
      )
  grey = np.rint(np.clip(pixels, 0.0, 1.0) * 255.0).astype(np.uint8)
  return 255 - grey if inverted else grey


def _labels(y, num_classes: int, source: str) -> np.ndarray:
  labels = np.asarray(y)
  if labels.ndim != 1 or (
    labels.size and (labels.dtype.kind not in 'iu' or labels.dtype == bool)
  ):
    raise NaturalDataError(
      f'{source}: labels must be a list of integers, got '
      f'{"shape " + str(labels.shape) if labels.ndim != 1 else labels.dtype}.'
    )
  if labels.size and (labels.min() < 0 or labels.max() >= num_classes):
    raise NaturalDataError(
      f'{source}: labels must lie in [0, {num_classes}), found range '
      f'[{labels.min()}, {labels.max()}].'
    )
  return labels.astype(np.int32)


def _read_leaf_file(path: str, num_classes: int, inverted: bool):
  """Yields (user, images, labels) of one LEAF JSON file, in 'users' order."""
  data = _load_json(path)
  if not isinstance(data, dict):
    raise NaturalDataError(
      f'{path}: expected a JSON object with keys users, num_samples and '
      f'user_data, got a {type(data).__name__}.'
    )
  missing = [k for k in ('users', 'user_data') if k not in data]
  if missing:
    raise NaturalDataError(
      f'{path}: missing key(s) {missing}; a LEAF file has users, '
      f'num_samples and user_data (found {sorted(data)[:5]}).'
    )
  users, user_data = data['users'], data['user_data']
  if not isinstance(users, list) or not isinstance(user_data, dict):
    raise NaturalDataError(
      f'{path}: users must be a list and user_data an object.'
    )
  counts = data.get('num_samples')
  if counts is not None and (
    not isinstance(counts, list) or len(counts) != len(users)
  ):
    raise NaturalDataError(
      f'{path}: num_samples must list one count per user ({len(users)} users).'
    )
  for i, user in enumerate(users):
    source = f'{path}: user {user!r}'
    record = user_data.get(user) if isinstance(user, str) else None
    if not isinstance(record, dict):
      raise NaturalDataError(
        f'{source}: listed in users but has no entry in user_data.'
      )
    if 'x' not in record or 'y' not in record:
      raise NaturalDataError(f"{source}: needs keys 'x' and 'y'.")
    x, y = record['x'], record['y']
    if not isinstance(x, list) or not isinstance(y, list):
      raise NaturalDataError(f"{source}: 'x' and 'y' must be lists.")
    if len(x) != len(y):
      raise NaturalDataError(
        f"{source}: 'x' has {len(x)} images but 'y' {len(y)} labels."
      )
    if counts is not None and counts[i] != len(y):
      raise NaturalDataError(
        f'{source}: num_samples says {counts[i]} but there are {len(y)} '
        'examples.'
      )
    try:
      pixels = np.asarray(x, dtype=np.float64).reshape(len(x), -1)
    except (ValueError, TypeError):
      raise NaturalDataError(
        f"{source}: 'x' must be a list of {_SIDE * _SIDE} numbers per image."
      ) from None
    if pixels.shape[1:] != (_SIDE * _SIDE,) and len(x):
      raise NaturalDataError(
        f"{source}: images in 'x' have {pixels.shape[1]} values, expected "
        f'{_SIDE * _SIDE} (28x28).'
      )
    images = _to_uint8(pixels, inverted, source)
    labels = _labels(y, num_classes, source)
    yield user, images.reshape(-1, _SIDE, _SIDE, 1), labels


def _assemble(
  parts: List[Tuple[str, np.ndarray, np.ndarray]], num_classes: int
) -> catalog.ArrayDataset:
  """(name, images, labels) per client -> one `ArrayDataset` with ids."""
  names = tuple(sorted({p[0] for p in parts}))
  index = {n: i for i, n in enumerate(names)}
  if not parts:
    parts = [('', np.zeros((0, _SIDE, _SIDE, 1), np.uint8), np.zeros(0))]
  return catalog.ArrayDataset(
    np.concatenate([p[1] for p in parts]),
    np.concatenate([p[2] for p in parts]).astype(np.int32),
    num_classes,
    np.concatenate(
      [np.full(len(p[2]), index.get(p[0], 0), np.int64) for p in parts]
    ),
    names,
  )


def read_leaf(
  directory_or_files: PathOrPaths,
  split: str = 'train',
  *,
  num_classes: int = FEMNIST_CLASSES,
  inverted: bool = True,
) -> catalog.ArrayDataset:
  """Reads one split of a LEAF FEMNIST dataset from its JSON files.

  Examples come file by file (files in name order, see `leaf_files`), and in
  a file user by user in its ``users`` order, each user's in its order.

  Args:
    directory_or_files: as for `leaf_files`.
    split: 'train' or 'test'.
    num_classes: 62 for FEMNIST (labels must lie below it).
    inverted: the files hold a white ground at 1.0 (LEAF's FEMNIST); the
      images are flipped to MNIST's 0 ground, 255 ink. False keeps them.

  Returns:
    `ArrayDataset` with uint8 [N, 28, 28, 1] images, int32 labels,
    ``client_ids`` [N] int64 into ``client_names`` (the users, sorted).

  Raises:
    DatasetNotFoundError: no files.
    NaturalDataError: a file is not valid JSON or not in LEAF's layout.
  """
  files = leaf_files(directory_or_files, split)
  parts = []
  for path in files:
    parts.extend(_read_leaf_file(path, num_classes, inverted))
  return _assemble(parts, num_classes)


# ----------------------------------------------------------------- SQLite ----


def _client_name(client_id) -> str:
  if isinstance(client_id, bytes):
    return client_id.decode('utf-8', errors='backslashreplace')
  return str(client_id)


def _client_examples(tree, n, num_classes: int, inverted: bool, source: str):
  missing = [k for k in ('pixels', 'label') if k not in tree]
  if missing:
    raise NaturalDataError(
      f'{source}: examples lack feature(s) {missing} (found '
      f'{sorted(map(str, tree))}); FedJAX EMNIST has pixels and label.'
    )
  pixels, label = tree['pixels'], tree['label']
  if not isinstance(pixels, np.ndarray) or not isinstance(label, np.ndarray):
    raise NaturalDataError(f'{source}: pixels and label must be arrays.')
  if pixels.ndim == 4 and pixels.shape[-1] == 1:
    pixels = pixels[..., 0]
  if pixels.shape[1:] != (_SIDE, _SIDE) or pixels.dtype.kind != 'f':
    raise NaturalDataError(
      f'{source}: pixels are {pixels.dtype} {pixels.shape}, expected float '
      '[n, 28, 28].'
    )
  if label.shape != (len(pixels),):
    raise NaturalDataError(
      f'{source}: label has shape {label.shape} for {len(pixels)} images.'
    )
  if len(pixels) != n:
    raise NaturalDataError(
      f'{source}: num_examples says {n} but the data holds {len(pixels)}.'
    )
  images = _to_uint8(pixels.astype(np.float64), inverted, source)
  return images[..., None], _labels(label, num_classes, source)


def read_fedjax_sqlite(
  path: Union[str, os.PathLike],
  *,
  num_classes: int = FEMNIST_CLASSES,
  inverted: bool = True,
) -> catalog.ArrayDataset:
  """Reads a FedJAX SQLite file (``federated_emnist_train.sqlite`` ...).

  Clients come in ``rowid`` order (FedJAX's), each one's examples in order.
  The file is opened read-only.

  Args:
    path: the .sqlite file.
    num_classes: 62 for EMNIST, 10 for the digits-only files.
    inverted: the pixels have a white ground at 1.0 (FedJAX's EMNIST); the
      images are flipped to MNIST's 0 ground, 255 ink. False keeps them.

  Returns:
    `ArrayDataset` with uint8 [N, 28, 28, 1] images, int32 labels,
    ``client_ids`` [N] int64 into ``client_names`` (the client ids decoded
    as UTF-8, sorted).

  Raises:
    DatasetNotFoundError: no such file.
    NaturalDataError: not an SQLite file, no ``federated_data`` table, or a
      row that does not decode.
  """
  path = os.fspath(path)
  if not os.path.isfile(path):
    raise catalog.DatasetNotFoundError(f'{path}: no such file.')
  uri = pathlib.Path(os.path.abspath(path)).as_uri() + '?mode=ro'
  parts = []
  try:
    connection = sqlite3.connect(uri, uri=True)
  except sqlite3.Error as e:
    raise NaturalDataError(f'{path}: cannot open as SQLite ({e}).') from None
  try:
    columns = {
      row[1] for row in connection.execute('PRAGMA table_info(federated_data)')
    }
    if not columns:
      tables = [
        row[0]
        for row in connection.execute(
          "SELECT name FROM sqlite_master WHERE type = 'table' ORDER BY name"
        )
      ]
      raise NaturalDataError(
        f'{path}: no table federated_data (tables: {tables or "none"}); '
        "FedJAX's layout is federated_data(client_id, data, num_examples)."
      )
    missing = sorted({'client_id', 'data', 'num_examples'} - columns)
    if missing:
      raise NaturalDataError(
        f'{path}: table federated_data lacks column(s) {missing}.'
      )
    rows = connection.execute(
      'SELECT client_id, data, num_examples FROM federated_data ORDER BY rowid'
    )
    for client_id, blob, n in rows:
      name = _client_name(client_id)
      source = f'{path}: client {name!r}'
      if not isinstance(blob, bytes):
        raise NaturalDataError(
          f'{source}: data is a {type(blob).__name__}, not a blob.'
        )
      try:
        tree = fedjax_blob.decode_fedjax_examples(blob)
      except ValueError as e:
        raise NaturalDataError(f'{source}: data blob is {e}.') from None
      images, labels = _client_examples(tree, n, num_classes, inverted, source)
      parts.append((name, images, labels))
  except sqlite3.Error as e:
    raise NaturalDataError(
      f'{path}: not a readable SQLite database ({e}).'
    ) from None
  finally:
    connection.close()
  return _assemble(parts, num_classes)


# ------------------------------------------------------------- both/load ----


def reindex_clients(
  dataset: catalog.ArrayDataset, client_names: Sequence[str]
) -> catalog.ArrayDataset:
  """``dataset`` with ``client_ids`` renumbered into ``client_names``.

  E.g. ``reindex_clients(test, train.client_names)`` numbers the test
  split's writers as the training split does.

  Raises:
    ValueError: ``dataset`` has no client ids, or a writer of it is not in
      ``client_names``.
  """
  if dataset.client_ids is None or dataset.client_names is None:
    raise ValueError('The dataset carries no client ids to renumber.')
  names = tuple(client_names)
  index = {n: i for i, n in enumerate(names)}
  if len(index) != len(names):
    raise ValueError('client_names has duplicate names.')
  mapping = np.array(
    [index.get(n, -1) for n in dataset.client_names], dtype=np.int64
  )
  present = np.unique(dataset.client_ids)
  absent = [dataset.client_names[i] for i in present if mapping[i] < 0]
  if absent:
    more = ', ...' if len(absent) > _MAX_ERRORS else ''
    raise ValueError(
      f'{len(absent)} writer(s) of the dataset are not in client_names: '
      f'{", ".join(map(repr, absent[:_MAX_ERRORS]))}{more}.'
    )
  return dataset._replace(
    client_ids=mapping[dataset.client_ids], client_names=names
  )


def _fedjax_path(name: str, split: str, directory: Optional[str]) -> str:
  pattern, _ = _FEDJAX_FILES[name]
  base = pattern.format(split)
  if directory:
    path = os.path.join(directory, base)
    if os.path.isfile(path):
      return path
  where = (
    repr(directory)
    if directory
    else f'(none: no data_dir and ${catalog.ENV_VAR} unset)'
  )
  raise catalog.DatasetNotFoundError(
    f'Dataset {name!r} ({split}): expected {base} in directory {where}. '
    f'Download it from {FEDJAX_EMNIST_URL}{base} (the file FedJAX '
    'distributes) on a machine with internet and put it in '
    f'{directory or "a directory passed as data_dir=..."}; nothing is '
    'downloaded automatically.'
  )


def _leaf_dir(name: str, directory: Optional[str]) -> str:
  if not directory:
    raise catalog.DatasetNotFoundError(
      f'Dataset {name!r}: no data_dir and ${catalog.ENV_VAR} unset. '
      + _leaf_hint('a directory passed as data_dir=...')
    )
  return directory


def check_available(name: str, directory: Optional[str]) -> None:
  """Raises `DatasetNotFoundError` unless both splits' files are there."""
  for split in catalog.SPLITS:
    if name == 'femnist':
      leaf_files(_leaf_dir(name, directory), split)
    else:
      _fedjax_path(name, split, directory)


def load(
  name: str, split: str, directory: Optional[str]
) -> catalog.ArrayDataset:
  """One split of a dataset in `DATASETS` from ``directory``."""
  if name == 'femnist':
    return read_leaf(_leaf_dir(name, directory), split)
  return read_fedjax_sqlite(
    _fedjax_path(name, split, directory),
    num_classes=_FEDJAX_FILES[name][1],
  )
