"""benchmarks/suite_profile.py: per-test JAX time, added up per file."""

import collections
import json

from benchmarks import suite_profile


def test_events_are_added_to_the_running_test(monkeypatch):
  records = collections.defaultdict(collections.Counter)
  monkeypatch.setattr(suite_profile, '_per_test', records)
  monkeypatch.setattr(suite_profile, '_current', ['tests/test_a.py::t1'])
  for event, seconds in (
    ('/jax/core/compile/backend_compile_duration', 0.5),
    ('/jax/core/compile/backend_compile_duration', 0.25),
    ('/jax/core/compile/jaxpr_to_mlir_module_duration', 0.125),
    ('/jax/core/compile/jaxpr_trace_duration', 0.0625),
    ('/jax/checkpoint/write/duration_secs', 9.0),  # not a JAX compile event
  ):
    suite_profile._on_event(event, seconds)
  assert dict(records['tests/test_a.py::t1']) == {
    'compile': 0.75,
    'programs': 2,
    'lower': 0.125,
    'trace': 0.0625,
  }


def test_processes_are_merged_and_added_up_per_file(tmp_path):
  # Two workers' files; a test file split across them; time outside tests.
  worker_1 = {
    'tests/test_a.py::t1': {'wall': 4.0, 'compile': 2.0, 'programs': 3},
    'tests/test_a.py::t2': {'wall': 1.0, 'trace': 0.5},
    '<between tests>': {'compile': 7.0},
  }
  worker_2 = {
    'tests/test_a.py::t3[x]': {'wall': 2.0, 'lower': 1.0, 'programs': 1},
    'tests/test_b.py::t1': {'wall': 10.0},
  }
  paths = []
  for i, records in enumerate((worker_1, worker_2)):
    path = tmp_path / f'profile_{i}.json'
    path.write_text(json.dumps(records))
    paths.append(str(path))
  rows = suite_profile.per_file(suite_profile.merge(paths))
  assert [name for name, _ in rows] == ['tests/test_b.py', 'tests/test_a.py']
  a = dict(rows)['tests/test_a.py']
  assert a == {
    'wall': 7.0,
    'compile': 2.0,
    'lower': 1.0,
    'trace': 0.5,
    'programs': 4.0,
    'other': 3.5,  # 7 - 2 - 1 - 0.5
  }
  cells = suite_profile.table_rows(rows, top=1)
  assert cells[0][0] == 'tests/test_b.py' and len(cells) == 2
  assert cells[-1] == ['**total**'] + [
    f'**{v}**' for v in ('17', '2', '1', '0', '4', '14')
  ]
