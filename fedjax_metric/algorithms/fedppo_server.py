"""FedPPO's server round: the selection, the rewards and what the agent
remembers (fedppo.py runs it; the agent itself is fedppo_agent.py).

Zhao, Li, Li, Yang and Xu, 'FedPPO: Reinforcement Learning-Based Client
Selection for Federated Learning with Heterogeneous Data', IEEE TCCN 2025, as
the authors' released code runs it (github.com/zzy211/fedppo,
src/ppo_remove_main.py; docs/methods.md, FedPPO). The observation s (N + 1
values): s[0] the global model's accuracy after the last round, s[1 + n]
client n's accuracy at its last selection. The selected clients' rewards

  r_i = acc_i + acc_g * dl_i / sum_{j selected} dl_j,
  dl_i = max(l_i^prev - l_i, 1e-5).
"""

from typing import Any, Dict

import jax
import jax.numpy as jnp

from fedjax_metric.algorithms import fedavg
from fedjax_metric.algorithms.fedppo_agent import (
  agent_optimizer,
  empty_buffer,
  init_agent,
  policy_log_probs,
  ppo_update,
  value,
)
from fedjax_metric.losses import softmax_cross_entropy
from fedjax_metric.models import split_variables

MIN_LOSS_DECREASE = 1e-5


def sample_without_replacement(log_probs, available, k, key):
  """[N] bool: ``k`` distinct available clients drawn from softmax
  ``log_probs``.

  The code draws from one categorical repeatedly and rejects repeats until
  it has k distinct clients; each next distinct draw then falls on a client
  with probability proportional to p among those not yet drawn, which is
  sampling without replacement, and the same distribution as the k largest
  of log p_n + Gumbel noise (the Gumbel-top-k trick).
  """
  noise = jax.random.gumbel(key, log_probs.shape)
  scores = jnp.where(available, log_probs + noise, -jnp.inf)
  order = jnp.argsort(-scores)
  rank = jnp.zeros_like(order).at[order].set(jnp.arange(order.shape[0]))
  return available & (rank < k)


def rewards(accuracy, global_accuracy, loss, previous_loss, selected):
  """r_i = acc_i + acc_g dl_i / sum_j dl_j over the selected clients
  (alpha = beta = 1 in the code), dl_i = max(l_i^prev - l_i, 1e-5); 0 for
  the others. All [N] except the scalar ``global_accuracy``."""
  decrease = jnp.maximum(previous_loss - loss, MIN_LOSS_DECREASE)
  decrease = jnp.where(selected, decrease, 0.0)
  share = decrease / jnp.maximum(jnp.sum(decrease), MIN_LOSS_DECREASE)
  return jnp.where(selected, accuracy + global_accuracy * share, 0.0)


def accuracy(model, variables, images, labels):
  """Fraction of ``images`` [V, ...] whose argmax logit is the label."""
  logits = fedavg.frozen_outputs(model, variables, images)['logits']
  return jnp.mean((jnp.argmax(logits, -1) == labels).astype(jnp.float32))


def training_loss(model, variables, ctx):
  """The client's mean cross-entropy over this round's batches under its
  trained model (the code averages the running batch losses of training;
  docs/methods.md)."""
  params, model_state = split_variables(variables)

  def add(carry, batch):
    outputs, _ = model.apply(params, model_state, batch.images, train=False)
    ce = softmax_cross_entropy(outputs['logits'], batch.labels)
    mask = batch.mask.astype(jnp.float32)
    return carry[0] + jnp.sum(ce * mask), carry[1] + jnp.sum(mask)

  total, count = ctx.scan_batches(add, (jnp.float32(0.0), jnp.float32(0.0)))
  return total / jnp.maximum(count, 1.0)


def scatter(values, client_ids, num_clients):
  """[C] slot values -> [N] by client id, 0 elsewhere (padding ids
  dropped)."""
  base = jnp.zeros((num_clients,), values.dtype)
  return base.at[client_ids].set(values, mode='drop')


