"""Every registered algorithm, automatically: tests parametrised over REGISTRY.

A newly registered algorithm is picked up here with its default keyword
arguments (and with `NON_DEFAULT_OPTIONS`) and run for two rounds on a tiny
federation, on a model that returns every output any algorithm reads
(logits, embedding, projection, feature levels; BatchNorm included). It must
train (some state moves), keep every number finite, give the same state
under the vmap, chunked and host executors, and compile its single program
once."""

import fl_fixtures as fx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fedjax_metric import algorithms, engine, executors, optimizers

SERVER = optimizers.make_server_optimizer('sgd')


@pytest.mark.parametrize('name', sorted(algorithms.REGISTRY))
def test_vectorized_sampler_gives_the_per_client_schedule_shape(name):
  """Both samplers give a cohort of the same shapes and the same masks (which
  steps and columns are real is not random), with every real index drawn
  from the slot's own client; only the draws differ."""
  images, labels, parts, data = fx.dirichlet_federation()
  alg = algorithms.REGISTRY[name](
    fx.all_outputs(),
    server_optimizer=SERVER,
    run=fx.partition_facts(parts, labels),
  )
  rounds = [[0, 1, 3], [1, 2], []]  # the last: a round nobody joins
  per_client = fx.round_cohorts(alg, parts, labels, rounds)
  vectorized = fx.round_cohorts(
    alg, parts, labels, rounds, sampler='vectorized'
  )
  for a, b, ids in zip(per_client, vectorized, rounds):
    for field in ('client_ids', 'slot_mask', 'example_mask', 'num_examples'):
      np.testing.assert_array_equal(getattr(a, field), getattr(b, field))
    assert a.example_idx.shape == b.example_idx.shape
    for slot, client in enumerate(ids):
      real = b.example_idx[slot][b.example_mask[slot]]
      assert np.isin(real, parts[client]).all(), (name, client)
    if ids:
      assert not np.array_equal(a.example_idx, b.example_idx)


# Options that change what each algorithm computes (not its defaults), so the
# padding test below also covers the non-default code paths.
NON_DEFAULT_OPTIONS = {
  'deepsvdd': dict(reduction='sum'),
  'fedalignuniform': dict(uniform_weight=0.5),
  'fedau': dict(cutoff=5),
  'fedaws': dict(spreadout_steps_per_round=2),
  'feddecorr': dict(decorr_form='paper'),
  'feddecorr_supervised': dict(decorr_form='paper', decorr_weight=0.5),
  'fedmetric': dict(negatives='true', rescale=True),
  'fedlc': dict(tau=0.5),
  'fedmlb': dict(ce_weight=0.5, temperature=2.0),
  'fitnet': dict(beta=0.5, level=0),
  'fedproc': dict(feature='projection'),
  'fedntd': dict(beta=0.5, temperature=3.0),
  'fedppo': dict(select_fraction=1.0, update_every=2, reward_examples=5),
  'fedprox': dict(mu=0.1),
  'fedquad': dict(squared=True),
  'fedrcl': dict(beta=0.5),
  'fedscl': dict(temperature=0.2),
  'fedu2': dict(temperature=0.2),
  'feduv': dict(squared=True),
  'fedx': dict(temperature=0.2),
  'l_dawa': dict(temperature=0.2),
  'moon': dict(mu=0.5),
  'pmfl': dict(mixing_compensation=True, history_size=2),
  'quadrupletfl': dict(squared=True),
  'ssd': dict(dsr_weight=0.5),
  'supconfl': dict(temperature=0.2),
  'tripletfl': dict(squared=True),
}


# Algorithms whose aggregation weights are their own (participation
# statistics, or no average at all).
UNIFORM_ONLY = ('deepsvdd', 'fedau', 'fedvarp', 'mifa', 'pmfl')


def test_an_option_an_algorithm_does_not_use_is_refused():
  """Algorithms whose aggregation weights are their own refuse example-count
  weighting in one line instead of ignoring it."""
  model = fx.all_outputs()
  for name in UNIFORM_ONLY:
    with pytest.raises(ValueError, match=f'{name} does not use server.weight'):
      algorithms.REGISTRY[name](
        model, server_optimizer=SERVER, weighting='num_examples'
      )


