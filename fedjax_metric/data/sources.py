"""Host-side loaders that turn on-disk image datasets into NumPy arrays.

Everything here runs on the host with NumPy only (no JAX), and nothing is ever
downloaded: files must already be on disk. Built-in names are `digits`,
`mnist`, `fashion_mnist`, `cifar10` and `cifar100`; any other name is loaded
with `tensorflow_datasets` from an already prepared TFDS data directory
(without TensorFlow when it was prepared with `--file_format=array_record`),
and so is `tfds:<name>`, which asks for TFDS's dataset even where a built-in
has the name (`tfds:cifar10` against the built-in `cifar10`).

For built-ins the directory is resolved as: the explicit `data_dir`, else
`$FEDJAX_METRIC_DATA_DIR/<name>`, else a per-dataset default (only
`fashion_mnist` has one, where Debian's `dataset-fashion-mnist` installs it).

`NATURAL_DATASETS` (`femnist`, `emnist_fedjax`, `emnist_fedjax_digits`) are
read by `natural` from LEAF's JSON or FedJAX's SQLite files; their examples
carry the writer's id (`ArrayDataset.client_ids`) for `partition.natural`.
"""

import gzip
import os
import pickle
import posixpath
import tarfile
from typing import Dict, List, Optional, Sequence, Tuple
import zlib

import numpy as np

# The names, types and checks every loader shares (`catalog`), re-exported:
# sources.ArrayDataset, sources.DatasetNotFoundError, sources.DATASETS, ...
from fedjax_metric.data.catalog import (
  DATASETS,
  ENV_VAR,
  GENERATED_DATASETS,
  NATURAL_DATASETS,
  SPLITS,
  TFDS_PREFIX,
  ArrayDataset,
  DatasetNotFoundError,
  check_labels,
)

DEFAULT_DIRS = {'fashion_mnist': '/usr/share/datasets/fashion-mnist'}
# Where each dataset comes from (`fedjax_metric.datasets()`); nothing is
# downloaded at run time.
DESCRIPTIONS = {
  'digits': "scikit-learn's 8x8 digits (1,797 images, 10 classes), built in.",
  'mnist': 'MNIST: IDX files in --config.dataset.data_dir, or TFDS as tfds:mnist.',
  'fashion_mnist': "Fashion-MNIST: Debian's dataset-fashion-mnist, IDX files "
  'or TFDS as tfds:fashion_mnist.',
  'cifar10': 'CIFAR-10: the python tarball in data_dir, or TFDS as tfds:cifar10.',
  'cifar100': 'CIFAR-100: the python tarball in data_dir, or TFDS as tfds:cifar100.',
  'femnist': 'FEMNIST (LEAF): 62 classes, one writer per example; the JSON '
  "files LEAF's data/femnist/preprocess.sh writes (its train/ and test/ "
  'folders) in data_dir (github.com/TalwalkarLab/leaf).',
  'emnist_fedjax': 'Federated EMNIST as FedJAX ships it: 62 classes, 3,400 '
  'writers; federated_emnist_{train,test}.sqlite from '
  'https://storage.googleapis.com/gresearch/fedjax/emnist/ in data_dir.',
  'emnist_fedjax_digits': "FedJAX's digits-only federated EMNIST: 10 "
  'classes; federated_emnist_digitsonly_{train,test}.sqlite from '
  'https://storage.googleapis.com/gresearch/fedjax/emnist/ in data_dir.',
  'synthetic': 'Synthetic(alpha, beta) of the FedProx paper (Li et al., '
  '2020): 60 features, 10 classes, log-normal client sizes; every client '
  'made from (seed, client id) when sampled (dataset.alpha, dataset.beta).',
}

_IDX_IMAGES_MAGIC = 0x00000803  # unsigned byte data, 3 dimensions.
_IDX_LABELS_MAGIC = 0x00000801  # unsigned byte data, 1 dimension.
_IDX_PREFIX = {'train': 'train', 'test': 't10k'}
_CIFAR_URL = 'https://www.cs.toronto.edu/~kriz/cifar.html'
# name -> (archive, folder inside it, {split: members}, label key, num_classes).
_CIFAR = {
  'cifar10': (
    'cifar-10-python.tar.gz',
    'cifar-10-batches-py',
    {'train': [f'data_batch_{i}' for i in range(1, 6)], 'test': ['test_batch']},
    b'labels',
    10,
  ),
  'cifar100': (
    'cifar-100-python.tar.gz',
    'cifar-100-python',
    {'train': ['train'], 'test': ['test']},
    b'fine_labels',
    100,
  ),
}


