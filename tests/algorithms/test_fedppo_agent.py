"""FedPPO's agent (fedppo_agent): its policy, returns and PPO loss against
NumPy re-derivations of the released code's rules (github.com/zzy211/fedppo,
ppo_server/ppo.py)."""

import jax
import jax.numpy as jnp
import numpy as np

from fedjax_metric.algorithms import fedppo_agent

from .fedppo_helpers import _np_mlp, _np_softmax


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
