"""Reading a run back from its workdir: its config and its checkpoints.

`load_config` rebuilds the locked config from ``config.json`` (fields added
to the library since keep their defaults, so older workdirs load too);
`restore` rebuilds the run as `train.run` builds it and loads a checkpoint.
Used by `fedjax_metric.load_run`, ``launch.evaluate`` and ``launch.report``.
"""

import ast
import json
import os

import jax
import ml_collections
import numpy as np
import orbax.checkpoint as ocp

from fedjax_metric import engine, settings, train
from fedjax_metric.data import augment, partition, sources

# Blocks a method config replaces as a whole (fedjax_metric/settings.py).
_WHOLE_BLOCKS = ('model', 'algorithm_kwargs')


def _merge(target, saved, top=True):
  """Writes the saved values into a fresh base config (new fields keep their
  defaults, so older workdirs load too)."""
  for key, value in saved.items():
    if top and key in _WHOLE_BLOCKS:
      target[key] = ml_collections.ConfigDict(value)
    elif (
      isinstance(value, dict)
      and key in target
      and isinstance(target[key], ml_collections.ConfigDict)
    ):
      _merge(target[key], value, top=False)
    else:
      target[key] = value


def load_config(workdir, overrides=()):
  """The run's config from ``workdir/config.json``, with ``overrides``
  (``'a.b=value'`` strings) applied."""
  path = os.path.join(workdir, 'config.json')
  if not os.path.exists(path):
    raise FileNotFoundError(
      f"{path} not found: is {workdir} a run's "
      'workdir (python -m launch.main --workdir=...)?'
    )
  with open(path) as f:
    saved = json.load(f)
  config = settings.base_config()
  _merge(config, saved)
  for item in overrides:
    name, sep, text = item.partition('=')
    if not sep:
      raise ValueError(f'--set={item!r} is not key.path=value.')
    try:
      value = ast.literal_eval(text)
    except (ValueError, SyntaxError):
      value = text
    *parents, leaf = name.split('.')
    node = config
    for part in parents:
      node = node[part]
    if leaf not in node:
      raise ValueError(f'--set={item!r}: the config has no field {name!r}.')
    node[leaf] = value
  return config


def input_scaling(config, train_images):
  """``(mean, std)`` [C] of the scaling the run evaluated its model with.

  ``x = (uint8 / 255 - mean) / std``: the training set's channel statistics
  (train.run's evaluation preprocess), except under the 'ssl' protocol,
  whose models see images on the 0..1 scale (evaluation/ssl.py).
  """
  if config.eval_protocol == 'ssl':
    channels = train_images.shape[-1]
    return (np.zeros(channels, np.float32), np.ones(channels, np.float32))
  return augment.channel_stats(train_images)


def restore(config, workdir, round_=None):
  """The saved run rebuilt as `train.run` builds it, at checkpoint ``round_``.

  Returns:
    A dict with ``model`` (ModelFns), ``preprocess`` (train.run's evaluation
    preprocess), ``train`` / ``test`` (datasets), ``clients`` (index arrays),
    ``server_state``, ``client_table`` and ``round`` (the checkpoint's).
  """
  ds = config.dataset
  train_split = sources.load(ds.name, 'train', ds.data_dir or None)
  test_split = sources.load(ds.name, 'test', ds.data_dir or None)
  train_split, validation = sources.hold_out(
    train_split, ds.get('validation_fraction', 0.0)
  )
  clients = train.make_partition(config, train_split.labels)
  mean, std = augment.channel_stats(train_split.images)
  preprocess = augment.make_preprocess(mean, std, 'none')
  model = train.build_model(
    config.model,
    train_split.num_classes,
    train_split.images.shape[1:],
    config.precision,
  )
  variables = model.init(
    jax.random.key(config.seed), preprocess(train_split.images[:1], None)
  )
  # The algorithm's state shapes as train.run made them (FedAU's table
  # depends on the participation probabilities).
  probs = np.full(
    config.num_clients, config.clients_per_round / config.num_clients
  )
  counts = partition.class_counts(
    train_split.labels, clients, train_split.num_classes
  )
  active = train.participation_mask(config, counts)
  if active is not None:
    probs = active[0]
  algorithm = train.build_algorithm(config, model, probs)
  server_state, client_table = engine.init_state(
    algorithm,
    variables,
    config.num_clients,
    key=jax.random.key(config.seed + 1),
  )
  directory = os.path.abspath(os.path.join(workdir, 'checkpoints'))
  if not os.path.isdir(directory):
    raise FileNotFoundError(
      f"No checkpoints in {workdir}: is it a run's "
      'workdir (python -m launch.main --workdir=...)?'
    )
  manager = ocp.CheckpointManager(directory)
  saved = list(manager.all_steps())
  round_ = manager.latest_step() if round_ is None else round_
  if round_ is None or round_ not in saved:
    manager.close()
    raise FileNotFoundError(
      f'No checkpoint of round {round_} in '
      f'{directory}; saved rounds: {sorted(saved)}.'
    )
  restored = manager.restore(
    round_,
    args=ocp.args.StandardRestore(
      {'server_state': server_state, 'client_table': client_table}
    ),
  )
  manager.close()
  return dict(
    model=model,
    preprocess=preprocess,
    train=train_split,
    test=test_split,
    validation=validation,
    clients=clients,
    server_state=engine.ServerState(*restored['server_state']),
    client_table=restored['client_table'],
    round=int(round_),
  )
