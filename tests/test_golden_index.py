"""The golden fixtures' index: provenance, a test that reads each, a doc row.

benchmarks/crosscheck/fixtures.py lists every tests/golden/*.npz with the
authors' repository@commit it came from and the golden test that compares
this library against it. Here: the real fixtures all carry that provenance,
each is read by a golden test, and docs/results/crosscheck.md names each
repository@commit; and the index refuses a fixture without provenance and
reports one that no test reads.
"""

import importlib.util
import os
import re

import numpy as np
import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(REPO, 'benchmarks', 'crosscheck', 'fixtures.py')


def load_index_module():
  spec = importlib.util.spec_from_file_location('crosscheck_fixtures', SCRIPT)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


fixtures = load_index_module()


def test_every_fixture_names_its_commit_and_a_golden_test_reads_it():
  rows = fixtures.index()
  assert len(rows) == len(os.listdir(fixtures.GOLDEN)) >= 20
  for name, source, readers, functions in rows:
    assert re.fullmatch(r'[\w.-]+/[\w.-]+@[0-9a-f]{7}', source), (name, source)
    assert readers != '(no test)', f'no golden test reads {name}.npz'
    assert functions.strip(), name


def test_crosscheck_md_names_every_fixtures_repository_at_its_commit():
  with open(
    os.path.join(REPO, 'docs', 'results', 'crosscheck.md'), encoding='utf-8'
  ) as f:
    doc = f.read()
  missing = [
    f'{name}: {source}'
    for name, source, _, _ in fixtures.index()
    if source not in doc
  ]
  assert not missing, f'crosscheck.md does not name {missing}'


def test_a_fixture_without_provenance_is_refused_and_an_unread_one_reported(
  tmp_path,
):
  golden = tmp_path / 'golden'
  golden.mkdir()
  (tmp_path / 'test_golden_x.py').write_text("load('made')\n")
  commit = 'ab' * 20
  np.savez(
    golden / 'made.npz',
    repository='someone/code',
    commit=commit,
    function='loss.py:f',
  )
  np.savez(golden / 'orphan.npz', repository='a/b', commit=commit, function='g')
  rows = fixtures.index(str(golden), str(tmp_path))
  assert rows == [
    ('made', 'someone/code@abababa', 'test_golden_x.py', 'loss.py:f'),
    ('orphan', 'a/b@abababa', '(no test)', 'g'),
  ]
  np.savez(golden / 'bare.npz', x=np.zeros(2))
  with pytest.raises(ValueError, match='bare.npz has no repository, commit'):
    fixtures.index(str(golden), str(tmp_path))
  (golden / 'bare.npz').unlink()
  np.savez(
    golden / 'short.npz', repository='a/b', commit='abc1234', function='h'
  )
  with pytest.raises(ValueError, match="short.npz names commit 'abc1234'"):
    fixtures.index(str(golden), str(tmp_path))
