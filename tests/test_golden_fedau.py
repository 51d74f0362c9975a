"""FedAU, MIFA, FedVarp and their participation model vs the authors' code.

tests/golden/fedau.npz holds outputs of the released code of Wang and Ji,
'A Lightweight Method for Tackling Unknown Participation Statistics in
Federated Averaging', ICLR 2024 (github.com/IBM/fedau; the repository and
commit are in the fixture), written by benchmarks/crosscheck/fedau.py (its
docstring lists the stubs and every setting that differs from the authors'
defaults). Each test runs our code on the same inputs and also shows that
a plausible near miss does not match.

  * partition (util/util.py `partition`) and probabilities
    (`data_participation_each_node`): our `partition._per_client` fed the
    authors' Dirichlet draws; `participation.probabilities(normalize=
    'expected', label_weights=their multiplier)`.
  * masks (util/util.py `WorkerSampler`): the authors draw from NumPy's
    global RandomState, we from a seeded `np.random.default_rng`, so the
    public `participation.sample` cannot give their masks. Our samplers'
    state machines (`_bernoulli`, `_markov` / `_markov_step`, `_cyclic`,
    `_cyclic_phases`) are driven by the authors' own draws instead: the
    uniform doubles their np.random.binomial(1, prob) calls consumed (one
    each), mapped to ours by `_coin_uniform`, and their cyclic samplers'
    initial rounds_to_switch.
  * aggregation (main.py's loop with a stub model adding fixed updates and
    a fixed participation mask): our algorithms' client_final and
    server_update slots, driven by hand with the same updates, in float64.
  * rounds (main.py's loop with softmax regression and real local SGD): our
    engine, the vmap executor, the recorded cohorts, float32.
"""

import os

import fl_fixtures as fx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fedjax_metric import algorithms, engine, executors, optimizers
from fedjax_metric.algorithms import fedau_intervals
from fedjax_metric.contract import RunFacts
from fedjax_metric.data import participation, partition

GOLDEN = np.load(os.path.join(os.path.dirname(__file__), 'golden', 'fedau.npz'))


def test_fixture_provenance():
  assert str(GOLDEN['repository']) == 'IBM/fedau'
  assert len(str(GOLDEN['commit'])) == 40
  assert 'WorkerSampler' in str(GOLDEN['function'])


class _StubRng:
  """Answers our samplers' generator calls with given values."""

  def __init__(self, *, dirichlet=None, random=(), integers=None):
    self._dirichlet = dirichlet
    self._random = list(random)
    self._integers = integers
    self.calls = []

  def dirichlet(self, alpha, size=None):
    self.calls.append(('dirichlet', np.asarray(alpha), size))
    return self._dirichlet

  def random(self, size=None):
    out = self._random.pop(0)
    assert out.shape == (size if isinstance(size, tuple) else (size,))
    return out

  def integers(self, low, high, size=None):
    self.calls.append(('integers', low, np.asarray(high), size))
    return self._integers


def _coin_uniform(uniform, prob):
  """Our u with (u < prob) == NumPy's legacy binomial(1, prob) on `uniform`.

  RandomState.binomial(1, p) (numpy/random/src/distributions, inversion)
  draws one double U and returns 1 iff U > exp(log(1 - p)) for p <= 0.5, and
  1 - [U > exp(log(p))] for p > 0.5. Ours returns u < p. So u = 1 - U for
  p <= 0.5 and u = U above (equal up to the last bit of the threshold: a
  draw within 1e-16 of it would differ; none in the fixture does, as the
  exact mask equality below shows).
  """
  return np.where(prob <= 0.5, 1.0 - uniform, uniform)


def _part_probabilities():
  return GOLDEN['part_probabilities']


# ---------------------------------------------------------------------------
# Partition and probabilities (util/util.py).
# ---------------------------------------------------------------------------


def _their_parts(prefix):
  sizes = GOLDEN[f'{prefix}_sizes']
  return np.split(GOLDEN[f'{prefix}_indices'], np.cumsum(sizes)[:-1])


def _our_per_client(dirichlet):
  labels = GOLDEN['part_labels']
  rng = _StubRng(dirichlet=dirichlet)
  parts = partition._per_client(
    partition._class_indices(labels),
    int(GOLDEN['part_num_clients']),
    float(GOLDEN['part_data_alpha']),
    rng,
  )
  ((_, alpha, size),) = rng.calls
  np.testing.assert_array_equal(alpha, np.full(10, GOLDEN['part_data_alpha']))
  assert size == int(GOLDEN['part_num_clients'])
  return parts


