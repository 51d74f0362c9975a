"""FedHyper-CL: each client's local learning rate by hypergradient descent.

Wang, Wang and Li, 'FedHyper: A Universal and Robust Learning Rate Scheduler
for Federated Learning with Hypergradient Descent', ICLR 2024. The global
scheduler FedHyper-G is a server optimizer (`optimizers.fedhyper_global`);
this is the client-side scheduler, a wrapper of any client method
(`schedule_local`), as the authors' code runs it (github.com/ATP-1010/FedHyper,
src/update.py). Each client starts the round at its configured rate
eta_l (multiplier beta = 1) and, after every local step but the first, with
u the step it just took (the model's change), Delta_{t-1} the previous
round's global update and g_prev the step before (Delta_{t-1} for the first
adapted step),

  gamma = min(1.1, 1 + 0.1 <u, Delta_{t-1}> / K + <u, g_prev>),
  beta  = clip(gamma * beta, 0.1, 10),

so the next step runs at eta_l * beta. K is the round's expected number of
clients (the code's num_users * frac).

The rate multiplies the gradient of the client's loss (the loss value is
unchanged): for plain SGD, the setting of PMFL's comparison, that is the
learning rate itself; with momentum, weight decay or Adam it scales only the
loss gradient, not the optimizer's own terms. Delta_{t-1} comes from
FedHyper-G's server state, so this runs only with
``server.optimizer='fedhyper'``. docs/methods.md, FedHyper.
"""

import functools
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
from optax.tree_utils import tree_vdot

from fedjax_metric import optimizers
from fedjax_metric.models import split_variables

# The authors' code's constants (src/update.py).
GLOBAL_TERM_WEIGHT = 0.1
MAX_GROWTH = 1.1
BOUNDS = (0.1, 10.0)


class LocalRate(NamedTuple):
  multiplier: jax.Array  # beta: float32 scalar
  previous_step: Any  # g_prev: params-shaped
  params_before: Any  # the params before the step being taken


def next_multiplier(multiplier, step, previous_step, global_update, k):
  """One hypergradient update of beta after a step (the module's equation)."""
  gamma = jnp.minimum(
    MAX_GROWTH,
    1.0
    + GLOBAL_TERM_WEIGHT * tree_vdot(step, global_update) / k
    + tree_vdot(step, previous_step),
  )
  return jnp.clip(gamma * multiplier, *BOUNDS)


def previous_global_update(server_state):
  """Delta_{t-1}: the last non-empty round's averaged model update, as
  FedHyper-G's state holds it (the negated pseudo-gradient)."""
  opt_state = server_state.opt_state
  if not isinstance(opt_state, optimizers.FedHyperState):
    raise ValueError(
      "FedHyper's local scheduler reads the previous global update from "
      "FedHyper-G's server state: set --config.server.optimizer=fedhyper."
    )
  return jax.tree.map(jnp.negative, opt_state.previous)


def _inner(ctx):
  """The wrapped method's context: its own local state, without the rate."""
  return ctx._replace(local_state=ctx.local_state[0])


def client_begin(inner_begin, ctx):
  """The wrapped method's client_begin; the rate starts at beta = 1 with
  g_prev = Delta_{t-1}."""
  variables, local_state = inner_begin(ctx)
  params, _ = split_variables(variables)
  rate = LocalRate(
    jnp.ones((), jnp.float32),
    previous_global_update(ctx.server_state),
    params,
  )
  return variables, (local_state, rate)


def client_loss(inner_loss, params, model_state, batch, ctx):
  """The wrapped method's loss, its gradient scaled by beta."""
  loss, aux = inner_loss(params, model_state, batch, _inner(ctx))
  beta = ctx.local_state[1].multiplier
  # Value: the loss; gradient: beta times the loss's.
  scaled = loss + (beta - 1.0) * (loss - jax.lax.stop_gradient(loss))
  return scaled, aux


def client_step_end(expected_clients, inner_step_end, params, model_state, ctx):
  """The wrapped method's client_step_end, then beta's update from the
  step just taken (`next_multiplier`, K = ``expected_clients``)."""
  local_state = inner_step_end(params, model_state, _inner(ctx))
  rate = ctx.local_state[1]
  step = jax.tree.map(jnp.subtract, params, rate.params_before)
  # The code leaves the round's first step alone; padded steps come after
  # the real ones and are discarded, so ctx.step counts the real steps.
  adapt = ctx.step >= 1
  multiplier = jnp.where(
    adapt,
    next_multiplier(
      rate.multiplier,
      step,
      rate.previous_step,
      previous_global_update(ctx.server_state),
      expected_clients,
    ),
    rate.multiplier,
  )
  previous_step = jax.tree.map(
    lambda new, old: jnp.where(adapt, new, old), step, rate.previous_step
  )
  return local_state, LocalRate(multiplier, previous_step, params)


def client_final(inner_final, end_variables, ctx):
  """The wrapped method's client_final."""
  return inner_final(end_variables, _inner(ctx))


def schedule_local(algorithm, *, expected_clients):
  """``algorithm`` whose clients adapt their local rate (FedHyper-CL).

  Args:
    algorithm: any `engine.Algorithm` whose server optimizer is FedHyper-G.
    expected_clients: K, the expected number of clients a round (> 0).

  Raises:
    ValueError: expected_clients <= 0.
  """
  if not expected_clients > 0:
    raise ValueError(
      f'FedHyper-CL needs the expected clients per round > 0, got '
      f'{expected_clients}.'
    )
  return algorithm._replace(
    client_begin=functools.partial(client_begin, algorithm.client_begin),
    client_loss=functools.partial(client_loss, algorithm.client_loss),
    client_step_end=functools.partial(
      client_step_end, expected_clients, algorithm.client_step_end
    ),
    client_final=functools.partial(client_final, algorithm.client_final),
  )
