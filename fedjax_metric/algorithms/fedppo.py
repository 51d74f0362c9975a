"""FedPPO: a PPO agent on the server picks the clients whose updates count.

Zhao, Li, Li, Yang and Xu, 'FedPPO: Reinforcement Learning-Based Client
Selection for Federated Learning with Heterogeneous Data', IEEE Transactions
on Cognitive Communications and Networking, 2025; as the authors' released
code runs it (github.com/zzy211/fedppo, src/ppo_remove_main.py and
src/ppo_server/ppo.py), in the participation setting of the PMFL comparison
(docs/methods.md, FedPPO, for every choice below and why).

Observation (N + 1 values in [0, 1]): s[0] the global model's accuracy after
the last round, s[1 + n] the accuracy of client n's local model the last time
it was selected (0 before). An actor MLP (N + 1 -> 64 -> 64 -> N, tanh) gives
a softmax pi(. | s) over the clients, a critic MLP (N + 1 -> 64 -> 64 -> 1)
the value V(s). In round t the server keeps K_t = ceil(select_fraction *
|A_t|) of the round's available clients A_t, drawn without replacement from
pi restricted to A_t, and averages their updates only. Each selected client i
earns

  r_i = acc_i + acc_g * dl_i / sum_{j selected} dl_j,
  dl_i = max(l_i^prev - l_i, 1e-5),

with accuracies measured on the server's held-out validation examples (the
code uses the test set; never here), acc_g that of the new global model, l_i
the client's training loss and l_i^prev its value at the client's previous
selection (0 before, so dl = 1e-5 then). Every transition (s_t, i,
log pi(i | s_t), V(s_t), r_i) is buffered; after rounds 0, U, 2U, ... (U = 5)
the buffer is one PPO update (Schulman et al., 2017, Eq. 7 with the value
and entropy terms of Eq. 9): Monte-Carlo returns discounted with gamma = 0.7
along the flattened sequence of transitions, normalised; advantages R -
V_old; 5 full-batch Adam steps (lr 1e-3) on

  mean[-min(rho A, clip(rho, 1 - 0.2, 1 + 0.2) A)] + 0.5 mean[(V - R)^2]
  - 0.01 mean[H(pi(. | s))],   rho = pi(i | s) / pi_old(i | s).

Where the selection happens: the engine trains every available client
(the cohort is the availability pattern's), each client writes its update,
accuracy and loss into its row of the client table, and ``server_update``
draws the selection and averages the selected rows. The draw depends only on
the observation, the availability and a key of (seed, round), never on this
round's training, so this is the same process as selecting first; the
unselected clients' training is computation thrown away. The client table
costs N x model size (as MIFA's).
"""

import math
from typing import Any, Dict

import jax
import jax.numpy as jnp
import numpy as np
import optax

from fedjax_metric import engine
from fedjax_metric.algorithms import fedau, fedavg
from fedjax_metric.contract import NO_RUN_FACTS, RunFacts
from fedjax_metric.losses import masked_mean, softmax_cross_entropy
from fedjax_metric.models import split_variables

# The released code's constants (ppo_remove_main.py l.283, ppo.py l.296).
DISCOUNT = 0.7
CLIP = 0.2
UPDATE_EPOCHS = 5
VALUE_WEIGHT = 0.5
ENTROPY_WEIGHT = 0.01
AGENT_LEARNING_RATE = 1e-3
HIDDEN = 64
UPDATE_EVERY = 5
MIN_LOSS_DECREASE = 1e-5
# Unavailable clients' logits: finite, so that p * log p and its gradient
# stay 0 (with -inf they are NaN), and far below any real logit.
_UNAVAILABLE_LOGIT = -1e9


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


def _scatter(values, client_ids, num_clients):
  """[C] slot values -> [N] by client id, 0 elsewhere (padding ids
  dropped)."""
  base = jnp.zeros((num_clients,), values.dtype)
  return base.at[client_ids].set(values, mode='drop')


