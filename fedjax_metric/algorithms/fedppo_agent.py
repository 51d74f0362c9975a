"""FedPPO's agent: the policy and value networks and the PPO update of the
server's client selection (fedppo_server.py runs them each round).

Zhao, Li, Li, Yang and Xu, 'FedPPO: Reinforcement Learning-Based Client
Selection for Federated Learning with Heterogeneous Data', IEEE TCCN 2025, as
the authors' released code runs it (github.com/zzy211/fedppo,
src/ppo_server/ppo.py; docs/methods.md, FedPPO).

An actor MLP (N + 1 -> 64 -> 64 -> N, tanh) gives a softmax pi(. | s) over
the clients, a critic MLP (N + 1 -> 64 -> 64 -> 1) the value V(s), both of
the observation s (N + 1 values, fedppo_server.py). Every
transition (s_t, i, log pi(i | s_t), V(s_t), r_i) is buffered; after rounds
0, U, 2U, ... (U = 5) the buffer is one PPO update (Schulman et al., 2017,
Eq. 7 with the value and entropy terms of Eq. 9): Monte-Carlo returns
discounted with gamma = 0.7 along the flattened sequence of transitions,
normalised; advantages R - V_old; 5 full-batch Adam steps (lr 1e-3) on

  mean[-min(rho A, clip(rho, 1 - 0.2, 1 + 0.2) A)] + 0.5 mean[(V - R)^2]
  - 0.01 mean[H(pi(. | s))],   rho = pi(i | s) / pi_old(i | s).
"""

import math
from typing import Any, Dict

import jax
import jax.numpy as jnp
import optax

from fedjax_metric.losses import masked_mean

# The released code's constants (ppo_remove_main.py l.283, ppo.py l.296).
DISCOUNT = 0.7
CLIP = 0.2
UPDATE_EPOCHS = 5
VALUE_WEIGHT = 0.5
ENTROPY_WEIGHT = 0.01
AGENT_LEARNING_RATE = 1e-3
HIDDEN = 64
UPDATE_EVERY = 5
# Unavailable clients' logits: finite, so that p * log p and its gradient
# stay 0 (with -inf they are NaN), and far below any real logit.
_UNAVAILABLE_LOGIT = -1e9


def agent_optimizer():
  """The agent's optimizer: Adam, lr 1e-3 (the code's)."""
  return optax.adam(AGENT_LEARNING_RATE)


def init_mlp(key, sizes):
  """Dense layers ``sizes[0] -> ... -> sizes[-1]`` with PyTorch's default
  initialisation (weights and biases uniform in +-1/sqrt(fan_in)), as the
  code's ``nn.Linear`` layers."""
  layers = []
  for fan_in, fan_out in zip(sizes[:-1], sizes[1:]):
    key, wkey, bkey = jax.random.split(key, 3)
    bound = 1.0 / math.sqrt(fan_in)
    layers.append(
      {
        'w': jax.random.uniform(
          wkey, (fan_in, fan_out), jnp.float32, -bound, bound
        ),
        'b': jax.random.uniform(bkey, (fan_out,), jnp.float32, -bound, bound),
      }
    )
  return layers


def mlp(layers, x):
  """tanh between layers, none after the last (the code's actor and critic
  before the actor's softmax)."""
  for layer in layers[:-1]:
    x = jnp.tanh(x @ layer['w'] + layer['b'])
  return x @ layers[-1]['w'] + layers[-1]['b']


def init_agent(key, num_clients: int, hidden: int = HIDDEN):
  """``{'actor', 'critic'}``: two separate MLPs, no shared trunk."""
  actor_key, critic_key = jax.random.split(key)
  sizes = (num_clients + 1, hidden, hidden)
  return {
    'actor': init_mlp(actor_key, sizes + (num_clients,)),
    'critic': init_mlp(critic_key, sizes + (1,)),
  }


def policy_log_probs(actor, observation, available):
  """log pi(. | s) over the N clients, restricted to ``available`` [N]
  (every client when none is, so the result stays finite); an unavailable
  client's log-probability is about -1e9."""
  logits = mlp(actor, observation)
  masked = jnp.where(available, logits, _UNAVAILABLE_LOGIT)
  return jax.nn.log_softmax(jnp.where(jnp.any(available), masked, logits))


