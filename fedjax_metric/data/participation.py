"""Heterogeneous client participation: probabilities and availability masks.

Host-side NumPy, run once per experiment before training. The participation
probability of a client is tied to its label histogram through one shared
Dirichlet vector, and a pattern turns the probabilities into a fixed
clients-by-rounds availability mask (Wang & Ji, 'A Lightweight Method for
Tackling Unknown Participation Statistics in Federated Averaging', ICLR 2024,
experimental setup; the authors' released code (github.com/IBM/fedau,
util/util.py `data_participation_each_node` and `WorkerSampler`); reused by
Zhang et al., 'Towards Performance-Enhanced Model-Contrastive Federated
Learning using Historical Information in Heterogeneous Scenarios',
preprint, 2025, Section V-B, Eq. 12).

Patterns (`sample`):
  'bernoulli'      independent Bernoulli(p_n) draws every round.
  'markov'         two-state Markov chain with stationary probability p_n.
  'cyclic'         FedAU's cyclic sampler: fixed-length active / inactive runs
                   starting inactive with a random phase (the default cyclic
                   form, from the released code).
  'cyclic_offset'  the cyclic form written in Zhang et al. (Section V-B):
                   active iff (t - o_n) mod cycle < p_n * cycle with a random
                   offset o_n in [0, cycle).
  'uniform'        exactly `clients_per_round` clients drawn uniformly without
                   replacement every round (the usual FedAvg sampler; p unused).

`sample` returns the whole bool [T, N] mask. For large populations (10^6
clients and more) `ParticipationStream` / `round_masks` yield the same rows
bit for bit one round at a time in O(N) memory, start at any round (a
resumed run), and `max_active_streamed` gives `max_active` of the mask
without building it.

This module must not import jax.
"""

import math
import warnings
import zlib

import numpy as np

PATTERNS = ('bernoulli', 'markov', 'cyclic', 'cyclic_offset', 'uniform')
NORMALIZATIONS = ('expected', 'empirical')


def _rng(seed, tag):
  """A generator keyed by (seed, tag): different tags give unrelated streams."""
  return np.random.default_rng(
    np.random.SeedSequence([int(seed), zlib.crc32(tag.encode())])
  )


def _check_unit_interval(name, value):
  if not 0.0 < value <= 1.0:
    raise ValueError(f'{name} must be in (0, 1], got {value}.')


def _label_histograms(class_counts):
  """Validated [N, J] counts -> row-normalised float64 histograms q."""
  counts = np.asarray(class_counts, dtype=np.float64)
  if counts.ndim != 2 or counts.shape[0] == 0 or counts.shape[1] == 0:
    raise ValueError(
      'class_counts must be a non-empty [N, J] array, got '
      f'shape {counts.shape}.'
    )
  if not np.all(np.isfinite(counts)):
    raise ValueError('class_counts must be finite.')
  if np.any(counts < 0):
    bad = np.unique(np.nonzero(counts < 0)[0])
    raise ValueError(
      'class_counts must be non-negative; clients '
      f'{bad.tolist()} have negative counts.'
    )
  totals = counts.sum(axis=1)
  if np.any(totals <= 0):
    empty = np.nonzero(totals <= 0)[0]
    raise ValueError(
      f'{empty.size} client(s) have no data (all class counts are 0; '
      f'first: {empty[:5].tolist()}); every client needs a label histogram.'
    )
  return counts / totals[:, None]