def test_partition_matches_authors_exactly():
  theirs = _their_parts('part')
  ours = _our_per_client(GOLDEN['part_dirichlet'])
  assert len(ours) == len(theirs)
  for a, b in zip(ours, theirs):
    np.testing.assert_array_equal(a, b)
  # Near miss: the cumulative cut one client off (rows rolled by one).
  rolled = _our_per_client(np.roll(GOLDEN['part_dirichlet'], 1, axis=0))
  assert any(len(a) != len(b) or np.any(a != b) for a, b in zip(rolled, theirs))


def _probabilities(normalize):
  counts = partition.class_counts(
    GOLDEN['part_labels'], _their_parts('part'), 10
  )
  return participation.probabilities(
    counts,
    mean=float(GOLDEN['part_prob_mean']),
    floor=float(GOLDEN['part_prob_min']),
    normalize=normalize,
    label_weights=GOLDEN['part_multiplier'],
  )


# <q_n, m> is a matmul here and np.sum(q * m) there: the last bit may differ.
PROB_RTOL = 1e-15


def test_probabilities_expected_matches_authors():
  theirs = _part_probabilities()
  ours = _probabilities('expected')
  np.testing.assert_allclose(ours, theirs, rtol=PROB_RTOL, atol=0)
  assert np.sum(theirs == GOLDEN['part_prob_min']) >= 3  # the floor acts
  # Near miss: 'empirical' (PMFL's reading, mean over this draw's clients).
  empirical = _probabilities('empirical')
  assert np.max(np.abs(empirical / theirs - 1)) > 1e-3


# ---------------------------------------------------------------------------
# Participation masks (util/util.py WorkerSampler).
# ---------------------------------------------------------------------------


def _shape():
  return int(GOLDEN['part_rounds']), int(GOLDEN['part_num_clients'])


def test_bernoulli_mask_from_their_draws():
  p = _part_probabilities()
  num_rounds, n = _shape()
  uniforms = GOLDEN['part_bernoulli_uniforms'].reshape(num_rounds, n)
  rng = _StubRng(random=[_coin_uniform(uniforms, p)])
  mask = participation._bernoulli(p, num_rounds, rng)
  np.testing.assert_array_equal(mask, GOLDEN['part_bernoulli_mask'])
  assert 0.05 < mask.mean() < 0.15
  # Near miss: the draws read client-major ([N, T]) instead of round-major.
  swapped = GOLDEN['part_bernoulli_uniforms'].reshape(n, num_rounds).T
  rng = _StubRng(random=[_coin_uniform(swapped, p)])
  wrong = participation._bernoulli(p, num_rounds, rng)
  assert np.sum(wrong != GOLDEN['part_bernoulli_mask']) > 50


def test_markov_rates_match_authors_exactly():
  to_on, to_off = participation.markov_rates(
    _part_probabilities(), float(GOLDEN['part_markov_rate'])
  )
  np.testing.assert_array_equal(to_on, GOLDEN['part_markov_to_on'])
  np.testing.assert_array_equal(to_off, GOLDEN['part_markov_to_off'])
  # Both branches: rescaled (P(on -> off) = 1) and not, and their coins on
  # both sides of 0.5.
  assert np.any(to_off == 1.0) and np.any((to_off > 0.5) & (to_off < 1.0))
  assert np.any(to_off < 0.5)


def _markov_driven():
  """Our chain on the authors' draws: (mask, initial u, per-round u)."""
  p = _part_probabilities()
  num_rounds, n = _shape()
  to_on, to_off = participation.markov_rates(
    p, float(GOLDEN['part_markov_rate'])
  )
  draws = GOLDEN['part_markov_uniforms']
  u0 = _coin_uniform(draws[:n], p)
  state = u0 < p
  rows = draws[n:].reshape(num_rounds, n)
  mask, used = [], []
  for t in range(num_rounds):
    # The coin's probability is the one of the client's current state.
    u = np.where(
      state, _coin_uniform(rows[t], to_off), _coin_uniform(rows[t], to_on)
    )
    used.append(u)
    state = participation._markov_step(state, u, to_on, to_off)
    mask.append(state)
  return np.array(mask), u0, np.array(used)


