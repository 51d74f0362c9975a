"""A saved run rebuilt: its data and model made again by `assemble.build`,
as `experiment.run` made them, and a checkpoint loaded into them, for the
config that ``config_io.load_config(workdir=...)`` reads back from
``config.json``. Used by `fedjax_metric.load_run`, ``launch.evaluate`` and
``launch.report``.
"""

import os

import numpy as np
import orbax.checkpoint as ocp

from fedjax_metric import assemble, engine, faults
from fedjax_metric import client_table as client_table_lib
from fedjax_metric.data import augment


def input_scaling(config, train_images):
  """``(mean, std)`` [C] of the scaling the run evaluated its model with.

  ``x = (uint8 / 255 - mean) / std``: the training set's channel statistics
  (experiment.run's evaluation preprocess), except under the 'ssl' protocol,
  whose models see images on the 0..1 scale (evaluation/ssl.py).
  """
  if config.eval_protocol == 'ssl':
    channels = train_images.shape[-1]
    return (np.zeros(channels, np.float32), np.ones(channels, np.float32))
  return augment.channel_stats(train_images)


def restore(config, workdir, round_=None):
  """The saved run rebuilt as `experiment.run` builds it, at checkpoint ``round_``.

  Returns:
    A dict with ``model`` (ModelFns), ``preprocess`` (experiment.run's evaluation
    preprocess), ``train`` / ``test`` (datasets), ``clients`` (index arrays),
    ``server_state``, ``client_table`` and ``round`` (the checkpoint's),
    and ``table_placement``: where the run kept its client table; off the
    device (client_table.py) ``client_table`` is ``()``.
  """
  directory = os.path.abspath(os.path.join(workdir, 'checkpoints'))
  if not os.path.isdir(directory):
    raise FileNotFoundError(
      f"No checkpoints in {workdir}: is it a run's "
      'workdir (python -m launch.main --workdir=...)?'
    )
  experiment = assemble.build(config)
  placement = client_table_lib.stored_placement(workdir) or 'device'
  if placement == 'device':
    server_state, client_table = assemble.initial_state(config, experiment)
  else:
    # The rows file holds the newest round's rows only: the checkpoint
    # gives the server state (and which rows were written), not the table.
    server_state = assemble.initial_server_state(config, experiment)
    client_table = client_table_lib.checkpoint_template(config.num_clients)
  manager = ocp.CheckpointManager(directory)
  saved = list(manager.all_steps())
  round_ = manager.latest_step() if round_ is None else round_
  if round_ is None or round_ not in saved:
    manager.close()
    raise FileNotFoundError(
      f'No checkpoint of round {round_} in '
      f'{directory}; saved rounds: {sorted(saved)}.'
    )
  step_dir = os.path.join(directory, str(round_))
  try:
    # The checksum saved with the checkpoint, read first: nothing is loaded
    # from a checkpoint that cannot be verified (a damaged metadata file).
    digest = faults.saved_digest(step_dir)
    with faults.orbax_reads_drained():  # A damaged file: one error, no noise.
      restored = manager.restore(
        round_,
        args=ocp.args.StandardRestore(
          {'server_state': server_state, 'client_table': client_table}
        ),
      )
  except faults.UnverifiedError as e:
    raise faults.CheckpointError(
      f'The checkpoint of round {round_} in {directory} cannot be loaded: '
      f'{e}. Load another round (saved: {sorted(saved)}).'
    ) from None
  finally:
    manager.close()
  if digest is not None and digest != faults.state_digest(restored):
    raise faults.CheckpointError(
      f'The checkpoint of round {round_} in {directory} does not match the '
      'checksum saved with it (its files changed on disk). Load another '
      f'round (saved: {sorted(saved)}).'
    )
  return dict(
    model=experiment.eval_model,
    preprocess=experiment.eval_preprocess,
    train=experiment.train,
    test=experiment.test,
    validation=experiment.validation,
    clients=experiment.clients,
    server_state=engine.ServerState(*restored['server_state']),
    client_table=restored['client_table'] if placement == 'device' else (),
    table_placement=placement,
    round=int(round_),
  )