def probabilities(
  class_counts,
  *,
  mean=0.1,
  floor=0.02,
  beta=0.1,
  seed=0,
  normalize='expected',
  label_weights=None,
):
  """Per-client participation probabilities tied to the label histograms.

  One vector m ~ Dirichlet(beta * 1_J) is shared by all clients; with q_n the
  normalised label histogram of client n, p_n is proportional to <q_n, m>:

    normalize='expected' (default; the authors' released FedAU code,
      github.com/IBM/fedau, util/util.py `data_participation_each_node`):
      p_n = J * mean * <q_n, m>. Since E[m] = 1_J / J, E_m[p_n] = mean for
      every client before the floor / clip.
    normalize='empirical' (Zhang et al., 'Towards Performance-Enhanced
      Model-Contrastive Federated Learning using Historical Information in
      Heterogeneous Scenarios', preprint, 2025, Eq. 12: 'r ... ensures
      E[p_k] = 0.1', read as an average over the clients of this draw):
      p_n = mean * <q_n, m> / ((1/N) sum_k <q_k, m>).

  Then p_n = max(p_n, floor) (both sources) and p_n = min(p_n, 1). The upper
  clip is ours: the released code does not clip, so with many classes
  (J * mean > 1) some p_n exceed 1 and its samplers break; a warning says how
  many clients were clipped.

  Args:
    class_counts: [N, J] non-negative label counts per client.
    mean: target mean participation probability, in (0, 1].
    floor: lower bound on every p_n, in (0, 1] (0.02 in both papers).
    beta: Dirichlet concentration of m, > 0.
    seed: integer seed for m.
    normalize: 'expected' or 'empirical', see above.
    label_weights: optional [J] non-negative vector used as m instead of a
      Dirichlet draw (for reproducing a given m; `beta` and `seed` unused).

  Returns:
    float64 [N] probabilities in [floor, 1].
  """
  q = _label_histograms(class_counts)
  _check_unit_interval('mean', mean)
  _check_unit_interval('floor', floor)
  if normalize not in NORMALIZATIONS:
    raise ValueError(
      f'unknown normalize={normalize!r}; expected one of {NORMALIZATIONS}.'
    )
  num_labels = q.shape[1]
  if label_weights is None:
    if not beta > 0:
      raise ValueError(f'beta must be > 0, got {beta}.')
    m = _rng(seed, 'probabilities').dirichlet(beta * np.ones(num_labels))
  else:
    m = np.asarray(label_weights, dtype=np.float64)
    if m.shape != (num_labels,) or np.any(m < 0) or not np.all(np.isfinite(m)):
      raise ValueError(
        'label_weights must be a finite non-negative '
        f'[{num_labels}] vector, got {m}.'
      )
  affinity = q @ m
  if normalize == 'expected':
    p = num_labels * mean * affinity
  else:
    average = affinity.mean()
    if not average > 0:
      raise ValueError(
        'every client has <q_n, m> = 0 (m puts no mass on any '
        'label present), so the empirical mean cannot be set.'
      )
    p = mean * affinity / average
  p = np.maximum(p, floor)
  clipped = int(np.sum(p > 1.0))
  if clipped:
    warnings.warn(
      f'{clipped} of {p.size} participation probabilities '
      'exceeded 1 and were clipped to 1 (the released FedAU code '
      'does not clip).',
      stacklevel=2,
    )
  return np.minimum(p, 1.0)


def _check_probabilities(p, pattern):
  p = np.asarray(p, dtype=np.float64)
  if p.ndim != 1 or p.size == 0:
    raise ValueError(f'p must be a non-empty [N] array, got shape {p.shape}.')
  if pattern != 'uniform' and not np.all((p > 0) & (p <= 1)):
    bad = np.nonzero(~((p > 0) & (p <= 1)))[0]
    raise ValueError(
      f'participation probabilities must be in (0, 1]; clients '
      f'{bad.tolist()} are not.'
    )
  return p


def _bernoulli(p, num_rounds, rng):
  return rng.random((num_rounds, p.size)) < p


def markov_rates(p, markov_rate):
  """Transition probabilities of the two-state 'markov' pattern.

  P(off -> on) = a and P(on -> off) = a (1/p - 1), so the stationary
  probability of 'on' is a / (a + a (1/p - 1)) = p. When a (1/p - 1) > 1 both
  are divided by it: P(on -> off) = 1, P(off -> on) = a / (a (1/p - 1)), which
  keeps the stationary probability p (the authors' released code,
  github.com/IBM/fedau, util/util.py `WorkerSampler`).

  Args:
    p: [N] stationary probabilities in (0, 1].
    markov_rate: a, in (0, 1].

  Returns:
    (to_on [N], to_off [N]) float64 transition probabilities.
  """
  p = np.asarray(p, dtype=np.float64)
  to_off = markov_rate * (1.0 / p - 1.0)
  to_on = np.full_like(p, markov_rate)
  rescale = to_off > 1.0
  to_on = np.where(rescale, markov_rate / np.where(rescale, to_off, 1.0), to_on)
  to_off = np.where(rescale, 1.0, to_off)
  return to_on, to_off


