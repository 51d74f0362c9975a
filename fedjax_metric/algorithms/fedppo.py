"""FedPPO: a PPO agent on the server picks the clients whose updates count.

Zhao, Li, Li, Yang and Xu, 'FedPPO: Reinforcement Learning-Based Client
Selection for Federated Learning with Heterogeneous Data', IEEE Transactions
on Cognitive Communications and Networking, 2025; as the authors' released
code runs it (github.com/zzy211/fedppo, src/ppo_remove_main.py and
src/ppo_server/ppo.py), in the participation setting of the PMFL comparison
(docs/methods.md, FedPPO, for every choice below and why).

Observation (N + 1 values in [0, 1]): s[0] the global model's accuracy after
the last round, s[1 + n] the accuracy of client n's local model the last time
it was selected (0 before). The agent (fedppo_agent.py: actor and critic
MLPs, the PPO update every U = 5 rounds) gives a softmax pi(. | s) over the
clients. In round t the server keeps K_t = ceil(select_fraction * |A_t|) of
the round's available clients A_t, drawn without replacement from pi
restricted to A_t, and averages their updates only. Each selected client i
earns (fedppo_server.py: the draw, the rewards, the agent's memory)

  r_i = acc_i + acc_g * dl_i / sum_{j selected} dl_j,
  dl_i = max(l_i^prev - l_i, 1e-5),

with accuracies measured on the server's held-out validation examples (the
code uses the test set; never here), acc_g that of the new global model, l_i
the client's training loss and l_i^prev its value at the client's previous
selection (0 before, so dl = 1e-5 then).

Where the selection happens: the engine trains every available client
(the cohort is the availability pattern's), each client writes its update,
accuracy and loss into its row of the client table, and ``server_update``
draws the selection and averages the selected rows. The draw depends only on
the observation, the availability and a key of (seed, round), never on this
round's training, so this is the same process as selecting first; the
unselected clients' training is computation thrown away. The client table
costs N x model size (as MIFA's).
"""

import dataclasses
import functools
from typing import Literal

import jax
import jax.numpy as jnp
import numpy as np

from fedjax_metric import engine
from fedjax_metric.algorithms import fedau, fedavg, fedppo_agent, fedppo_server
from fedjax_metric.algorithms.spec import AlgorithmSpec
from fedjax_metric.contract import NO_RUN_FACTS


@dataclasses.dataclass(frozen=True)
class Options:
  """FedPPO's options (the released code's values).

  Attributes:
    select_fraction: K_t = ceil(select_fraction * |A_t|) clients kept of the
      |A_t| available, in (0, 1].
    reward_examples: validation examples the accuracies acc_i, acc_g of the
      reward are measured on (the first ones of the stratified split; >= 1).
    update_every: U, rounds between PPO updates (the code: 5; >= 1).
    selection: 'ppo' (the method), or 'random': the same number of clients
      drawn uniformly from the available ones, an ablation that keeps
      everything else (the agent still learns, unused) and so isolates what
      the policy's choice adds.
  """

  select_fraction: float = 0.5
  reward_examples: int = 256
  update_every: int = fedppo_agent.UPDATE_EVERY
  selection: Literal['ppo', 'random'] = 'ppo'

  def __post_init__(self):
    if not 0.0 < self.select_fraction <= 1.0:
      raise ValueError(
        'fedppo: select_fraction must be in (0, 1], got '
        f'{self.select_fraction}.'
      )
    if self.selection not in ('ppo', 'random'):
      raise ValueError(
        f"fedppo: selection must be 'ppo' or 'random', got {self.selection!r}."
      )
    if self.reward_examples < 1 or self.update_every < 1:
      raise ValueError(
        'fedppo: reward_examples and update_every must be >= 1, got '
        f'{self.reward_examples} and {self.update_every}.'
      )


def init_extra(
  options, reward_images, reward_labels, variables, num_clients, key
):
  """The agent's state (`fedppo_server.init_state`) and the reward examples:
  data, not state, in the extra rather than bound to a hook so that the
  compiled programs do not embed them as constants."""
  del variables
  return {
    **fedppo_server.init_state(key, num_clients, options.update_every),
    'reward_images': jnp.asarray(reward_images),
    'reward_labels': jnp.asarray(reward_labels),
  }


