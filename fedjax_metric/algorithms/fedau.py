"""FedAU: aggregation weights from online estimates of participation intervals.

Wang & Ji, 'A Lightweight Method for Tackling Unknown Participation Statistics
in Federated Averaging', ICLR 2024. A participating client's update is scaled
by omega_n, the average length of its completed participation intervals, an
online estimate of 1 / p_n; the server adds (eta_g / N) sum_n omega_n Delta_n
(N = all clients; the weights are not renormalised).

The weight bookkeeping (`fedau_intervals.interval_step`, pure JAX, and
`fedau_intervals.interval_weights` over a whole participation mask) has a
module of its own, fedau_intervals.py; this one is the algorithm, with the
four aggregations of the released code (github.com/IBM/fedau, main.py,
``-weighting``): 'adaptive' (FedAU), 'known_prob', 'average_all' and
'average_participating' (FedAvg over the round's participants). MIFA and
FedVarp, the two other aggregations of that code, keep a stored update per
client: algorithms/mifa.py and algorithms/fedvarp.py.

Slots replaced relative to FedAvg (docs/methods.md, Heterogeneous
participation):
  * ``init_server``: the interval counters of all N clients in the server
    extra (plain int32 [N] arrays, kept for every aggregation);
  * ``client_final``: the update Delta_n = w_end - w_global with the weight
    omega_n (1 / p_n, or 1), read from the counters as they were before the
    round;
  * ``server_update``: the weighted sum divided by N (or by |S_t|), times
    eta_g through the server optimizer, then every client's counters
    advance (participants and the cutoff alike, also in a round nobody
    joins).
"""

import dataclasses
import functools
import typing
from typing import Literal, Optional

import jax
import jax.numpy as jnp

from fedjax_metric.algorithms import fedau_intervals as intervals
from fedjax_metric.algorithms import fedavg
from fedjax_metric.algorithms.spec import AlgorithmSpec
from fedjax_metric.contract import NO_RUN_FACTS, RunFacts

Aggregation = Literal[
  'adaptive', 'known_prob', 'average_all', 'average_participating'
]
AGGREGATIONS = typing.get_args(Aggregation)


def participation_vector(aggregate, num_clients: int):
  """bool [N]: True for the round's participants (padding slots dropped).

  Args:
    aggregate: the round's `engine.Aggregate` (client_ids [C], slot_mask
      [C]; padding slots hold an id >= N).
    num_clients: N.
  """
  return (
    jnp.zeros((num_clients,), bool)
    .at[aggregate.client_ids]
    .set(aggregate.slot_mask, mode='drop')
  )


@dataclasses.dataclass(frozen=True)
class Options:
  """FedAU's options (the released code's ``-weighting`` and ``-K``).

  Attributes:
    aggregation: the weights omega_n and divisor D of `build`'s equation:
      'adaptive' (FedAU), 'known_prob', 'average_all' or
      'average_participating' (AGGREGATIONS).
    cutoff: K, the longest interval recorded (a positive int), or None for
      none (the released default K = 100000 has that effect; its README
      also runs K = 50).
  """

  aggregation: Aggregation = 'adaptive'
  cutoff: Optional[int] = None

  def __post_init__(self):
    if self.aggregation not in AGGREGATIONS:
      raise ValueError(
        f'Unknown aggregation {self.aggregation!r}; use one of '
        f'{AGGREGATIONS} (algorithm_kwargs.aggregation).'
      )
    object.__setattr__(self, 'cutoff', intervals.check_cutoff(self.cutoff))


def init_extra(inverse_p, variables, num_clients, key):
  """The server extra: the interval counters of all N clients, at zero."""
  del variables, key
  if inverse_p is not None and inverse_p.shape[0] != num_clients:
    raise ValueError(
      f'participation_probabilities has '
      f'{inverse_p.shape[0]} entries for {num_clients} '
      'clients.'
    )
  # Three distinct buffers: the round donates the state, and one array
  # donated twice is an error.
  return {
    name: jnp.zeros((num_clients,), jnp.int32)
    for name in ('counter', 'interval_sum', 'interval_count')
  }