def test_markov_mask_from_their_draws():
  theirs = GOLDEN['part_markov_mask']
  mask, u0, used = _markov_driven()
  np.testing.assert_array_equal(mask, theirs)
  # `_markov` itself, fed the same effective uniforms, gives the same mask.
  p = _part_probabilities()
  rng = _StubRng(random=[u0, used])
  whole = participation._markov(
    p, mask.shape[0], float(GOLDEN['part_markov_rate']), rng
  )
  np.testing.assert_array_equal(whole, theirs)
  # Near miss: the state read before the round's transition.
  before = np.concatenate([(u0 < p)[None], mask[:-1]])
  assert np.sum(before != theirs) > 20


def test_cyclic_mask_from_their_initial_phase():
  p = _part_probabilities()
  num_rounds, _ = _shape()
  cycle = int(GOLDEN['part_cyclic_cycle'])
  theirs = GOLDEN['part_cyclic_mask']
  active, inactive = participation.cyclic_lengths(p, cycle)
  np.testing.assert_array_equal(active, GOLDEN['part_cyclic_active'])
  np.testing.assert_array_equal(inactive, GOLDEN['part_cyclic_inactive'])
  first = GOLDEN['part_cyclic_first_switch']
  rng = _StubRng(integers=first)
  mask = participation._cyclic(p, num_rounds, cycle, rng)
  np.testing.assert_array_equal(mask, theirs)
  ((_, low, high, _),) = rng.calls
  assert low == 0
  np.testing.assert_array_equal(high, GOLDEN['part_cyclic_inactive'])
  # The streamed closed form (`ParticipationStream`) on the same phase.
  offset, period, threshold = participation._cyclic_phases(
    p, 'cyclic', cycle, _StubRng(integers=first)
  )
  t = np.arange(num_rounds)[:, None]
  np.testing.assert_array_equal((t - offset) % period < threshold, theirs)
  # Near miss: the first switch one round later.
  late = participation._cyclic(
    p, num_rounds, cycle, _StubRng(integers=first + 1)
  )
  assert np.sum(late != theirs) >= 2 * len(p)


# ---------------------------------------------------------------------------
# Aggregation: fixed updates, fixed mask, every -weighting of main.py.
# ---------------------------------------------------------------------------

AGG_KINDS = {
  # fixture run -> (registry name, make kwargs)
  'adaptive_k3': ('fedau', dict(aggregation='adaptive', cutoff=3)),
  'adaptive': ('fedau', dict(aggregation='adaptive', cutoff=None)),
  'known_prob': ('fedau', dict(aggregation='known_prob')),
  'average_all': ('fedau', dict(aggregation='average_all')),
  'average_participating': (
    'fedau',
    dict(aggregation='average_participating'),
  ),
  'mifa': ('mifa', {}),
  'fedvarp': ('fedvarp', {}),
}

# A plausible near miss of each: it must not match the fixture.
AGG_NEAR_MISS = {
  'adaptive_k3': ('fedau', dict(aggregation='adaptive', cutoff=4)),
  'adaptive': ('fedau', dict(aggregation='adaptive', cutoff=3)),
  'known_prob': ('fedau', dict(aggregation='average_all')),
  'average_all': ('fedau', dict(aggregation='average_participating')),
  'average_participating': ('fedau', dict(aggregation='average_all')),
  'mifa': ('fedvarp', {}),
  'fedvarp': ('mifa', {}),
}

# Relative to the trajectory's largest entry, in float64 but for the weights
# our code rounds to float32: FedAU's omega (fedau_intervals.current_omega)
# and known_prob's 1 / p (fedau_intervals.inverse_probabilities), measured
# 1.9e-8. MIFA and FedVarp keep ybar incrementally (ybar += (1 / N) sum of
# new - old) where the authors take the mean of the table: float64
# rounding, measured 5.2e-16 (MIFA) and 3.0e-16 (FedVarp); the plain
# averages 1.1e-16.
AGG_TOL = {
  'adaptive_k3': 1e-7,
  'adaptive': 1e-7,
  'known_prob': 1e-7,
  'average_all': 1e-14,
  'average_participating': 1e-14,
  'mifa': 1e-14,
  'fedvarp': 1e-14,
}


