"""Participation patterns and their algorithms through experiment.run, end to end.

A recording algorithm (FedAvg whose server extra notes each round's
participants and whether the global model moved) shows that the cohorts are
exactly the availability mask's active sets, that a round nobody joins leaves
the model as it was (with server momentum, which would otherwise move it),
and that the round compiles once although cohort sizes vary. The training
accuracy option is checked against a plain forward pass of the final model.
"""

import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp
import pytest

from configs import fedavg as fedavg_config
from fedjax_metric import algorithms, assemble, executors, experiment
from fedjax_metric.algorithms import fedau, fedavg, spec
from fedjax_metric.data import augment, sources

NUM_CLIENTS, NUM_ROUNDS = 6, 8


def build_recorder(model, options, *, server_optimizer, run, weighting):
  """FedAvg that records [T, N] participants and [T] 'model unchanged'."""
  del options
  num_rounds = run.num_rounds
  base = fedavg.build(
    model, server_optimizer=server_optimizer, weighting=weighting
  )

  def init_extra(variables, num_clients, key):
    del variables, key
    return {
      'seen': jnp.zeros((num_rounds, num_clients), jnp.int32),
      'unchanged': jnp.zeros((num_rounds,), jnp.int32),
    }

  def server_update(server_state, aggregate, client_table):
    new = base.server_update(server_state, aggregate, client_table)
    extra = server_state.extra
    t = server_state.round
    seen = fedau.participation_vector(aggregate, extra['seen'].shape[1])
    same = jnp.all(
      jnp.stack(
        [
          jnp.all(a == b)
          for a, b in zip(
            jax.tree.leaves(new.variables),
            jax.tree.leaves(server_state.variables),
            strict=True,
          )
        ]
      )
    )
    return new._replace(
      extra={
        'seen': extra['seen'].at[t].set(seen.astype(jnp.int32)),
        'unchanged': extra['unchanged'].at[t].set(same.astype(jnp.int32)),
      }
    )

  return base._replace(
    init_server=fedavg.make_init_server(server_optimizer, init_extra),
    server_update=server_update,
  )


def bernoulli_config(executor):
  config = fedavg_config.get_config('runlocal')
  config.unlock()
  config.algorithm = 'recorder'
  config.num_clients = NUM_CLIENTS
  config.num_rounds = NUM_ROUNDS
  config.participation.pattern = 'bernoulli'
  config.participation.mean = 0.3
  config.server.momentum = 0.9
  config.executor = executor
  config.num_devices = 1  # C = the most active round, not a multiple of 4.
  config.checkpoint_every = NUM_ROUNDS
  config.eval_every = NUM_ROUNDS
  config.eval_train_examples = 10**6  # More than digits has: all of it.
  config.progress = False
  return config


def final_server_state(workdir):
  with ocp.CheckpointManager(
    os.path.join(os.path.abspath(workdir), 'checkpoints')
  ) as manager:
    return manager.restore(manager.latest_step())['server_state']


