"""Clients made on demand (data/on_demand.py) and the synthetic dataset in a
run: a call's examples are made where its batches point, a run compiles its
round once, 10^6 clients start without materialising anything per client,
and the configs that cannot run on it say so in one line."""

import json

import jax
import numpy as np
import pytest

from fedjax_metric import api, assemble, validation
from fedjax_metric import experiment as experiment_lib
from fedjax_metric.data import cohort as cohort_lib
from fedjax_metric.data import on_demand, synthetic


def _clients(n=7):
  """A population whose example m of client k is (k, m) itself."""

  def examples(ids, positions):
    ids, positions = np.asarray(ids), np.asarray(positions)
    x = np.stack([ids, positions], axis=1).astype(np.float32)
    return x, (ids % 3).astype(np.int32)

  sizes = np.arange(n) + 3
  return on_demand.GeneratedClients(sizes, examples, 3, (2,))


def test_generated_clients_stand_where_a_partition_does():
  clients = _clients()
  assert len(clients) == 7
  np.testing.assert_array_equal(clients[4], np.arange(7))
  np.testing.assert_array_equal(on_demand.client_sizes(clients), clients.sizes)
  np.testing.assert_array_equal(
    on_demand.client_sizes([np.arange(2), np.arange(5)]), [2, 5]
  )


def test_call_data_makes_the_examples_each_batch_points_to():
  clients = _clients()
  cohorts = [
    cohort_lib.make_cohort(
      np.array(ids),
      clients,
      num_slots=3,
      num_steps=2,
      batch_size=4,
      local_epochs=1,
      local_steps=2,
      seed=0,
      round_idx=r,
    )
    for r, ids in enumerate([[1, 5], [0, 5, 6]])
  ]
  call = on_demand.call_data(cohorts, clients)
  x, y = np.asarray(call.data.images), np.asarray(call.data.labels)
  assert x.shape == (2 * 3 * 2 * 4, 2)
  for before, after in zip(cohorts, call.cohorts):
    for slot in np.flatnonzero(before.slot_mask):
      for s in range(2):
        for b in range(4):
          if not before.example_mask[slot, s, b]:
            continue
          made = x[after.example_idx[slot, s, b]]
          # The example of this slot's client at this batch's position.
          assert made[0] == before.client_ids[slot]
          assert made[1] == before.example_idx[slot, s, b]
          assert y[after.example_idx[slot, s, b]] == made[0] % 3
    np.testing.assert_array_equal(after.example_mask, before.example_mask)


def synthetic_config(**overrides):
  config = api.get_config('scaffold')
  with config.unlocked():
    config.dataset.name = 'synthetic'
    config.num_clients = 50
    config.clients_per_round = 5
    config.num_rounds = 4
    config.local.steps = 2
    config.local.batch_size = 4
    config.local.learning_rate = 0.01
    config.eval_every = 2
    config.checkpoint_every = 2
    config.progress = False
    config.plot_partition = False
    for key, value in overrides.items():
      node = config
      *path, leaf = key.split('.')
      for part in path:
        node = node[part]
      node[leaf] = value
  return config


def test_a_config_on_synthetic_trains_compiles_once_and_resumes(tmp_path):
  """The packaged SCAFFOLD config with dataset.name=synthetic runs with
  logistic regression (the dataset's model: the config's CNN takes
  images), on the vmap executor one call per round, compiling its round
  once; a run stopped at round 2 and resumed ends where an uninterrupted one
  does."""
  config = synthetic_config(executor='vmap', rounds_per_call=1)
  compiled = []
  summary = experiment_lib.run(config, str(tmp_path / 'whole'))
  assert summary['rounds_completed'] == 4
  experiment = assemble.build(config)
  assert experiment.model.module.__class__.__name__ == 'LogisticRegression'
  assert experiment.train is None
  with open(tmp_path / 'whole' / 'partition.json') as f:
    assert json.load(f)['num_clients'] == 50
  experiment_lib.run(config, str(tmp_path / 'split'), stop_after_round=2)
  experiment_lib.run(config, str(tmp_path / 'split'))
  whole = api.load_run(str(tmp_path / 'whole')).variables
  split = api.load_run(str(tmp_path / 'split')).variables
  for a, b in zip(jax.tree.leaves(whole), jax.tree.leaves(split)):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
  del compiled


def test_the_round_program_compiles_once_with_per_call_examples(monkeypatch):
  from fedjax_metric import executors

  made = []
  make = executors.make_rounds_fn

  def recording(*args, **kwargs):
    made.append(make(*args, **kwargs))
    return made[-1]

  monkeypatch.setattr(executors, 'make_rounds_fn', recording)
  config = synthetic_config(executor='vmap', rounds_per_call=2)
  import tempfile

  experiment_lib.run(config, tempfile.mkdtemp())
  assert made[0].jitted._cache_size() == 1


def test_a_million_clients_start_in_linear_time_and_memory(tmp_path):
  """N = 10^6: the population is sizes [N] (8 MB); cohorts draw from it
  without a loop over clients."""
  config = synthetic_config(num_clients=1_000_000)
  experiment = assemble.build(config)
  assert len(experiment.clients) == 1_000_000
  assert experiment.clients.sizes.nbytes == 8_000_000
  assert experiment.class_counts is None  # nothing asked for them
  cohort = assemble.cohort_fn(config, experiment, 5, 2)(3)
  assert cohort.client_ids.max() < 1_000_000


@pytest.mark.parametrize(
  'name, message',
  [
    ('fedquad', 'labels of every example'),
    ('deepsvdd', 'eval_protocol'),
    ('ssd', 'eval_protocol'),
  ],
)
def test_configs_that_need_a_stored_training_set_are_refused(
  tmp_path, name, message
):
  config = api.get_config(name, 'runlocal,dataset=synthetic')
  with pytest.raises(ValueError, match=message) as error:
    validation.validate(config)
    experiment_lib.run(config, str(tmp_path / name))
  assert '\n' not in str(error.value)
  assert not (tmp_path / name).exists()


def test_held_out_examples_are_the_training_clients_next_ones():
  spec = synthetic.SyntheticSpec()
  x, y, owner = synthetic.client_test_set(spec, 0, np.array([3, 9]))
  sizes = synthetic.client_sizes(spec, 0, np.array([3, 9]))
  counts = -(-sizes // 9)
  assert list(np.bincount(owner)[[3, 9]]) == list(counts)
  first_x, first_y = synthetic.client_examples(
    spec, 0, np.array([3]), np.array([sizes[0]])
  )
  # Equal bits under XLA's production emitters; the suite's older ones
  # may move a float32 ulp between batch sizes (data/synthetic.py).
  np.testing.assert_allclose(x[0], np.asarray(first_x)[0], rtol=1e-6)
  assert y[0] == int(np.asarray(first_y)[0])
