"""The golden fixtures: which authors' code each was made from, and its test.

  python benchmarks/crosscheck/fixtures.py          # a table, one fixture a row
  make crosscheck                                   # the table, then the tests

Every ``tests/golden/<name>.npz`` was written by
``benchmarks/crosscheck/<script>.py`` from the authors' released code run
unchanged at a named commit (docs/results/crosscheck.md); it records
``repository``, ``commit`` (40 hex digits) and ``function`` (the authors'
functions it ran). This lists them with the test files that read each one.
It needs neither PyTorch nor the authors' code: only NumPy and the files.
"""

import glob
import os
import re
import sys

import numpy as np

REPO = os.path.dirname(
  os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
)
GOLDEN = os.path.join(REPO, 'tests', 'golden')


def fixture_provenance(path):
  """{'repository', 'commit', 'function'} of one fixture, as strings; the
  commit must be a full 40-hex SHA."""
  with np.load(path, allow_pickle=False) as data:
    missing = [k for k in ('repository', 'commit', 'function') if k not in data]
    if missing:
      raise ValueError(
        f'{path} has no {", ".join(missing)}: remake it with its script'
      )
    found = {k: str(data[k]) for k in ('repository', 'commit', 'function')}
  if not re.fullmatch(r'[0-9a-f]{40}', found['commit']):
    raise ValueError(
      f'{path} names commit {found["commit"]!r}, not 40 hex digits: remake it '
      'with its script and --commit=<the full SHA>'
    )
  return found


def tests_reading(name, tests_dir=None):
  """The golden test files (basenames) that name the fixture: ``<name>.npz``, or
  ``'<name>'`` quoted (tests load by name through a helper)."""
  pattern = re.compile(rf"""{re.escape(name)}\.npz|['"]{re.escape(name)}['"]""")
  tests_dir = tests_dir or os.path.join(REPO, 'tests')
  readers = []
  for path in sorted(glob.glob(os.path.join(tests_dir, 'test_golden_*.py'))):
    with open(path, encoding='utf-8') as f:
      if pattern.search(f.read()):
        readers.append(os.path.basename(path))
  return readers


def index(golden_dir=GOLDEN, tests_dir=None):
  """One row a fixture: (name, repository@commit[:7], tests, functions)."""
  rows = []
  for path in sorted(glob.glob(os.path.join(golden_dir, '*.npz'))):
    name = os.path.basename(path)[: -len('.npz')]
    p = fixture_provenance(path)
    rows.append(
      (
        name,
        f'{p["repository"]}@{p["commit"][:7]}',
        ', '.join(tests_reading(name, tests_dir)) or '(no test)',
        p['function'],
      )
    )
  return rows


def main():
  try:
    rows = index()
  except ValueError as e:  # A fixture without provenance: one line.
    print(e, file=sys.stderr)
    return 2
  print("| fixture | authors' code | read by | what ran |")
  print('|---|---|---|---|')
  for row in rows:
    print('| ' + ' | '.join(row) + ' |')
  unread = [r[0] for r in rows if r[2] == '(no test)']
  if unread:
    print(f'fixtures no test reads: {", ".join(unread)}', file=sys.stderr)
    return 1
  return 0


if __name__ == '__main__':
  sys.exit(main())
