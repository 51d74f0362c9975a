"""Federated evaluation (evaluation/federated.py) against a NumPy
re-derivation: per-client accuracy of a sample of clients and its mean and
percentiles, drawn afresh per round from (seed, round)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fedjax_metric import assemble, contract, models
from fedjax_metric.data import sources
from fedjax_metric.evaluation import federated, protocols

D, K = 5, 4


def _model_and_variables():
  model = models.build('logistic_regression', K, (D,))
  variables = model.init(jax.random.key(3))
  return model, variables


def _population(num_clients=40, seed=0):
  """Every client with 3-12 held-out examples of its own."""
  rng = np.random.default_rng(seed)
  sizes = rng.integers(3, 13, num_clients)
  owner = np.repeat(np.arange(num_clients), sizes)
  x = rng.normal(size=(owner.size, D)).astype(np.float32)
  y = rng.integers(0, K, owner.size).astype(np.int32)
  return x, y, owner


def _reference(variables, x, y, owner, clients):
  w = np.asarray(variables['params']['Dense_0']['kernel'], np.float64)
  b = np.asarray(variables['params']['Dense_0']['bias'], np.float64)
  right = np.argmax(x @ w + b, axis=1) == y
  acc = np.array([right[owner == c].mean() for c in clients])
  return {
    'fed_accuracy_mean': acc.mean(),
    'fed_accuracy_p10': np.percentile(acc, 10),
    'fed_accuracy_p50': np.percentile(acc, 50),
    'fed_accuracy_p90': np.percentile(acc, 90),
  }


def test_per_client_accuracy_and_percentiles_match_numpy():
  model, variables = _model_and_variables()
  x, y, owner = _population()

  def client_examples(ids):
    keep = np.isin(owner, ids)
    return x[keep], y[keep], owner[keep]

  evaluate = federated.make_federated_eval(
    model=model,
    preprocess=lambda v, key: v.astype(jnp.float32),
    pool=np.arange(40),
    client_examples=client_examples,
    num_clients=15,
    every=0,
    seed=7,
    batch_size=16,  # several batches, the last one padded
  )
  state = contract.ServerState(variables, (), jnp.int32(6))
  got = evaluate(state)
  clients = federated.sample_clients(np.arange(40), 15, 7, 6)
  want = _reference(variables, x, y, owner, clients)
  for name, value in want.items():
    np.testing.assert_allclose(got[name], value, rtol=0, atol=1e-12)
  assert got['fed_clients'] == 15
  # A different round draws other clients; the same round the same ones.
  assert not np.array_equal(
    federated.sample_clients(np.arange(40), 15, 7, 8), clients
  )
  np.testing.assert_array_equal(
    federated.sample_clients(np.arange(40), 15, 7, 6), clients
  )


def test_it_runs_only_at_its_rounds():
  model, variables = _model_and_variables()
  x, y, owner = _population()
  evaluate = federated.make_federated_eval(
    model=model,
    preprocess=lambda v, key: v,
    pool=np.arange(40),
    client_examples=lambda ids: (x[:3], y[:3], np.full(3, ids[0])),
    num_clients=1,
    every=10,
    seed=0,
    batch_size=8,
  )
  assert evaluate(contract.ServerState(variables, (), jnp.int32(15))) == {}
  assert evaluate(contract.ServerState(variables, (), jnp.int32(20)))


def test_a_client_counts_once_whatever_its_size():
  acc = federated.per_client_accuracy(
    np.array([1, 1, 1, 1, 0, 0], float),
    np.array([2, 2, 2, 2, 5, 5]),
    np.array([2, 5]),
  )
  np.testing.assert_array_equal(acc, [1.0, 0.0])
  assert federated.summarize(acc)['fed_accuracy_mean'] == 0.5


def test_natural_test_splits_are_drawn_by_writer_and_others_are_refused():
  x, y, owner = _population(6)
  test = sources.ArrayDataset(x, y, K, client_ids=owner)
  pool, client_examples = protocols.federated_source([], test)
  np.testing.assert_array_equal(pool, np.arange(6))
  ex, ey, eo = client_examples(np.array([1, 4]))
  assert set(eo) == {1, 4} and len(ey) == np.isin(owner, [1, 4]).sum()
  assert protocols.federated_source([], sources.ArrayDataset(x, y, K)) is None


def test_a_dataset_without_per_client_test_data_is_refused():
  from fedjax_metric import api

  config = api.get_config('fedavg', 'runlocal')
  with config.unlocked():
    config.federated_eval.clients = 5
  model, _ = _model_and_variables()
  with pytest.raises(ValueError, match='federated_eval.clients=0'):
    protocols.make_evaluator(
      assemble.eval_settings(config),
      model=model,
      preprocess=None,
      train=sources.ArrayDataset(*_population(3)[:2], K),
      test=sources.ArrayDataset(*_population(3)[:2], K),
      clients=[np.arange(2)],
    )