def value(critic, observation):
  return mlp(critic, observation)[0]


def entropy(log_probs, available):
  """H(pi) = -sum_n p_n log p_n over the available clients."""
  p = jnp.exp(log_probs)
  return -jnp.sum(jnp.where(available, p * log_probs, 0.0))


def discounted_returns(reward, taken, discount=DISCOUNT):
  """R_j = r_j + gamma R_{j+1} along the flattened transitions (entries not
  ``taken`` are skipped), no bootstrap at the end: the code's Monte-Carlo
  returns, which also discount across the clients of one round."""

  def body(later, step):
    r, t = step
    current = jnp.where(t, r + discount * later, later)
    return current, current

  _, out = jax.lax.scan(body, jnp.float32(0.0), (reward, taken), reverse=True)
  return out


def normalise(returns, taken):
  """(R - mean) / (std + 1e-7) over the taken entries, std with Bessel's
  correction (torch's ``Tensor.std``)."""
  count = jnp.sum(taken)
  mean = jnp.sum(jnp.where(taken, returns, 0.0)) / jnp.maximum(count, 1)
  square = jnp.sum(jnp.where(taken, (returns - mean) ** 2, 0.0))
  std = jnp.sqrt(square / jnp.maximum(count - 1, 1))
  return (returns - mean) / (std + 1e-7)


def ppo_loss(agent, buffer, returns, advantages):
  """The clipped surrogate + value + entropy loss over the taken entries of
  ``buffer`` (states [U, N + 1], available / taken / log_prob [U, N]);
  ``returns`` and ``advantages`` [U, N]."""
  log_probs = jax.vmap(policy_log_probs, (None, 0, 0))(
    agent['actor'], buffer['state'], buffer['available']
  )
  values = jax.vmap(value, (None, 0))(agent['critic'], buffer['state'])
  taken = buffer['taken']
  # Entries not taken hold whatever the buffer had: keep them out of exp.
  ratio = jnp.exp(jnp.where(taken, log_probs - buffer['log_prob'], 0.0))
  clipped = jnp.clip(ratio, 1.0 - CLIP, 1.0 + CLIP)
  surrogate = -jnp.minimum(ratio * advantages, clipped * advantages)
  value_error = (values[:, None] - returns) ** 2
  entropies = jax.vmap(entropy)(log_probs, buffer['available'])
  per_entry = (
    surrogate + VALUE_WEIGHT * value_error - ENTROPY_WEIGHT * entropies[:, None]
  )
  per_entry = jnp.where(taken, per_entry, 0.0)
  return masked_mean(per_entry.reshape(-1), taken.reshape(-1))


def ppo_update(agent, agent_opt_state, buffer, optimizer):
  """One PPO update on the buffer: returns, advantages against the stored
  V_old, then ``UPDATE_EPOCHS`` full-batch optimizer steps."""
  taken = buffer['taken'].reshape(-1)
  returns = discounted_returns(buffer['reward'].reshape(-1), taken)
  returns = normalise(returns, taken).reshape(buffer['taken'].shape)
  advantages = returns - buffer['value'][:, None]

  def epoch(_, carry):
    agent, opt_state = carry
    grads = jax.grad(ppo_loss)(agent, buffer, returns, advantages)
    updates, opt_state = optimizer.update(grads, opt_state, agent)
    return optax.apply_updates(agent, updates), opt_state

  return jax.lax.fori_loop(0, UPDATE_EPOCHS, epoch, (agent, agent_opt_state))


def empty_buffer(num_clients: int, update_every: int) -> Dict[str, Any]:
  """Transitions by (round since the last update, client id): a client is
  selected at most once a round, so [U, N] holds them all; within a round
  the flattened order is the clients' index order."""
  u, n = update_every, num_clients
  return {
    'state': jnp.zeros((u, n + 1), jnp.float32),
    'available': jnp.zeros((u, n), bool),
    'value': jnp.zeros((u,), jnp.float32),
    'log_prob': jnp.zeros((u, n), jnp.float32),
    'reward': jnp.zeros((u, n), jnp.float32),
    'taken': jnp.zeros((u, n), bool),
  }
