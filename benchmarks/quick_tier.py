"""Which test functions the quick tier (`make test`) leaves to `make test-all`.

The quick tier has a budget: 6 minutes from an empty compilation cache on 2
CPU cores (docs/testing.md). This script reads the per-test durations of a
quick-tier run (pytest's ``--durations=0`` output) and writes
tests/quick_tier_excluded.txt: the most expensive test functions, dropped
until the rest fits ``--budget`` worker-seconds, while every test module
keeps at least its cheapest function (so every module of the package, and
every algorithm under tests/algorithms/, still runs something):

  FEDJAX_METRIC_TEST_JAX_CACHE=$(mktemp -d) python -m pytest -q -n 2 \\
      --quick tests --durations=0 > /tmp/quick.log
  python -m benchmarks.quick_tier --durations=/tmp/quick.log --budget=600

Run it again when the suite's costs move. CI runs every test (make test-all),
so the list only decides what the edit loop skips.
"""

import collections
import datetime
import os
import re
import sys
from typing import Dict, Iterable, Set

from absl import app, flags

_LINE = re.compile(r'\s*([\d.]+)s (?:call|setup|teardown)\s+(\S+)')


def function_costs(lines: Iterable[str]) -> Dict[str, float]:
  """Seconds per test function (its cases, setup and teardown summed), from
  pytest's durations lines; the key drops the parametrization id."""
  costs = collections.Counter()
  for line in lines:
    match = _LINE.match(line)
    if match:
      costs[match.group(2).split('[', 1)[0]] += float(match.group(1))
  return dict(costs)


def choose_excluded(costs: Dict[str, float], budget: float) -> Set[str]:
  """The functions to leave out: the most expensive first, until the rest
  sums to at most ``budget``; each module's cheapest function is never
  left out (so the result may stay above the budget)."""
  cheapest = {}
  for name, seconds in costs.items():
    module = name.split('::', 1)[0]
    if module not in cheapest or seconds < costs[cheapest[module]]:
      cheapest[module] = name
  kept = set(cheapest.values())
  total = sum(costs.values())
  excluded = set()
  for name in sorted(costs, key=lambda n: (-costs[n], n)):
    if total <= budget:
      break
    if name in kept:
      continue
    excluded.add(name)
    total -= costs[name]
  return excluded


def main(argv):
  del argv
  flag = flags.FLAGS
  with open(flag.durations) as f:
    costs = function_costs(f)
  if not costs:
    sys.exit(
      f'No durations in {flag.durations}: run pytest with --durations=0.'
    )
  excluded = choose_excluded(costs, flag.budget)
  kept = sum(s for n, s in costs.items() if n not in excluded)
  header = [
    '# Test functions the quick tier (make test) leaves out; make test-all',
    '# (CI) runs them. Written by benchmarks/quick_tier.py on '
    f'{datetime.date.today()}',
    f'# from {os.path.basename(flag.durations)}: {len(costs)} functions, '
    f'{sum(costs.values()):.0f} worker-s; budget {flag.budget:.0f}; kept '
    f'{kept:.0f} worker-s.',
  ]
  body = [
    f'{name}  # {costs[name]:.1f} s'
    for name in sorted(excluded, key=lambda n: (n.split('::')[0], n))
  ]
  with open(flag.out, 'w') as f:
    f.write('\n'.join(header + body) + '\n')
  print(
    f'{len(excluded)} of {len(costs)} functions left out; kept {kept:.0f} '
    f'of {sum(costs.values()):.0f} worker-s -> {flag.out}'
  )


def define_flags():
  """The command's flags, defined only when it runs: importing the module
  (tests/test_quick_tier.py) defines none, so no other command's flag of
  the same name clashes."""
  flags.DEFINE_string(
    'durations', None, "A pytest log with '--durations=0'.", required=True
  )
  flags.DEFINE_float(
    'budget', 600.0, 'Worker-seconds the kept tests may sum to.'
  )
  flags.DEFINE_string(
    'out',
    os.path.join(
      os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
      'tests',
      'quick_tier_excluded.txt',
    ),
    'The list to write.',
  )


if __name__ == '__main__':
  define_flags()
  app.run(main)
