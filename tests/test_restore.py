"""fedjax_metric/restore.py: a saved run rebuilt from its config and a
checkpoint (`restore`), and the input scaling its model was evaluated with
(`input_scaling`). The checkpoint is written here the way experiment.run
writes one, from the config's initial state shifted so that it differs
from a fresh build: no training."""

import os

import jax
import numpy as np
import orbax.checkpoint as ocp
import pytest
from test_faults import load_config

from fedjax_metric import assemble, faults
from fedjax_metric import restore as restore_lib
from fedjax_metric.data import augment


def test_input_scaling_is_the_training_sets_unless_ssl():
  rng = np.random.default_rng(0)
  images = rng.integers(0, 256, (6, 4, 4, 3)).astype(np.uint8)
  config = load_config('fedavg')
  mean, std = restore_lib.input_scaling(config, images)
  want_mean, want_std = augment.channel_stats(images)
  np.testing.assert_array_equal(mean, want_mean)
  np.testing.assert_array_equal(std, want_std)
  assert mean.shape == (3,) and (mean > 0).all()
  config.eval_protocol = 'ssl'  # Its models see images on the 0..1 scale.
  mean, std = restore_lib.input_scaling(config, images)
  np.testing.assert_array_equal(mean, np.zeros(3, np.float32))
  np.testing.assert_array_equal(std, np.ones(3, np.float32))


def test_a_workdir_without_checkpoints_is_refused_before_building(
  tmp_path, monkeypatch
):
  def build(*args, **kwargs):
    raise AssertionError('the data and model were built')

  monkeypatch.setattr(assemble, 'build', build)
  with pytest.raises(FileNotFoundError, match='No checkpoints in .*workdir'):
    restore_lib.restore(load_config('fedavg'), str(tmp_path))


def test_restore_loads_the_saved_round_into_the_rebuilt_run(tmp_path):
  config = load_config('fedavg')
  server_state, client_table = assemble.initial_state(
    config, assemble.build(config)
  )
  saved = server_state._replace(
    variables=jax.tree.map(lambda x: x + 1.0, server_state.variables),
    round=server_state.round + 3,
  )
  directory = str(tmp_path / 'checkpoints')
  with ocp.CheckpointManager(directory) as manager:
    manager.save(
      3,
      args=ocp.args.StandardSave(
        {'server_state': saved, 'client_table': client_table}
      ),
    )
  restored = restore_lib.restore(config, str(tmp_path))
  assert restored['round'] == 3 and restored['table_placement'] == 'device'
  assert int(restored['server_state'].round) == 3
  for got, want, fresh in zip(
    jax.tree.leaves(restored['server_state'].variables),
    jax.tree.leaves(saved.variables),
    jax.tree.leaves(server_state.variables),
  ):
    np.testing.assert_array_equal(got, want)
    assert not np.array_equal(got, fresh)
  assert restored['test'] is not None and callable(restored['preprocess'])
  with pytest.raises(FileNotFoundError, match=r'round 5 .*saved rounds: \[3\]'):
    restore_lib.restore(config, str(tmp_path), round_=5)


def test_a_checkpoint_that_fails_its_checksum_is_not_loaded(tmp_path):
  """`load_run`, evaluate and report load a checkpoint read-only: one whose
  arrays differ from the checksum saved with them, or whose checksum file
  is gone, is refused in one line naming the round and the saved ones."""
  config = load_config('fedavg')
  server_state, client_table = assemble.initial_state(
    config, assemble.build(config)
  )
  item = {'server_state': server_state, 'client_table': client_table}
  directory = str(tmp_path / 'checkpoints')
  with ocp.CheckpointManager(directory) as manager:
    for step, digest in [
      (1, faults.state_digest(item)),
      (2, '0' * 64),
      (3, faults.state_digest(item)),
    ]:
      manager.save(
        step,
        args=ocp.args.StandardSave(item),
        custom_metadata={'sha256': digest},
      )
  os.remove(os.path.join(directory, '3', faults.METADATA_FILE))
  assert restore_lib.restore(config, str(tmp_path), round_=1)['round'] == 1
  with pytest.raises(
    faults.CheckpointError, match=r'round 2 .*does not match the checksum'
  ) as raised:
    restore_lib.restore(config, str(tmp_path), round_=2)
  assert '\n' not in str(raised.value) and 'saved: [1, 2, 3]' in str(
    raised.value
  )
  with pytest.raises(
    faults.CheckpointError, match=r'round 3 .*cannot be verified'
  ):
    restore_lib.restore(config, str(tmp_path))
