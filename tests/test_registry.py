"""Every registered algorithm, automatically: one test per REGISTRY entry.

A newly registered algorithm is picked up here with its default keyword
arguments and run for two rounds on a tiny federation, on a model that
returns every output any algorithm reads (logits, embedding, projection,
feature levels; BatchNorm included). It must train (some state moves), keep
every number finite, give the same state under the vmap and host executors,
and compile its single program once.
"""

import fl_fixtures as fx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fedjax_metric import algorithms, engine, executors, optimizers

SERVER = optimizers.make_server_optimizer('sgd')


def run(alg, variables, parts, data, round_cohorts, executor):
  state, table = engine.init_state(alg, variables, len(parts))
  round_fn = executors.make_round_fn(
    fx.make_spec(alg, lr=0.05), data, executor=executor, steps_per_call=100
  )
  losses = []
  for c in round_cohorts:
    state, table, metrics = round_fn(state, table, c)
    losses.append(float(metrics['train_loss_sum']))
  return state, table, losses, round_fn


@pytest.mark.parametrize('name', sorted(algorithms.REGISTRY))
def test_registered_algorithm_trains_and_executors_agree(name):
  images, labels, parts, data = fx.dirichlet_federation()
  model = fx.all_outputs()
  alg = algorithms.REGISTRY[name](model, server_optimizer=SERVER)
  variables = fx.init_variables(model, images)
  # Cohort sizes differ between rounds: the program must not recompile.
  round_cohorts = fx.round_cohorts(alg, parts, labels, [[0, 1, 3], [1, 2]])
  initial = engine.init_state(alg, variables, len(parts))
  results = {}
  for executor in ('vmap', 'host'):
    state, table, losses, round_fn = run(
      alg, variables, parts, data, round_cohorts, executor
    )
    assert all(np.isfinite(losses)), (executor, losses)
    leaves = jax.tree.leaves((state, table))
    assert all(
      np.all(np.isfinite(np.asarray(x)))
      for x in leaves
      if jnp.issubdtype(x.dtype, jnp.floating)
    ), executor
    results[executor] = (state, table)
    if executor == 'vmap':
      assert round_fn.jitted._cache_size() == 1
  assert fx.max_abs_diff(results['vmap'], initial) > 1e-4  # It trained.
  # Uniformity / decorrelation losses (exponentials of pairwise distances,
  # normalised covariances) amplify float32 rounding: round-1 losses of the
  # two executors agree to ~1e-7 relative, round-2 parameters to ~3.4e-4.
  amplifying = {'fedalignuniform', 'feddecorr', 'fedu2'}
  tolerance = max(fx.executor_tolerance(), 1e-3 if name in amplifying else 0)
  assert fx.max_abs_diff(results['vmap'], results['host']) < tolerance


@pytest.mark.parametrize('name', sorted(algorithms.REGISTRY))
def test_vectorized_sampler_gives_the_per_client_schedule_shape(name):
  """Both samplers give a cohort of the same shapes and the same masks (which
  steps and columns are real is not random), with every real index drawn
  from the slot's own client; only the draws differ."""
  images, labels, parts, data = fx.dirichlet_federation()
  alg = algorithms.REGISTRY[name](fx.all_outputs(), server_optimizer=SERVER)
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
