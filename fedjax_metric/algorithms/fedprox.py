"""FedProx: FedAvg plus a proximal term.

Li, Sahu, Zaheer, Sanjabi, Talwalkar and Smith, 'Federated Optimization in
Heterogeneous Networks', MLSys 2020. Local objective (Eq. 2):
``h_k(w; w^t) = F_k(w) + mu/2 ||w - w^t||^2``. Only the client loss changes;
``w^t`` is the global params in the context (docs/methods.md, FedProx).
"""

import jax
import jax.numpy as jnp

from fedjax_metric.algorithms import fedavg
from fedjax_metric.contract import NO_RUN_FACTS, RunFacts


def proximal_term(params, global_params):
  """``1/2 ||params - global_params||^2`` over all leaves."""
  squares = jax.tree.map(
    lambda p, g: jnp.sum(jnp.square(p - g)), params, global_params
  )
  return 0.5 * sum(jax.tree.leaves(squares))


def make(
  model,
  *,
  server_optimizer,
  run: RunFacts = NO_RUN_FACTS,
  weighting='num_examples',
  mu=0.01,
):
  """FedProx: `fedavg.make` with the proximal client loss (mu >= 0)."""
  if mu < 0:
    raise ValueError(f'FedProx mu must be >= 0, got {mu}.')
  cross_entropy = fedavg.make_cross_entropy_loss(model)

  def client_loss(params, model_state, batch, ctx):
    loss, aux = cross_entropy(params, model_state, batch, ctx)
    global_params = ctx.server_state.variables['params']
    return loss + mu * proximal_term(params, global_params), aux

  return fedavg.make(
    model, server_optimizer=server_optimizer, weighting=weighting
  )._replace(client_loss=client_loss)
