"""The clients axis sharded over four simulated devices equals one device."""

import fl_fixtures as fx
import jax
import numpy as np
import pytest
from test_engine import federation, run_rounds

from fedjax_metric import engine, executors, sharding


def test_sharded_over_four_devices_equals_one_device():
  # Simulated CPU devices (conftest.py), also on a machine with one GPU.
  assert len(jax.devices('cpu')) >= 4, 'conftest sets 4 simulated CPU devices'
  _, alg, data, parts, variables = federation()
  cohorts = [
    fx.cohort(parts, ids, num_slots=4, round_idx=r)
    for r, ids in enumerate([[0, 2, 5], [1, 3, 4, 5]])
  ]
  one, _, _ = run_rounds(
    'vmap',
    alg,
    data,
    parts,
    variables,
    cohorts,
    mesh=sharding.make_mesh(1, backend='cpu'),
  )
  mesh4 = sharding.make_mesh(4, backend='cpu')
  four, _, round_fn = run_rounds(
    'vmap',
    alg,
    sharding.replicate(data, mesh4),
    parts,
    variables,
    cohorts,
    mesh=mesh4,
  )
  assert (
    len(four.variables['params']['Dense_0']['kernel'].sharding.device_set) == 4
  )
  assert fx.max_abs_diff(one.variables, four.variables) < 1e-5
  hlo = (
    round_fn.jitted.lower(
      *sharding.replicate(engine.init_state(alg, variables, 6), mesh4),
      sharding.shard_cohort(cohorts[0], mesh4),
      sharding.replicate(data, mesh4),
    )
    .compile()
    .as_text()
  )
  assert 'all-reduce' in hlo  # The weighted sum became a cross-device reduce.


@pytest.mark.parametrize('executor', ['vmap', 'chunked'])
def test_rounds_in_one_program_sharded_over_four_devices(executor):
  """Two rounds as one program (a scan over rounds) with the clients axis
  of the stacked [R, C, ...] cohorts split over 4 devices: the result of two
  one-round calls on one device, and the scan body still all-reduces."""
  _, alg, data, parts, variables = federation()
  cohorts = [
    fx.cohort(parts, ids, num_slots=4, round_idx=r)
    for r, ids in enumerate([[0, 2, 5], [1, 3, 4, 5]])
  ]
  one, _, _ = run_rounds('vmap', alg, data, parts, variables, cohorts)
  mesh4 = sharding.make_mesh(4, backend='cpu')
  state, table, data4 = sharding.replicate(
    (*engine.init_state(alg, variables, len(parts)), data), mesh4
  )
  rounds_fn = executors.make_rounds_fn(
    fx.make_spec(alg, momentum=0.9),
    data4,
    executor=executor,
    chunk_size=4 if executor == 'chunked' else 0,
    rounds_per_call=2,
    mesh=mesh4,
  )
  four, _, metrics = rounds_fn(state, table, cohorts)
  assert metrics['train_loss_sum'].shape == (2,)
  assert fx.max_abs_diff(one.variables, four.variables) < 1e-5
  stacked = sharding.shard_cohort(
    jax.tree.map(lambda *x: np.stack(x), *cohorts), mesh4, stacked=True
  )
  assert len(stacked.example_idx.sharding.device_set) == 4
  hlo = (
    rounds_fn.jitted.lower(
      *sharding.replicate(engine.init_state(alg, variables, 6), mesh4),
      stacked,
      data4,
    )
    .compile()
    .as_text()
  )
  assert 'all-reduce' in hlo


def test_chunked_sharded_over_four_devices_equals_vmap_on_one():
  """Chunks interleave slots (j, j + m, ...), so a sharded clients axis keeps
  every device busy in every chunk; the result must not depend on it."""
  _, alg, data, parts, variables = federation()
  cohorts = [
    fx.cohort(parts, ids, num_slots=8, round_idx=r)
    for r, ids in enumerate([[0, 2, 5], [1, 3, 4, 5, 0, 2]])
  ]
  one, _, _ = run_rounds(
    'vmap',
    alg,
    data,
    parts,
    variables,
    cohorts,
    mesh=sharding.make_mesh(1, backend='cpu'),
  )
  mesh4 = sharding.make_mesh(4, backend='cpu')
  four, _, round_fn = run_rounds(
    'chunked',
    alg,
    sharding.replicate(data, mesh4),
    parts,
    variables,
    cohorts,
    mesh=mesh4,
    chunk_size=4,
  )
  assert fx.max_abs_diff(one.variables, four.variables) < 1e-5
  assert round_fn.jitted._cache_size() == 1