def _markov(p, num_rounds, markov_rate, rng):
  to_on, to_off = markov_rates(p, markov_rate)
  state = rng.random(p.size) < p
  draws = rng.random((num_rounds, p.size))
  mask = np.empty((num_rounds, p.size), dtype=bool)
  for t in range(num_rounds):
    # The released code moves the chain first and then reads the state.
    state = np.where(state, draws[t] >= to_off, draws[t] < to_on)
    mask[t] = state
  return mask


def cyclic_lengths(p, cycle):
  """(active_len, inactive_len) int64 [N] of the 'cyclic' pattern.

  active_len = max(1, round(cycle * p)) (NumPy round-half-to-even, as in the
  released code), inactive_len = max(1, cycle - active_len). The long-run
  rate is active_len / (active_len + inactive_len): p up to rounding, except
  cycle / (cycle + 1) for p = 1.
  """
  active = np.maximum(1, np.round(cycle * np.asarray(p))).astype(np.int64)
  return active, np.maximum(1, cycle - active).astype(np.int64)


def _cyclic(p, num_rounds, cycle, rng):
  active_len, inactive_len = cyclic_lengths(p, cycle)
  rounds_to_switch = rng.integers(0, inactive_len)
  state = np.zeros(p.size, dtype=bool)
  mask = np.empty((num_rounds, p.size), dtype=bool)
  for t in range(num_rounds):
    switch = rounds_to_switch == 0
    state = state ^ switch
    rounds_to_switch = (
      np.where(
        switch, np.where(state, active_len, inactive_len), rounds_to_switch
      )
      - 1
    )
    mask[t] = state
  return mask


def _cyclic_offset(p, num_rounds, cycle, rng):
  offset = rng.integers(0, cycle, size=p.size)
  # Rounding to 9 decimals first stops p * cycle = 7.000000000000001 (p = 0.07)
  # from admitting an eighth active round per cycle.
  threshold = np.round(p * cycle, 9)
  phase = (np.arange(num_rounds)[:, None] - offset[None, :]) % cycle
  return phase < threshold[None, :]


def _check_clients_per_round(num_clients, clients_per_round):
  """K of 'uniform' as an int in [1, N]."""
  if clients_per_round is None:
    raise ValueError("pattern 'uniform' needs clients_per_round.")
  if (
    int(clients_per_round) != clients_per_round
    or not 1 <= clients_per_round <= num_clients
  ):
    raise ValueError(
      f'clients_per_round={clients_per_round} must be an '
      f'integer in [1, {num_clients}].'
    )
  return int(clients_per_round)


def _uniform(num_clients, num_rounds, clients_per_round, rng):
  _check_clients_per_round(num_clients, clients_per_round)
  # The first K entries of a uniformly random permutation are a uniform
  # K-subset; argsort of iid uniforms is such a permutation.
  chosen = np.argsort(rng.random((num_rounds, num_clients)), axis=1)
  mask = np.zeros((num_rounds, num_clients), dtype=bool)
  np.put_along_axis(mask, chosen[:, : int(clients_per_round)], True, axis=1)
  return mask


