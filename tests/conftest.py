"""Settings for every test, applied before JAX starts.

* Four simulated CPU devices, so the sharded paths are tested on any machine
  (on a GPU machine the mesh tests build their meshes from these CPU devices).
* Matmul precision 'highest': tests compare with float64 NumPy references at
  ~1e-5; on GPUs the default (TF32) changes results at ~1e-3. On CPU it
  changes nothing. The library's own precision is a config choice
  (`config.precision`), documented in the README.
* Most XLA optimisations off, and XLA CPU's older (faster-compiling) loop
  emitters: the suite compiles thousands of small programs, and compiling
  dominates its run time; the numerics compared are unaffected (the tests'
  tolerances hold either way, checked on CPU).

Tests that compare a subprocess with an in-process run bit for bit give the
subprocess the same settings through `JAX_ENV`.

* A persistent compilation cache shared by the xdist workers and the
  subprocesses tests start (through the environment): the same programs (a
  config's round, a model's evaluation) are compiled in several tests and
  processes. It lives in the system's temporary directory and is kept
  between runs (its keys include the JAX version and flags, so a stale entry
  is never used); FEDJAX_METRIC_TEST_JAX_CACHE puts it elsewhere.
"""

import os
import tempfile

import jax

_CACHE_DIR = os.environ.setdefault(
  'FEDJAX_METRIC_TEST_JAX_CACHE',
  os.path.join(tempfile.gettempdir(), 'fedjax_metric_test_jax_cache'),
)
os.environ['JAX_COMPILATION_CACHE_DIR'] = _CACHE_DIR
# Most of the suite's programs compile in well under 0.2 s: not worth a file.
os.environ['JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS'] = '0.05'
jax.config.update('jax_compilation_cache_dir', _CACHE_DIR)
jax.config.update('jax_persistent_cache_min_compile_time_secs', 0.05)


# XLA CPU's older loop emitters compile the suite's programs about a third
# faster than its MLIR fusion emitters (measured on 48 compile-heavy tests:
# 100 s -> 66 s of CPU time); results agree within the tests' tolerances.
# Read when the CPU backend starts, which is after this file runs.
# XLA aborts at start-up on a flag it does not know ("Unknown flag in
# XLA_FLAGS"), and jaxlib 0.11 no longer knows this one (seen on a GPU
# machine with jax 0.11.2, where the suite's workers all died at start).
def _xla_knows_cpu_fusion_emitters_flag() -> bool:
  import jaxlib

  major_minor = tuple(int(x) for x in jaxlib.__version__.split('.')[:2])
  return major_minor < (0, 11)


# FEDJAX_METRIC_TEST_PRODUCTION_XLA=1 keeps XLA's own emitters: the tests
# of bit-identity between two different programs run so (a subprocess of
# tests/test_client_table.py), since the old emitters can sum a fused loop
# in another order in the two programs (1e-8 apart) where the production
# emitters give the same bits.
PRODUCTION_XLA = bool(os.environ.get('FEDJAX_METRIC_TEST_PRODUCTION_XLA'))
SUITE_XLA_FLAGS = (
  '--xla_cpu_use_fusion_emitters=false'
  if _xla_knows_cpu_fusion_emitters_flag() and not PRODUCTION_XLA
  else ''
)
XLA_FLAGS = ' '.join(
  filter(None, [os.environ.get('XLA_FLAGS'), SUITE_XLA_FLAGS])
)

JAX_ENV = {
  'JAX_NUM_CPU_DEVICES': '4',
  'JAX_DEFAULT_MATMUL_PRECISION': 'highest',
  'JAX_DISABLE_MOST_OPTIMIZATIONS': 'true',
  'XLA_FLAGS': XLA_FLAGS,
}

# Child processes (the CLI, multi-host, notebook and scaling tests) inherit
# the compile settings; each test that needs a device count sets its own.
os.environ.update(
  {k: v for k, v in JAX_ENV.items() if k != 'JAX_NUM_CPU_DEVICES'}
)