# The validation split is drawn with this seed whatever the run's seed, so
# that runs differing only in their seed tune on the same held-out examples.
VALIDATION_SEED = 0


def hold_out(
  dataset: ArrayDataset, fraction: float, *, seed: int = VALIDATION_SEED
):
  """Splits a training set into (train, validation), stratified by class.

  Each class keeps ``round(fraction * n_c)`` of its n_c examples for
  validation, a uniformly random choice from ``seed``; the rest, in their
  original order, are the training set the clients are partitioned from.
  Hyper-parameters are chosen on the validation split, never on the test
  set.

  Args:
    dataset: the training split.
    fraction: in [0, 1); 0 returns (dataset, None).

  Returns:
    (train, validation): `ArrayDataset`s; validation is None for 0.

  Raises:
    ValueError: fraction outside [0, 1), or a class left without training
      or validation examples.
  """
  if not 0.0 <= fraction < 1.0:
    raise ValueError(
      f'validation_fraction must be in [0, 1), got {fraction} '
      '(--config.dataset.validation_fraction).'
    )
  if fraction == 0.0:
    return dataset, None
  rng = np.random.default_rng(seed)
  held = []
  for c in np.unique(dataset.labels):
    members = np.flatnonzero(dataset.labels == c)
    k = int(round(fraction * members.size))
    if k == 0 or k == members.size:
      raise ValueError(
        f'validation_fraction={fraction} leaves class {c} ({members.size} '
        'examples) without training or validation examples; choose a '
        'fraction between 1 / n and 1 - 1 / n of its size.'
      )
    held.append(rng.choice(members, k, replace=False))
  is_held = np.zeros(dataset.labels.size, bool)
  is_held[np.concatenate(held)] = True

  def take(mask):
    ids = dataset.client_ids
    return dataset._replace(
      images=dataset.images[mask],
      labels=dataset.labels[mask],
      client_ids=None if ids is None else ids[mask],
    )

  return take(~is_held), take(is_held)


def load(
  name: str, split: str = 'train', data_dir: Optional[str] = None
) -> ArrayDataset:
  """Loads one split of a dataset from local files.

  Args:
    name: A name from `DATASETS`, or else a TFDS dataset name (e.g. `svhn_cropped`).
    split: 'train' or 'test' for built-ins; any TFDS split string otherwise.
    data_dir: Directory holding the files; see the module docstring for defaults.
      Ignored by `digits`, which ships with scikit-learn.

  Returns:
    The split as an `ArrayDataset`.

  Raises:
    DatasetNotFoundError: The files are missing.
    ValueError: Unknown split, or the files are corrupt.
  """
  tfds = tfds_name(name)
  if tfds is not None:
    from fedjax_metric.data import tfds_source  # Optional extra: lazy.

    return tfds_source.load(tfds, split, data_dir)
  if split not in SPLITS:
    raise ValueError(
      f'Dataset {name!r}: split must be one of {SPLITS}, got {split!r}.'
    )
  if name in GENERATED_DATASETS:
    raise ValueError(
      f"{name!r} makes each client's examples when it is sampled "
      '(data/on_demand.py) and has no stored splits to load; use it as '
      "--config.dataset.name, not as an evaluation's dataset."
    )
  if name == 'digits':
    ds = _load_digits(split)
  elif name in NATURAL_DATASETS:
    from fedjax_metric.data import natural  # Lazy: SQLite, JSON readers.

    ds = natural.load(name, split, _resolve_dir(name, data_dir))
  elif name in ('mnist', 'fashion_mnist'):
    ds = _load_idx_dataset(name, split, _resolve_dir(name, data_dir))
  else:
    ds = _load_cifar(name, split, _resolve_dir(name, data_dir))
  check_labels(ds.labels, ds.num_classes, f'{name}/{split}')
  return ds