def sample(
  p,
  num_rounds,
  pattern,
  *,
  seed=0,
  markov_rate=0.05,
  cycle=100,
  clients_per_round=None,
):
  """Availability mask of every client in every round.

  Patterns, all from the authors' released FedAU code (github.com/IBM/fedau,
  util/util.py `WorkerSampler`; Wang & Ji, ICLR 2024) except
  'cyclic_offset' and 'uniform':
    'bernoulli': mask[t, n] ~ Bernoulli(p_n) independently.
    'markov': see `markov_rates`; the initial state is Bernoulli(p_n) and the
      transition is applied before the state is read in every round, so round
      0 already shows one transition.
    'cyclic': see `cyclic_lengths`; every client starts inactive with
      rounds_to_switch ~ UniformInt[0, inactive_len - 1]; each round, if
      rounds_to_switch == 0 the state toggles and rounds_to_switch becomes the
      new state's length; then rounds_to_switch is decremented and the state
      read. The first active round is therefore rounds_to_switch's initial
      value.
    'cyclic_offset': Zhang et al., 'Towards Performance-Enhanced
      Model-Contrastive Federated Learning using Historical Information in
      Heterogeneous Scenarios', preprint, 2025, Section V-B: mask[t, n] = 1 iff
      (t - o_n) mod cycle < p_n * cycle with o_n ~ UniformInt[0, cycle - 1].
      Every full cycle has ceil(p_n * cycle) active rounds.
    'uniform': exactly `clients_per_round` clients per round, uniformly without
      replacement; `p` only gives N.
  The generator is seeded with (seed, pattern), so patterns do not share
  random streams. Markov and cyclic loop over rounds, vectorised over clients.

  Args:
    p: [N] participation probabilities in (0, 1] (any values for 'uniform').
    num_rounds: T >= 1.
    pattern: one of PATTERNS.
    seed: integer seed.
    markov_rate: a = P(off -> on) of 'markov', in (0, 1] (0.05 in both papers).
    cycle: cycle length of 'cyclic' / 'cyclic_offset' (100 in both papers).
    clients_per_round: K for 'uniform'.

  Returns:
    bool [T, N] mask, True where the client participates.
  """
  p, num_rounds = _check_sample_args(p, num_rounds, pattern, markov_rate, cycle)
  rng = _rng(seed, pattern)
  if pattern == 'bernoulli':
    return _bernoulli(p, num_rounds, rng)
  if pattern == 'markov':
    return _markov(p, num_rounds, markov_rate, rng)
  if pattern in ('cyclic', 'cyclic_offset'):
    sampler = _cyclic if pattern == 'cyclic' else _cyclic_offset
    return sampler(p, num_rounds, int(cycle), rng)
  return _uniform(p.size, num_rounds, clients_per_round, rng)


def _check_sample_args(p, num_rounds, pattern, markov_rate, cycle):
  """`sample`'s checks (but K of 'uniform'), in its order: (p, T)."""
  if pattern not in PATTERNS:
    raise ValueError(
      f'unknown pattern {pattern!r}; expected one of {PATTERNS}.'
    )
  p = _check_probabilities(p, pattern)
  if int(num_rounds) != num_rounds or num_rounds < 1:
    raise ValueError(
      f'num_rounds must be a positive integer, got {num_rounds}.'
    )
  if pattern == 'markov':
    _check_unit_interval('markov_rate', markov_rate)
  if pattern in ('cyclic', 'cyclic_offset'):
    if int(cycle) != cycle or cycle < 1:
      raise ValueError(f'cycle must be a positive integer, got {cycle}.')
  return p, int(num_rounds)


def _check_mask(mask):
  mask = np.asarray(mask)
  if mask.ndim != 2 or mask.size == 0:
    raise ValueError(
      f'mask must be a non-empty [T, N] array, got shape {mask.shape}.'
    )
  return mask.astype(bool)


def max_active(mask):
  """Largest number of participants in any round, at least 1.

  The fixed cohort-slot count of a run: a jitted round with this many slots
  holds every round's participants.

  Args:
    mask: bool [T, N] availability mask.

  Returns:
    int.
  """
  return max(1, int(_check_mask(mask).sum(axis=1).max()))


# ---------------------------------------------------------------------------
# Streaming: one round's row at a time, for populations of 10^6+ clients
# ---------------------------------------------------------------------------


