"""Where the test suite's time goes: JAX's compile, lowering and tracing, per test.

Two parts:

* A pytest plugin (``-p benchmarks.suite_profile``). Each process (every
  xdist worker) listens to JAX's monitoring events and adds up, per test, the
  seconds of ``backend_compile_duration`` (XLA compilation),
  ``jaxpr_to_mlir_module_duration`` (lowering) and ``jaxpr_trace_duration``
  (tracing), the number of programs compiled, and the test's wall time
  (setup, call and teardown). At the end it writes one JSON file per process
  into ``$SUITE_PROFILE_DIR``. Work done in child processes (CLI, notebook,
  multi-host tests) is not seen: it counts as the test's "other" time.
* A command. ``python -m benchmarks.suite_profile [--empty_cache]
  [--workers=2] [pytest args]`` runs the suite with the plugin, adds the
  files up per test file, prints the table, and appends it to
  benchmarks/suite_profile.md. ``--empty_cache`` uses a fresh persistent
  compilation cache, as a fresh CI machine has.

The listener's cost is small: a whole-suite run with it took 8% longer than
one without, about the spread between two runs of the same suite.
"""

import collections
import json
import os
import sys
import tempfile
import time
from typing import Dict, List, Mapping, Tuple

import pytest

EVENTS = {
  'backend_compile_duration': 'compile',
  'jaxpr_to_mlir_module_duration': 'lower',
  'jaxpr_trace_duration': 'trace',
}
COLUMNS = ('wall', 'compile', 'lower', 'trace', 'programs', 'other')

_current = ['<collection>']
_per_test: Dict[str, collections.Counter] = collections.defaultdict(
  collections.Counter
)


def _on_event(event: str, duration: float, **kwargs) -> None:
  del kwargs
  name = EVENTS.get(event.rsplit('/', 1)[-1])
  if name:
    _per_test[_current[0]][name] += duration
    if name == 'compile':
      _per_test[_current[0]]['programs'] += 1


def pytest_configure(config):
  del config
  from jax import monitoring  # pylint: disable=g-import-not-at-top

  monitoring.register_event_duration_secs_listener(_on_event)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
  """Times the whole protocol of one test (setup, call, teardown), in the
  process that runs it (an xdist worker, not the controller)."""
  del nextitem
  _current[0] = item.nodeid
  start = time.perf_counter()
  yield
  _per_test[item.nodeid]['wall'] += time.perf_counter() - start
  _current[0] = '<between tests>'


def pytest_sessionfinish(session):
  del session
  directory = os.environ.get('SUITE_PROFILE_DIR')
  if directory and any('wall' in r for r in _per_test.values()):
    path = os.path.join(directory, f'profile_{os.getpid()}.json')
    with open(path, 'w') as f:
      json.dump(_per_test, f)


def per_file(
  records: Mapping[str, Mapping[str, float]],
) -> List[Tuple[str, Dict[str, float]]]:
  """Adds per-test records up per test file, largest wall time first.

  Args:
    records: ``{node id: {'wall', 'compile', 'lower', 'trace', 'programs'}}``
      (missing keys count as 0); node ids without '::' (time outside any
      test) are left out.

  Returns:
    ``[(file, {column: total})]`` with ``other = wall - compile - lower -
    trace`` (execution, Python, child processes).
  """
  files: Dict[str, collections.Counter] = collections.defaultdict(
    collections.Counter
  )
  for nodeid, record in records.items():
    if '::' not in nodeid:
      continue
    files[nodeid.split('::', 1)[0]].update(
      {k: record.get(k, 0.0) for k in COLUMNS[:-1]}
    )
  rows = []
  for name, total in files.items():
    row = {k: float(total[k]) for k in COLUMNS[:-1]}
    row['other'] = row['wall'] - row['compile'] - row['lower'] - row['trace']
    rows.append((name, row))
  return sorted(rows, key=lambda r: -r[1]['wall'])


def merge(paths: List[str]) -> Dict[str, collections.Counter]:
  """The per-test records of several processes' JSON files, added up."""
  merged: Dict[str, collections.Counter] = collections.defaultdict(
    collections.Counter
  )
  for path in paths:
    with open(path) as f:
      for nodeid, record in json.load(f).items():
        merged[nodeid].update(record)
  return merged


def table_rows(rows, top: int):
  """Formatted cells: the ``top`` largest files, then the total."""
  total = collections.Counter()
  for _, row in rows:
    total.update(row)
  cells = [
    [name] + [f'{row[k]:.0f}' for k in COLUMNS] for name, row in rows[:top]
  ]
  cells.append(['**total**'] + [f'**{total[k]:.0f}**' for k in COLUMNS])
  return cells


def main(argv: List[str]) -> int:
  import argparse  # pylint: disable=g-import-not-at-top
  import shutil  # pylint: disable=g-import-not-at-top
  import subprocess  # pylint: disable=g-import-not-at-top

  from benchmarks import machine  # pylint: disable=g-import-not-at-top

  parser = argparse.ArgumentParser(
    prog='python -m benchmarks.suite_profile',
    description='Runs the test suite and tables its time per test file; '
    'other arguments go to pytest (default: tests).',
  )
  parser.add_argument(
    '--empty_cache',
    action='store_true',
    help='a fresh persistent compilation cache, as on a fresh CI machine',
  )
  parser.add_argument('--workers', default='2', help='pytest-xdist -n')
  args, pytest_args = parser.parse_known_args(argv)
  out = tempfile.mkdtemp(prefix='suite_profile_')
  env = machine.child_env(SUITE_PROFILE_DIR=out)
  if args.empty_cache:
    env['FEDJAX_METRIC_TEST_JAX_CACHE'] = os.path.join(out, 'jax_cache')
  command = [
    sys.executable,
    '-m',
    'pytest',
    '-q',
    '-p',
    'benchmarks.suite_profile',
    '-n',
    args.workers,
    '--dist',
    'worksteal',
    *(pytest_args or ['tests']),
  ]
  start = time.perf_counter()
  proc = subprocess.run(command, cwd=machine.REPO_ROOT, env=env, check=False)
  wall = time.perf_counter() - start
  paths = [
    os.path.join(out, name)
    for name in os.listdir(out)
    if name.startswith('profile_')
  ]
  rows = per_file(merge(paths))
  shutil.rmtree(out)  # The profiles and the empty-cache run's cache.
  notes = [
    f'Device: {machine.cpu_name()}.',
    f'Compilation cache: {"empty" if args.empty_cache else "as found"}; '
    f'{args.workers} workers; pytest exit {proc.returncode}; wall {wall:.0f} s.',
    'Seconds summed over the tests of each file (worker-seconds); other = '
    'wall - compile - lower - trace (execution, Python, child processes).',
    'Command: `python -m benchmarks.suite_profile '
    + ' '.join(argv).strip()
    + '`',
  ]
  section = machine.markdown_section(
    'test suite profile', notes, ['file', *COLUMNS], table_rows(rows, 25)
  )
  print(section)
  machine.append_markdown(
    os.path.join(machine.REPO_ROOT, 'benchmarks', 'suite_profile.md'),
    section,
    title='Where the test suite spends its time',
    script='benchmarks/suite_profile.py',
  )
  return proc.returncode


if __name__ == '__main__':
  sys.exit(main(sys.argv[1:]))