def tfds_name(name: str) -> Optional[str]:
  """The TFDS dataset ``name`` asks for, or None for a built-in one.

  'tfds:cifar10' -> 'cifar10' (TFDS's, although a built-in has the name);
  'svhn_cropped' -> itself (no built-in has it); 'cifar10' -> None.
  """
  if name.startswith(TFDS_PREFIX):
    rest = name[len(TFDS_PREFIX) :]
    if not rest:
      raise ValueError(
        f'Dataset {name!r} names no TFDS dataset: write {TFDS_PREFIX}<name>, '
        f'e.g. {TFDS_PREFIX}cifar10.'
      )
    return rest
  built_in = DATASETS + NATURAL_DATASETS + GENERATED_DATASETS
  return None if name in built_in else name


def check_available(name: str, data_dir: Optional[str] = None) -> None:
  """Raises unless both splits of a dataset can be found, reading nothing.

  A run calls this before it writes anything, so a missing dataset costs a
  second, not a set-up. Built-ins: their files must be where `load` looks.
  Other names: with `tensorflow_datasets` installed, the dataset must be
  prepared in the data directory (its metadata is read); without it they
  cannot load, and a name close to a built-in one (``fashion-mnist``) is taken
  for a typo of it.

  Args:
    name: As for `load`.
    data_dir: As for `load`.

  Raises:
    DatasetNotFoundError: The files are missing, or the name is unknown.
  """
  if name == 'digits' or name in GENERATED_DATASETS:
    return
  if name in NATURAL_DATASETS:
    from fedjax_metric.data import natural  # Lazy: SQLite, JSON readers.

    natural.check_available(name, _resolve_dir(name, data_dir))
  elif name in ('mnist', 'fashion_mnist'):
    for split in SPLITS:
      _idx_paths(name, split, _resolve_dir(name, data_dir))
  elif name in _CIFAR:
    splits = _CIFAR[name][2]
    _cifar_location(
      name, _resolve_dir(name, data_dir), splits['train'] + splits['test']
    )
  else:
    from fedjax_metric.data import tfds_source  # Optional extra: lazy.

    tfds_source.check_available(tfds_name(name), data_dir)


def _resolve_dir(name: str, data_dir: Optional[str]) -> Optional[str]:
  """Explicit dir, else $FEDJAX_METRIC_DATA_DIR/name, else the default (may be None)."""
  if data_dir is not None:
    return os.fspath(data_dir)
  if os.environ.get(ENV_VAR):
    return os.path.join(os.environ[ENV_VAR], name)
  return DEFAULT_DIRS.get(name)


# ---------------------------------------------------------------- digits ----


def _load_digits(split: str) -> ArrayDataset:
  """sklearn's 8x8 digits with a fixed stratified 80/20 split (1438/359)."""
  from sklearn.datasets import load_digits  # Lazy: sklearn is slow to import.

  bunch = load_digits()
  # Pixels are counts 0..16; rescale so every dataset shares the uint8 0..255 range.
  images = np.round(bunch.images * (255.0 / 16.0)).astype(np.uint8)[..., None]
  labels = bunch.target.astype(np.int32)
  rng = np.random.RandomState(0)  # Own generator: independent of global state.
  is_test = np.zeros(len(labels), dtype=bool)
  for c in range(10):
    members = rng.permutation(np.flatnonzero(labels == c))
    is_test[members[: int(round(0.2 * len(members)))]] = True
  keep = is_test if split == 'test' else ~is_test
  return ArrayDataset(images[keep], labels[keep], 10)


# ------------------------------------------------------------------- IDX ----


def _read_maybe_gz(path: str) -> bytes:
  try:
    if path.endswith('.gz'):
      with gzip.open(path, 'rb') as f:
        return f.read()
    with open(path, 'rb') as f:
      return f.read()
  except (OSError, EOFError, zlib.error) as e:  # Bad or truncated gzip stream.
    raise ValueError(f'{path}: cannot read file ({e}).') from e


