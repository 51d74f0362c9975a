"""Tests for fedjax_metric.data.natural and partition.natural.

The files are written here in the published layouts, not by the readers:
LEAF's JSON as data/femnist/preprocess/data_to_json.py and
data/utils/split_data.py write it (github.com/TalwalkarLab/leaf), FedJAX's
SQLite as fedjax/core/sqlite_federated_data.py `SQLiteFederatedDataBuilder`
and fedjax/core/serialization.py `msgpack_serialize` write it
(github.com/google/fedjax), with the msgpack library.
"""

import ast
import inspect
import json
import os
import sqlite3
import zlib

import numpy as np
import pytest
from test_fedjax_blob import _serialize

from fedjax_metric.data import fedjax_blob, natural, sources
from fedjax_metric.data import partition as P


@pytest.fixture(autouse=True)
def _no_env_dir(monkeypatch):
  monkeypatch.delenv(sources.ENV_VAR, raising=False)


def _grey(rng, n):
  """n 28x28 uint8 greyscale characters as NIST scans them: a white (255)
  ground with darker ink strokes."""
  grey = np.full((n, 28, 28), 255, np.uint8)
  grey[:, 5:20, 10:14] = rng.integers(0, 200, size=(n, 15, 4))
  return grey


def _one_line(error):
  text = str(error.value)
  assert '\n' not in text and 'Traceback' not in text
  return text


# ------------------------------------------------------------------- LEAF ----

# Writers and their examples, as NIST names them; file order is not sorted.
WRITERS = {
  'f0347_22': 3,
  'f0102_05': 2,
  'f3100_41': 4,
  'f0001_00': 1,
  'f2222_10': 3,
}
# Which all_data_<k>.json file holds each writer, in that file's order.
FILES = {2: ['f0347_22', 'f0102_05'], 10: ['f3100_41', 'f0001_00', 'f2222_10']}


def _leaf_users(seed):
  """{writer: (grey [n, 28, 28], labels [n])} with 2n examples to split."""
  rng = np.random.default_rng(seed)
  out = {}
  for w, n in WRITERS.items():
    out[w] = (_grey(rng, 2 * n), rng.integers(0, 62, size=2 * n))
  return out


def _leaf_json(users, names, rows):
  """A LEAF file's object; x as data_to_json.py: grey / 255, flattened."""
  return {
    'users': names,
    'num_samples': [len(rows[w]) for w in names],
    'user_data': {
      w: {
        'x': [(users[w][0][i].flatten() / 255).tolist() for i in rows[w]],
        'y': [int(users[w][1][i]) for i in rows[w]],
      }
      for w in names
    },
  }


def _write_leaf(root, users):
  """leaf/data/femnist/data/{train,test} after `-t sample`: a writer's
  first n examples in train, the other n in test."""
  expected = {'train': [], 'test': []}
  for split, offset in (('train', 0), ('test', 1)):
    folder = root / 'data' / split
    folder.mkdir(parents=True)
    for k, names in FILES.items():
      rows = {
        w: range(offset * WRITERS[w], (1 + offset) * WRITERS[w]) for w in names
      }
      path = folder / f'all_data_{k}_niid_05_keep_0_{split}_9.json'
      with open(path, 'w') as f:
        json.dump(_leaf_json(users, names, rows), f)
      for w in names:
        expected[split] += [(w, i) for i in rows[w]]
  return expected


@pytest.fixture
def leaf(tmp_path):
  users = _leaf_users(0)
  return tmp_path, users, _write_leaf(tmp_path, users)


