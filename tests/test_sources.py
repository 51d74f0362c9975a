"""Tests for fedjax_metric.data.sources against hand-built files."""

import glob
import gzip
import importlib.util
import io
import json
import os
import pickle
import shutil
import struct
import subprocess
import sys
import tarfile

import numpy as np
import pytest
import tiny_tfds

from configs import fedavg
from fedjax_metric import validation
from fedjax_metric.data import sources, tfds_source

TESTS = os.path.dirname(os.path.abspath(__file__))

FASHION_DIR = '/usr/share/datasets/fashion-mnist'


@pytest.fixture(autouse=True)
def _no_env_dir(monkeypatch):
  # A data dir set in the developer's environment must not leak into tests.
  monkeypatch.delenv(sources.ENV_VAR, raising=False)


# ------------------------------------------------------------------- IDX ----


def _idx_bytes(magic, array):
  """Builds an IDX file by hand: big-endian magic, big-endian dims, raw bytes."""
  header = struct.pack('>I', magic) + b''.join(
    struct.pack('>I', d) for d in array.shape
  )
  return header + array.astype(np.uint8).tobytes()


def _mnist_split(n, seed):
  images = (
    np.random.RandomState(seed)
    .randint(0, 256, size=(n, 28, 28))
    .astype(np.uint8)
  )
  images[0, 3, 7] = 201  # A pixel we check by position.
  labels = (np.arange(n) * 3 + seed) % 10
  return images, labels.astype(np.uint8)


def _write_idx(directory, prefix, images, labels, gz):
  files = {
    f'{prefix}-images-idx3-ubyte': _idx_bytes(0x803, images),
    f'{prefix}-labels-idx1-ubyte': _idx_bytes(0x801, labels),
  }
  for base, data in files.items():
    if gz:
      with gzip.open(os.path.join(directory, base + '.gz'), 'wb') as f:
        f.write(data)
    else:
      with open(os.path.join(directory, base), 'wb') as f:
        f.write(data)


@pytest.mark.parametrize('gz', [False, True])
@pytest.mark.parametrize('name', ['mnist', 'fashion_mnist'])
def test_idx_roundtrip(tmp_path, name, gz):
  train = _mnist_split(5, seed=1)
  test = _mnist_split(3, seed=2)
  _write_idx(tmp_path, 'train', *train, gz=gz)
  _write_idx(tmp_path, 't10k', *test, gz=gz)
  for split, (images, labels) in (('train', train), ('test', test)):
    ds = sources.load(name, split, data_dir=str(tmp_path))
    assert ds.images.dtype == np.uint8 and ds.labels.dtype == np.int32
    assert ds.images.shape == (len(labels), 28, 28, 1)
    np.testing.assert_array_equal(ds.images[..., 0], images)
    np.testing.assert_array_equal(ds.labels, labels)
    assert ds.images[0, 3, 7, 0] == 201
    assert ds.num_classes == 10


def test_idx_env_var_dir(tmp_path, monkeypatch):
  (tmp_path / 'mnist').mkdir()
  _write_idx(tmp_path / 'mnist', 't10k', *_mnist_split(2, seed=3), gz=False)
  monkeypatch.setenv(sources.ENV_VAR, str(tmp_path))
  assert sources.load('mnist', 'test').images.shape == (2, 28, 28, 1)


def test_idx_bad_magic(tmp_path):
  _write_idx(tmp_path, 'train', *_mnist_split(4, seed=1), gz=False)
  path = tmp_path / 'train-images-idx3-ubyte'
  data = bytearray(path.read_bytes())
  data[3] = 0x01  # Claims to be a labels file.
  path.write_bytes(bytes(data))
  with pytest.raises(ValueError, match='train-images-idx3-ubyte.*magic'):
    sources.load('mnist', 'train', data_dir=str(tmp_path))


def test_idx_truncated(tmp_path):
  _write_idx(tmp_path, 'train', *_mnist_split(4, seed=1), gz=True)
  path = tmp_path / 'train-images-idx3-ubyte.gz'
  raw = gzip.decompress(path.read_bytes())
  path.write_bytes(gzip.compress(raw[:-100]))
  with pytest.raises(ValueError, match='train-images-idx3-ubyte.gz.*truncated'):
    sources.load('fashion_mnist', 'train', data_dir=str(tmp_path))


def test_idx_truncated_gzip_stream(tmp_path):
  _write_idx(tmp_path, 't10k', *_mnist_split(4, seed=1), gz=True)
  path = tmp_path / 't10k-labels-idx1-ubyte.gz'
  path.write_bytes(path.read_bytes()[:15])
  with pytest.raises(ValueError, match='t10k-labels-idx1-ubyte.gz'):
    sources.load('mnist', 'test', data_dir=str(tmp_path))