def parse_idx(data: bytes, expected_magic: int, source: str) -> np.ndarray:
  """Parses an unsigned-byte IDX file (the MNIST format) into a uint8 array.

  Args:
    data: Whole file contents (already decompressed).
    expected_magic: 0x00000803 for [N, rows, cols] images, 0x00000801 for [N] labels.
    source: File name used in error messages.

  Returns:
    uint8 array whose shape is given by the big-endian dims in the header.

  Raises:
    ValueError: Bad magic number or payload size not matching the header.
  """
  if len(data) < 4:
    raise ValueError(
      f'{source}: truncated IDX file ({len(data)} bytes, no header).'
    )
  magic = int.from_bytes(data[:4], 'big')
  if magic != expected_magic:
    raise ValueError(
      f'{source}: bad IDX magic number 0x{magic:08x}, '
      f'expected 0x{expected_magic:08x}.'
    )
  ndim = magic & 0xFF
  header = 4 + 4 * ndim
  if len(data) < header:
    raise ValueError(f'{source}: truncated IDX header.')
  dims = tuple(
    int.from_bytes(data[4 + 4 * i : 8 + 4 * i], 'big') for i in range(ndim)
  )
  expected = header + int(np.prod(dims, dtype=np.int64))
  if len(data) != expected:
    problem = 'truncated' if len(data) < expected else 'has trailing bytes'
    raise ValueError(
      f'{source}: IDX file {problem}: {len(data)} bytes, header '
      f'dims {dims} need {expected}.'
    )
  return np.frombuffer(data, dtype=np.uint8, offset=header).reshape(dims)


def _find_file(directory: str, base: str) -> Optional[str]:
  for candidate in (base, base + '.gz'):
    path = os.path.join(directory, candidate)
    if os.path.isfile(path):
      return path
  return None


def _idx_hint(name: str, directory: Optional[str]) -> str:
  if name == 'fashion_mnist':
    return (
      'Install them with `apt-get install dataset-fashion-mnist` (puts them in '
      f'{DEFAULT_DIRS[name]}), or pass data_dir=... / set ${ENV_VAR}.'
    )
  where = (
    directory or f'a directory passed as data_dir=... (or ${ENV_VAR}/mnist)'
  )
  return (
    f'Put the four IDX files from the MNIST site (raw or .gz) in {where}; '
    'nothing is downloaded automatically.'
  )


def _idx_paths(name: str, split: str, directory: Optional[str]) -> List[str]:
  """The (images, labels) files of an MNIST-format split; raises if absent."""
  prefix = _IDX_PREFIX[split]
  bases = (f'{prefix}-images-idx3-ubyte', f'{prefix}-labels-idx1-ubyte')
  paths = [_find_file(directory, b) if directory else None for b in bases]
  if None in paths:
    wanted = ', '.join(f'{b}[.gz]' for b in bases)
    searched = (
      repr(directory)
      if directory
      else f'(none: no data_dir and ${ENV_VAR} unset)'
    )
    raise DatasetNotFoundError(
      f'Dataset {name!r} ({split}): expected files {wanted} '
      f'in directory {searched}. {_idx_hint(name, directory)}'
    )
  return paths


def _load_idx_dataset(
  name: str, split: str, directory: Optional[str]
) -> ArrayDataset:
  """Loads an MNIST-format split as [N, 28, 28, 1] uint8 images."""
  paths = _idx_paths(name, split, directory)
  images = parse_idx(_read_maybe_gz(paths[0]), _IDX_IMAGES_MAGIC, paths[0])
  labels = parse_idx(_read_maybe_gz(paths[1]), _IDX_LABELS_MAGIC, paths[1])
  if images.shape[1:] != (28, 28):
    raise ValueError(
      f'{paths[0]}: expected 28x28 images, got {images.shape[1:]}.'
    )
  if len(images) != len(labels):
    raise ValueError(
      f'{paths[1]}: {len(labels)} labels for {len(images)} images '
      f'in {paths[0]}.'
    )
  return ArrayDataset(images[..., None].copy(), labels.astype(np.int32), 10)


# ----------------------------------------------------------------- CIFAR ----


def _read_cifar_members(
  name: str, directory: Optional[str], members: Sequence[str]
) -> List[Tuple[str, bytes]]:
  """Returns (source, bytes) per member from an extracted folder or the tar.gz."""
  kind, path = _cifar_location(name, directory, members)
  if kind == 'folder':
    out = []
    for m in members:
      with open(os.path.join(path, m), 'rb') as f:
        out.append((os.path.join(path, m), f.read()))
    return out
  folder = _CIFAR[name][1]
  return _read_tar_members(path, [f'{folder}/{m}' for m in members])