def _check_round(name, value, num_rounds, *, inclusive):
  """An int round index in [0, T] (inclusive) or [0, T - 1]."""
  last = num_rounds if inclusive else num_rounds - 1
  if int(value) != value or not 0 <= value <= last:
    raise ValueError(f'{name} must be an integer in [0, {last}], got {value}.')
  return int(value)


def _markov_step(state, u, to_on, to_off):
  """Next bool [N] state of the 'markov' chain from uniforms u [N].

  The same expression as `_markov`: a client that is on stays on iff
  u >= P(on -> off); one that is off turns on iff u < P(off -> on).
  """
  return np.where(state, u >= to_off, u < to_on)


def _smallest_k(u, k):
  """bool [N], True at the k entries argsort(u)[:k] picks ('uniform' rows).

  np.partition finds the k-th smallest value in O(N) (about 10 ms at
  N = 10^6 where argsort takes about 120 ms). The entries <= it are exactly
  argsort's first k unless the k-th and (k+1)-th smallest are equal (for
  uniform doubles about N / 2^53 per round); then argsort itself picks, as
  `_uniform` does, so the row is `sample`'s bit for bit either way.

  Args:
    u: float [N] values (no NaN).
    k: int in [1, N].
  """
  kth = np.partition(u, k - 1)[k - 1]
  mask = u <= kth
  if np.count_nonzero(mask) == k:
    return mask
  mask = np.zeros(u.size, dtype=bool)
  mask[np.argsort(u)[:k]] = True
  return mask


def _cyclic_phases(p, pattern, cycle, rng):
  """(offset, period, threshold) of a cyclic pattern, from `sample`'s draws.

  Both cyclic patterns read mask[t, n] = ((t - offset_n) mod period_n) <
  threshold_n for every t >= 0:
    'cyclic_offset': offset o_n, period `cycle`, threshold
      round(p_n * cycle, 9) (`_cyclic_offset` itself).
    'cyclic': `_cyclic`'s loop first toggles (to active) at round r_n, its
      initial rounds_to_switch, then alternates active_len active and
      inactive_len inactive rounds: offset r_n, period active_len +
      inactive_len, threshold active_len. Before r_n, (t - r_n) mod period
      lies in [period - r_n, period - 1] and r_n <= inactive_len - 1, so it is
      > active_len: inactive, as the loop says.

  Args:
    p: float64 [N] probabilities.
    pattern: 'cyclic' or 'cyclic_offset'.
    cycle: int cycle length.
    rng: the pattern's fresh generator (`_rng(seed, pattern)`).

  Returns:
    int64 [N] offsets, int64 [N] or int period, int64 or float64 [N]
    thresholds.
  """
  if pattern == 'cyclic_offset':
    offset = rng.integers(0, cycle, size=p.size)
    return offset, cycle, np.round(p * cycle, 9)
  active_len, inactive_len = cyclic_lengths(p, cycle)
  first_switch = rng.integers(0, inactive_len)
  return first_switch, active_len + inactive_len, active_len