jax.config.update('jax_num_cpu_devices', 4)
jax.config.update('jax_default_matmul_precision', 'highest')
jax.config.update('jax_disable_most_optimizations', True)


# The quick tier (`make test`, `pytest --quick`): every test module and every
# test function runs, but a function parametrized over many cases keeps a
# sample of them, drawn with a fixed seed, as JAX's own suite does with
# JAX_NUM_GENERATED_CASES; `make test-all` (CI) runs every case. A function
# marked `every_case` keeps all its cases in the quick tier too (e.g. one
# check that each registered algorithm builds), and one marked `slow` leaves
# the quick tier (it must have a quicker sibling in its module).
QUICK_CASES_ENV = 'FEDJAX_METRIC_NUM_GENERATED_CASES'
QUICK_CASES_DEFAULT = 2
# The quick tier's budget (6 minutes from an empty compilation cache on 2
# cores) leaves its most expensive functions to make test-all: the list is
# measured, not chosen by hand (benchmarks/quick_tier.py writes it from a
# --durations=0 run; every test module keeps its cheapest function).
QUICK_EXCLUDED_FILE = os.path.join(
  os.path.dirname(os.path.abspath(__file__)), 'quick_tier_excluded.txt'
)


def quick_excluded(path=QUICK_EXCLUDED_FILE):
  """The function ids (``tests/x.py::test_f``) the quick tier leaves out."""
  if not os.path.exists(path):
    return set()
  with open(path) as f:
    lines = (line.split('#', 1)[0].strip() for line in f)
    return {line for line in lines if line}


def pytest_addoption(parser):
  parser.addoption(
    '--quick',
    action='store_true',
    help='The quick tier: a seeded sample of each parametrized test '
    f"function's cases (${QUICK_CASES_ENV}, default "
    f'{QUICK_CASES_DEFAULT}); tests marked slow left out.',
  )


def pytest_configure(config):
  config.addinivalue_line(
    'markers', 'every_case: keep all parametrized cases in the quick tier'
  )
  config.addinivalue_line(
    'markers', 'slow: left out of the quick tier (make test-all runs it)'
  )


def quick_sample(items, cases_per_function: int, excluded=frozenset()):
  """The quick tier's items: per test function (module + name), all of an
  unparametrized or `every_case` function, else ``cases_per_function`` of
  its cases chosen by a generator seeded from the function's id (the same
  choice on every machine and run, and under xdist in every worker, which
  collects alike); `slow` items and the functions in ``excluded`` dropped.
  Order is kept."""
  import random  # pylint: disable=g-import-not-at-top
  import zlib  # pylint: disable=g-import-not-at-top

  groups = {}
  for item in items:
    key = item.nodeid.split('[', 1)[0]
    groups.setdefault(key, []).append(item)
  keep = set()
  for key, members in groups.items():
    if key in excluded:
      continue
    members = [m for m in members if m.get_closest_marker('slow') is None]
    parametrized = len(members) > 1 or any('[' in m.nodeid for m in members)
    if (
      not parametrized
      or len(members) <= cases_per_function
      or any(m.get_closest_marker('every_case') for m in members)
    ):
      keep.update(id(m) for m in members)
      continue
    rng = random.Random(zlib.crc32(key.encode()))
    keep.update(id(m) for m in rng.sample(members, cases_per_function))
  return [item for item in items if id(item) in keep]


def pytest_collection_modifyitems(config, items):
  if not config.getoption('--quick'):
    return
  cases = int(os.environ.get(QUICK_CASES_ENV, QUICK_CASES_DEFAULT))
  kept = quick_sample(items, cases, quick_excluded())
  kept_ids = {id(item) for item in kept}
  deselected = [item for item in items if id(item) not in kept_ids]
  if deselected:
    config.hook.pytest_deselected(items=deselected)
  items[:] = kept