def _cifar_location(
  name: str, directory: Optional[str], members: Sequence[str]
) -> Tuple[str, str]:
  """('folder', dir) holding every member, or ('tar', archive), or raises."""
  archive, folder, _, _, _ = _CIFAR[name]
  if directory:
    # The folder may be inside `directory` or be `directory` itself.
    for candidate in (os.path.join(directory, folder), directory):
      if all(os.path.isfile(os.path.join(candidate, m)) for m in members):
        return 'folder', candidate
    tar_path = os.path.join(directory, archive)
    if os.path.isfile(tar_path):
      return 'tar', tar_path
  where = directory or f'(none: no data_dir and ${ENV_VAR} unset)'
  raise DatasetNotFoundError(
    f'Dataset {name!r}: found neither {archive} nor an extracted {folder}/ folder '
    f'(with {", ".join(members)}) in directory {where!r}. Download {archive} '
    f'("CIFAR python version") from {_CIFAR_URL} on a machine with internet and '
    f'put it in {directory or "a directory passed as data_dir=..."}.'
  )


def _read_tar_members(
  tar_path: str, names: Sequence[str]
) -> List[Tuple[str, bytes]]:
  """Reads the named members into memory in one pass, never extracting to disk."""
  found: Dict[str, bytes] = {}
  try:
    with tarfile.open(tar_path, 'r:gz') as tar:
      for info in tar:
        member = posixpath.normpath(info.name)
        if member in names and info.isfile():
          found[member] = tar.extractfile(info).read()
  except (tarfile.TarError, OSError, EOFError, zlib.error) as e:
    raise ValueError(f'{tar_path}: corrupt or truncated archive ({e}).') from e
  missing = [n for n in names if n not in found]
  if missing:
    raise ValueError(f'{tar_path}: archive lacks member(s) {missing}.')
  return [(f'{tar_path}:{n}', found[n]) for n in names]


def _parse_cifar_batch(
  data: bytes, label_key: bytes, source: str
) -> Tuple[np.ndarray, np.ndarray]:
  """Decodes one pickled CIFAR batch into [N, 32, 32, 3] images and [N] labels."""
  try:
    # The official archives are Python 2 pickles; 'bytes' keeps their str keys as bytes.
    # Note pickle can run code: only load archives from a trusted source.
    batch = pickle.loads(data, encoding='bytes')
  except Exception as e:  # pylint: disable=broad-except  # Any unpickling failure.
    raise ValueError(
      f'{source}: cannot unpickle CIFAR batch ({type(e).__name__}: {e}).'
    ) from e
  if (
    not isinstance(batch, dict)
    or b'data' not in batch
    or label_key not in batch
  ):
    raise ValueError(
      f'{source}: expected a dict with keys b"data" and {label_key!r}.'
    )
  pixels = np.asarray(batch[b'data'])
  labels = np.asarray(batch[label_key])
  if pixels.ndim != 2 or pixels.shape[1] != 3 * 32 * 32:
    raise ValueError(
      f'{source}: b"data" has shape {pixels.shape}, expected [N, 3072].'
    )
  if pixels.size and (pixels.min() < 0 or pixels.max() > 255):
    raise ValueError(f'{source}: pixel values outside 0..255.')
  if labels.shape != (len(pixels),):
    raise ValueError(
      f'{source}: {labels.shape} labels for {len(pixels)} images.'
    )
  # Rows are channel-major (all R, then G, then B), each plane row-major.
  images = pixels.astype(np.uint8).reshape(-1, 3, 32, 32).transpose(0, 2, 3, 1)
  return images, labels.astype(np.int32)


def _load_cifar(
  name: str, split: str, directory: Optional[str]
) -> ArrayDataset:
  _, _, splits, label_key, num_classes = _CIFAR[name]
  parts = [
    _parse_cifar_batch(data, label_key, source)
    for source, data in _read_cifar_members(name, directory, splits[split])
  ]
  images = np.ascontiguousarray(np.concatenate([p[0] for p in parts]))
  return ArrayDataset(
    images, np.concatenate([p[1] for p in parts]), num_classes
  )