class ParticipationStream:
  """The rows of `sample`'s mask one round at a time, in O(N) memory.

  Iterating yields bool [N] rows for rounds next_round, ..., T - 1; row t is
  sample(p, T, pattern, seed=..., ...)[t] bit for bit (same arguments,
  same checks, same error messages). `sample` holds T * N bools at once
  (and bernoulli / markov / uniform draw a float64 [T, N] array: 8 GB at
  T = 1000, N = 10^6); the stream holds a few [N] arrays:
    'bernoulli', 'uniform': rng.random((T, N)) fills its rows in order with
      one 64-bit PCG64 output per double, so rng.random(N) per round draws
      the same numbers; 'uniform' rows take the k smallest via `_smallest_k`.
    'markov': the initial state rng.random(N) < p, then one rng.random(N)
      and one `_markov_step` per round.
    'cyclic', 'cyclic_offset': the same one rng.integers call as `sample`,
      then a closed form (`_cyclic_phases`), stepped by one per round.

  Resuming at round t (construct with start=t, or `seek(t)`) gives the rows
  a stream read from round 0 gives from t on. Its cost:
    'bernoulli', 'uniform': O(1): PCG64.advance(t * N) skips the t rows'
      draws.
    'cyclic', 'cyclic_offset': O(N): every client's phase in closed form.
    'markov': O(t N) time, O(N) memory: the chain is replayed from round 0,
      vectorised over clients (its state at t depends on every earlier
      draw; about 5 ms per round at N = 10^6 on one CPU core: 5 s to
      resume at t = 1000).

  Attributes:
    pattern: one of PATTERNS.
    num_rounds: T.
    num_clients: N.
    next_round: the round of the row `next` returns.
  """

  def __init__(
    self,
    p,
    num_rounds,
    pattern,
    *,
    seed=0,
    markov_rate=0.05,
    cycle=100,
    clients_per_round=None,
    start=0,
  ):
    """Checks the arguments as `sample` does and positions at `start`.

    Args:
      p, num_rounds, pattern, seed, markov_rate, cycle, clients_per_round:
        as in `sample`.
      start: the first round to yield, an integer in [0, T] (T: nothing
        left, for a finished run).
    """
    p, num_rounds = _check_sample_args(
      p, num_rounds, pattern, markov_rate, cycle
    )
    self.pattern = pattern
    self.num_rounds = num_rounds
    self.num_clients = p.size
    self._seed = seed
    self._p = p
    self._rng = None
    if pattern == 'uniform':
      self._k = _check_clients_per_round(p.size, clients_per_round)
    if pattern == 'markov':
      self._to_on, self._to_off = markov_rates(p, markov_rate)
    if pattern in ('cyclic', 'cyclic_offset'):
      self._offset, self._period, self._threshold = _cyclic_phases(
        p, pattern, int(cycle), _rng(seed, pattern)
      )
    # A scratch row of uniforms, refilled in place every round.
    self._u = None if pattern.startswith('cyclic') else np.empty(p.size)
    start = _check_round('start', start, num_rounds, inclusive=True)
    if pattern == 'markov':
      self._restart_markov()
    else:
      self.next_round = 0
    self.seek(start)

  def _restart_markov(self):
    """Positions the chain at round 0: `_markov`'s first draw."""
    self._rng = _rng(self._seed, 'markov')
    self._state = self._rng.random(self.num_clients) < self._p
    self.next_round = 0

  def seek(self, round_index):
    """Positions the stream so that `next` returns row `round_index`.

    Args:
      round_index: an integer in [0, T].
    """
    t = _check_round(
      'round_index', round_index, self.num_rounds, inclusive=True
    )
    if self.pattern in ('cyclic', 'cyclic_offset'):
      self._phase = (t - self._offset) % self._period
    elif self.pattern == 'markov':
      if t < self.next_round:
        self._restart_markov()
      while self.next_round < t:
        self._step()
    else:
      self._rng = _rng(self._seed, self.pattern)
      # Row t's draws start at output t * N (one output per double).
      self._rng.bit_generator.advance(t * self.num_clients)
    self.next_round = t

  def _step(self):
    """Row next_round as bool [N]; moves to the next round (no bound check)."""
    if self.pattern in ('cyclic', 'cyclic_offset'):
      row = self._phase < self._threshold
      self._phase += 1
      np.putmask(self._phase, self._phase == self._period, 0)
    else:
      self._rng.random(out=self._u)
      if self.pattern == 'bernoulli':
        row = self._u < self._p
      elif self.pattern == 'markov':
        row = self._state = _markov_step(
          self._state, self._u, self._to_on, self._to_off
        )
      else:
        row = _smallest_k(self._u, self._k)
    self.next_round += 1
    return row

  def __iter__(self):
    return self

  def __next__(self):
    """bool [N] row of round next_round (a new array every call)."""
    if self.next_round >= self.num_rounds:
      raise StopIteration
    # The markov state is kept for the next step, so callers get a copy.
    row = self._step()
    return row.copy() if self.pattern == 'markov' else row

  def mask_at(self, round_index):
    """bool [N] row of round `round_index`; the stream then stands after it.

    `seek(round_index)` then `next`: for 'markov' a round before next_round
    replays the chain from round 0.
    """
    _check_round('round_index', round_index, self.num_rounds, inclusive=False)
    self.seek(round_index)
    return next(self)

  def rounds_covering_counts(self):
    """W: rounds 0..W-1 show every participant count of rounds 0..T-1.

    'uniform': 1 (every row has K participants). Cyclic patterns: the rows
    are periodic with the lcm of the clients' periods (`_cyclic_phases`), so
    min(T, lcm) rounds (cycle = 100: 100 rounds unless some clients have
    active_len = cycle, whose period is cycle + 1). Otherwise T.
    """
    if self.pattern == 'uniform':
      return 1
    if self.pattern in ('cyclic', 'cyclic_offset'):
      periods = np.unique(self._period).tolist()
      return min(self.num_rounds, math.lcm(*periods))
    return self.num_rounds