def make(
  model,
  *,
  server_optimizer,
  run: RunFacts = NO_RUN_FACTS,
  weighting='num_examples',
  select_fraction=0.5,
  reward_examples=256,
  update_every=UPDATE_EVERY,
  selection='ppo',
):
  """FedPPO as an `engine.Algorithm`.

  Args:
    model: `ModelFns`.
    server_optimizer: applied to the selected clients' mean update (sgd(1):
      the code's plain average).
    run: needs ``run.validation`` (the held-out split: the rewards'
      accuracies); `assemble.build` fills it when
      ``dataset.validation_fraction > 0``.
    weighting: the selected clients' updates averaged by example count (the
      code) or uniformly.
    select_fraction: K_t = ceil(select_fraction * available clients), in
      (0, 1].
    reward_examples: validation examples the accuracies are measured on
      (the first ones of the stratified split).
    update_every: U, rounds between PPO updates (the code: 5).
    selection: 'ppo' (the method), or 'random': the same number of clients
      drawn uniformly from the available ones, an ablation that keeps
      everything else (the agent still learns, unused) and so isolates what
      the policy's choice adds.

  Raises:
    ValueError: no validation split, or an option out of range.
  """
  if not 0.0 < select_fraction <= 1.0:
    raise ValueError(
      f'fedppo: select_fraction must be in (0, 1], got {select_fraction}.'
    )
  if selection not in ('ppo', 'random'):
    raise ValueError(
      f"fedppo: selection must be 'ppo' or 'random', got {selection!r}."
    )
  if reward_examples < 1 or update_every < 1:
    raise ValueError(
      'fedppo: reward_examples and update_every must be >= 1, got '
      f'{reward_examples} and {update_every}.'
    )
  if run.validation is None:
    raise ValueError(
      'fedppo measures its rewards on held-out validation examples: set '
      '--config.dataset.validation_fraction (e.g. 0.02).'
    )
  held = run.validation
  reward_images = np.asarray(
    held.preprocess(jnp.asarray(held.images[:reward_examples]), None)
  )
  reward_labels = np.asarray(held.labels[:reward_examples], np.int32)
  agent_optimizer = optax.adam(AGENT_LEARNING_RATE)
  base = fedavg.build(
    model, server_optimizer=server_optimizer, weighting=weighting
  )

  def init_extra(variables, num_clients, key):
    del variables
    agent = init_agent(key, num_clients)
    return {
      'agent': agent,
      'agent_opt_state': agent_optimizer.init(agent),
      'observation': jnp.zeros((num_clients + 1,), jnp.float32),
      'previous_loss': jnp.zeros((num_clients,), jnp.float32),
      'buffer': empty_buffer(num_clients, update_every),
      # Raw key data: a checkpoint holds plain arrays.
      'key': jax.random.key_data(jax.random.fold_in(key, 1)),
      # Data, not state: in the extra rather than closed over, so that the
      # compiled programs do not embed it as a constant.
      'reward_images': jnp.asarray(reward_images),
      'reward_labels': jnp.asarray(reward_labels),
    }

  def init_client(variables, key):
    del key
    return {
      'delta': jax.tree.map(jnp.zeros_like, variables),
      'weight': jnp.zeros((), jnp.float32),
      'accuracy': jnp.zeros((), jnp.float32),
      'loss': jnp.zeros((), jnp.float32),
    }

  def client_final(end_variables, ctx):
    delta, weight, _ = base.client_final(end_variables, ctx)
    extra = ctx.server_state.extra
    row = {
      'delta': delta,
      'weight': jnp.asarray(weight, jnp.float32),
      'accuracy': accuracy(
        model, end_variables, extra['reward_images'], extra['reward_labels']
      ),
      'loss': training_loss(model, end_variables, ctx),
    }
    return delta, weight, row

  def server_update(server_state, aggregate, cohort_rows):
    extra = server_state.extra
    num_clients = extra['previous_loss'].shape[0]
    ids = aggregate.client_ids
    available = fedau.participation_vector(aggregate, num_clients)
    observation = extra['observation']
    agent = extra['agent']
    log_probs = policy_log_probs(agent['actor'], observation, available)
    k = jnp.ceil(select_fraction * jnp.sum(available)).astype(jnp.int32)
    round_key = jax.random.fold_in(
      jax.random.wrap_key_data(extra['key']), server_state.round
    )
    drawn_from = log_probs if selection == 'ppo' else jnp.zeros_like(log_probs)
    selected = sample_without_replacement(drawn_from, available, k, round_key)

    rows = cohort_rows
    in_selection = aggregate.slot_mask & selected.at[ids].get(mode='clip')
    weights = jnp.where(in_selection, rows['weight'], 0.0)
    # FedAvg's weighted mean, over the selected rows only.
    mean_delta = fedavg.mean_update(
      aggregate._replace(
        update_sum=engine.weighted_sum(weights, rows['delta']),
        weight_sum=jnp.sum(weights),
      )
    )
    new_state = fedavg.skip_if_nobody(
      aggregate,
      server_state,
      fedavg.apply_server_optimizer(server_optimizer, server_state, mean_delta),
    )

    global_accuracy = accuracy(
      model,
      new_state.variables,
      extra['reward_images'],
      extra['reward_labels'],
    )
    client_accuracy = _scatter(rows['accuracy'], ids, num_clients)
    client_loss = _scatter(rows['loss'], ids, num_clients)
    reward = rewards(
      client_accuracy,
      global_accuracy,
      client_loss,
      extra['previous_loss'],
      selected,
    )

    # The round's transitions; the code updates after rounds 0, U, 2U, ...
    # (``epoch % 5 == 0``), so round t goes to position (t - 1) mod U.
    position = (server_state.round + update_every - 1) % update_every
    buffer = extra['buffer']
    entries = {
      'state': observation,
      'available': available,
      'value': value(agent['critic'], observation),
      'log_prob': log_probs,
      'reward': reward,
      'taken': selected,
    }
    buffer = {
      name: buffer[name].at[position].set(entries[name]) for name in buffer
    }
    due = server_state.round % update_every == 0
    # Returns need two transitions for a standard deviation.
    learn = due & (jnp.sum(buffer['taken']) >= 2)
    agent, agent_opt_state = jax.lax.cond(
      learn,
      lambda: ppo_update(
        agent, extra['agent_opt_state'], buffer, agent_optimizer
      ),
      lambda: (agent, extra['agent_opt_state']),
    )
    buffer = dict(buffer, taken=jnp.where(due, False, buffer['taken']))

    observation = jnp.concatenate(
      [
        global_accuracy[None],
        jnp.where(selected, client_accuracy, observation[1:]),
      ]
    )
    new_extra = dict(
      extra,
      agent=agent,
      agent_opt_state=agent_opt_state,
      observation=observation,
      previous_loss=jnp.where(selected, client_loss, extra['previous_loss']),
      buffer=buffer,
    )
    return new_state._replace(extra=new_extra)

  return base._replace(
    init_server=fedavg.make_init_server(server_optimizer, init_extra),
    init_client=init_client,
    client_final=client_final,
    server_update=server_update,
  )
