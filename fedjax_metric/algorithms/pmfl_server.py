"""PMFL's server arithmetic: adaptive aggregation weights and history mixing.

Zhang et al., 'Towards Performance-Enhanced Model-Contrastive Federated
Learning using Historical Information in Heterogeneous Scenarios',
preprint, 2025, Algorithm 2 and Eqs. 9-11. x_k^t, the weight of node k's
update, is the mean length of its participation intervals (FedAU's
estimator, counted so that the interval ending in round t already counts,
cutoff C = 50); psi (Eq. 11) mixes the new global model with the H - 1
previous ones. pmfl_history.py and pmfl.py use them.
"""

import functools
from typing import NamedTuple, Optional

import jax
import jax.numpy as jnp
import numpy as np


class AdaptiveState(NamedTuple):
  """Per-node state of Algorithm 2, all int32 [N].

  Attributes:
    interval: Q_k, rounds since the node's last recorded interval.
    count: R_k, number of recorded intervals (participations and cutoffs).
    interval_sum: sum of the recorded intervals Q*_k, so that x_k =
      interval_sum / count (0 while count == 0).
  """

  interval: jax.Array
  count: jax.Array
  interval_sum: jax.Array


def init_adaptive_state(num_clients: int) -> AdaptiveState:
  """Q_k = R_k = 0 and x_k = 0 for `num_clients` nodes (Section IV-D1)."""
  zeros = jnp.zeros((num_clients,), jnp.int32)
  return AdaptiveState(interval=zeros, count=zeros, interval_sum=zeros)


def adaptive_weight(state: AdaptiveState) -> jax.Array:
  """x_k of a state: the mean recorded interval, 0 before any record. [N]."""
  return (state.interval_sum / jnp.maximum(state.count, 1)).astype(jnp.float32)


def adaptive_step(
  state: AdaptiveState, participated, *, cutoff: Optional[int] = 50
):
  """Algorithm 2, lines 2-14 (adaptive aggregation weight), for one round.

  Zhang et al., 'Towards Performance-Enhanced Model-Contrastive Federated
  Learning using Historical Information in Heterogeneous Scenarios',
  preprint, 2025, Algorithm 2 and Eq. 8, for every node k:

    line 3:      Q_k <- Q_k + 1
    line 4:      if A_k^t = 1 or Q_k = C:
    lines 5-9:     Q* <- Q_k; x_k^t <- Q* if R_k = 0,
                   else (R_k x_k^{t-1} + Q*) / (R_k + 1)          (Eq. 8)
    line 11:       R_k <- R_k + 1; Q_k <- 0
    line 14:     else x_k^t <- x_k^{t-1}

  Eq. 8 is the running mean of the recorded Q* values; it is kept here as an
  exact integer sum / count (same value, no float drift over 10^4 rounds).
  Unlike FedAU (`fedjax_metric.algorithms.fedau_intervals.interval_step`), the
  interval that ends in round t is already part of the weight x_k^t used in
  round t's aggregation (line 17), and a first participation gets x = Q*
  (its elapsed rounds), not 1.

  Args:
    state: `AdaptiveState` before this round.
    participated: bool [N], A_k^t.
    cutoff: C, a positive int (50, Section V-C); None disables the cutoff.

  Returns:
    (new_state, x): x float32 [N] = x_k^t after this round's update, for every
    node (participating or not).
  """
  participated = jnp.asarray(participated, bool)
  interval = state.interval + 1
  record = participated
  if cutoff is not None:
    record = record | (interval == cutoff)
  new_state = AdaptiveState(
    interval=jnp.where(record, 0, interval),
    count=state.count + record.astype(jnp.int32),
    interval_sum=state.interval_sum + jnp.where(record, interval, 0),
  )
  return new_state, adaptive_weight(new_state)


def participant_weight(extra, client_id):
  """x_k^t of a node that participates in round t, from the state before it.

  Algorithm 2 lines 3-9 for A_k^t = 1: Q* = Q_k + 1 and x_k^t = (R_k
  x_k^{t-1} + Q*) / (R_k + 1) (= Q* when R_k = 0). Equals `adaptive_step`'s
  x for a participant; the cutoff does not matter here because a
  participation always records its interval.

  Args:
    extra: the server extra (int32 [N] 'interval', 'count', 'interval_sum').
    client_id: int32 scalar (an out-of-range padding id reads the last row).
  """
  interval = extra['interval'].at[client_id].get(mode='clip') + 1
  count = extra['count'].at[client_id].get(mode='clip')
  total = extra['interval_sum'].at[client_id].get(mode='clip')
  return ((total + interval) / (count + 1)).astype(jnp.float32)