def test_idx_label_count_mismatch(tmp_path):
  images, labels = _mnist_split(4, seed=1)
  _write_idx(tmp_path, 'train', images, labels[:3], gz=False)
  with pytest.raises(ValueError, match='3 labels for 4 images'):
    sources.load('mnist', 'train', data_dir=str(tmp_path))


def test_idx_label_out_of_range(tmp_path):
  images, labels = _mnist_split(4, seed=1)
  labels[2] = 10
  _write_idx(tmp_path, 'train', images, labels, gz=False)
  with pytest.raises(ValueError, match=r'\[0, 10\)'):
    sources.load('mnist', 'train', data_dir=str(tmp_path))


def test_parse_idx_trailing_bytes():
  data = _idx_bytes(0x801, np.arange(3)) + b'\x00'
  with pytest.raises(ValueError, match='trailing'):
    sources.parse_idx(data, 0x801, 'labels.idx')


def test_fashion_mnist_missing_dir(tmp_path):
  missing = str(tmp_path / 'nope')
  with pytest.raises(sources.DatasetNotFoundError) as info:
    sources.load('fashion_mnist', 'train', data_dir=missing)
  msg = str(info.value)
  assert 'train-images-idx3-ubyte' in msg and 'train-labels-idx1-ubyte' in msg
  assert missing in msg
  assert 'apt-get install dataset-fashion-mnist' in msg
  assert isinstance(info.value, FileNotFoundError)


def test_mnist_missing_without_dir():
  with pytest.raises(
    sources.DatasetNotFoundError, match='t10k-images-idx3-ubyte.*MNIST site'
  ):
    sources.load('mnist', 'test')


@pytest.mark.skipif(
  not os.path.isdir(FASHION_DIR), reason='dataset-fashion-mnist not installed'
)
def test_real_fashion_mnist():
  for split, n in (('train', 60000), ('test', 10000)):
    ds = sources.load('fashion_mnist', split)
    assert ds.images.shape == (n, 28, 28, 1) and ds.images.dtype == np.uint8
    assert ds.labels.shape == (n,) and ds.num_classes == 10
    np.testing.assert_array_equal(np.unique(ds.labels), np.arange(10))
    assert ds.images.max() == 255


# ----------------------------------------------------------------- CIFAR ----


def _cifar_batch(n, seed, num_classes):
  """Returns (pickled dict fields, expected HWC images, labels)."""
  rng = np.random.RandomState(seed)
  hwc = rng.randint(0, 256, size=(n, 32, 32, 3)).astype(np.uint8)
  hwc[0, 5, 9] = (10, 20, 30)  # Row 5, column 9: distinct R, G, B.
  # Build the row-major CHW rows by hand rather than with transpose.
  rows = np.zeros((n, 3072), np.uint8)
  for i in range(n):
    for c in range(3):
      for y in range(32):
        rows[i, c * 1024 + y * 32 : c * 1024 + y * 32 + 32] = hwc[i, y, :, c]
  labels = [int(v) for v in rng.randint(0, num_classes, size=n)]
  return rows, hwc, labels


def _cifar_files(name):
  """Returns ({member: pickled bytes}, {split: (images, labels)})."""
  if name == 'cifar10':
    key, num_classes = b'labels', 10
    layout = {
      'train': [f'data_batch_{i}' for i in range(1, 6)],
      'test': ['test_batch'],
    }
  else:
    key, num_classes = b'fine_labels', 100
    layout = {'train': ['train'], 'test': ['test']}
  files, expected = {}, {}
  seed = 0
  for split, members in layout.items():
    images, labels = [], []
    for member in members:
      seed += 1
      rows, hwc, lab = _cifar_batch(2, seed, num_classes)
      fields = {b'data': rows, key: lab, b'batch_label': b'x'}
      if name == 'cifar100':
        fields[b'coarse_labels'] = [0] * len(lab)
      files[member] = pickle.dumps(fields, protocol=2)
      images.append(hwc)
      labels.extend(lab)
    expected[split] = (np.concatenate(images), np.array(labels))
  return files, expected


_FOLDER = {'cifar10': 'cifar-10-batches-py', 'cifar100': 'cifar-100-python'}
_ARCHIVE = {
  'cifar10': 'cifar-10-python.tar.gz',
  'cifar100': 'cifar-100-python.tar.gz',
}


