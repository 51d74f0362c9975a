"""FedPPO (Zhao et al., IEEE TCCN 2025): its server round, which updates
count, what it remembers, when the agent learns, and checkpointing, against
the released code's rules (github.com/zzy211/fedppo: ppo_server/ppo.py,
ppo_remove_main.py)."""

import math

import fl_fixtures as fx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fedjax_metric import algorithms, contract, engine, executors, optimizers
from fedjax_metric.models import split_variables

from .fedppo_helpers import _np_mlp, _np_softmax

SERVER = optimizers.make_server_optimizer('sgd')


def _federation(**options):
  """FedPPO (uniform weighting unless ``options`` say otherwise) on the
  fixtures' tiny federation: ``(alg, model, variables, parts, labels,
  data)``."""
  images, labels, parts, data = fx.dirichlet_federation()
  model = fx.all_outputs()
  alg = algorithms.REGISTRY['fedppo'](
    model,
    server_optimizer=SERVER,
    run=fx.partition_facts(parts, labels),
    **{'weighting': 'uniform', **options},
  )
  variables = fx.init_variables(model, images)
  return alg, model, variables, parts, labels, data


def test_only_the_selected_clients_updates_move_the_global_model():
  """3 available clients, select_fraction 0.5: 2 selected; the new global
  model is the old one plus the plain mean of the 2 selected rows' updates
  (the third trained, wrote its row, and does not count); only the
  selected clients' accuracies and losses enter the observation."""
  alg, model, variables, parts, labels, data = _federation()
  (cohort,) = fx.round_cohorts(alg, parts, labels, [[0, 1, 3]])
  spec = fx.make_spec(alg, lr=0.05)
  state, table = engine.init_state(alg, variables, len(parts))
  before = jax.tree.map(np.asarray, state.variables)
  round_fn = executors.make_round_fn(spec, data, executor='vmap')
  state, table, _ = round_fn(state, table, cohort)

  extra = jax.tree.map(np.asarray, state.extra)
  previous_loss = extra['previous_loss']
  selected = np.flatnonzero(previous_loss != 0)
  assert len(selected) == math.ceil(0.5 * 3) == 2
  assert set(selected) <= {0, 1, 3}
  rows = jax.tree.map(np.asarray, table)
  expected = jax.tree.map(
    lambda old, d: old + d[selected].mean(axis=0), before, rows['delta']
  )
  assert fx.max_abs_diff(state.variables, expected) < 1e-6
  # The unselected available client trained too: its row moved.
  (unselected,) = {0, 1, 3} - set(selected)
  assert np.abs(rows['loss'][unselected]) > 0
  np.testing.assert_allclose(previous_loss[selected], rows['loss'][selected])
  observation = extra['observation']
  np.testing.assert_allclose(
    observation[1 + selected], rows['accuracy'][selected]
  )
  assert observation[1 + unselected] == 0.0
  # s[0]: the new global model's accuracy on the held-out examples.
  held = fx.held_out()
  params, model_state = split_variables(state.variables)
  outputs, _ = model.apply(
    params,
    model_state,
    held.preprocess(jnp.asarray(held.images), None),
    train=False,
  )
  accuracy = np.mean(np.argmax(outputs['logits'], -1) == held.labels)
  np.testing.assert_allclose(observation[0], accuracy, rtol=1e-6)


def test_the_agent_learns_after_rounds_0_and_U_only():
  """The code updates PPO when ``epoch % 5 == 0``: after round 0 (its K
  transitions) and after round 5 (rounds 1-5); in between the transitions
  accumulate in the buffer and the agent stays as it was."""
  alg, _, variables, parts, labels, data = _federation(select_fraction=1.0)
  cohorts = fx.round_cohorts(alg, parts, labels, [[0, 1, 2, 3]] * 6)
  spec = fx.make_spec(alg, lr=0.05)
  state, table = engine.init_state(alg, variables, len(parts))
  round_fn = executors.make_round_fn(spec, data, executor='vmap')
  agents = [jax.tree.map(np.asarray, state.extra['agent'])]
  taken = []
  for cohort in cohorts:
    state, table, _ = round_fn(state, table, cohort)
    agents.append(jax.tree.map(np.asarray, state.extra['agent']))
    taken.append(int(np.sum(state.extra['buffer']['taken'])))
  moved = [fx.max_abs_diff(a, b) > 0 for a, b in zip(agents, agents[1:])]
  assert moved == [True, False, False, False, False, True]
  # Cleared after each update; 4 transitions a round in between.
  assert taken == [0, 4, 8, 12, 16, 0]


def test_fedppo_refuses_a_run_without_a_validation_split_and_bad_options():
  model = fx.all_outputs()
  with pytest.raises(ValueError, match='validation_fraction'):
    algorithms.REGISTRY['fedppo'](model, server_optimizer=SERVER)
  run = contract.RunFacts(validation=fx.held_out())
  with pytest.raises(ValueError, match='select_fraction'):
    algorithms.REGISTRY['fedppo'](
      model, server_optimizer=SERVER, run=run, select_fraction=0.0
    )