@functools.partial(jax.jit, static_argnames=('cutoff',))
def _scan_adaptive(participation, *, cutoff):
  def step(state, participated):
    return adaptive_step(state, participated, cutoff=cutoff)

  _, weights = jax.lax.scan(
    step, init_adaptive_state(participation.shape[1]), participation
  )
  return weights


def adaptive_weights(participation, *, cutoff: Optional[int] = 50):
  """PMFL weights x_k^t for a whole participation mask (Algorithm 2).

  Runs `adaptive_step` from Q = R = 0, x = 0 (Zhang et al., 2025, Section
  IV-D1, Algorithm 2 lines 2-14).

  Args:
    participation: bool [T, N], A_k^t.
    cutoff: C (default 50) or None for no cutoff.

  Returns:
    float32 [T, N] NumPy array: x_k^t after round t's update, for every node
    (a node never recorded so far has x = 0).
  """
  participation = np.asarray(participation)
  if participation.ndim != 2 or participation.size == 0:
    raise ValueError(
      'participation must be a non-empty [T, N] array, got '
      f'shape {participation.shape}.'
    )
  if cutoff is not None and (int(cutoff) != cutoff or cutoff < 1):
    raise ValueError(
      f'cutoff must be a positive integer or None, got {cutoff}.'
    )
  participation = participation.astype(bool)
  cutoff = None if cutoff is None else int(cutoff)
  return np.asarray(_scan_adaptive(jnp.asarray(participation), cutoff=cutoff))


def history_mixing_weight(round_idx, num_rounds):
  """psi = 1/2 - t / (2 (T - 1)) (Zhang et al., 2025, Eq. 11).

  Decreases linearly from 1/2 in round t = 0 to 0 in the last round
  t = T - 1. With T = 1 the single round is the last one and psi = 0.

  Args:
    round_idx: t, 0-based round index (int or traced int scalar).
    num_rounds: T >= 1 (int or traced int scalar).

  Returns:
    float32 scalar psi.
  """
  if isinstance(num_rounds, int) and num_rounds < 1:
    raise ValueError(f'num_rounds must be >= 1, got {num_rounds}.')
  t = jnp.asarray(round_idx, jnp.float32)
  span = jnp.asarray(num_rounds, jnp.float32) - 1.0
  return jnp.where(span > 0, 0.5 - t / (2.0 * jnp.maximum(span, 1.0)), 0.0)


def mixing_step_factor(psi, num_past):
  """How much Eq. 10's history mixing shortens a steady step: (1 - psi) /
  (1 + psi (h + 1) / 2), h = ``num_past`` past global models mixed in.

  Zhang et al., 2025, Eq. 10 with a constant update u per round: if the
  global model moves steadily, W^t = W^0 + t v, the mean of W^{t-1} ..
  W^{t-h} is W^t - v (h + 1) / 2, and Eq. 10,
  W^t + v = (1 - psi) (W^t + u) + psi (W^t - v (h + 1) / 2), gives
  v (1 + psi (h + 1) / 2) = (1 - psi) u. With
  the paper's H = 3 (h = 2) that is 0.29 at psi = 1/2 (round 0) and 1 at
  psi = 0 (the last round); averaged over Eq. 11's linear schedule, 0.58.
  So besides smoothing, the mixing runs the first half of training at a
  fraction of eta_g.

  Args:
    psi: float scalar in [0, 1/2].
    num_past: int scalar h >= 0 (0 gives 1: nothing is mixed in).

  Returns:
    float32 scalar in (0, 1].
  """
  psi = jnp.asarray(psi, jnp.float32)
  lag = (jnp.asarray(num_past, jnp.float32) + 1.0) / 2.0
  factor = (1.0 - psi) / (1.0 + psi * lag)
  return jnp.where(jnp.asarray(num_past) > 0, factor, 1.0)