def _write_tar(path, folder, files):
  with tarfile.open(path, 'w:gz') as tar:
    for member, data in files.items():
      info = tarfile.TarInfo(f'{folder}/{member}')
      info.size = len(data)
      tar.addfile(info, io.BytesIO(data))


def _check_cifar(name, data_dir, expected):
  for split, (images, labels) in expected.items():
    ds = sources.load(name, split, data_dir=str(data_dir))
    assert ds.images.dtype == np.uint8 and ds.images.shape == images.shape
    np.testing.assert_array_equal(ds.images, images)
    np.testing.assert_array_equal(ds.labels, labels)
    assert ds.labels.dtype == np.int32
    assert ds.num_classes == (10 if name == 'cifar10' else 100)
    assert tuple(ds.images[0, 5, 9]) == (10, 20, 30)


@pytest.mark.parametrize('name', ['cifar10', 'cifar100'])
def test_cifar_tar(tmp_path, name):
  files, expected = _cifar_files(name)
  _write_tar(tmp_path / _ARCHIVE[name], _FOLDER[name], files)
  _check_cifar(name, tmp_path, expected)
  assert os.listdir(tmp_path) == [_ARCHIVE[name]]  # Nothing was extracted.


@pytest.mark.parametrize('name', ['cifar10', 'cifar100'])
@pytest.mark.parametrize('point_at_folder', [False, True])
def test_cifar_extracted(tmp_path, name, point_at_folder):
  files, expected = _cifar_files(name)
  folder = tmp_path / _FOLDER[name]
  folder.mkdir()
  for member, data in files.items():
    (folder / member).write_bytes(data)
  _check_cifar(name, folder if point_at_folder else tmp_path, expected)


def test_cifar_missing(tmp_path):
  with pytest.raises(sources.DatasetNotFoundError) as info:
    sources.load('cifar10', 'train', data_dir=str(tmp_path))
  msg = str(info.value)
  assert 'cifar-10-python.tar.gz' in msg and 'cifar-10-batches-py' in msg
  assert str(tmp_path) in msg


def test_cifar_bad_pickle(tmp_path):
  files, _ = _cifar_files('cifar10')
  files['test_batch'] = b'not a pickle at all'
  _write_tar(tmp_path / _ARCHIVE['cifar10'], _FOLDER['cifar10'], files)
  with pytest.raises(ValueError, match='test_batch.*unpickle'):
    sources.load('cifar10', 'test', data_dir=str(tmp_path))


def test_cifar_missing_member(tmp_path):
  files, _ = _cifar_files('cifar10')
  del files['data_batch_3']
  _write_tar(tmp_path / _ARCHIVE['cifar10'], _FOLDER['cifar10'], files)
  with pytest.raises(ValueError, match='data_batch_3'):
    sources.load('cifar10', 'train', data_dir=str(tmp_path))


def test_cifar_truncated_archive(tmp_path):
  files, _ = _cifar_files('cifar100')
  path = tmp_path / _ARCHIVE['cifar100']
  _write_tar(path, _FOLDER['cifar100'], files)
  path.write_bytes(path.read_bytes()[:200])
  with pytest.raises(ValueError, match='cifar-100-python.tar.gz'):
    sources.load('cifar100', 'train', data_dir=str(tmp_path))


def test_cifar_wrong_row_size(tmp_path):
  folder = tmp_path / _FOLDER['cifar100']
  folder.mkdir()
  bad = {b'data': np.zeros((2, 3000), np.uint8), b'fine_labels': [0, 1]}
  (folder / 'test').write_bytes(pickle.dumps(bad))
  with pytest.raises(ValueError, match='3072'):
    sources.load('cifar100', 'test', data_dir=str(tmp_path))


# ---------------------------------------------------------------- digits ----