def _one_server_round(alg, state, table, available_ids, num_slots=4):
  """``server_update`` on a hand-made round: the rows of ``available_ids``
  hold a loss of 1 (so the selected ones show in ``previous_loss``)."""
  ids = np.full(num_slots, np.iinfo(np.int32).max, np.int32)
  ids[: len(available_ids)] = available_ids
  mask = np.arange(num_slots) < len(available_ids)
  table = dict(table, loss=table['loss'].at[np.asarray(available_ids)].set(1.0))
  aggregate = engine.Aggregate(
    update_sum=jax.tree.map(jnp.zeros_like, state.variables),
    weight_sum=jnp.float32(mask.sum()),
    num_participants=jnp.float32(mask.sum()),
    client_ids=jnp.asarray(ids),
    slot_mask=jnp.asarray(mask),
  )
  # server_update reads the cohort's rows only (contract.Algorithm).
  rows = engine.gather_rows(table, jnp.asarray(ids))
  new_state = alg.server_update(state, aggregate, rows)
  return set(np.flatnonzero(np.asarray(new_state.extra['previous_loss'])))


@pytest.mark.parametrize('selection', ['ppo', 'random'])
def test_the_policy_makes_the_choice_unless_selection_is_random(selection):
  """An actor whose output strongly prefers client 2 picks it whenever it is
  available, in every round (k = 1 of 3); with ``selection='random'`` the
  same actor is ignored and the picks vary over rounds."""
  alg, _, variables, parts, _, _ = _federation(
    select_fraction=0.3, selection=selection
  )
  state, table = engine.init_state(alg, variables, len(parts))
  actor = state.extra['agent']['actor']
  last = dict(
    w=jnp.zeros_like(actor[-1]['w']),
    b=jnp.array([0.0, 0.0, 20.0, 0.0]),
  )
  agent = dict(state.extra['agent'], actor=actor[:-1] + [last])
  picks = []
  for round_idx in range(8):
    extra = dict(state.extra, agent=agent)
    state_t = state._replace(extra=extra, round=jnp.int32(round_idx + 1))
    picks.append(_one_server_round(alg, state_t, table, [0, 2, 3]))
  if selection == 'ppo':
    assert picks == [{2}] * 8
  else:
    assert all(len(p) == 1 and p <= {0, 2, 3} for p in picks)
    assert len(set.union(*picks)) > 1


def test_the_agent_checkpoints_and_resumes_bit_for_bit(tmp_path):
  """The agent, its Adam state, the buffer and the observation are server
  state: a run stopped after round 3 and resumed ends where an uninterrupted
  one does, through the PPO update after round index 5."""
  import importlib
  import os

  import orbax.checkpoint as ocp

  from fedjax_metric import experiment

  config = importlib.import_module('configs.fedppo').get_config('runlocal')
  config.unlock()
  config.progress = False
  config.participation.pattern = 'uniform'
  config.clients_per_round = 4
  config.num_rounds = 7
  config.eval_every = 7
  config.checkpoint_every = 2

  def final_state(workdir):
    with ocp.CheckpointManager(os.path.join(workdir, 'checkpoints')) as m:
      return m.restore(m.latest_step())['server_state']

  straight, resumed = str(tmp_path / 'straight'), str(tmp_path / 'resumed')
  experiment.run(config, straight)
  assert (
    experiment.run(config, resumed, stop_after_round=3)['rounds_completed'] == 3
  )
  experiment.run(config, resumed)
  a, b = final_state(straight), final_state(resumed)
  leaves_a, leaves_b = jax.tree.leaves(a), jax.tree.leaves(b)
  assert len(leaves_a) == len(leaves_b)
  for x, y in zip(leaves_a, leaves_b):
    np.testing.assert_array_equal(np.asarray(x), np.asarray(y))
  # benchmarks.fedppo_policy reads the same agent: its entropy and extremes
  # against a NumPy softmax of the actor at the final observation.
  from benchmarks import fedppo_policy

  summary = fedppo_policy.policy_summary(straight)
  extra = fedppo_policy.server_extra(a)
  actor = fedppo_policy._layers(extra['agent']['actor'])
  logits = _np_mlp(actor, np.asarray(extra['observation'], np.float64))
  p = _np_softmax(logits)
  assert summary['round'] == 7
  np.testing.assert_allclose(
    summary['entropy'], -np.sum(p * np.log(p)), rtol=1e-4
  )
  np.testing.assert_allclose(summary['max_times_n'], p.max() * 4, rtol=1e-4)
  assert summary['spearman_participation'] is None  # uniform sampling
  assert -1.0 <= summary['spearman_last_accuracy'] <= 1.0
