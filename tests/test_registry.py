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
from fedjax_metric.data import cohort as cohort_lib
from fedjax_metric.data import partition as partition_lib

SERVER = optimizers.make_server_optimizer('sgd')


def federation():
  images, labels = fx.make_data(96)
  parts = partition_lib.dirichlet(labels, 4, 1.0, seed=2, variant='per_class')
  data = engine.DeviceData(jnp.asarray(images), jnp.asarray(labels))
  return images, labels, parts, data


def cohorts(alg, parts, labels, rounds, *, batch_size=8):
  sizes = [len(p) for p in parts]
  s = cohort_lib.num_local_steps(
    sizes, batch_size=batch_size, local_epochs=1, local_steps=0
  )
  return [
    cohort_lib.make_cohort(
      np.asarray(ids),
      parts,
      num_slots=4,
      num_steps=s,
      batch_size=batch_size,
      local_epochs=1,
      local_steps=0,
      seed=0,
      round_idx=r,
      labels=labels,
      batches_fn=alg.client_batches,
    )
    for r, ids in enumerate(rounds)
  ]


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
  images, labels, parts, data = federation()
  model = fx.all_outputs()
  alg = algorithms.REGISTRY[name](model, server_optimizer=SERVER)
  variables = fx.init_variables(model, images)
  # Cohort sizes differ between rounds: the program must not recompile.
  round_cohorts = cohorts(alg, parts, labels, [[0, 1, 3], [1, 2]])
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
