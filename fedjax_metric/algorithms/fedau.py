"""FedAU: aggregation weights from online estimates of participation intervals.

Wang & Ji, 'A Lightweight Method for Tackling Unknown Participation Statistics
in Federated Averaging', ICLR 2024. A participating client's update is scaled
by omega_n, the average length of its completed participation intervals, an
online estimate of 1 / p_n; the server adds (eta_g / N) sum_n omega_n Delta_n
(N = all clients; the weights are not renormalised).

This module holds the weight bookkeeping as pure JAX (`interval_step`, usable
inside a jitted round), a host helper (`interval_weights`) that runs it over a
whole participation mask, and the algorithm (`make`) with the four
aggregations of the released code (github.com/IBM/fedau, main.py,
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

import functools
from typing import NamedTuple, Optional

import jax
import jax.numpy as jnp
import numpy as np

from fedjax_metric.algorithms import fedavg
from fedjax_metric.contract import NO_RUN_FACTS, RunFacts


class IntervalState(NamedTuple):
  """Per-client interval bookkeeping, all int32 [N].

  Attributes:
    counter: consecutive rounds without participation since the last recorded
      interval (c_n).
    interval_sum: sum of the completed interval lengths (sum of T_n).
    interval_count: number of completed intervals (|T_n|).
  """

  counter: jax.Array
  interval_sum: jax.Array
  interval_count: jax.Array


def init_interval_state(num_clients: int) -> IntervalState:
  """All-zero state (no interval recorded yet) for `num_clients` clients."""
  zeros = jnp.zeros((num_clients,), jnp.int32)
  return IntervalState(counter=zeros, interval_sum=zeros, interval_count=zeros)


def interval_step(state: IntervalState, participated, *, cutoff: Optional[int]):
  """One round of FedAU's online interval estimate; pure and jittable.

  Follows the authors' released code (github.com/IBM/fedau, main.py, weighting
  method 'adaptive'), with T_n the list of completed intervals of client n:

    participant:     omega_n = mean(T_n), or 1 if T_n is empty (no scaling
                     on a first participation with nothing recorded);
                     then append c_n + 1 to T_n and set c_n = 0.
    non-participant: omega_n = 0; c_n += 1; if c_n >= K append K and set
                     c_n = 0 (the cutoff).

  The weight used in a round therefore never includes the interval that ends
  in that round. A client whose first interval was closed by the cutoff gets
  mean(T_n) = K, not 1, on its first participation (as in the code).

  Args:
    state: `IntervalState` before this round.
    participated: bool [N], True for this round's participants.
    cutoff: K, a positive int; None disables the cutoff (the code's default
      K = 100000 has the same effect in runs shorter than K rounds).

  Returns:
    (new_state, omega): omega float32 [N], 0 for non-participants.
  """
  participated = jnp.asarray(participated, bool)
  has_history = state.interval_count > 0
  mean_interval = state.interval_sum / jnp.maximum(state.interval_count, 1)
  omega = jnp.where(
    participated, jnp.where(has_history, mean_interval, 1.0), 0.0
  ).astype(jnp.float32)
  # After the increment the counter is the length of the interval that would
  # end now; it never exceeds K because the cutoff resets it at K.
  elapsed = state.counter + 1
  record = participated
  if cutoff is not None:
    record = record | (elapsed >= cutoff)
  new_state = IntervalState(
    counter=jnp.where(record, 0, elapsed),
    interval_sum=state.interval_sum + jnp.where(record, elapsed, 0),
    interval_count=state.interval_count + record.astype(jnp.int32),
  )
  return new_state, omega


def _check_cutoff(cutoff):
  if cutoff is not None and (int(cutoff) != cutoff or cutoff < 1):
    raise ValueError(
      f'cutoff must be a positive integer or None, got {cutoff}.'
    )
  return None if cutoff is None else int(cutoff)


def _check_participation(participation):
  participation = np.asarray(participation)
  if participation.ndim != 2 or participation.size == 0:
    raise ValueError(
      'participation must be a non-empty [T, N] array, got '
      f'shape {participation.shape}.'
    )
  return participation.astype(bool)


@functools.partial(jax.jit, static_argnames=('cutoff',))
def _scan_intervals(participation, *, cutoff):
  def step(state, participated):
    return interval_step(state, participated, cutoff=cutoff)

  _, omegas = jax.lax.scan(
    step, init_interval_state(participation.shape[1]), participation
  )
  return omegas


def interval_weights(participation, *, cutoff: Optional[int]) -> np.ndarray:
  """FedAU weights omega[t, n] for a whole participation mask.

  Runs `interval_step` over the rounds from the all-zero state (Wang & Ji,
  ICLR 2024; the authors' released code, github.com/IBM/fedau, main.py).

  Args:
    participation: bool [T, N] mask, True where client n participates in
      round t.
    cutoff: K (a positive int; 50 in the released README's runs) or None for
      no cutoff.

  Returns:
    float32 [T, N] NumPy array: the weight multiplying client n's update in
    round t (0 where it does not participate).
  """
  participation = _check_participation(participation)
  cutoff = _check_cutoff(cutoff)
  return np.asarray(_scan_intervals(jnp.asarray(participation), cutoff=cutoff))


# ---------------------------------------------------------------------------
# The algorithm.
# ---------------------------------------------------------------------------

AGGREGATIONS = (
  'adaptive',
  'known_prob',
  'average_all',
  'average_participating',
)


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


def _state_from_extra(extra) -> IntervalState:
  # The server extra holds plain dicts: they survive a checkpoint round trip
  # unchanged, which a NamedTuple nested in the extra need not.
  return IntervalState(
    extra['counter'], extra['interval_sum'], extra['interval_count']
  )


def _extra_from_state(state: IntervalState):
  return {
    'counter': state.counter,
    'interval_sum': state.interval_sum,
    'interval_count': state.interval_count,
  }


def _client_value(values, client_id):
  """values[client_id]; a padding slot's out-of-range id reads the last row."""
  return values.at[client_id].get(mode='clip')


def current_omega(extra, client_id):
  """FedAU's weight of a participant, from the counters before the round.

  mean(T_n) if client n has a completed interval, else 1 (the released code,
  github.com/IBM/fedau, main.py: no scaling on a first participation); equals
  `interval_step`'s omega for a participant.
  """
  count = _client_value(extra['interval_count'], client_id)
  total = _client_value(extra['interval_sum'], client_id)
  return jnp.where(count > 0, total / jnp.maximum(count, 1), 1.0).astype(
    jnp.float32
  )


def _check_probabilities(probabilities):
  p = np.asarray(probabilities, np.float64)
  if p.ndim != 1 or p.size == 0 or not np.all((p > 0) & (p <= 1)):
    raise ValueError(
      'participation_probabilities must be a non-empty [N] '
      "array in (0, 1]; train.run passes the run's true p_n "
      "to aggregation='known_prob'."
    )
  return jnp.asarray(p, jnp.float32)


def make(
  model,
  *,
  server_optimizer,
  run: RunFacts = NO_RUN_FACTS,
  weighting='uniform',
  aggregation='adaptive',
  cutoff: Optional[int] = None,
):
  """FedAU and the other aggregations of its released code.

  Wang & Ji, 'A Lightweight Method for Tackling Unknown Participation
  Statistics in Federated Averaging', ICLR 2024, Algorithm 1; the authors'
  released code (github.com/IBM/fedau, main.py). Clients run local SGD from
  the global model w and send Delta_n = w_n - w; the server moves

    w <- w + eta_g (1 / D) sum_{n in S_t} omega_n Delta_n,

  with eta_g the server optimizer's learning rate (sgd(eta_g); the released
  README uses eta_g = 1 for FedAU) and, per ``aggregation``:

    'adaptive' (FedAU):  omega_n = mean of client n's completed participation
                         intervals (`interval_step`; 1 on a first
                         participation; the interval that ends this round
                         counts from the next participation on), D = N.
    'known_prob':        omega_n = 1 / p_n with the true probability, D = N.
    'average_all':       omega_n = 1, D = N.
    'average_participating': omega_n = 1, D = |S_t| (FedAvg with uniform
                         weights over the participants).

  D = N for the first three: the weights are not renormalised to sum to 1.
  A round nobody joins leaves the model unchanged (the counters still
  advance).

  Args:
    model: `ModelFns`.
    server_optimizer: optax transformation of the pseudo-gradient; sgd(eta_g).
    weighting: 'uniform' only (anything else is refused): every client
      counts by its omega_n alone, as in the released code.
    aggregation: one of AGGREGATIONS.
    cutoff: FedAU's K, a positive int, or None for none (the released
      default K = 100000 has that effect; its README also runs K = 50).
    run: the run's facts; 'known_prob' reads the [N] true p_n from
      ``run.participation_probabilities`` (assemble.build_algorithm fills
      it).
  """
  fedavg.refuse_weighting(
    'fedau', weighting, 'every client counts by its omega_n alone'
  )
  if aggregation not in AGGREGATIONS:
    raise ValueError(
      f'Unknown aggregation {aggregation!r}; use one of '
      f'{AGGREGATIONS} (algorithm_kwargs.aggregation).'
    )
  cutoff = _check_cutoff(cutoff)
  inverse_p = None
  if aggregation == 'known_prob':
    if run.participation_probabilities is None:
      raise ValueError(
        "aggregation='known_prob' needs the run's participation "
        'probabilities (train.run passes them; when calling fedau.make '
        'directly, pass run=RunFacts(participation_probabilities=p)).'
      )
    inverse_p = 1.0 / _check_probabilities(run.participation_probabilities)
  base = fedavg.build(
    model, server_optimizer=server_optimizer, weighting='uniform'
  )

  def init_extra(variables, num_clients, key):
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

  def client_final(end_variables, ctx):
    delta, _, row = base.client_final(end_variables, ctx)
    if aggregation == 'adaptive':
      omega = current_omega(ctx.server_state.extra, ctx.client_id)
    elif aggregation == 'known_prob':
      omega = _client_value(inverse_p, ctx.client_id)
    else:
      omega = jnp.ones((), jnp.float32)
    return delta, omega, row

  def server_update(server_state, aggregate, cohort_rows):
    del cohort_rows
    state = _state_from_extra(server_state.extra)
    num_clients = state.counter.shape[0]
    participated = participation_vector(aggregate, num_clients)
    state, _ = interval_step(state, participated, cutoff=cutoff)
    if aggregation == 'average_participating':
      divisor = jnp.maximum(aggregate.num_participants, 1.0)
    else:
      divisor = jnp.asarray(num_clients, jnp.float32)
    direction = jax.tree.map(lambda u: u / divisor, aggregate.update_sum)
    new_state = fedavg.apply_server_optimizer(
      server_optimizer, server_state, direction
    )
    new_state = fedavg.skip_if_nobody(aggregate, server_state, new_state)
    return new_state._replace(extra=_extra_from_state(state))

  return base._replace(
    init_server=fedavg.make_init_server(server_optimizer, init_extra),
    client_final=client_final,
    server_update=server_update,
  )
