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

This module must not import jax.
"""

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
      f'clients {empty.tolist()} have no data (all class counts'
      ' are 0); every client needs a label histogram.'
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


def _uniform(num_clients, num_rounds, clients_per_round, rng):
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
  if pattern not in PATTERNS:
    raise ValueError(
      f'unknown pattern {pattern!r}; expected one of {PATTERNS}.'
    )
  p = _check_probabilities(p, pattern)
  if int(num_rounds) != num_rounds or num_rounds < 1:
    raise ValueError(
      f'num_rounds must be a positive integer, got {num_rounds}.'
    )
  num_rounds = int(num_rounds)
  rng = _rng(seed, pattern)
  if pattern == 'bernoulli':
    return _bernoulli(p, num_rounds, rng)
  if pattern == 'markov':
    _check_unit_interval('markov_rate', markov_rate)
    return _markov(p, num_rounds, markov_rate, rng)
  if pattern in ('cyclic', 'cyclic_offset'):
    if int(cycle) != cycle or cycle < 1:
      raise ValueError(f'cycle must be a positive integer, got {cycle}.')
    sampler = _cyclic if pattern == 'cyclic' else _cyclic_offset
    return sampler(p, num_rounds, int(cycle), rng)
  return _uniform(p.size, num_rounds, clients_per_round, rng)


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
