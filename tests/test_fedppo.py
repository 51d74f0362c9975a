"""FedPPO (Zhao et al., IEEE TCCN 2025): its selection, rewards, returns and
PPO loss against NumPy re-derivations of the released code's rules
(github.com/zzy211/fedppo: ppo_server/ppo.py, ppo_remove_main.py), and its
server round: which updates count, what it remembers, when the agent
learns."""

import math

import fl_fixtures as fx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fedjax_metric import algorithms, contract, engine, executors, optimizers
from fedjax_metric.algorithms import fedppo_agent, fedppo_server
from fedjax_metric.models import split_variables

SERVER = optimizers.make_server_optimizer('sgd')


def _np_softmax(x):
  e = np.exp(x - x.max())
  return e / e.sum()


def test_selection_draws_distinct_clients_as_the_codes_rejection_sampling():
  """The code draws from one categorical until it has k distinct clients;
  the Gumbel-top-k draw must include each client as often (20,000 draws
  each, NumPy against JAX), pick exactly k, and never an unavailable one."""
  logits = np.array([2.0, 0.5, -1.0, 1.0, 0.0, 3.0], np.float32)
  available = np.array([True, True, True, True, True, False])
  k, draws = 3, 20_000
  p = _np_softmax(logits[available])
  ids = np.flatnonzero(available)
  rng = np.random.default_rng(0)
  counts = np.zeros(len(logits))
  for _ in range(draws):
    chosen = set()
    while len(chosen) < k:
      chosen.add(int(ids[rng.choice(len(ids), p=p)]))
    counts[list(chosen)] += 1
  log_probs = jnp.asarray(logits) - jax.nn.logsumexp(logits[available])
  keys = jax.random.split(jax.random.key(1), draws)
  picked = np.asarray(
    jax.vmap(fedppo_server.sample_without_replacement, (None, None, None, 0))(
      log_probs, jnp.asarray(available), k, keys
    )
  )
  assert (picked.sum(axis=1) == k).all()
  assert not picked[:, ~available].any()
  np.testing.assert_allclose(picked.mean(axis=0), counts / draws, atol=0.02)


def test_policy_is_a_softmax_over_the_available_clients_only():
  agent = fedppo_agent.init_agent(jax.random.key(0), 4)
  observation = jnp.array([0.3, 0.1, 0.0, 0.9, 0.5])
  available = jnp.array([True, False, True, True])
  log_probs = fedppo_agent.policy_log_probs(
    agent['actor'], observation, available
  )
  h = np.asarray(observation, np.float64)
  for layer in agent['actor'][:-1]:
    h = np.tanh(h @ np.asarray(layer['w']) + np.asarray(layer['b']))
  logits = h @ np.asarray(agent['actor'][-1]['w']) + np.asarray(
    agent['actor'][-1]['b']
  )
  expected = np.log(_np_softmax(logits[[0, 2, 3]]))
  np.testing.assert_allclose(
    np.asarray(log_probs)[[0, 2, 3]], expected, rtol=1e-5
  )
  assert float(log_probs[1]) < -1e8
  # Nobody available (a round nobody joins): still finite.
  nobody = fedppo_agent.policy_log_probs(
    agent['actor'], observation, jnp.zeros(4, bool)
  )
  assert np.isfinite(np.asarray(nobody)).all()


def test_rewards_by_hand():
  """r_i = acc_i + acc_g * dl_i / sum_j dl_j, dl_i = max(l_prev - l, 1e-5);
  a first selection (l_prev = 0) and a loss that rose both give 1e-5."""
  r = fedppo_server.rewards(
    accuracy=jnp.array([0.5, 0.8, 0.2, 0.9]),
    global_accuracy=jnp.float32(0.6),
    loss=jnp.array([1.0, 2.0, 1.0, 3.0]),
    previous_loss=jnp.array([1.5, 0.0, 0.5, 2.0]),
    selected=jnp.array([True, True, False, True]),
  )
  total = 0.5 + 1e-5 + 1e-5
  expected = [
    0.5 + 0.6 * 0.5 / total,
    0.8 + 0.6 * 1e-5 / total,
    0.0,
    0.9 + 0.6 * 1e-5 / total,
  ]
  np.testing.assert_allclose(np.asarray(r), expected, rtol=1e-6)


