"""The Python entry points (fedjax_metric/api.py) where they differ from the
command line: a temporary workdir, and errors that name config fields as
Python spells them."""

import os
import tempfile

import pytest

import fedjax_metric as fm
from fedjax_metric import validation


@pytest.fixture
def temp_root(tmp_path, monkeypatch):
  """tempfile's directory, for this test only."""
  root = tmp_path / 'tmp'
  root.mkdir()
  monkeypatch.setattr(tempfile, 'tempdir', str(root))
  return root


def test_a_run_that_fails_to_start_leaves_no_temporary_workdir(temp_root):
  config = fm.get_config('fedavg', 'runlocal')
  config.clients_per_round = 9
  with pytest.raises(validation.ConfigError):
    fm.run(config)
  assert not os.listdir(temp_root)


def test_errors_raised_from_python_name_fields_as_python_does(temp_root):
  config = fm.get_config('fedavg', 'runlocal')
  config.clients_per_round = 9
  with pytest.raises(validation.ConfigError) as info:
    fm.run(config, str(temp_root / 'run'))
  message = str(info.value)
  assert '--config.' not in message, message
  assert 'config.clients_per_round=9' in message, message
  assert not os.path.exists(temp_root / 'run')


def test_run_returns_the_variables_it_holds_equal_to_the_checkpoints(
  tmp_path, monkeypatch
):
  """fm.run does not rebuild the run to read its final model (data, model
  and client table built twice); what it returns is the checkpoint's, bit
  for bit, and a second call on the finished workdir reads it from there."""
  import jax  # pylint: disable=g-import-not-at-top
  import numpy as np  # pylint: disable=g-import-not-at-top

  from fedjax_metric import restore as restore_lib  # pylint: disable=g-import-not-at-top

  config = fm.get_config('scaffold', 'runlocal')
  config.num_rounds = 2
  workdir = str(tmp_path / 'run')
  restore = restore_lib.restore
  calls = []

  def counting_restore(*args, **kwargs):
    calls.append(args)
    return restore(*args, **kwargs)

  monkeypatch.setattr(restore_lib, 'restore', counting_restore)
  result = fm.run(config, workdir)
  assert not calls  # Not rebuilt from the checkpoint.
  loaded = fm.load_run(workdir)
  assert len(calls) == 1
  again = fm.run(config, workdir)  # Finished: read back, once more.
  assert len(calls) == 2
  for other in (loaded, again):
    same = jax.tree_util.tree_map(
      lambda a, b: np.array_equal(np.asarray(a), np.asarray(b)),
      result.variables,
      other.variables,
    )
    assert all(jax.tree_util.tree_leaves(same))
    assert other.final == result.final
  assert result.summary['rounds_completed'] == 2
