"""FedVarp: variance reduction for partial participation with stored updates.

Jhunjhunwala, Sharma, Nagarkatti and Joshi, 'FedVARP: Tackling the Variance
Due to Partial Client Participation in Federated Learning', UAI 2022,
Algorithm 1; as implemented in the released code of Wang & Ji (ICLR 2024),
github.com/IBM/fedau, main.py (``-weighting fedvarp``). Every client n keeps
y_n, its most recent update (0 before its first participation), and the
server keeps ybar = (1 / N) sum_n y_n as it was at the end of the previous
round (0 at first). In round t, with S_t the participants,

  v = (1 / |S_t|) sum_{n in S_t} (Delta_n - y_n^old) + ybar^old
  w <- w + eta_g v;     y_n <- Delta_n for n in S_t;
  ybar <- (1 / N) sum_n y_n   (used in round t + 1).

A round nobody joins changes nothing (the released code applies a zero
update then and leaves ybar as it was).

Each participant sends Delta_n - y_n^old (MIFA's client_final), so the
server has sum_{S_t} (Delta_n - y_n^old) as its aggregate and moves ybar by
it over N, as MIFA does: no row outside the cohort is read, so the table may
live in host memory or on disk (client_table.py).

Slots replaced relative to FedAvg:
  * ``init_client``: y_n = 0 shaped like the model variables (the client
    table costs N x model size);
    ``init_server``: ybar = 0 in the server extra;
  * ``client_final``: writes Delta_n into its row, sends Delta_n - y_n^old;
  * ``server_update``: the move above, then ybar moved by the same sum / N.
"""

import functools

import jax
import jax.numpy as jnp

from fedjax_metric.algorithms import fedavg, mifa
from fedjax_metric.algorithms.spec import NO_OPTIONS, AlgorithmSpec


def server_update(server_optimizer, server_state, aggregate, cohort_rows):
  """w <- w + eta_g (mean_{S_t} (Delta_n - y_n^old) + ybar^old), then ybar
  moved by the same sum / N; a round nobody joins changes nothing."""
  del cohort_rows  # Their change arrived in the aggregate.
  change_sum = aggregate.update_sum
  ybar_old = server_state.extra['ybar']
  participants = jnp.maximum(aggregate.num_participants, 1.0)
  direction = jax.tree.map(
    lambda old, d: old + d / participants, ybar_old, change_sum
  )
  new_state = fedavg.apply_server_optimizer(
    server_optimizer, server_state, direction
  )
  ybar = mifa.moved_mean(ybar_old, change_sum, aggregate.num_clients)
  new_state = new_state._replace(extra={'ybar': ybar})
  return fedavg.skip_if_nobody(aggregate, server_state, new_state)


def build(model, options=NO_OPTIONS, *, server_optimizer, weighting='uniform'):
  """FedVarp (Jhunjhunwala et al., UAI 2022) as in FedAU's released code.

  Args:
    model: `ModelFns`.
    options: none of its own (`spec.NO_OPTIONS`).
    server_optimizer: optax transformation of the pseudo-gradient; sgd(eta_g)
      (the released README runs FedVarp with eta_g = 1).
    weighting: 'uniform' only (anything else is refused): participants count
      equally (1 / |S_t|), as in the released code.
  """
  del options
  fedavg.refuse_weighting(
    'fedvarp', weighting, 'participants count equally, as in the paper'
  )
  return mifa.stored_updates(model, server_optimizer)._replace(
    server_update=functools.partial(server_update, server_optimizer)
  )


SPEC = AlgorithmSpec(
  'fedvarp',
  build,
  description='FedVarp (Jhunjhunwala et al., 2022): stored updates as '
  'control variates.',
)
SPECS = (SPEC,)