def round_masks(
  p,
  num_rounds,
  pattern,
  *,
  seed=0,
  markov_rate=0.05,
  cycle=100,
  clients_per_round=None,
  start=0,
):
  """Iterator of `sample`'s rows for rounds start, ..., T - 1, bit for bit.

  A `ParticipationStream` (arguments checked now, not at the first row);
  see it for the memory and the cost of a start > 0.

  Returns:
    an iterator of bool [N] rows.
  """
  return ParticipationStream(
    p,
    num_rounds,
    pattern,
    seed=seed,
    markov_rate=markov_rate,
    cycle=cycle,
    clients_per_round=clients_per_round,
    start=start,
  )


def max_active_streamed(
  p,
  num_rounds,
  pattern,
  *,
  seed=0,
  markov_rate=0.05,
  cycle=100,
  clients_per_round=None,
):
  """max_active(sample(...)) in O(N) memory, without the [T, N] mask.

  Streams the rows of rounds 0..W-1 (`rounds_covering_counts`: all T for
  'bernoulli' and 'markov', one period for the cyclic patterns, one round
  for 'uniform') and keeps the largest count.

  Args:
    as in `sample`.

  Returns:
    int, at least 1.
  """
  stream = ParticipationStream(
    p,
    num_rounds,
    pattern,
    seed=seed,
    markov_rate=markov_rate,
    cycle=cycle,
    clients_per_round=clients_per_round,
  )
  most = 0
  for _ in range(stream.rounds_covering_counts()):
    # _step, not next: the markov row need not be copied to be counted.
    most = max(most, int(np.count_nonzero(stream._step())))
  return max(1, most)


def plot(mask, path, *, title=''):
  """Saves a clients x rounds picture of the mask as a PNG.

  Rows are clients sorted by participation rate (most frequent at the top);
  dark pixels are participations. Uses the Agg canvas directly, so the global
  matplotlib backend is untouched.

  Args:
    mask: bool [T, N] availability mask.
    path: output file path.
    title: optional figure title.
  """
  # Imported here so that sampling never pays for matplotlib.
  from matplotlib import figure
  from matplotlib.backends import backend_agg

  mask = _check_mask(mask)
  num_rounds, num_clients = mask.shape
  order = np.argsort(-mask.mean(axis=0), kind='stable')
  fig = figure.Figure(
    figsize=(
      min(16.0, 4.0 + num_rounds / 100.0),
      min(12.0, 2.0 + num_clients / 25.0),
    )
  )
  backend_agg.FigureCanvasAgg(fig)
  ax = fig.add_subplot(1, 1, 1)
  ax.imshow(
    mask[:, order].T,
    aspect='auto',
    interpolation='nearest',
    cmap='Greys',
    vmin=0,
    vmax=1,
  )
  ax.set_xlabel('round')
  ax.set_ylabel('client (sorted by participation rate)')
  if title:
    ax.set_title(title)
  fig.tight_layout()
  fig.savefig(path, dpi=100, format='png')
