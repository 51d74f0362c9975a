"""FedProx: FedAvg plus a proximal term.

Li, Sahu, Zaheer, Sanjabi, Talwalkar and Smith, 'Federated Optimization in
Heterogeneous Networks', MLSys 2020. Local objective (Eq. 2):
``h_k(w; w^t) = F_k(w) + mu/2 ||w - w^t||^2``. Only the client loss changes;
``w^t`` is the global params in the context (docs/methods.md, FedProx).
"""

import dataclasses
import functools

import jax
import jax.numpy as jnp

from fedjax_metric.algorithms import fedavg
from fedjax_metric.algorithms.spec import AlgorithmSpec


@dataclasses.dataclass(frozen=True)
class Options:
  """FedProx's options.

  Attributes:
    mu: mu of Eq. 2, the weight of the proximal term (>= 0; 0 is FedAvg).
  """

  mu: float = 0.01

  def __post_init__(self):
    if self.mu < 0:
      raise ValueError(f'FedProx mu must be >= 0, got {self.mu}.')


def proximal_term(params, global_params):
  """``1/2 ||params - global_params||^2`` over all leaves."""
  squares = jax.tree.map(
    lambda p, g: jnp.sum(jnp.square(p - g)), params, global_params
  )
  return 0.5 * sum(jax.tree.leaves(squares))


def client_loss(options, model, params, model_state, batch, ctx):
  """Eq. 2: cross-entropy + mu/2 ||w - w^t||^2, w^t the global params."""
  loss, aux = fedavg.cross_entropy_loss(model, params, model_state, batch, ctx)
  global_params = ctx.server_state.variables['params']
  return loss + options.mu * proximal_term(params, global_params), aux


def build(model, options, *, server_optimizer, weighting='num_examples'):
  """FedProx: FedAvg with the proximal client loss."""
  return fedavg.build(
    model, server_optimizer=server_optimizer, weighting=weighting
  )._replace(client_loss=functools.partial(client_loss, options, model))


SPEC = AlgorithmSpec(
  'fedprox',
  build,
  Options,
  description='FedProx (Li et al., 2020): a proximal term mu/2 ||w - w_g||^2.',
)
SPECS = (SPEC,)
