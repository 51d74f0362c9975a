"""FedAU's weight estimators: participation intervals and known p_n.

Wang & Ji, 'A Lightweight Method for Tackling Unknown Participation Statistics
in Federated Averaging', ICLR 2024; the authors' released code
(github.com/IBM/fedau, main.py). FedAU (algorithms/fedau.py) scales a
participating client's update by omega_n, the average length of its
completed participation intervals, an online estimate of 1 / p_n.

This module holds that bookkeeping as pure JAX (`interval_step`, usable
inside a jitted round), a host helper (`interval_weights`) that runs it over
a whole participation mask, the server-extra form of the state FedAU's
hooks read (`current_omega`), and the checked 1 / p_n of the
'known_prob' aggregation (`inverse_probabilities`).
"""

import functools
from typing import NamedTuple, Optional

import jax
import jax.numpy as jnp
import numpy as np


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


def check_cutoff(cutoff):
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
  _, omegas = jax.lax.scan(
    functools.partial(interval_step, cutoff=cutoff),
    init_interval_state(participation.shape[1]),
    participation,
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
  cutoff = check_cutoff(cutoff)
  return np.asarray(_scan_intervals(jnp.asarray(participation), cutoff=cutoff))


# ---------------------------------------------------------------------------
# The state as FedAU's server extra holds it.
# ---------------------------------------------------------------------------


def state_from_extra(extra) -> IntervalState:
  """The `IntervalState` in FedAU's server extra."""
  # The server extra holds plain dicts: they survive a checkpoint round trip
  # unchanged, which a NamedTuple nested in the extra need not.
  return IntervalState(
    extra['counter'], extra['interval_sum'], extra['interval_count']
  )


def extra_from_state(state: IntervalState):
  """The server extra's dict of the three int32 [N] counters."""
  return {
    'counter': state.counter,
    'interval_sum': state.interval_sum,
    'interval_count': state.interval_count,
  }


def client_value(values, client_id):
  """values[client_id]; a padding slot's out-of-range id reads the last row."""
  return values.at[client_id].get(mode='clip')


def current_omega(extra, client_id):
  """FedAU's weight of a participant, from the counters before the round.

  mean(T_n) if client n has a completed interval, else 1 (the released code,
  github.com/IBM/fedau, main.py: no scaling on a first participation); equals
  `interval_step`'s omega for a participant.
  """
  count = client_value(extra['interval_count'], client_id)
  total = client_value(extra['interval_sum'], client_id)
  return jnp.where(count > 0, total / jnp.maximum(count, 1), 1.0).astype(
    jnp.float32
  )


def inverse_probabilities(probabilities):
  """1 / p_n, float32 [N], of the run's true participation probabilities
  ('known_prob'); refuses anything but a non-empty [N] array in (0, 1]."""
  p = np.asarray(probabilities, np.float64)
  if p.ndim != 1 or p.size == 0 or not np.all((p > 0) & (p <= 1)):
    raise ValueError(
      'participation_probabilities must be a non-empty [N] '
      "array in (0, 1]; experiment.run passes the run's true p_n "
      "to aggregation='known_prob'."
    )
  return 1.0 / jnp.asarray(p, jnp.float32)