def test_digits():
  train = sources.load('digits', 'train')
  test = sources.load('digits', 'test')
  for ds in (train, test):
    assert ds.images.dtype == np.uint8 and ds.images.shape[1:] == (8, 8, 1)
    assert ds.labels.dtype == np.int32 and ds.num_classes == 10
    np.testing.assert_array_equal(np.unique(ds.labels), np.arange(10))
  assert len(train.labels) + len(test.labels) == 1797
  assert 350 <= len(test.labels) <= 370
  assert train.images.max() == 255 and train.images.min() == 0
  # Scaling: every value is round(k * 255 / 16) for some count k in 0..16.
  allowed = np.round(np.arange(17) * 255 / 16)
  assert np.isin(
    np.concatenate([train.images.ravel(), test.images.ravel()]), allowed
  ).all()
  # Disjoint: no test image (with its label) also appears in train.
  train_keys = {
    (im.tobytes(), int(l)) for im, l in zip(train.images, train.labels)
  }
  test_keys = {
    (im.tobytes(), int(l)) for im, l in zip(test.images, test.labels)
  }
  assert len(test_keys) == len(
    test.labels
  )  # Sklearn digits have no exact duplicates.
  assert not train_keys & test_keys
  # Every (image, label) pair matches sklearn's own data, scaled independently here.
  from sklearn.datasets import load_digits  # pylint: disable=g-import-not-at-top

  raw = load_digits()
  scaled = (raw.images * 255 / 16 + 0.5).astype(np.uint8)[..., None]
  assert train_keys | test_keys == {
    (im.tobytes(), int(l)) for im, l in zip(scaled, raw.target)
  }
  # Stratified: each class is about 20% test.
  for c in range(10):
    frac = np.sum(test.labels == c) / (
      np.sum(test.labels == c) + np.sum(train.labels == c)
    )
    assert abs(frac - 0.2) < 0.01
  again = sources.load('digits', 'test')
  np.testing.assert_array_equal(again.images, test.images)
  np.testing.assert_array_equal(again.labels, test.labels)


def test_bad_split():
  with pytest.raises(ValueError, match="'train', 'test'"):
    sources.load('digits', 'validation')
  with pytest.raises(ValueError, match='split'):
    sources.load('cifar10', 'train[:10%]', data_dir='/nonexistent')


# ------------------------------------------------------------------ TFDS ----


@pytest.fixture(scope='module')
def tfds_dir(tmp_path_factory):
  """A data directory with `tiny_tfds.NAME` prepared as ArrayRecord, by TFDS
  itself, in another process (see tests/tiny_tfds.py)."""
  pytest.importorskip(
    'tensorflow_datasets',
    reason='the test extra installs it (pip install -e .[test])',
  )
  data_dir = str(tmp_path_factory.mktemp('tfds'))
  subprocess.run(
    [sys.executable, os.path.join(TESTS, 'tiny_tfds.py'), data_dir],
    check=True,
    capture_output=True,
  )
  return data_dir


def _sorted_pairs(images, labels):
  """Images and labels ordered by the images' bytes: TFDS shuffles records
  when it prepares a dataset, so only the multiset of examples is fixed."""
  order = sorted(range(len(labels)), key=lambda i: images[i].tobytes())
  return images[order], np.asarray(labels)[order]


def test_tfds_array_record_dataset_loads_without_tensorflow(
  tfds_dir, monkeypatch
):
  def no_tensorflow(*args):
    raise AssertionError(f'TensorFlow path taken: {args[1:]}')

  monkeypatch.setattr(tfds_source, '_read_with_tensorflow', no_tensorflow)
  sources.check_available(tiny_tfds.NAME, tfds_dir)
  for split, size in tiny_tfds.SIZES.items():
    ds = sources.load(tiny_tfds.NAME, split, data_dir=tfds_dir)
    assert ds.images.dtype == np.uint8 and ds.labels.dtype == np.int32
    assert ds.images.shape == (size, *tiny_tfds.SHAPE)
    assert ds.num_classes == tiny_tfds.NUM_CLASSES
    got = _sorted_pairs(ds.images, ds.labels)
    want = _sorted_pairs(*tiny_tfds.examples(split))
    np.testing.assert_array_equal(got[0], want[0])  # PNG is lossless.
    np.testing.assert_array_equal(got[1], want[1])
  # TFDS split strings work as in tfds.load.
  half = sources.load(tiny_tfds.NAME, 'train[:50%]', data_dir=tfds_dir)
  assert half.images.shape[0] == tiny_tfds.SIZES['train'] // 2
  train = {im.tobytes() for im in tiny_tfds.examples('train')[0]}
  assert {im.tobytes() for im in half.images} <= train
  # A run's config names it like any dataset; validation reads its metadata.
  config = fedavg.get_config('runlocal')
  config.dataset.name, config.dataset.data_dir = tiny_tfds.NAME, tfds_dir
  validation.validate(config)
  # The environment variable stands in for data_dir.
  monkeypatch.setenv(sources.ENV_VAR, tfds_dir)
  test = sources.load(tiny_tfds.NAME, 'test')
  assert test.images.shape[0] == tiny_tfds.SIZES['test']