def _make(name, kwargs, eta):
  kwargs = dict(kwargs)
  if kwargs.get('aggregation') == 'known_prob':
    kwargs['run'] = RunFacts(
      participation_probabilities=GOLDEN['agg_probabilities']
    )
  server = optimizers.make_server_optimizer('sgd', learning_rate=eta)
  return algorithms.REGISTRY[name](
    fx.linear(), server_optimizer=server, **kwargs
  )


def _drive(alg, mask, deltas, w0):
  """Our client_final / server_update slots on fixed updates; [T, d]."""
  num_rounds, num_clients = mask.shape
  variables = {'params': {'w': jnp.asarray(w0)}}
  key = jax.random.key(0)
  state = alg.init_server(variables, num_clients, key)
  table = [alg.init_client(variables, key) for _ in range(num_clients)]
  trajectory = []
  for t in range(num_rounds):
    updates, weights = [], []
    for n in range(num_clients):
      ctx = fx.client_context(state, client_row=table[n], client_id=n)
      if mask[t, n]:
        end = jax.tree.map(lambda w: w + deltas[t, n], state.variables)
        update, weight, table[n] = alg.client_final(end, ctx)
      else:  # A padding slot: the engine zeroes its update and weight.
        update = jax.tree.map(jnp.zeros_like, state.variables)
        weight = jnp.zeros((), jnp.float32)
      updates.append(update)
      weights.append(weight)
    stacked = jax.tree.map(lambda *x: jnp.stack(x), *updates)
    weights = jnp.stack(weights)
    slot_mask = jnp.asarray(mask[t])
    aggregate = engine.Aggregate(
      engine.weighted_sum(weights, engine.mask_slots(slot_mask, stacked)),
      jnp.sum(weights),
      jnp.sum(slot_mask.astype(jnp.float32)),
      jnp.where(slot_mask, jnp.arange(num_clients), num_clients),
      slot_mask,
      num_clients,
    )
    state = alg.server_update(state, aggregate, None)
    trajectory.append(np.asarray(state.variables['params']['w'], np.float64))
  return np.array(trajectory)


def _agg_run(spec):
  name, kwargs = spec
  return _drive(
    _make(name, kwargs, float(GOLDEN['agg_lr_global'])),
    GOLDEN['agg_mask'],
    GOLDEN['agg_deltas'],
    GOLDEN['agg_w0'],
  )


def _relative(ours, theirs):
  return float(np.max(np.abs(ours - theirs)) / np.max(np.abs(theirs)))


@pytest.mark.parametrize('run', list(AGG_KINDS))
def test_aggregation_matches_authors_loop(run):
  assert run in list(GOLDEN['agg_runs'])
  theirs = GOLDEN[f'agg_{run}_w']
  with jax.enable_x64():
    ours = _agg_run(AGG_KINDS[run])
    near = _agg_run(AGG_NEAR_MISS[run])
  tol = AGG_TOL[run]
  assert _relative(ours, theirs) <= tol, _relative(ours, theirs)
  assert _relative(near, theirs) > 1e3 * tol


def test_aggregation_fixture_exercises_the_edges():
  mask = GOLDEN['agg_mask']
  assert not mask[2].any()  # a round nobody joins
  assert not mask[:, 4].any()  # a client that never joins (MIFA's zero row)
  # MIFA moves in the empty round, FedVarp does not.
  mifa, fedvarp = GOLDEN['agg_mifa_w'], GOLDEN['agg_fedvarp_w']
  assert np.max(np.abs(mifa[2] - mifa[1])) > 0.1
  np.testing.assert_array_equal(fedvarp[2], fedvarp[1])


def test_fedau_weights_match_authors_csv():
  """Our omega table vs the weights main.py printed (%.4f; 'nan' before a
  first interval, where the update is not scaled: 1). A non-participant's
  column repeats its last weight, so only participations are compared."""
  mask = GOLDEN['agg_mask']
  for run, cutoff in (
    ('adaptive_k3', int(GOLDEN['agg_k'])),
    ('adaptive', None),
  ):
    printed = np.nan_to_num(GOLDEN[f'agg_{run}_csv_weights'], nan=1.0)
    ours = fedau_intervals.interval_weights(mask, cutoff=cutoff)
    np.testing.assert_allclose(ours[mask], printed[mask], atol=5e-5)
  # Near miss: K + 1 (client 3's first weight would be K + 1 = 4, not 3).
  wrong = fedau_intervals.interval_weights(
    mask, cutoff=int(GOLDEN['agg_k']) + 1
  )
  printed = GOLDEN['agg_adaptive_k3_csv_weights']
  assert (
    np.max(np.abs(wrong[mask] - np.nan_to_num(printed, nan=1.0)[mask])) > 0.5
  )