@pytest.mark.parametrize('options', ['default', 'non_default'])
@pytest.mark.parametrize('name', sorted(algorithms.REGISTRY))
def test_executors_and_rounds_per_call_agree_with_padding_slots(name, options):
  """The round contract, for every algorithm. Three rounds: 3 and 2 clients
  in 4 slots, then a round nobody joins (what a participation pattern
  produces); chunks of 3, so a chunk is mostly or wholly padding.

  * The vmap, chunked and host executors give finite state and the same
    update (the host loop never trains a padding slot: the reference).
  * The state moves (it trained); the vmap program compiles once for all
    three cohorts.
  * With its defaults, the chunked executor runs the three rounds as one
    program (`engine.multi_round`, a scan over rounds of chunked rounds),
    which gives the state and per-round losses of three one-round vmap
    calls, client tables and server extras included, from one compiled
    program. (One program covers both: a chunked round inside the scan is
    the chunked executor's one-round program, `engine.single_program_round`;
    a separate one-round chunked run compiled a third copy of the round.)

  Run twice per algorithm: with its defaults under example-count weighting
  (uniform for the algorithms that refuse it), and with non-default options
  (`NON_DEFAULT_OPTIONS`) under uniform weighting by the vmap and host
  executors, so that every algorithm's default and non-default code paths
  and both weightings are covered. Before padding was masked by selection,
  SCAFFOLD with example-count weighting divided its control delta by a
  padding slot's zero weight and ended in NaN."""
  default = options == 'default'
  if default:
    kwargs = {} if name in UNIFORM_ONLY else dict(weighting='num_examples')
  else:
    kwargs = dict(NON_DEFAULT_OPTIONS.get(name, {}), weighting='uniform')
  images, labels, parts, data = fx.dirichlet_federation()
  model = fx.all_outputs()
  alg = algorithms.REGISTRY[name](
    model,
    server_optimizer=SERVER,
    run=fx.partition_facts(parts, labels),
    **kwargs,
  )
  variables = fx.init_variables(model, images)
  cohorts = fx.round_cohorts(alg, parts, labels, [[0, 1, 3], [1, 2], []])
  assert not cohorts[1].slot_mask.all()  # the test needs a padding slot
  spec = fx.make_spec(alg, lr=0.05)
  initial = engine.init_state(alg, variables, len(parts))
  results, losses = {}, {}
  runs = ('vmap', 'host', 'chunked, 3 rounds a call')
  for run in runs if default else ('vmap', 'host'):
    # A fresh state each run: the round programs donate their input.
    state, table = engine.init_state(alg, variables, len(parts))
    if run == 'chunked, 3 rounds a call':
      rounds_fn = executors.make_rounds_fn(
        spec, data, executor='chunked', chunk_size=3, rounds_per_call=3
      )
      state, table, metrics = rounds_fn(state, table, cohorts)
      losses[run] = list(np.asarray(metrics['train_loss_sum']))
      assert rounds_fn.jitted._cache_size() == 1
    else:
      # One local step per host call: the host reference then compiles one
      # step, not an unrolled block of all of them (6 s for fedu2's two-view
      # step). Blocks of several steps: tests/test_executors.py.
      round_fn = executors.make_round_fn(
        spec, data, executor=run, chunk_size=3, steps_per_call=1
      )
      losses[run] = []
      for cohort in cohorts:
        state, table, metrics = round_fn(state, table, cohort)
        losses[run].append(float(metrics['train_loss_sum']))
      if run == 'vmap':
        assert round_fn.jitted._cache_size() == 1
    assert np.isfinite(losses[run]).all(), (name, run, losses[run])
    assert losses[run][2] == 0.0, run  # nobody in round 3
    floats = [
      np.asarray(x)
      for x in jax.tree.leaves((state, table))
      if jnp.issubdtype(x.dtype, jnp.floating)
    ]
    assert all(np.isfinite(x).all() for x in floats), (name, run)
    assert int(state.round) == 3, run
    results[run] = (state, table)
  assert fx.max_abs_diff(results['vmap'], initial) > 1e-4  # It trained.
  # Uniformity / decorrelation losses (exponentials of pairwise distances,
  # normalised covariances) amplify float32 rounding: round-1 losses of the
  # executors agree to ~1e-7 relative, round-2 parameters to ~3.4e-4.
  amplifying = {'fedalignuniform', 'feddecorr', 'fedu2', 'ssd'}
  tolerance = max(fx.executor_tolerance(), 1e-3 if name in amplifying else 0)
  for run in results:
    difference = fx.max_abs_diff(results[run], results['host'])
    assert difference < tolerance, (run, difference)
  if default:
    # Inside the scan XLA fuses differently, so the round-1 state differs
    # in the last bits (1e-8 to 1e-6, checked for every algorithm).
    many, one = losses['chunked, 3 rounds a call'], losses['vmap']
    np.testing.assert_allclose(many[0], one[0], rtol=1e-6)
    np.testing.assert_allclose(
      many, one, rtol=1e-2 if name in amplifying else 1e-5
    )


@pytest.mark.parametrize('name', ['scaffold', 'fedavg', 'fedau', 'pmfl'])
def test_hooks_give_a_padding_slot_finite_outputs(name):
  """No hook produces inf or NaN for a padding slot (no steps, zero examples)
  under example-count weighting: the engine masks padding by selection, and
  a hook's own outputs stay finite too."""
  images, labels, parts, data = fx.dirichlet_federation()
  model = fx.all_outputs()
  weighting = 'uniform' if name in UNIFORM_ONLY else 'num_examples'
  alg = algorithms.REGISTRY[name](
    model, server_optimizer=SERVER, weighting=weighting
  )
  variables = fx.init_variables(model, images)
  (cohort,) = fx.round_cohorts(alg, parts, labels, [[1, 2]])
  pad = int(np.flatnonzero(~cohort.slot_mask)[0])
  assert cohort.num_examples[pad] == 0
  state, table = engine.init_state(alg, variables, len(parts))
  rows = engine.gather_rows(table, cohort.client_ids)
  update, weight, new_row, _ = engine.client_update(
    fx.make_spec(alg, lr=0.05),
    data,
    state,
    jax.tree.map(lambda x: x[pad], rows),
    cohort.client_ids[pad],
    pad,
    cohort.example_idx[pad],
    cohort.example_mask[pad],
    cohort.num_examples[pad],
    unroll=1,
  )
  assert np.isfinite(float(weight))
  for leaf in jax.tree.leaves((update, new_row)):
    if jnp.issubdtype(leaf.dtype, jnp.floating):
      assert np.isfinite(np.asarray(leaf)).all(), name
