"""MOON (Li, He and Song, 'Model-Contrastive Federated Learning', CVPR 2021).

Local objective (Eq. 3-4): ``CE(F(x), y) + mu * l_con`` with
``l_con = -log(exp(sim(z, z_glob)/tau) / (exp(sim(z, z_glob)/tau) +
exp(sim(z, z_prev)/tau)))``: z from the model being trained, z_glob from the
current global model and z_prev from this client's previous local model, both
frozen and in eval mode (the authors' released code, github.com/QinbinLi/MOON,
main.py ``train_net_fedcon``; docs/methods.md, MOON).

Slots replaced relative to FedAvg:
  * ``init_client``: the client-table row is the client's previous local model,
    initially an independent random init per client: a client never sampled
    before contrasts against its own random net, as in the reference code;
  * ``client_loss``: CE + mu * l_con; in round 0 the pool of previous models is
    empty in the reference code, so l_con is CE over the single positive logit
    = 0;
  * ``client_final``: stores the new local model in the row.
"""

import dataclasses
import functools

import jax.numpy as jnp

from fedjax_metric import losses
from fedjax_metric.algorithms import fedavg
from fedjax_metric.algorithms.spec import AlgorithmSpec


@dataclasses.dataclass(frozen=True)
class Options:
  """MOON's options (defaults of the authors' main.py; their README uses
  mu = 5 with the simple CNN on CIFAR-10).

  Attributes:
    mu: mu of Eq. 4, the weight of the model-contrastive loss (>= 0).
    temperature: tau of Eq. 3 (> 0).
  """

  mu: float = 1.0
  temperature: float = 0.5

  def __post_init__(self):
    if self.mu < 0 or self.temperature <= 0:
      raise ValueError(
        f'MOON needs mu >= 0 and temperature > 0 (got {self.mu}, '
        f'{self.temperature}).'
      )


def init_client(model, variables, key):
  """The row: the client's previous local model, at first its own random
  initialisation (as in the reference code)."""
  del variables
  return model.init(key)


def frozen_embedding(model, variables, images):
  """The projection z of a frozen (evaluation-mode) model."""
  return fedavg.frozen_outputs(model, variables, images)['embedding']


def client_loss(options, model, params, model_state, batch, ctx):
  """Eq. 4: CE + mu * l_con, with z_glob from the global model and z_prev
  from the row; l_con is 0 in round 0 (no previous models yet)."""
  outputs, ce, model_state = fedavg.forward_and_cross_entropy(
    model, params, model_state, batch
  )
  z_global = frozen_embedding(model, ctx.server_state.variables, batch.images)
  z_previous = frozen_embedding(model, ctx.client_row, batch.images)
  contrastive = losses.masked_mean(
    losses.moon_contrastive_loss(
      outputs['embedding'],
      z_global,
      z_previous,
      temperature=options.temperature,
    ),
    batch.mask,
  )
  contrastive = jnp.where(ctx.server_state.round == 0, 0.0, contrastive)
  return ce + options.mu * contrastive, (
    model_state,
    {'ce': ce, 'metric': contrastive},
  )


def client_final(weighting, end_variables, ctx):
  """FedAvg's update and weight; the new local model becomes the row."""
  update, weight, _ = fedavg.delta_final(weighting, end_variables, ctx)
  return update, weight, end_variables


def build(model, options, *, server_optimizer, weighting='num_examples'):
  """MOON. The model's 'embedding' is the projection z."""
  base = fedavg.build(
    model, server_optimizer=server_optimizer, weighting=weighting
  )
  return base._replace(
    init_client=functools.partial(init_client, model),
    client_loss=functools.partial(client_loss, options, model),
    client_final=functools.partial(client_final, weighting),
  )


SPEC = AlgorithmSpec(
  'moon',
  build,
  Options,
  description='MOON (Li et al., 2021): model-contrastive loss.',
)
SPECS = (SPEC,)
