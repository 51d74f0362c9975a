"""Executors (vmap, chunked, sequential, host): the same result, one
compilation each, clear errors, no implicit transfers inside a round."""

import fl_fixtures as fx
import jax
import numpy as np
import pytest
from test_engine import federation, run_rounds

from fedjax_metric import engine, executors


@pytest.mark.parametrize('norm', ['none', 'batch'])
def test_executors_agree(norm):
  _, alg, data, parts, variables = federation(norm=norm)
  cohorts = [
    fx.cohort(parts, ids, num_slots=4, round_idx=r)
    for r, ids in enumerate([[0, 2, 5], [1, 3, 4, 5]])
  ]
  results = {}
  # host with 2 steps per call runs blocks; with 100 it fuses each client.
  for name, executor, chunk, per_call in [
    ('vmap', 'vmap', 0, 2),
    ('sequential', 'sequential', 0, 2),
    ('chunked', 'chunked', 2, 2),
    ('host', 'host', 0, 2),
    ('host fused', 'host', 0, 100),
  ]:
    state, metrics, _ = run_rounds(
      executor,
      alg,
      data,
      parts,
      variables,
      cohorts,
      chunk_size=chunk,
      steps_per_call=per_call,
    )
    results[name] = (state.variables, metrics)
  reference, ref_metrics = results['vmap']
  assert fx.max_abs_diff(reference, variables) > 1e-3  # Training moved it.
  for executor, (result, metrics) in results.items():
    assert fx.max_abs_diff(reference, result) < 1e-5, executor
    np.testing.assert_allclose(
      metrics['train_loss_sum'], ref_metrics['train_loss_sum'], rtol=1e-5
    )


def test_single_program_compiles_once():
  _, alg, data, parts, variables = federation()
  # Different real cohort sizes and different clients (sizes) every round.
  cohorts = [
    fx.cohort(parts, ids, num_slots=4, round_idx=r, num_steps=5)
    for r, ids in enumerate([[0], [1, 2, 3], [2, 4, 5, 0]])
  ]
  _, _, round_fn = run_rounds('vmap', alg, data, parts, variables, cohorts)
  assert round_fn.jitted._cache_size() == 1


def test_host_loop_compiles_once():
  _, alg, data, parts, variables = federation()
  cohorts = [
    fx.cohort(parts, ids, num_slots=4, round_idx=r, num_steps=6)
    for r, ids in enumerate([[0], [1, 2, 3], [2, 4, 5, 0]])
  ]
  _, _, round_fn = run_rounds('host', alg, data, parts, variables, cohorts)
  for name, fn in round_fn.fns._asdict().items():
    # 6 steps in blocks of 2: the fused one-block path is never taken.
    assert fn._cache_size() == (0 if name == 'whole_client' else 1), name
  # All 6 steps in one block: one fused call per client, compiled once.
  _, _, round_fn = run_rounds(
    'host', alg, data, parts, variables, cohorts, steps_per_call=6
  )
  assert round_fn.fns.whole_client._cache_size() == 1
  assert round_fn.fns.steps._cache_size() == 0


@pytest.mark.parametrize('steps_per_call', [0, -2])
def test_the_host_loop_refuses_blocks_of_no_steps_when_built(steps_per_call):
  _, alg, data, _, _ = federation()
  with pytest.raises(ValueError, match='use steps_per_call >= 1'):
    executors.make_round_fn(
      fx.make_spec(alg),
      data,
      executor='host',
      steps_per_call=steps_per_call,
    )


@pytest.mark.parametrize('chunk_size', [3, 5])
def test_chunk_size_that_does_not_divide_the_cohort(chunk_size):
  _, alg, data, parts, variables = federation()
  cohorts = [fx.cohort(parts, [0, 2, 5, 1], num_slots=4)]
  a, _, _ = run_rounds('vmap', alg, data, parts, variables, cohorts)
  b, _, _ = run_rounds(
    'chunked', alg, data, parts, variables, cohorts, chunk_size=chunk_size
  )
  assert fx.max_abs_diff(a.variables, b.variables) < 1e-5


@pytest.mark.parametrize(
  'executor,chunk_size',
  [('vmap', 0), ('sequential', 0), ('chunked', 2), ('host', 0)],
)
def test_no_implicit_transfer_inside_a_round(executor, chunk_size):
  """Under ``transfer_guard('disallow')`` only explicit ``device_put`` may move
  data: the cohort's index arrays. The host executor reads the masks on the
  host, so it is given the NumPy cohort and puts each slot's indices itself."""
  _, alg, data, parts, variables = federation(norm='batch')
  spec = fx.make_spec(alg, momentum=0.9)
  state, table = engine.init_state(alg, variables, len(parts))
  round_fn = executors.make_round_fn(
    spec, data, executor=executor, chunk_size=chunk_size, steps_per_call=2
  )
  cohorts = [
    fx.cohort(parts, ids, num_slots=4, round_idx=r)
    for r, ids in enumerate([[0, 2, 5], [1, 3, 4]])
  ]
  state, table, _ = round_fn(state, table, cohorts[0])  # Compiles.
  cohort = cohorts[1] if executor == 'host' else jax.device_put(cohorts[1])
  with jax.transfer_guard('disallow'):
    state, table, metrics = round_fn(state, table, cohort)
  assert float(metrics['train_examples']) > 0


def test_unknown_executor_is_a_clear_error():
  _, alg, data, _, _ = federation()
  with pytest.raises(ValueError, match='Unknown executor'):
    executors.make_round_fn(fx.make_spec(alg), data, executor='pmap')
  with pytest.raises(ValueError, match='chunk_size'):
    executors.make_round_fn(fx.make_spec(alg), data, executor='chunked')
