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

Slots replaced relative to FedAvg:
  * ``init_client``: y_n = 0, shaped like the model variables (the client
    table costs N x model size; train.run checks it against the memory
    budget before allocating it);
  * ``client_final``: writes Delta_n into the client's row;
  * ``server_update``: the mean of the whole table (read after this round's
    rows were written), times eta_g through the server optimizer.
"""

import jax
import jax.numpy as jnp

from fedjax_metric.algorithms import fedavg
from fedjax_metric.contract import NO_RUN_FACTS, RunFacts


def zeros_like_variables(variables, key):
  """init_client of MIFA and FedVarp: a stored update of zeros."""
  del key
  return jax.tree.map(jnp.zeros_like, variables)


def table_mean(client_table):
  """(1 / N) sum_n y_n over the table's N rows, for every leaf.

  A product with a vector of 1 / N: XLA's CPU reduction over the leading
  axis is about 100x slower (0.5 s vs 3 ms for 250 rows of 10^5 floats).
  """

  def mean(t):
    weights = jnp.full((t.shape[0],), 1.0 / t.shape[0], t.dtype)
    return jnp.tensordot(
      weights, t, axes=1, precision=jax.lax.Precision.HIGHEST
    )

  return jax.tree.map(mean, client_table)


def make(
  model, *, server_optimizer, run: RunFacts = NO_RUN_FACTS, weighting='uniform'
):
  """MIFA (Gu et al., NeurIPS 2021) as in FedAU's released code.

  Args:
    model: `ModelFns`.
    server_optimizer: optax transformation of the pseudo-gradient; sgd(eta_g)
      (the released README runs MIFA with eta_g = 1).
    weighting: 'uniform' only (anything else is refused): the stored updates
      are averaged uniformly over all N clients, as in the released code.
  """
  fedavg.refuse_weighting(
    'mifa',
    weighting,
    'the stored updates are averaged uniformly over all clients',
  )
  base = fedavg.make(
    model, server_optimizer=server_optimizer, weighting='uniform'
  )

  def client_final(end_variables, ctx):
    delta, weight, _ = base.client_final(end_variables, ctx)
    return delta, weight, delta

  def server_update(server_state, aggregate, client_table):
    del aggregate  # The table already holds this round's updates.
    return fedavg.apply_server_optimizer(
      server_optimizer, server_state, table_mean(client_table)
    )

  return base._replace(
    init_client=zeros_like_variables,
    client_final=client_final,
    server_update=server_update,
  )