def init_state(key, num_clients: int, update_every: int) -> Dict[str, Any]:
  """The server's agent state: the agent, its Adam state, the observation
  s, each client's loss at its last selection, the transitions and the
  selection's key (raw key data: a checkpoint holds plain arrays)."""
  agent = init_agent(key, num_clients)
  return {
    'agent': agent,
    'agent_opt_state': agent_optimizer().init(agent),
    'observation': jnp.zeros((num_clients + 1,), jnp.float32),
    'previous_loss': jnp.zeros((num_clients,), jnp.float32),
    'buffer': empty_buffer(num_clients, update_every),
    'key': jax.random.key_data(jax.random.fold_in(key, 1)),
  }


def select(actor, observation, available, key_data, round_idx, fraction, ppo):
  """The round's action: K_t = ceil(fraction |A_t|) of the ``available``
  clients [N], drawn from pi(. | s) (``ppo``) or uniformly (the 'random'
  ablation) with a key of (seed, round). Returns (log pi(. | s) [N],
  selected bool [N])."""
  log_probs = policy_log_probs(actor, observation, available)
  k = jnp.ceil(fraction * jnp.sum(available)).astype(jnp.int32)
  round_key = jax.random.fold_in(jax.random.wrap_key_data(key_data), round_idx)
  drawn_from = log_probs if ppo else jnp.zeros_like(log_probs)
  selected = sample_without_replacement(drawn_from, available, k, round_key)
  return log_probs, selected


def learn(
  state,
  available,
  log_probs,
  selected,
  client_accuracy,
  client_loss,
  global_accuracy,
  round_idx,
  update_every,
):
  """The agent's state after round t: its rewards and transitions buffered,
  and after rounds 0, U, 2U, ... (the code's ``epoch % 5 == 0``) a PPO
  update (`ppo_update`) on the buffer.

  Args:
    state: `init_state`'s entries before the round (the server extra).
    available, log_probs, selected: [N], `select`'s input and output.
    client_accuracy, client_loss: [N] acc_i and l_i of this round's clients
      (0 elsewhere; `scatter`).
    global_accuracy: acc_g, of the new global model.
    round_idx: t, an int32 scalar.
    update_every: U.

  Returns:
    The new 'agent', 'agent_opt_state', 'observation', 'previous_loss' and
    'buffer' (after an update, no buffered entry is taken).
  """
  agent, observation = state['agent'], state['observation']
  reward = rewards(
    client_accuracy,
    global_accuracy,
    client_loss,
    state['previous_loss'],
    selected,
  )
  transition = {
    'state': observation,
    'available': available,
    'value': value(agent['critic'], observation),
    'log_prob': log_probs,
    'reward': reward,
    'taken': selected,
  }
  # The code updates after rounds 0, U, 2U, ... (``epoch % 5 == 0``), so
  # round t goes to position (t - 1) mod U.
  position = (round_idx + update_every - 1) % update_every
  buffer = {
    name: state['buffer'][name].at[position].set(transition[name])
    for name in state['buffer']
  }
  due = round_idx % update_every == 0
  # Returns need two transitions for a standard deviation.
  learn_now = due & (jnp.sum(buffer['taken']) >= 2)
  agent, agent_opt_state = jax.lax.cond(
    learn_now,
    lambda: ppo_update(
      agent, state['agent_opt_state'], buffer, agent_optimizer()
    ),
    lambda: (agent, state['agent_opt_state']),
  )
  return {
    'agent': agent,
    'agent_opt_state': agent_opt_state,
    'observation': jnp.concatenate(
      [
        global_accuracy[None],
        jnp.where(selected, client_accuracy, observation[1:]),
      ]
    ),
    'previous_loss': jnp.where(selected, client_loss, state['previous_loss']),
    'buffer': dict(buffer, taken=jnp.where(due, False, buffer['taken'])),
  }
