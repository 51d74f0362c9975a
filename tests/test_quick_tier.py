"""The quick tier (`make test`): a seeded sample of each parametrized test
function's cases, every function kept, `slow` left out, `every_case` whole."""

import os
import subprocess
import sys

import conftest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


class _Item:
  def __init__(self, nodeid, *markers):
    self.nodeid = nodeid
    self._markers = set(markers)

  def get_closest_marker(self, name):
    return name if name in self._markers else None


def _items():
  return (
    [_Item('tests/test_a.py::test_plain')]
    + [_Item(f'tests/test_a.py::test_many[{i}]') for i in range(10)]
    + [_Item(f'tests/test_a.py::test_all[{i}]', 'every_case') for i in range(4)]
    + [_Item('tests/test_b.py::test_slow', 'slow')]
    + [_Item(f'tests/test_b.py::test_two[{i}]') for i in range(2)]
  )


def test_every_function_kept_with_a_sample_of_its_cases():
  kept = [i.nodeid for i in conftest.quick_sample(_items(), 3)]
  many = [k for k in kept if '::test_many[' in k]
  assert len(many) == 3
  assert 'tests/test_a.py::test_plain' in kept
  assert sum('::test_all[' in k for k in kept) == 4
  assert sum('::test_two[' in k for k in kept) == 2
  assert 'tests/test_b.py::test_slow' not in kept
  # Order is the collection's, and the sample is the same on every call
  # (xdist's workers must collect the same items).
  order = [i.nodeid for i in _items()]
  assert kept == sorted(kept, key=order.index)
  assert kept == [i.nodeid for i in conftest.quick_sample(_items(), 3)]


def test_each_function_draws_its_own_sample():
  """Seeded by the function's id: not one fixed set of case indices for
  every function (which would never run some cases anywhere)."""
  picks = set()
  for name in range(20):
    items = [_Item(f'tests/test_c.py::test_f{name}[{i}]') for i in range(10)]
    kept = conftest.quick_sample(items, 3)
    picks.add(tuple(k.nodeid.split('[')[1] for k in kept))
  assert len(picks) > 5


def test_pytest_quick_deselects_cases_and_keeps_every_module():
  """Collection with --quick: fewer items, no module lost."""

  def collect(*extra):
    done = subprocess.run(
      [
        sys.executable,
        '-m',
        'pytest',
        '-q',
        '--collect-only',
        '-p',
        'no:xdist',
        *extra,
        'tests/test_quick_tier.py',
        'tests/test_paired.py',
      ],
      cwd=REPO,
      capture_output=True,
      text=True,
      timeout=300,
      stdin=subprocess.DEVNULL,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return [l for l in done.stdout.splitlines() if '::' in l]

  everything, quick = collect(), collect('--quick')
  assert set(quick) <= set(everything)
  modules = lambda ids: {i.split('::')[0] for i in ids}
  assert modules(quick) == modules(everything)


def test_excluded_functions_leave_the_quick_tier_whole():
  items = _items()
  kept = conftest.quick_sample(
    items, 3, excluded={'tests/test_a.py::test_many'}
  )
  names = [i.nodeid for i in kept]
  assert not any('::test_many[' in n for n in names)
  assert 'tests/test_a.py::test_plain' in names


def test_the_budget_drops_the_most_expensive_and_keeps_each_modules_cheapest():
  from benchmarks import quick_tier  # pylint: disable=g-import-not-at-top

  costs = {
    'tests/a.py::big': 50.0,
    'tests/a.py::small': 1.0,
    'tests/b.py::only': 40.0,  # A module's only function stays.
    'tests/c.py::mid': 10.0,
    'tests/c.py::cheap': 2.0,
  }
  assert quick_tier.choose_excluded(costs, budget=60) == {'tests/a.py::big'}
  assert quick_tier.choose_excluded(costs, budget=10) == {
    'tests/a.py::big',
    'tests/c.py::mid',
  }
  assert quick_tier.choose_excluded(costs, budget=1000) == set()
  log = [
    '   3.50s call     tests/a.py::big[x]',
    '   1.50s call     tests/a.py::big[y]',
    '   0.25s setup    tests/a.py::small',
    'noise',
  ]
  assert quick_tier.function_costs(log) == {
    'tests/a.py::big': 5.0,
    'tests/a.py::small': 0.25,
  }


def test_every_excluded_function_exists():
  """A stale entry (a test renamed or moved) would quietly put its
  function back in the quick tier: each one must name a test function
  defined in its file."""
  import ast  # pylint: disable=g-import-not-at-top

  excluded = conftest.quick_excluded()
  assert excluded, 'tests/quick_tier_excluded.txt is empty or missing'
  defined = {}
  for name in excluded:
    path, _, function = name.partition('::')
    if path not in defined:
      with open(os.path.join(REPO, path)) as f:
        tree = ast.parse(f.read())
      defined[path] = {
        n.name for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)
      }
    assert function.split('::')[-1] in defined[path], name
