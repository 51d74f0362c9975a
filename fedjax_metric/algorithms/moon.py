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

import jax.numpy as jnp

from fedjax_metric import losses
from fedjax_metric.algorithms import fedavg
from fedjax_metric.contract import NO_RUN_FACTS, RunFacts


def make(
  model,
  *,
  server_optimizer,
  run: RunFacts = NO_RUN_FACTS,
  weighting='num_examples',
  mu=1.0,
  temperature=0.5,
):
  """MOON. Defaults mu=1, tau=0.5 (MOON main.py; its README uses mu=5 with the
  simple CNN on CIFAR-10). The model's 'embedding' is the projection z."""
  if mu < 0 or temperature <= 0:
    raise ValueError(
      f'MOON needs mu >= 0 and temperature > 0 (got {mu}, {temperature}).'
    )
  base = fedavg.make(
    model, server_optimizer=server_optimizer, weighting=weighting
  )

  def init_client(variables, key):
    del variables
    return model.init(key)

  def frozen_embedding(variables, images):
    return fedavg.frozen_outputs(model, variables, images)['embedding']

  def client_loss(params, model_state, batch, ctx):
    outputs, ce, model_state = fedavg.forward_and_cross_entropy(
      model, params, model_state, batch
    )
    z_global = frozen_embedding(ctx.server_state.variables, batch.images)
    z_previous = frozen_embedding(ctx.client_row, batch.images)
    contrastive = losses.masked_mean(
      losses.moon_contrastive_loss(
        outputs['embedding'], z_global, z_previous, temperature=temperature
      ),
      batch.mask,
    )
    contrastive = jnp.where(ctx.server_state.round == 0, 0.0, contrastive)
    return ce + mu * contrastive, (
      model_state,
      {'ce': ce, 'metric': contrastive},
    )

  def client_final(end_variables, ctx):
    update, weight, _ = base.client_final(end_variables, ctx)
    return update, weight, end_variables

  return base._replace(
    init_client=init_client, client_loss=client_loss, client_final=client_final
  )