@pytest.mark.parametrize('executor', ['host', 'vmap'])
def test_bernoulli_run_cohorts_are_the_mask(executor, tmp_path, monkeypatch):
  recorder = spec.AlgorithmSpec(
    'recorder',
    build_recorder,
    reads=('server_optimizer', 'run', 'weighting'),
    description='FedAvg recording its participants.',
  )
  monkeypatch.setitem(algorithms.REGISTRY, 'recorder', recorder)
  made = []
  make_rounds_fn = executors.make_rounds_fn

  def recording_make_rounds_fn(*args, **kwargs):
    made.append(make_rounds_fn(*args, **kwargs))
    return made[-1]

  monkeypatch.setattr(executors, 'make_rounds_fn', recording_make_rounds_fn)
  config = bernoulli_config(executor)
  summary = experiment.run(config, str(tmp_path))

  with open(tmp_path / 'participation.json') as f:
    written = json.load(f)
  assert (tmp_path / 'participation.png').stat().st_size > 0
  with open(tmp_path / 'partition.json') as f:
    counts = np.asarray(json.load(f)['class_counts'])
  probs, mask = assemble.participation_mask(config, counts)
  np.testing.assert_allclose(written['probabilities'], probs)
  assert written['active_per_round'] == mask.sum(1).tolist()
  # The seed gives both kinds of round; the checks below need them.
  assert (mask.sum(1) == 0).any() and (mask.sum(1) >= 2).any()

  extra = final_server_state(tmp_path)['extra']
  np.testing.assert_array_equal(np.asarray(extra['seen']), mask)
  np.testing.assert_array_equal(
    np.asarray(extra['unchanged']), mask.sum(1) == 0
  )
  assert summary['num_slots'] == mask.sum(1).max()
  rounds_fn = made[0]
  if executor == 'vmap':
    # All 8 rounds, of 0 to 2 participants, in one program compiled once.
    assert summary['rounds_per_call'] == NUM_ROUNDS
    assert rounds_fn.jitted._cache_size() == 1
  else:
    assert summary['rounds_per_call'] == 1
    assert rounds_fn.round_fn.fns.whole_client._cache_size() == 1
    assert rounds_fn.round_fn.fns.server._cache_size() == 1

  if executor == 'host':  # Training accuracy over the whole training set.
    data = sources.load('digits', 'train')
    mean, std = augment.channel_stats(data.images)
    images = augment.make_preprocess(mean, std, 'none')(
      jnp.asarray(data.images), None
    )
    model = assemble.build_model(
      config.model, data.num_classes, data.images.shape[1:]
    )
    variables = final_server_state(tmp_path)['variables']
    params = variables['params']
    state = {k: v for k, v in variables.items() if k != 'params'}
    outputs, _ = model.apply(params, state, images, train=False)
    accuracy = np.mean(
      np.argmax(np.asarray(outputs['logits']), 1) == data.labels
    )
    assert summary['train_accuracy'] == pytest.approx(accuracy, abs=1e-6)
    assert 'train_eval_loss' in summary


def test_train_subset_is_fixed_and_sized(tmp_path):
  config = fedavg_config.get_config('runlocal')
  config.unlock()
  config.num_rounds = 1
  config.eval_train_examples = 100
  config.progress = False
  first = experiment.run(config, str(tmp_path / 'a'))
  second = experiment.run(config, str(tmp_path / 'b'))
  # 100 examples: accuracy is a multiple of 1 / 100, and the same subset.
  assert first['train_accuracy'] * 100 == pytest.approx(
    round(first['train_accuracy'] * 100), abs=1e-6
  )
  assert first['train_accuracy'] == second['train_accuracy']
  config.eval_train_examples = -1
  with pytest.raises(ValueError, match='eval_train_examples'):
    experiment.run(config, str(tmp_path / 'c'))


def test_build_algorithm_passes_run_facts(monkeypatch):
  received = {}

  def factory(
    model,
    *,
    server_optimizer,
    run,
    weighting,
    knob=0,
  ):
    received.update(
      num_rounds=run.num_rounds,
      num_clients=run.num_clients,
      knob=knob,
      probabilities=run.participation_probabilities,
    )
    return fedavg.build(model, server_optimizer=server_optimizer)

  monkeypatch.setitem(algorithms.REGISTRY, 'facts', factory)
  config = fedavg_config.get_config('runlocal')
  config.unlock()
  config.algorithm = 'facts'
  config.num_rounds = 17
  config.algorithm_kwargs.knob = 3
  assemble.build_algorithm(config, None, np.array([0.5, 0.25]))
  assert received['num_rounds'] == 17 and received['knob'] == 3
  assert received['num_clients'] == config.num_clients
  np.testing.assert_array_equal(received['probabilities'], [0.5, 0.25])
  config.algorithm_kwargs.num_rounds = 5
  with pytest.raises(ValueError, match='num_rounds'):
    assemble.build_algorithm(config, None)
  # Every registered factory receives them (and may ignore them).
  config.algorithm = 'fedavg'
  del config.algorithm_kwargs['num_rounds']
  del config.algorithm_kwargs['knob']
  assert assemble.build_algorithm(config, None, np.ones(2)) is not None


def test_known_prob_run_uses_the_true_probabilities(tmp_path):
  """fedau with known_prob needs p_n: experiment.run hands them over (uniform
  sampler: K / N). PMFL's config runs end to end in tests/test_experiment.py
  (test_every_config_runs_locally)."""
  config = fedavg_config.get_config('runlocal')
  config.unlock()
  config.algorithm = 'fedau'
  config.algorithm_kwargs.aggregation = 'known_prob'
  config.server.weighting = 'uniform'  # FedAU's weights are its own
  config.num_rounds = 1
  config.progress = False
  summary = experiment.run(config, str(tmp_path / 'known'))
  assert summary['rounds_completed'] == 1
  assert np.isfinite(summary['test_loss'])