def _check_split(ds, users, expected):
  names = sorted(WRITERS)
  assert ds.client_names == tuple(names)
  assert ds.images.dtype == np.uint8 and ds.images.shape == (
    len(expected),
    28,
    28,
    1,
  )
  assert ds.labels.dtype == np.int32 and ds.num_classes == 62
  assert ds.client_ids.dtype == np.int64
  for k, (w, i) in enumerate(expected):
    # MNIST's convention: ground 0, ink 255 (LEAF's ground is 1.0).
    np.testing.assert_array_equal(ds.images[k, ..., 0], 255 - users[w][0][i])
    assert ds.labels[k] == users[w][1][i]
    assert ds.client_names[ds.client_ids[k]] == w
  assert ds.images[:, 0, 0].max() == 0  # The white ground became 0.


def test_leaf_reads_images_labels_and_writers_in_file_order(leaf):
  root, users, expected = leaf
  for split in sources.SPLITS:
    ds = natural.read_leaf(root / 'data', split)
    # all_data_2 before all_data_10, users in each file's order.
    _check_split(ds, users, expected[split])


def test_leaf_accepts_femnist_folder_flat_folder_and_file_list(leaf, tmp_path):
  root, users, expected = leaf
  # leaf/data/femnist: the split is under data/.
  _check_split(natural.read_leaf(root, 'test'), users, expected['test'])
  flat = tmp_path / 'flat'
  flat.mkdir()
  for split in sources.SPLITS:
    for name in os.listdir(root / 'data' / split):
      os.link(root / 'data' / split / name, flat / name)
  _check_split(natural.read_leaf(flat, 'train'), users, expected['train'])
  files = sorted(
    (root / 'data' / 'test').iterdir(),
    key=lambda p: '_10_' in p.name,  # all_data_2 first.
  )
  _check_split(natural.read_leaf(files, 'test'), users, expected['test'])
  one = natural.read_leaf(files[0], 'test')
  assert one.client_names == tuple(sorted(FILES[2]))
  # A folder of unsplit all_data_*.json is not taken as both splits.
  unsplit = tmp_path / 'all_data'
  unsplit.mkdir()
  os.link(files[0], unsplit / 'all_data_2.json')
  with pytest.raises(sources.DatasetNotFoundError) as error:
    natural.read_leaf(unsplit, 'train')
  assert 'no train/ folder and no *_train_*.json' in _one_line(error)
  assert len(natural.read_leaf([unsplit / 'all_data_2.json']).labels) == 5


def test_leaf_natural_partition_and_train_test_alignment(leaf):
  root, users, _ = leaf
  train = sources.load('femnist', 'train', data_dir=str(root / 'data'))
  test = sources.load('femnist', 'test', data_dir=str(root / 'data'))
  parts = P.natural(train.client_ids)
  assert len(parts) == len(WRITERS)
  flat = np.concatenate(parts)
  assert sorted(flat) == list(range(len(train.labels)))  # Each once.
  for j, part in enumerate(parts):
    assert part.dtype == np.int64
    writer = sorted(WRITERS)[j]
    assert len(part) == WRITERS[writer]
    assert set(train.client_ids[part]) == {j}
  # Both splits number the writers alike, and match their examples.
  assert train.client_names == test.client_names
  for j, part in enumerate(P.natural(test.client_ids)):
    w = test.client_names[j]
    np.testing.assert_array_equal(
      test.labels[part], users[w][1][WRITERS[w] : 2 * WRITERS[w]]
    )


def test_leaf_registered_and_checked(leaf, tmp_path, monkeypatch):
  root, _, _ = leaf
  assert 'femnist' in sources.DESCRIPTIONS
  assert sources.tfds_name('femnist') is None
  sources.check_available('femnist', str(root / 'data'))
  monkeypatch.setenv(sources.ENV_VAR, str(tmp_path / 'env'))
  os.makedirs(tmp_path / 'env')
  os.symlink(root / 'data', tmp_path / 'env' / 'femnist')
  assert len(sources.load('femnist', 'test').labels) == sum(WRITERS.values())
  empty = tmp_path / 'empty'
  empty.mkdir()
  with pytest.raises(sources.DatasetNotFoundError) as error:
    sources.check_available('femnist', str(empty))
  assert 'preprocess.sh' in _one_line(error) and str(empty) in str(error.value)
  monkeypatch.delenv(sources.ENV_VAR)
  with pytest.raises(sources.DatasetNotFoundError, match='no data_dir'):
    sources.load('femnist', 'train')
  (empty / 'train').mkdir()
  with pytest.raises(sources.DatasetNotFoundError, match='no .json file'):
    natural.read_leaf(empty, 'train')


