"""What every dataset loader shares: the names, the in-memory split and its
errors.

`sources` (the built-in loaders and the dispatch by name), `natural` (LEAF,
FedJAX) and `tfds_source` (prepared TFDS directories) all build an
`ArrayDataset`, raise `DatasetNotFoundError` for files that are not on disk
and check labels with `check_labels`; they import these from here, and
`sources` re-exports them (``sources.ArrayDataset``), so that no loader
imports the module that dispatches to it. NumPy only.
"""

from typing import NamedTuple, Optional, Tuple

import numpy as np

ENV_VAR = 'FEDJAX_METRIC_DATA_DIR'
SPLITS = ('train', 'test')
DATASETS = ('digits', 'mnist', 'fashion_mnist', 'cifar10', 'cifar100')
# Built in too, with a writer id per example (fedjax_metric.data.natural).
NATURAL_DATASETS = ('femnist', 'emnist_fedjax', 'emnist_fedjax_digits')
# Made on demand from (seed, client id): no files, no stored examples
# (fedjax_metric.data.synthetic, data/on_demand.py).
GENERATED_DATASETS = ('synthetic',)
# 'tfds:<name>' is TFDS's dataset <name> even where a built-in has the name
# ('tfds:cifar10' reads a prepared TFDS data_dir, 'cifar10' the tarball).
TFDS_PREFIX = 'tfds:'


class DatasetNotFoundError(FileNotFoundError):
  """The dataset's files are not on disk (they are never downloaded)."""


class ArrayDataset(NamedTuple):
  """A whole split held in host memory.

  Attributes:
    images: uint8 [N, H, W, C] pixels.
    labels: int32 [N] class ids in [0, num_classes).
    num_classes: Number of classes.
    client_ids: None, or int64 [N], each example's writer, an index into
      client_names (the natural datasets, `partition.natural`).
    client_names: None, or the writers' names, for `client_ids`.
  """

  images: np.ndarray
  labels: np.ndarray
  num_classes: int
  client_ids: Optional[np.ndarray] = None
  client_names: Optional[Tuple[str, ...]] = None


def check_labels(labels: np.ndarray, num_classes: int, source: str) -> None:
  """Raises ValueError unless every label lies in [0, num_classes)."""
  if labels.size and (labels.min() < 0 or labels.max() >= num_classes):
    raise ValueError(
      f'{source}: labels must lie in [0, {num_classes}), found '
      f'range [{labels.min()}, {labels.max()}].'
    )