def test_tfds_prefix_picks_tfds_over_a_built_in_name(tfds_dir, tmp_path):
  assert sources.tfds_name('cifar10') is None  # the built-in tarball loader
  assert sources.tfds_name('tfds:cifar10') == 'cifar10'
  assert sources.tfds_name('svhn_cropped') == 'svhn_cropped'
  with pytest.raises(ValueError, match='tfds:<name>'):
    sources.tfds_name('tfds:')
  # tfds:<name> reads the same prepared data as the bare TFDS name.
  prefixed = sources.load(f'tfds:{tiny_tfds.NAME}', 'test', data_dir=tfds_dir)
  bare = sources.load(tiny_tfds.NAME, 'test', data_dir=tfds_dir)
  np.testing.assert_array_equal(prefixed.images, bare.images)
  sources.check_available(f'tfds:{tiny_tfds.NAME}', tfds_dir)
  # tfds:cifar10 asks TFDS, not the tarball loader: a directory holding the
  # CIFAR-10 tarball does not satisfy it, and the error says which is which.
  files, _ = _cifar_files('cifar10')
  _write_tar(tmp_path / _ARCHIVE['cifar10'], _FOLDER['cifar10'], files)
  sources.check_available('cifar10', str(tmp_path))
  with pytest.raises(sources.DatasetNotFoundError) as info:
    sources.check_available('tfds:cifar10', str(tmp_path))
  message = str(info.value)
  assert "TFDS's cifar10" in message and "plain 'cifar10'" in message
  assert 'tfds build cifar10' in message


def test_tfds_dataset_not_prepared_is_a_clear_error(tmp_path):
  # Without TFDS the error is the install hint (the next test), not this.
  pytest.importorskip(
    'tensorflow_datasets',
    reason='the test extra installs it (pip install -e .[test])',
  )
  missing = str(tmp_path / 'no_tfds_here')
  for call in (
    lambda: sources.load(tiny_tfds.NAME, 'train', data_dir=missing),
    lambda: sources.check_available(tiny_tfds.NAME, missing),
  ):
    with pytest.raises(sources.DatasetNotFoundError) as info:
      call()
    msg = str(info.value)
    assert missing in msg
    assert f'tfds build {tiny_tfds.NAME} --file_format=array_record' in msg
  # Before a run writes anything.
  config = fedavg.get_config('runlocal')
  config.dataset.name, config.dataset.data_dir = tiny_tfds.NAME, missing
  with pytest.raises(sources.DatasetNotFoundError, match='tfds build'):
    validation.validate(config)


def test_tfds_names_without_tfds_installed_are_one_install_hint(
  tmp_path, monkeypatch
):
  # sys.modules[name] = None makes `import name` raise ImportError.
  monkeypatch.setitem(sys.modules, 'tensorflow_datasets', None)
  with pytest.raises(ImportError) as info:
    sources.load(tiny_tfds.NAME, 'train', data_dir=str(tmp_path))
  message = str(info.value)
  assert f"'{tiny_tfds.NAME}' is not built in" in message
  assert 'pip install tensorflow-datasets' in message
  assert '\n' not in message


def test_tfds_record_format_without_tensorflow_is_a_clear_error(
  tfds_dir, tmp_path, monkeypatch
):
  """A dataset prepared in TFDS's default TFRecord format needs TensorFlow;
  without it the error says how to rebuild it in a format read without."""
  copy = str(tmp_path / 'copy')
  shutil.copytree(tfds_dir, copy)
  (info_path,) = glob.glob(
    os.path.join(copy, tiny_tfds.NAME, '*', 'dataset_info.json')
  )
  with open(info_path) as f:
    info = json.load(f)
  assert info['fileFormat'] == 'array_record'
  info['fileFormat'] = 'tfrecord'
  with open(info_path, 'w') as f:
    json.dump(info, f)
  find_spec = importlib.util.find_spec
  monkeypatch.setattr(
    tfds_source.importlib.util,
    'find_spec',
    lambda name, *a: None if name == 'tensorflow' else find_spec(name, *a),
  )
  with pytest.raises(ImportError, match='stored as tfrecord') as error:
    sources.load(tiny_tfds.NAME, 'train', data_dir=copy)
  assert '--file_format=array_record' in str(error.value)


def test_unknown_name_without_tfds_says_what_to_install(tmp_path, monkeypatch):
  monkeypatch.setitem(sys.modules, 'tensorflow_datasets', None)
  with pytest.raises(ImportError, match='pip install tensorflow-datasets'):
    sources.load('svhn_cropped', 'train', data_dir=str(tmp_path))
  with pytest.raises(
    sources.DatasetNotFoundError, match=r"fedjax_metric\[tfds\]'"
  ):
    sources.check_available('svhn_cropped', str(tmp_path))


def test_listing():
  assert set(sources.DATASETS) == {
    'digits',
    'mnist',
    'fashion_mnist',
    'cifar10',
    'cifar100',
  }
  assert issubclass(sources.DatasetNotFoundError, FileNotFoundError)