# ---------------------------------------------------------------------------
# Rounds: real local SGD in our engine vs main.py's loop.
# ---------------------------------------------------------------------------

ROUND_KINDS = {
  'adaptive_k2': ('fedau', dict(aggregation='adaptive', cutoff=2)),
  'known_prob': ('fedau', dict(aggregation='known_prob')),
  'average_participating': (
    'fedau',
    dict(aggregation='average_participating'),
  ),
  'mifa': ('mifa', {}),
  'fedvarp': ('fedvarp', {}),
}

# Float32 engine vs the float64 reference, 8 rounds of 3 steps, weights of
# size ~1: measured 1.6e-7 to 2.4e-7.
ROUND_ATOL = 1e-6


def _engine_rounds(name, kwargs):
  kwargs = dict(kwargs)
  if kwargs.get('aggregation') == 'known_prob':
    kwargs['run'] = RunFacts(
      participation_probabilities=GOLDEN['rounds_probabilities']
    )
  server = optimizers.make_server_optimizer(
    'sgd', learning_rate=float(GOLDEN['rounds_lr_global'])
  )
  alg = algorithms.REGISTRY[name](
    fx.linear(), server_optimizer=server, **kwargs
  )
  images, labels = GOLDEN['rounds_images'], GOLDEN['rounds_labels']
  parts = _their_parts('rounds')
  mask = GOLDEN['rounds_mask']
  steps = int(GOLDEN['rounds_steps'])
  variables = fx.init_variables(fx.linear(), images)
  variables['params']['Dense_0'] = {
    'kernel': jnp.asarray(GOLDEN['rounds_kernel0'], jnp.float32),
    'bias': jnp.asarray(GOLDEN['rounds_bias0'], jnp.float32),
  }
  data = engine.DeviceData(jnp.asarray(images), jnp.asarray(labels, jnp.int32))
  state, table = engine.init_state(alg, variables, len(parts))
  round_fn = executors.make_round_fn(
    fx.make_spec(alg, lr=float(GOLDEN['rounds_lr'])), data, executor='vmap'
  )
  kernels, biases = [], []
  with jax.default_matmul_precision('highest'):
    for t in range(mask.shape[0]):
      cohort = fx.cohort(
        parts,
        np.flatnonzero(mask[t]),
        num_slots=len(parts),
        batch_size=int(GOLDEN['rounds_batch']),
        epochs=steps,
        num_steps=steps,
        round_idx=t,
      )
      state, table, _ = round_fn(state, table, cohort)
      dense = state.variables['params']['Dense_0']
      kernels.append(np.asarray(dense['kernel'], np.float64))
      biases.append(np.asarray(dense['bias'], np.float64))
  return np.array(kernels), np.array(biases)


def _round_diff(run, kernels, biases):
  return max(
    float(np.max(np.abs(kernels - GOLDEN[f'rounds_{run}_kernel']))),
    float(np.max(np.abs(biases - GOLDEN[f'rounds_{run}_bias']))),
  )


@pytest.mark.parametrize('run', list(ROUND_KINDS))
def test_rounds_match_authors_loop(run):
  assert run in list(GOLDEN['rounds_runs'])
  diff = _round_diff(run, *_engine_rounds(*ROUND_KINDS[run]))
  assert diff <= ROUND_ATOL, diff


def test_rounds_near_miss_cutoff():
  """K = 3 instead of 2 changes the weights of the recorded mask."""
  diff = _round_diff(
    'adaptive_k2',
    *_engine_rounds('fedau', dict(aggregation='adaptive', cutoff=3)),
  )
  assert diff > 1e3 * ROUND_ATOL, diff


def test_rounds_fixture_exercises_the_edges():
  mask = GOLDEN['rounds_mask']
  assert not mask.sum(1).all()  # a round nobody joins
  assert mask.sum(0).all()  # every client joins at least once
  # The recorded mask has participations after >= K rounds out (K closes an
  # interval before the client returns).
  omega_k2 = fedau_intervals.interval_weights(mask, cutoff=2)
  omega_k3 = fedau_intervals.interval_weights(mask, cutoff=3)
  assert np.any(omega_k2 != omega_k3)
