"""FedAU: aggregation weights from online estimates of participation intervals.

Wang & Ji, 'A Lightweight Method for Tackling Unknown Participation Statistics
in Federated Averaging', ICLR 2024. A participating client's update is scaled
by omega_n, the average length of its completed participation intervals, an
online estimate of 1 / p_n; the server adds (eta_g / N) sum_n omega_n Delta_n
(N = all clients; the weights are not renormalised).

This module holds the weight bookkeeping as pure JAX (`interval_step`, usable
inside a jitted round) and a host helper (`interval_weights`) that runs it
over a whole participation mask.
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


def interval_step(state: IntervalState, participated, *,
                  cutoff: Optional[int]):
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
  omega = jnp.where(participated, jnp.where(has_history, mean_interval, 1.0),
                    0.0).astype(jnp.float32)
  # After the increment the counter is the length of the interval that would
  # end now; it never exceeds K because the cutoff resets it at K.
  elapsed = state.counter + 1
  record = participated
  if cutoff is not None:
    record = record | (elapsed >= cutoff)
  new_state = IntervalState(
      counter=jnp.where(record, 0, elapsed),
      interval_sum=state.interval_sum + jnp.where(record, elapsed, 0),
      interval_count=state.interval_count + record.astype(jnp.int32))
  return new_state, omega


def _check_cutoff(cutoff):
  if cutoff is not None and (int(cutoff) != cutoff or cutoff < 1):
    raise ValueError('cutoff must be a positive integer or None, got '
                     f'{cutoff}.')
  return None if cutoff is None else int(cutoff)


def _check_participation(participation):
  participation = np.asarray(participation)
  if participation.ndim != 2 or participation.size == 0:
    raise ValueError('participation must be a non-empty [T, N] array, got '
                     f'shape {participation.shape}.')
  return participation.astype(bool)


@functools.partial(jax.jit, static_argnames=('cutoff',))
def _scan_intervals(participation, *, cutoff):
  def step(state, participated):
    return interval_step(state, participated, cutoff=cutoff)

  _, omegas = jax.lax.scan(step, init_interval_state(participation.shape[1]),
                           participation)
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
