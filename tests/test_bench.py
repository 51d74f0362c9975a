"""benchmarks/bench.py without PyTorch: which rows a command asks for.

The timings and the PyTorch peer itself are tested in
tests/test_torch_reference.py (with the ``[bench]`` extra)."""

from absl import app, flags
from absl.testing import flagsaver
import pytest

from benchmarks import bench


@pytest.fixture(autouse=True)
def parsed_flags():
  if not flags.FLAGS.is_parsed():
    flags.FLAGS(['bench'])


def test_each_compile_mode_is_a_row_of_its_own():
  with flagsaver.flagsaver(
    executors=['host', 'torch_vmap'],
    torch=True,
    torch_compile=True,
    torch_compile_modes=['default', 'max-autotune'],
  ):
    names = bench.executor_names()
  assert names == [
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
  with flagsaver.flagsaver(executors=['host'], torch=False):
    assert bench.executor_names() == ['host']
  with flagsaver.flagsaver(
    executors=['torch_vmap'], torch_compile_modes=['fastest']
  ):
    with pytest.raises(app.UsageError, match='fastest'):
      bench.executor_names()