def _damage(leaf_root, edit):
  """Rewrites all_data_10 (first by name; f3100_41 first, 4 examples)
  through ``edit(obj, text) -> obj or text``."""
  path = sorted((leaf_root / 'data' / 'train').iterdir())[0]
  with open(path) as f:
    text = f.read()
  out = edit(json.loads(text), text)
  if not isinstance(out, (str, bytes)):
    out = json.dumps(out)
  path.write_bytes(out.encode() if isinstance(out, str) else out)
  return path


def _first(obj):
  return obj['user_data'][obj['users'][0]]


def _set(obj, key, value, user=True):
  (_first(obj) if user else obj)[key] = value
  return obj


LEAF_DAMAGE = {
  'truncated': (lambda o, t: t[: len(t) // 2], 'not valid JSON'),
  'not_utf8': (lambda o, t: b'{"users": ["\xff\xfe"]}', 'not UTF-8'),
  'list': (lambda o, t: '[1, 2]', 'expected a JSON object'),
  'no_user_data': (
    lambda o, t: {k: v for k, v in o.items() if k != 'user_data'},
    r"missing key\(s\) \['user_data'\]",
  ),
  'user_not_in_data': (
    lambda o, t: dict(
      o, users=o['users'] + ['f9999_99'], num_samples=o['num_samples'] + [1]
    ),
    "'f9999_99': listed in users but has no entry",
  ),
  'x_y_mismatch': (
    lambda o, t: _set(o, 'y', _first(o)['y'][:-1]),
    "'f3100_41': 'x' has 4 images but 'y' 3 labels",
  ),
  'no_y': (
    lambda o, t: _set(
      o, 'user_data', {u: {'x': []} for u in o['users']}, False
    ),
    "needs keys 'x' and 'y'",
  ),
  'short_image': (
    lambda o, t: _set(o, 'x', [r[:-1] for r in _first(o)['x']]),
    'have 783 values, expected 784',
  ),
  'ragged_images': (
    lambda o, t: _set(o, 'x', [_first(o)['x'][0][:5]] + _first(o)['x'][1:]),
    'list of 784 numbers per image',
  ),
  'num_samples': (
    lambda o, t: _set(o, 'num_samples', [9] + o['num_samples'][1:], False),
    'num_samples says 9 but there are 4 examples',
  ),
  'raw_0_255_pixels': (
    lambda o, t: _set(o, 'x', [[255.0] * 784 for _ in _first(o)['x']]),
    r'pixel values span \[255, 255\], expected floats in \[0, 1\]',
  ),
  'float_labels': (
    lambda o, t: _set(o, 'y', [0.5] * len(_first(o)['y'])),
    'labels must be a list of integers',
  ),
  'label_62': (
    lambda o, t: _set(o, 'y', [62] * len(_first(o)['y'])),
    r"'f3100_41': labels must lie in \[0, 62\), found range \[62, 62\]",
  ),
}


@pytest.mark.parametrize('case', sorted(LEAF_DAMAGE))
def test_leaf_damaged_file_gets_one_line_error(leaf, case):
  root, _, _ = leaf
  edit, match = LEAF_DAMAGE[case]
  path = _damage(root, edit)
  with pytest.raises(natural.NaturalDataError, match=match) as error:
    sources.load('femnist', 'train', data_dir=str(root / 'data'))
  assert isinstance(error.value, ValueError)
  assert _one_line(error).startswith(str(path))


# ----------------------------------------------------------------- FedJAX ----


SCHEMA = """CREATE TABLE federated_data (
  client_id BLOB NOT NULL PRIMARY KEY,
  data BLOB NOT NULL,
  num_examples INTEGER NOT NULL );"""

# FedJAX's EMNIST client ids: 16 hex digits, ':', the NIST writer.
CLIENTS = {
  b'c3a1f0e2d4b59687:f0347_22': 3,
  b'0a1b2c3d4e5f6789:f3100_41': 1,
  b'7f7f7f7f00000000:f0102_05': 2,
}


def _pixels(rng, n):
  """FedJAX's EMNIST pixels: float32 [n, 28, 28] in [0, 1], ground 1.0."""
  return (_grey(rng, n) / np.float32(255)).astype(np.float32)


def _write_sqlite(path, seed, clients=CLIENTS, overrides=None):
  """Rows in `clients` order (rowid), as SQLiteFederatedDataBuilder."""
  rng = np.random.default_rng(seed)
  truth = {}
  connection = sqlite3.connect(path)
  connection.execute(SCHEMA)
  for client_id, n in clients.items():
    examples = {
      'pixels': _pixels(rng, n),
      'label': rng.integers(0, 62, size=n).astype(np.int32),
    }
    truth[client_id.decode()] = examples
    data = zlib.compress(_serialize(examples))
    data, n = (overrides or {}).get(client_id, lambda d, n: (d, n))(data, n)
    connection.execute(
      'INSERT INTO federated_data VALUES (?, ?, ?);', (client_id, data, n)
    )
  connection.commit()
  connection.close()
  return truth


def _check_fedjax(ds, truth):
  names = tuple(sorted(truth))
  assert ds.client_names == names
  order = [c.decode() for c in CLIENTS]  # rowid order.
  assert ds.images.dtype == np.uint8 and ds.images.shape[1:] == (28, 28, 1)
  assert ds.labels.dtype == np.int32 and ds.client_ids.dtype == np.int64
  k = 0
  for name in order:
    ex = truth[name]
    n = len(ex['label'])
    expect = 255 - np.rint(ex['pixels'] * 255).astype(np.uint8)
    np.testing.assert_array_equal(ds.images[k : k + n, ..., 0], expect)
    np.testing.assert_array_equal(ds.labels[k : k + n], ex['label'])
    assert (ds.client_ids[k : k + n] == names.index(name)).all()
    k += n
  assert k == len(ds.labels)
  assert ds.images[:, 0, 0].max() == 0  # The white ground became 0.


def test_fedjax_sqlite_reads_rows_in_rowid_order(tmp_path):
  path = tmp_path / 'federated_emnist_train.sqlite'
  truth = _write_sqlite(path, 0)
  before = path.read_bytes()
  ds = natural.read_fedjax_sqlite(path)
  _check_fedjax(ds, truth)
  assert ds.num_classes == 62
  assert path.read_bytes() == before  # Opened read-only.


def test_pixels_round_to_nearest_grey(tmp_path):
  x = [0.0] * 784
  x[0], x[1], x[2] = 0.999, 0.0019, 1.0  # 254.7, 0.48, 255 of 255.
  path = tmp_path / 'all_data_0_train_9.json'
  path.write_text(
    json.dumps(
      {
        'users': ['u'],
        'num_samples': [1],
        'user_data': {'u': {'x': [x], 'y': [3]}},
      }
    )
  )
  ds = natural.read_leaf(path)
  assert ds.images[0, 0, :4, 0].tolist() == [0, 255, 0, 255]
  assert natural.read_leaf(path, inverted=False).images[
    0, 0, :3, 0
  ].tolist() == [
    255,
    0,
    255,
  ]


def test_fedjax_partition_alignment_and_registration(tmp_path):
  train_truth = _write_sqlite(tmp_path / 'federated_emnist_train.sqlite', 1)
  _write_sqlite(tmp_path / 'federated_emnist_test.sqlite', 2)
  sources.check_available('emnist_fedjax', str(tmp_path))
  assert sources.tfds_name('emnist_fedjax') is None
  train = sources.load('emnist_fedjax', 'train', data_dir=str(tmp_path))
  test = sources.load('emnist_fedjax', 'test', data_dir=str(tmp_path))
  _check_fedjax(train, train_truth)
  assert train.client_names == test.client_names
  parts = P.natural(train.client_ids)
  assert [len(p) for p in parts] == [
    CLIENTS[n.encode()] for n in train.client_names
  ]
  assert sorted(np.concatenate(parts)) == list(range(len(train.labels)))
  for j, part in enumerate(parts):
    np.testing.assert_array_equal(
      train.labels[part], train_truth[train.client_names[j]]['label']
    )
  # The digits-only files, by their own names.
  with pytest.raises(sources.DatasetNotFoundError) as error:
    sources.check_available('emnist_fedjax_digits', str(tmp_path))
  text = _one_line(error)
  assert 'federated_emnist_digitsonly_train.sqlite' in text
  assert 'storage.googleapis.com/gresearch/fedjax/emnist/' in text


def test_fedjax_missing_file_is_not_created(tmp_path):
  path = tmp_path / 'federated_emnist_train.sqlite'
  with pytest.raises(sources.DatasetNotFoundError, match='no such file'):
    natural.read_fedjax_sqlite(path)
  assert not path.exists()
  with pytest.raises(sources.DatasetNotFoundError) as error:
    sources.load('emnist_fedjax', 'test', data_dir=str(tmp_path))
  assert 'federated_emnist_test.sqlite' in _one_line(error)
  assert not os.listdir(tmp_path)


FIRST = next(iter(CLIENTS))


def _bad_table(path):
  connection = sqlite3.connect(path)
  connection.execute('CREATE TABLE examples (client_id TEXT, data BLOB)')
  connection.commit()
  connection.close()


def _no_column(path):
  connection = sqlite3.connect(path)
  connection.execute('CREATE TABLE federated_data (client_id BLOB, data BLOB)')
  connection.commit()
  connection.close()


def _truncate(path):
  _write_sqlite(path, 0, {b'%016x:f0000_00' % i: 40 for i in range(6)})
  data = path.read_bytes()
  path.write_bytes(data[: len(data) // 2])


SQLITE_DAMAGE = {
  'not_sqlite': (
    lambda p: p.write_bytes(b'{"users": []}' * 20),
    'not a readable SQLite database',
  ),
  'truncated': (_truncate, 'not a readable SQLite database'),
  'wrong_table': (
    _bad_table,
    r"no table federated_data \(tables: \['examples'\]\)",
  ),
  'missing_column': (_no_column, r"lacks column\(s\) \['num_examples'\]"),
  'not_zlib': (
    lambda p: _write_sqlite(
      p, 0, overrides={FIRST: lambda d, n: (b'xx' + d, n)}
    ),
    'data blob is not zlib-compressed',
  ),
  'cut_blob': (
    lambda p: _write_sqlite(p, 0, overrides={FIRST: lambda d, n: (d[:-9], n)}),
    'data blob is not zlib-compressed',
  ),
  'cut_msgpack': (
    lambda p: _write_sqlite(
      p,
      0,
      overrides={
        FIRST: lambda d, n: (zlib.compress(zlib.decompress(d)[:-5]), n)
      },
    ),
    'not msgpack in FedJAX serialisation',
  ),
  'num_examples': (
    lambda p: _write_sqlite(p, 0, overrides={FIRST: lambda d, n: (d, n + 1)}),
    'num_examples says 4 but the data holds 3',
  ),
  'no_label': (
    lambda p: _write_sqlite(
      p,
      0,
      overrides={
        FIRST: lambda d, n: (
          zlib.compress(_serialize({'pixels': np.zeros((n, 28, 28))})),
          n,
        )
      },
    ),
    r"lack feature\(s\) \['label'\]",
  ),
  'label_62': (
    lambda p: _write_sqlite(
      p,
      0,
      overrides={
        FIRST: lambda d, n: (
          zlib.compress(
            _serialize(
              {
                'pixels': np.zeros((n, 28, 28), np.float32),
                'label': np.full(n, 62, np.int32),
              }
            )
          ),
          n,
        )
      },
    ),
    r'labels must lie in \[0, 62\), found range \[62, 62\]',
  ),
  'text_data': (
    lambda p: _write_sqlite(p, 0, overrides={FIRST: lambda d, n: ('abc', n)}),
    'data is a str, not a blob',
  ),
}


@pytest.mark.parametrize('case', sorted(SQLITE_DAMAGE))
def test_fedjax_damaged_file_gets_one_line_error(tmp_path, case):
  path = tmp_path / 'federated_emnist_train.sqlite'
  write, match = SQLITE_DAMAGE[case]
  write(path)
  with pytest.raises(natural.NaturalDataError, match=match) as error:
    natural.read_fedjax_sqlite(path)
  assert _one_line(error).startswith(str(path))
  assert isinstance(error.value, ValueError)
  if case in ('not_zlib', 'num_examples', 'no_label', 'label_62'):
    assert FIRST.decode() in str(error.value)  # Names the client.


# --------------------------------------------------------------- common ----


def test_reindex_clients_renumbers_into_other_names(leaf):
  root, _, _ = leaf
  test = natural.read_leaf(root / 'data', 'test')
  names = ('zz_other',) + tuple(reversed(test.client_names))
  moved = natural.reindex_clients(test, names)
  assert moved.client_names == names
  for old, new in zip(test.client_ids, moved.client_ids):
    assert names[new] == test.client_names[old]
  with pytest.raises(ValueError, match=r"1 writer\(s\).*'f0001_00'"):
    natural.reindex_clients(test, names[:-1])


def test_hold_out_keeps_client_ids_with_their_examples():
  n = 300
  rows = np.arange(n)
  # Each image spells its row: (row // 256, row % 256).
  images = np.stack([rows // 256, rows % 256], -1).astype(np.uint8)
  images = images.reshape(n, 1, 1, 2)
  ids = rows.astype(np.int64) // 7
  ds = sources.ArrayDataset(
    images, (rows % 3).astype(np.int32), 3, ids, ('w',) * 43
  )
  train, val = sources.hold_out(ds, 0.2)
  for part in (train, val):
    row = part.images[:, 0, 0, 0].astype(np.int64) * 256 + part.images[
      :, 0, 0, 1
    ].astype(np.int64)
    np.testing.assert_array_equal(part.client_ids, row // 7)
    np.testing.assert_array_equal(part.labels, row % 3)
    assert part.client_names == ds.client_names
  assert len(train.client_ids) + len(val.client_ids) == n
  # Three-field construction still works and carries no ids.
  plain = sources.ArrayDataset(images, ds.labels, 3)
  assert plain.client_ids is None and plain.client_names is None
  assert sources.hold_out(plain, 0.2)[1].client_ids is None


@pytest.mark.parametrize('module', [natural, fedjax_blob])
def test_natural_has_no_jax_import(module):
  tree = ast.parse(inspect.getsource(module))
  names = {
    a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names
  }
  names |= {
    n.module or '' for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)
  }
  assert not {
    m
    for m in names
    if m.split('.')[0] in ('jax', 'fedjax', 'msgpack', 'tensorflow')
  }


# -------------------------------------------------------------- partition ----


def test_natural_one_client_per_writer_in_id_order():
  ids = np.array([5, 2, 5, 9, 2, 5])
  parts = P.natural(ids)
  assert [p.tolist() for p in parts] == [[1, 4], [0, 2, 5], [3]]
  assert all(p.dtype == np.int64 for p in parts)
  assert P.natural(ids, seed=3)[0].tolist() == [1, 4]  # Seed unused.


def test_natural_subset_of_writers():
  ids = np.repeat(np.arange(10), 3)
  rng = np.random.default_rng(0)
  ids = ids[rng.permutation(ids.size)]
  all_parts = P.natural(ids)
  sub = P.natural(ids, 4, seed=1)
  assert len(sub) == 4
  writers = [int(ids[p[0]]) for p in sub]
  assert writers == sorted(writers) and len(set(writers)) == 4
  for p, w in zip(sub, writers):
    np.testing.assert_array_equal(p, all_parts[w])
  assert [p.tolist() for p in P.natural(ids, 4, seed=1)] == [
    p.tolist() for p in sub
  ]
  draws = {
    tuple(int(ids[p[0]]) for p in P.natural(ids, 4, seed=s)) for s in range(20)
  }
  assert len(draws) > 5  # The seed picks the writers.
  counts = np.zeros(10)
  for s in range(2000):
    for p in P.natural(ids, 3, seed=s):
      counts[ids[p[0]]] += 1
  assert np.allclose(counts / 2000, 0.3, atol=0.05)  # Uniform.
  assert len(P.natural(ids, 10)) == 10


@pytest.mark.parametrize(
  'ids, n, match',
  [
    (np.arange(6) // 2, 4, 'has 3 writers'),
    (np.arange(6) // 2, 0, 'has 3 writers'),
    (np.arange(6) // 2, 1.5, 'has 3 writers'),
    (np.zeros(0, np.int64), None, 'non-empty 1-D integer'),
    (np.zeros((2, 2), np.int64), None, 'non-empty 1-D integer'),
    (np.array([0.0, 1.0]), None, 'non-empty 1-D integer'),
  ],
)
def test_natural_errors(ids, n, match):
  with pytest.raises(ValueError, match=match) as error:
    P.natural(ids, n)
  _one_line(error)


def test_registered_names_agree():
  assert natural.DATASETS == sources.NATURAL_DATASETS
  assert set(sources.NATURAL_DATASETS) <= set(sources.DESCRIPTIONS)
  assert not set(sources.NATURAL_DATASETS) & set(sources.DATASETS)


def test_a_run_partitions_femnist_by_writer_and_evaluates_per_writer(
  leaf, tmp_path
):
  """fedavg on the LEAF files with partition.method=natural: one client per
  writer (partition.json), and the federated evaluation scores writers on
  their own test examples."""
  import json as json_lib

  from fedjax_metric import api, experiment

  root, _, _ = leaf
  config = api.get_config('fedavg', 'runlocal')
  with config.unlocked():
    config.dataset.name = 'femnist'
    config.dataset.data_dir = str(root / 'data')
    config.partition.method = 'natural'
    config.num_clients = len(WRITERS)
    config.clients_per_round = 2
    config.local.batch_size = 2
    config.federated_eval.clients = 3
    config.plot_partition = False
    config.progress = False
  experiment.run(config, str(tmp_path / 'run'))
  with open(tmp_path / 'run' / 'partition.json') as f:
    written = json_lib.load(f)
  assert written['num_clients'] == len(WRITERS)
  assert sorted(np.sum(written['class_counts'], axis=1)) == sorted(
    WRITERS.values()
  )
  with open(tmp_path / 'run' / 'metrics.jsonl') as f:
    row = json_lib.loads(f.readlines()[-1])
  assert row['fed_clients'] == 3
  assert 0.0 <= row['fed_accuracy_p10'] <= row['fed_accuracy_p90'] <= 1.0
  too_many = config.copy_and_resolve_references()
  with too_many.unlocked():
    too_many.num_clients = len(WRITERS) + 1
    too_many.clients_per_round = 1
  with pytest.raises(ValueError, match='writers') as error:
    experiment.run(too_many, str(tmp_path / 'too_many'))
  _one_line(error)
  assert not (tmp_path / 'too_many').exists()
