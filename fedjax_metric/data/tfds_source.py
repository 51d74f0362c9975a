"""Datasets outside the built-in ones, read from a prepared TFDS data_dir.

`tensorflow_datasets` (the ``tfds`` extra) reads a dataset that a user has
already prepared (``tfds build NAME --file_format=array_record``); nothing is
downloaded. The array_record format is read without TensorFlow. Called by
`sources.load` / `sources.check_available` for any name not in
`sources.DATASETS`; imports only `catalog`, never `sources`.
"""

import difflib
import importlib.util
import os
from typing import Optional, Tuple

import numpy as np

from fedjax_metric.data.catalog import (
  DATASETS,
  ENV_VAR,
  NATURAL_DATASETS,
  TFDS_PREFIX,
  ArrayDataset,
  DatasetNotFoundError,
  check_labels,
)


def _not_built_in(name: str) -> str:
  """The start of an error about a TFDS name, with a guess at a built-in one
  where the name looks like a typo of it."""
  if name in DATASETS:  # Asked for as tfds:<name>.
    return (
      f"Dataset {TFDS_PREFIX}{name} is TFDS's {name} (the built-in loader "
      f'is plain {name!r}). '
    )
  built_in = DATASETS + NATURAL_DATASETS
  close = difflib.get_close_matches(
    name.lower().replace('-', '_'), built_in, n=1
  )
  guess = f'Did you mean {close[0]!r}? ' if close else ''
  return f'Dataset {name!r} is not built in ({", ".join(built_in)}). {guess}'


def check_available(name: str, data_dir: Optional[str] = None) -> None:
  """Raises unless TFDS is installed and ``name`` is prepared in the data
  directory (its metadata is read, no examples)."""
  if importlib.util.find_spec('tensorflow_datasets') is None:
    raise DatasetNotFoundError(
      _not_built_in(name) + 'Other names are loaded '
      f'with tensorflow_datasets, which is not installed: {_TFDS_INSTALL}.'
    )
  _tfds_builder(name, data_dir)


_TFDS_INSTALL = (
  'pip install tensorflow-datasets (datasets prepared with '
  "--file_format=array_record), or pip install 'fedjax_metric[tfds]' (any "
  'format)'
)


def _import_tfds(name: str):
  try:
    import tensorflow_datasets as tfds  # pylint: disable=g-import-not-at-top
  except ImportError as e:
    raise ImportError(
      _not_built_in(name) + 'Other names are loaded with tensorflow_datasets, '
      f'which is not installed: {_TFDS_INSTALL}.'
    ) from e
  return tfds


def _tfds_builder(name: str, data_dir: Optional[str]):
  """The TFDS builder of an already prepared dataset, reading only metadata.

  The dataset's code need not be installed: TFDS rebuilds the builder from the
  files' `dataset_info.json` (a dataset prepared on another machine and
  copied here).

  Raises:
    DatasetNotFoundError: `name` is not prepared in `data_dir`.
  """
  tfds = _import_tfds(name)
  data_dir = (
    data_dir if data_dir is not None else os.environ.get(ENV_VAR) or None
  )
  where = data_dir or '~/tensorflow_datasets (TFDS default)'

  def missing(detail: str) -> DatasetNotFoundError:
    return DatasetNotFoundError(
      _not_built_in(name) + 'Other names must be prepared TFDS datasets; it '
      f'is not one in data_dir {where!r}{detail}. Prepare it on a machine '
      f'with internet with `tfds build {name} --file_format=array_record '
      '--data_dir=DIR`, then copy DIR here and pass data_dir=DIR.'
    )

  # ValueError: not a valid TFDS name (e.g. 'fashion-mnist').
  not_found = (
    AssertionError,
    FileNotFoundError,
    ValueError,
    getattr(
      getattr(tfds.core, 'registered', None),
      'DatasetNotFoundError',
      FileNotFoundError,
    ),
  )
  try:
    builder = tfds.builder(name, data_dir=data_dir)
  except not_found as e:
    first_line = (str(e).strip().splitlines() or [type(e).__name__])[0]
    raise missing(f' ({first_line[:200]})') from e
  if not builder.is_prepared():
    raise missing('')
  return builder


def load(name: str, split: str, data_dir: Optional[str]) -> ArrayDataset:
  """Loads a prepared TFDS dataset (never downloads) as an `ArrayDataset`.

  Datasets written in the ArrayRecord format are read with TFDS's random
  access data source, which needs no TensorFlow (images are decoded with
  Pillow); other formats (TFRecord, TFDS's default) go through TFDS's
  tf.data pipeline (`builder.as_dataset`), which needs TensorFlow.
  """
  builder = _tfds_builder(name, data_dir)
  info = builder.info
  keys = info.supervised_keys
  if not keys or len(keys) != 2:
    raise ValueError(
      f'TFDS dataset {name!r} has no (image, label) supervised keys '
      f'({keys!r}); only supervised image classification datasets load here.'
    )
  label_key = keys[1]
  file_format = str(getattr(info.file_format, 'value', info.file_format))
  if file_format == 'array_record':
    images, labels = _read_data_source(
      builder.as_data_source(split=split), keys, f'{name}/{split}'
    )
  else:
    images, labels = _read_with_tensorflow(builder, name, split, file_format)
  num_classes = int(info.features[label_key].num_classes)
  labels = np.asarray(labels, dtype=np.int32)
  check_labels(labels, num_classes, f'{name}/{split}')
  return ArrayDataset(np.asarray(images, dtype=np.uint8), labels, num_classes)


def _read_data_source(
  source, keys: Tuple[str, str], where: str, chunk: int = 4096
) -> Tuple[np.ndarray, np.ndarray]:
  """Every record of a TFDS data source, stacked: ([N, H, W, C], [N])."""
  image_key, label_key = keys
  images, labels = [], []
  for start in range(0, len(source), chunk):
    records = source.__getitems__(
      list(range(start, min(start + chunk, len(source))))
    )
    images.extend(r[image_key] for r in records)
    labels.extend(r[label_key] for r in records)
  if not images:
    raise ValueError(f'TFDS split {where} is empty.')
  return np.stack(images), np.asarray(labels)


def _read_with_tensorflow(
  builder, name: str, split: str, file_format: str
) -> Tuple[np.ndarray, np.ndarray]:
  """A TFRecord dataset, whole, through tf.data (needs TensorFlow)."""
  if importlib.util.find_spec('tensorflow') is None:
    raise ImportError(
      f'TFDS dataset {name!r} is stored as {file_format}, which only '
      'TensorFlow reads; TensorFlow is not installed. Either pip install '
      f"'fedjax_metric[tfds]', or rebuild it with `tfds build {name} "
      '--file_format=array_record`, which this library reads without '
      'TensorFlow.'
    )
  tfds = _import_tfds(name)
  ds = builder.as_dataset(split=split, batch_size=-1, as_supervised=True)
  return tfds.as_numpy(ds)