def test_returns_follow_the_codes_monte_carlo_loop():
  """ppo.py update(): R = r + gamma R walked backwards over the flat list of
  transitions (no terminal state), then (R - mean) / (std + 1e-7) with
  torch's unbiased std; entries never taken are not transitions."""
  rng = np.random.default_rng(3)
  reward = rng.uniform(0, 2, 12).astype(np.float32)
  taken = rng.uniform(size=12) < 0.6
  flat = reward[taken]
  expected, running = [], 0.0
  for r in flat[::-1]:
    running = r + 0.7 * running
    expected.insert(0, running)
  expected = np.array(expected)
  expected = (expected - expected.mean()) / (expected.std(ddof=1) + 1e-7)
  returns = fedppo_agent.discounted_returns(
    jnp.asarray(reward), jnp.asarray(taken)
  )
  normalised = fedppo_agent.normalise(returns, jnp.asarray(taken))
  np.testing.assert_allclose(
    np.asarray(normalised)[taken], expected, rtol=1e-5, atol=1e-6
  )


def _np_mlp(layers, x):
  for layer in layers[:-1]:
    x = np.tanh(x @ np.asarray(layer['w'], np.float64) + np.asarray(layer['b']))
  return x @ np.asarray(layers[-1]['w'], np.float64) + np.asarray(
    layers[-1]['b']
  )


def test_ppo_loss_is_the_clipped_surrogate_plus_value_minus_entropy():
  """mean(-min(rho A, clip(rho, 0.8, 1.2) A)) + 0.5 mean((V - R)^2) - 0.01
  mean(H), over the taken transitions, with the policy restricted to each
  round's available clients; re-derived in float64 NumPy."""
  n, u = 4, 2
  rng = np.random.default_rng(5)
  agent = fedppo_agent.init_agent(jax.random.key(2), n)
  buffer = {
    'state': rng.uniform(size=(u, n + 1)).astype(np.float32),
    'available': np.array([[True, True, False, True], [True] * 4]),
    'taken': np.array([[True, False, False, True], [False, True, True, True]]),
  }
  # Old log-probabilities near the current ones, so some ratios clip.
  old = np.zeros((u, n))
  for i in range(u):
    logits = _np_mlp(agent['actor'], buffer['state'][i])
    logits[~buffer['available'][i]] = -1e9
    old[i] = np.log(np.maximum(_np_softmax(logits), 1e-30)) + rng.normal(
      0, 0.3, n
    )
  buffer['log_prob'] = old.astype(np.float32)
  returns = rng.normal(size=(u, n)).astype(np.float32)
  advantages = rng.normal(size=(u, n)).astype(np.float32)

  terms = []
  for i in range(u):
    logits = _np_mlp(agent['actor'], buffer['state'][i])
    avail = buffer['available'][i]
    p = np.zeros(n)
    p[avail] = _np_softmax(logits[avail])
    entropy = -np.sum(p[avail] * np.log(p[avail]))
    v = _np_mlp(agent['critic'], buffer['state'][i])[0]
    for j in np.flatnonzero(buffer['taken'][i]):
      ratio = p[j] / np.exp(old[i, j])
      a = advantages[i, j]
      surrogate = -min(ratio * a, np.clip(ratio, 0.8, 1.2) * a)
      terms.append(surrogate + 0.5 * (v - returns[i, j]) ** 2 - 0.01 * entropy)
  loss = fedppo_agent.ppo_loss(
    agent,
    jax.tree.map(jnp.asarray, buffer),
    jnp.asarray(returns),
    jnp.asarray(advantages),
  )
  np.testing.assert_allclose(float(loss), np.mean(terms), rtol=1e-5)


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

  from fedjax_metric import train

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
  train.run(config, straight)
  assert train.run(config, resumed, stop_after_round=3)['rounds_completed'] == 3
  train.run(config, resumed)
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