def init_client(variables, key):
  """The row: the client's last update, weight, accuracy and loss."""
  del key
  return {
    'delta': jax.tree.map(jnp.zeros_like, variables),
    'weight': jnp.zeros((), jnp.float32),
    'accuracy': jnp.zeros((), jnp.float32),
    'loss': jnp.zeros((), jnp.float32),
  }


def client_final(model, weighting, end_variables, ctx):
  """FedAvg's update and weight, also written to the row with the trained
  model's validation accuracy acc_i and training loss l_i."""
  delta, weight, _ = fedavg.delta_final(weighting, end_variables, ctx)
  extra = ctx.server_state.extra
  row = {
    'delta': delta,
    'weight': jnp.asarray(weight, jnp.float32),
    'accuracy': fedppo_server.accuracy(
      model, end_variables, extra['reward_images'], extra['reward_labels']
    ),
    'loss': fedppo_server.training_loss(model, end_variables, ctx),
  }
  return delta, weight, row


def server_update(
  options, model, server_optimizer, server_state, aggregate, cohort_rows
):
  """Draws the selection, averages the selected rows, measures the new
  global model's accuracy acc_g and lets the agent learn from the round
  (`fedppo_server.learn`)."""
  extra = server_state.extra
  num_clients = extra['previous_loss'].shape[0]
  ids = aggregate.client_ids
  available = fedau.participation_vector(aggregate, num_clients)
  observation = extra['observation']
  agent = extra['agent']
  log_probs, selected = fedppo_server.select(
    agent['actor'],
    observation,
    available,
    extra['key'],
    server_state.round,
    options.select_fraction,
    options.selection == 'ppo',
  )
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

  global_accuracy = fedppo_server.accuracy(
    model, new_state.variables, extra['reward_images'], extra['reward_labels']
  )
  learned = fedppo_server.learn(
    extra,
    available,
    log_probs,
    selected,
    fedppo_server.scatter(rows['accuracy'], ids, num_clients),
    fedppo_server.scatter(rows['loss'], ids, num_clients),
    global_accuracy,
    server_state.round,
    options.update_every,
  )
  return new_state._replace(extra=dict(extra, **learned))


def build(
  model,
  options,
  *,
  server_optimizer,
  weighting='num_examples',
  run=NO_RUN_FACTS,
):
  """FedPPO as an `engine.Algorithm`.

  Args:
    model: `ModelFns`.
    options: `Options`.
    server_optimizer: applied to the selected clients' mean update (sgd(1):
      the code's plain average).
    weighting: the selected clients' updates averaged by example count (the
      code) or uniformly.
    run: needs ``run.validation`` (the held-out split: the rewards'
      accuracies); `assemble.build` fills it when
      ``dataset.validation_fraction > 0``.

  Raises:
    ValueError: no validation split.
  """
  if run.validation is None:
    raise ValueError(
      'fedppo measures its rewards on held-out validation examples: set '
      '--config.dataset.validation_fraction (e.g. 0.02).'
    )
  held = run.validation
  reward_images = np.asarray(
    held.preprocess(jnp.asarray(held.images[: options.reward_examples]), None)
  )
  reward_labels = np.asarray(held.labels[: options.reward_examples], np.int32)
  base = fedavg.build(
    model, server_optimizer=server_optimizer, weighting=weighting
  )
  extra = functools.partial(init_extra, options, reward_images, reward_labels)
  return base._replace(
    init_server=fedavg.make_init_server(server_optimizer, extra),
    init_client=init_client,
    client_final=functools.partial(client_final, model, weighting),
    server_update=functools.partial(
      server_update, options, model, server_optimizer
    ),
  )


SPEC = AlgorithmSpec(
  'fedppo',
  build,
  Options,
  reads=frozenset({'server_optimizer', 'weighting', 'run'}),
  description='FedPPO (Zhao et al., 2025): a PPO agent on the server picks '
  'the clients whose updates are averaged.',
)
SPECS = (SPEC,)
