"""benchmarks/bench.py without PyTorch: which rows a command asks for.

Importing the module defines no flags (it does so only as the program), so
this runs beside the tests of the other tools. The timings and the PyTorch
peer itself are tested in tests/test_torch_reference.py (with the
``[bench]`` extra)."""

import importlib

from absl import app, flags
import pytest

from benchmarks import bench


def rows(executors, modes=('default',), torch=True, torch_compile=True):
  return bench.executor_names(
    executors, torch=torch, torch_compile=torch_compile, compile_modes=modes
  )


def test_each_compile_mode_is_a_row_of_its_own():
  assert rows(['host', 'torch_vmap'], ['default', 'max-autotune']) == [
    'host',
    'torch_vmap',
    'torch',
    'torch_vmap_compiled',
    'torch_vmap_compiled@max-autotune',
  ]
  assert bench.torch_form('torch_vmap_compiled@max-autotune') == (
    'vmap_compiled',
    'max-autotune',
  )
  assert bench.torch_form('torch_vmap_compiled') == ('vmap_compiled', None)
  assert bench.torch_form('vmap') is None  # A JAX executor.
  assert bench.row_label('torch_vmap_compiled@max-autotune') == (
    'pytorch vmap + compile (max-autotune)'
  )


def test_no_compiled_row_without_torch_vmap_and_an_unknown_mode_is_refused():
  assert rows(['host'], torch=False) == ['host']
  assert rows(['torch_vmap'], torch=False, torch_compile=False) == [
    'torch_vmap'
  ]
  with pytest.raises(app.UsageError, match='fastest'):
    rows(['torch_vmap'], ['fastest'])


def test_importing_defines_no_flags():
  before = set(flags.FLAGS)
  importlib.reload(bench)
  assert set(flags.FLAGS) == before
