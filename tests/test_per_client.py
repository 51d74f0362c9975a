"""Per-client metrics (``logging.per_client``): each cohort client's loss,
examples and update norm per round, from every executor, to per_client.csv.
"""

import csv
import os

import fl_fixtures as fx
import jax
import numpy as np
import pytest
from test_experiment import load_config

from fedjax_metric import algorithms, engine, executors, experiment, optimizers

SERVER = optimizers.make_server_optimizer('sgd')
ROUNDS = [[0, 1, 3], [1, 2], []]  # a padding slot, then nobody


def run_rounds(executor, *, rounds_per_call=1):
  """The three rounds' ``clients`` metrics ([3, C] arrays) and the train
  loss sums, under ``executor``."""
  images, labels, parts, data = fx.dirichlet_federation()
  model = fx.all_outputs()
  alg = algorithms.REGISTRY['moon'](
    model, server_optimizer=SERVER, weighting='num_examples'
  )
  variables = fx.init_variables(model, images)
  cohorts = fx.round_cohorts(alg, parts, labels, ROUNDS)
  spec = fx.make_spec(alg, lr=0.05)._replace(per_client=True)
  state, table = engine.init_state(alg, variables, len(parts))
  if rounds_per_call > 1:
    rounds_fn = executors.make_rounds_fn(
      spec, data, executor=executor, rounds_per_call=rounds_per_call
    )
    _, _, metrics = rounds_fn(state, table, cohorts)
    return jax.tree.map(np.asarray, metrics)
  round_fn = executors.make_round_fn(
    spec, data, executor=executor, chunk_size=3, steps_per_call=1
  )
  per_round = []
  for cohort in cohorts:
    state, table, metrics = round_fn(state, table, cohort)
    per_round.append(jax.tree.map(np.asarray, metrics))
  return jax.tree.map(lambda *x: np.stack(x), *per_round)


def test_every_executor_reports_the_same_clients():
  """vmap, chunked (chunks of 3: the second round's padding slot is in a
  chunk of its own), host and three rounds in one call agree; each client's
  loss times its examples sums to the round's train loss; padding slots and
  the empty round report zeros."""
  runs = {
    'vmap': run_rounds('vmap'),
    'chunked': run_rounds('chunked'),
    'host': run_rounds('host'),
    '3 rounds a call': run_rounds('vmap', rounds_per_call=3),
  }
  reference = runs['host']['clients']
  for name, metrics in runs.items():
    clients = metrics['clients']
    for key in ('client_id', 'slot_mask', 'examples'):
      np.testing.assert_array_equal(clients[key], reference[key], err_msg=name)
    for key in ('loss', 'update_norm'):
      np.testing.assert_allclose(
        clients[key], reference[key], rtol=1e-4, atol=1e-6, err_msg=name
      )
    np.testing.assert_allclose(
      (clients['loss'] * clients['examples']).sum(1),
      metrics['train_loss_sum'],
      rtol=1e-5,
    )
  real = reference['slot_mask']
  assert real.sum(1).tolist() == [3, 2, 0]
  assert (reference['update_norm'][real] > 0).all()
  for key in ('loss', 'examples', 'update_norm'):
    assert not reference[key][~real].any(), key


def test_update_norm_is_the_norm_of_the_clients_delta():
  """One client, FedAvg at server learning rate 1: the new global model is
  the old one plus that client's delta, so its reported norm is the norm of
  the global model's change."""
  images, labels, parts, data = fx.dirichlet_federation()
  model = fx.all_outputs()
  alg = algorithms.REGISTRY['fedavg'](model, server_optimizer=SERVER)
  variables = fx.init_variables(model, images)
  (cohort,) = fx.round_cohorts(alg, parts, labels, [[2]])
  spec = fx.make_spec(alg, lr=0.05)._replace(per_client=True)
  state, table = engine.init_state(alg, variables, len(parts))
  round_fn = executors.make_round_fn(spec, data, executor='vmap')
  new_state, _, metrics = round_fn(state, table, cohort)
  change = [
    np.asarray(a, np.float64) - np.asarray(b, np.float64)
    for a, b in zip(
      jax.tree.leaves(new_state.variables), jax.tree.leaves(variables)
    )
  ]
  want = np.sqrt(sum(np.sum(c**2) for c in change))
  slot = int(np.flatnonzero(np.asarray(cohort.slot_mask))[0])
  got = float(metrics['clients']['update_norm'][slot])
  assert got == pytest.approx(want, rel=1e-4)


def read_rows(workdir):
  with open(os.path.join(workdir, 'per_client.csv'), newline='') as f:
    return list(csv.DictReader(f))


def test_a_run_writes_per_client_csv_and_a_resume_keeps_it_whole(tmp_path):
  """3 rounds of 4 clients, stopped after round 1 and resumed: one row per
  client and round, no round written twice, the columns pandas reads."""
  config = load_config('fedavg')
  config.num_rounds = 3
  config.logging.per_client = True
  workdir = str(tmp_path)
  experiment.run(config, workdir, stop_after_round=1)
  assert [r['round'] for r in read_rows(workdir)] == ['1'] * 4
  experiment.run(config, workdir)
  rows = read_rows(workdir)
  assert list(rows[0]) == [
    'round',
    'client_id',
    'examples',
    'loss',
    'update_norm',
  ]
  assert [int(r['round']) for r in rows] == [1] * 4 + [2] * 4 + [3] * 4
  for round_ in (1, 2, 3):
    ids = {int(r['client_id']) for r in rows if int(r['round']) == round_}
    assert ids == {0, 1, 2, 3}
  assert all(float(r['loss']) > 0 and int(r['examples']) > 0 for r in rows)
