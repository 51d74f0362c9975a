"""MIFA: averaging the latest update of every client, participating or not.

Gu, Huang, Zhang and Huang, 'Fast Federated Learning in the Presence of
Arbitrary Device Unavailability', NeurIPS 2021, Algorithm 1; as implemented
in the released code of Wang & Ji (ICLR 2024), github.com/IBM/fedau, main.py
(``-weighting mifa``). Every client n keeps y_n, its most recent update
(0 before its first participation). In round t each participant sets
y_n <- Delta_n = w_n - w, and the server moves

  w <- w + eta_g (1 / N) sum_{n = 1}^{N} y_n

over ALL N clients (not only those seen so far), in every round: also in a
round nobody joins, where the stored updates move the model again (as in the
released code and Algorithm 1 of the paper).

The mean ybar = (1 / N) sum_n y_n is kept in the server extra and moved
by the cohort's change, ybar <- ybar + (1 / N) sum_{n in S_t} (Delta_n -
y_n^old): equal to the mean of the table (up to float rounding, which the
released code's np.mean has too), without reading the N - |S_t| rows that
did not change. That is what lets the table live in host memory or on disk
(client_table.py), where only the cohort's rows reach the device.

Slots replaced relative to FedAvg:
  * ``init_client``: y_n = 0, shaped like the model variables (the client
    table costs N x model size: see docs/scale.md for where it can live);
    ``init_server``: ybar = 0 in the server extra;
  * ``client_final``: writes Delta_n into the client's row and sends
    Delta_n - y_n^old;
  * ``server_update``: ybar moved by the sum of those, then ybar times eta_g
    through the server optimizer.
"""

import functools

import jax
import jax.numpy as jnp

from fedjax_metric.algorithms import fedavg
from fedjax_metric.algorithms.spec import NO_OPTIONS, AlgorithmSpec


def zeros_like_variables(variables, key):
  """init_client of MIFA and FedVarp: a stored update of zeros."""
  del key
  return jax.tree.map(jnp.zeros_like, variables)


def init_mean(variables, num_clients, key):
  """init_extra of MIFA and FedVarp: ybar = 0, the mean of N zero rows."""
  del num_clients
  return {'ybar': zeros_like_variables(variables, key)}


def client_final(end_variables, ctx):
  """MIFA's and FedVarp's client_final: the row becomes Delta_n; the update
  sent is Delta_n - y_n^old, scaled so that the engine's weighted sum is
  the plain sum over the cohort (`fedavg.plain_sum_share`)."""
  delta, weight, _ = fedavg.delta_final('uniform', end_variables, ctx)
  change = jax.tree.map(jnp.subtract, delta, ctx.client_row)
  return fedavg.plain_sum_share(change, weight), weight, delta


def moved_mean(ybar, change_sum, num_clients):
  """ybar + (1 / N) sum_{S_t} (Delta_n - y_n^old): the table's new mean."""
  return jax.tree.map(lambda m, d: m + d / num_clients, ybar, change_sum)


def server_update(server_optimizer, server_state, aggregate, cohort_rows):
  """ybar moved by the cohort's change, then w <- w + eta_g ybar through
  the server optimizer (in every round, also one nobody joins)."""
  del cohort_rows  # Their change arrived in the aggregate.
  ybar = moved_mean(
    server_state.extra['ybar'], aggregate.update_sum, aggregate.num_clients
  )
  new_state = fedavg.apply_server_optimizer(
    server_optimizer, server_state, ybar
  )
  return new_state._replace(extra={'ybar': ybar})


def build(model, options=NO_OPTIONS, *, server_optimizer, weighting='uniform'):
  """MIFA (Gu et al., NeurIPS 2021) as in FedAU's released code.

  Args:
    model: `ModelFns`.
    options: none of its own (`spec.NO_OPTIONS`).
    server_optimizer: optax transformation of the pseudo-gradient; sgd(eta_g)
      (the released README runs MIFA with eta_g = 1).
    weighting: 'uniform' only (anything else is refused): the stored updates
      are averaged uniformly over all N clients, as in the released code.
  """
  del options
  fedavg.refuse_weighting(
    'mifa',
    weighting,
    'the stored updates are averaged uniformly over all clients',
  )
  return stored_updates(model, server_optimizer)._replace(
    server_update=functools.partial(server_update, server_optimizer)
  )


def stored_updates(model, server_optimizer):
  """FedAvg with MIFA's and FedVarp's client table of stored updates
  (init_client, ybar in the server extra, client_final); the server update
  is the caller's."""
  base = fedavg.build(
    model, server_optimizer=server_optimizer, weighting='uniform'
  )
  return base._replace(
    init_server=fedavg.make_init_server(server_optimizer, init_mean),
    init_client=zeros_like_variables,
    client_final=client_final,
  )


SPEC = AlgorithmSpec(
  'mifa',
  build,
  description="MIFA (Gu et al., 2021): every client's latest update, each "
  'round.',
)
SPECS = (SPEC,)
