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