def client_final(options, inverse_p, end_variables, ctx):
  """Delta_n = w_end - w_global with the weight omega_n (from the counters
  before the round, 1 / p_n, or 1)."""
  delta, _, row = fedavg.delta_final('uniform', end_variables, ctx)
  if options.aggregation == 'adaptive':
    omega = intervals.current_omega(ctx.server_state.extra, ctx.client_id)
  elif options.aggregation == 'known_prob':
    omega = intervals.client_value(inverse_p, ctx.client_id)
  else:
    omega = jnp.ones((), jnp.float32)
  return delta, omega, row


def server_update(
  options, server_optimizer, server_state, aggregate, cohort_rows
):
  """w <- w + eta_g (1 / D) sum_S omega_n Delta_n (no move in a round
  nobody joins); then every client's counters advance."""
  del cohort_rows
  state = intervals.state_from_extra(server_state.extra)
  num_clients = state.counter.shape[0]
  participated = participation_vector(aggregate, num_clients)
  state, _ = intervals.interval_step(state, participated, cutoff=options.cutoff)
  if options.aggregation == 'average_participating':
    divisor = jnp.maximum(aggregate.num_participants, 1.0)
  else:
    divisor = jnp.asarray(num_clients, jnp.float32)
  direction = jax.tree.map(lambda u: u / divisor, aggregate.update_sum)
  new_state = fedavg.apply_server_optimizer(
    server_optimizer, server_state, direction
  )
  new_state = fedavg.skip_if_nobody(aggregate, server_state, new_state)
  return new_state._replace(extra=intervals.extra_from_state(state))


def build(
  model,
  options,
  *,
  server_optimizer,
  weighting='uniform',
  run: RunFacts = NO_RUN_FACTS,
):
  """FedAU and the other aggregations of its released code.

  Wang & Ji, 'A Lightweight Method for Tackling Unknown Participation
  Statistics in Federated Averaging', ICLR 2024, Algorithm 1; the authors'
  released code (github.com/IBM/fedau, main.py). Clients run local SGD from
  the global model w and send Delta_n = w_n - w; the server moves

    w <- w + eta_g (1 / D) sum_{n in S_t} omega_n Delta_n,

  with eta_g the server optimizer's learning rate (sgd(eta_g); the released
  README uses eta_g = 1 for FedAU) and, per ``options.aggregation``:

    'adaptive' (FedAU):  omega_n = mean of client n's completed participation
                         intervals (`fedau_intervals.interval_step`; 1 on a
                         first participation; the interval that ends this
                         round counts from the next participation on), D = N.
    'known_prob':        omega_n = 1 / p_n with the true probability, D = N.
    'average_all':       omega_n = 1, D = N.
    'average_participating': omega_n = 1, D = |S_t| (FedAvg with uniform
                         weights over the participants).

  D = N for the first three: the weights are not renormalised to sum to 1.
  A round nobody joins leaves the model unchanged (the counters still
  advance).

  Args:
    model: `ModelFns`.
    options: `Options` (aggregation, cutoff).
    server_optimizer: optax transformation of the pseudo-gradient; sgd(eta_g).
    weighting: 'uniform' only (anything else is refused): every client
      counts by its omega_n alone, as in the released code.
    run: the run's facts; 'known_prob' reads the [N] true p_n from
      ``run.participation_probabilities`` (assemble.build_algorithm fills
      it).
  """
  fedavg.refuse_weighting(
    'fedau', weighting, 'every client counts by its omega_n alone'
  )
  inverse_p = None
  if options.aggregation == 'known_prob':
    if run.participation_probabilities is None:
      raise ValueError(
        "aggregation='known_prob' needs the run's participation "
        'probabilities (experiment.run passes them; when calling fedau.SPEC '
        'directly, pass run=RunFacts(participation_probabilities=p)).'
      )
    inverse_p = intervals.inverse_probabilities(run.participation_probabilities)
  base = fedavg.build(
    model, server_optimizer=server_optimizer, weighting='uniform'
  )
  return base._replace(
    init_server=fedavg.make_init_server(
      server_optimizer, functools.partial(init_extra, inverse_p)
    ),
    client_final=functools.partial(client_final, options, inverse_p),
    server_update=functools.partial(server_update, options, server_optimizer),
  )


SPEC = AlgorithmSpec(
  'fedau',
  build,
  Options,
  reads=frozenset({'server_optimizer', 'weighting', 'run'}),
  description='FedAU (Wang & Ji, 2024): weights from online participation '
  'intervals.',
)
SPECS = (SPEC,)
