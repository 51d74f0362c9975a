"""Memory: the client table is sized before it exists, and the chunked
executor's chunk size comes from a per-device budget."""

from algorithms.participation_helpers import server
import fl_fixtures as fx
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from test_experiment import load_config

from fedjax_metric import (
  algorithms,
  assemble,
  engine,
  executors,
  experiment,
  memory,
  models,
  optimizers,
)
from fedjax_metric.algorithms import fedavg, moon
from fedjax_metric.data import cohort as cohort_lib
from fedjax_metric.data import partition as partition_lib

SGD_SERVER = optimizers.make_server_optimizer('sgd')
MIB = 1024**2


def test_choose_chunk_size_by_hand():
  # 100 MiB fixed, 10 MiB per slot, 200 MiB budget -> 10 slots per device.
  assert memory.choose_chunk_size(100 * MIB, 10 * MIB, 200 * MIB, 1000) == 10
  # Over 4 devices each holds k / 4 slots: k = 40.
  assert memory.choose_chunk_size(100 * MIB, 10 * MIB, 200 * MIB, 1000, 4) == 40
  # Never more than the cohort (rounded up to the device count).
  assert memory.choose_chunk_size(100 * MIB, 10 * MIB, 200 * MIB, 6) == 6
  assert memory.choose_chunk_size(100 * MIB, 10 * MIB, 200 * MIB, 6, 4) == 8


def test_choose_chunk_size_fails_clearly_when_one_slot_does_not_fit():
  with pytest.raises(memory.MemoryBudgetError, match='batch_size'):
    memory.choose_chunk_size(100 * MIB, 150 * MIB, 200 * MIB, 10)


def test_chunk_memory_model_predicts_a_larger_chunk():
  """Two compiles fix the line; XLA's own analysis at k = 6 must lie on it."""
  images, labels = fx.make_data(72)
  parts = partition_lib.iid(labels, 6, seed=0)
  model = fx.cnn()
  alg = fedavg.build(model, server_optimizer=SGD_SERVER)
  data = engine.DeviceData(jnp.asarray(images), jnp.asarray(labels))
  spec = fx.make_spec(alg)
  state, table = engine.init_state(alg, fx.init_variables(model, images), 6)
  example_shape = (5, 8)
  fixed, per_slot = executors.chunk_memory_model(
    spec, data, state, table, example_shape
  )
  # Arguments alone (data, state) are a floor for the fixed part.
  assert fixed >= memory.tree_bytes((data, state)) - 64
  assert per_slot > 0
  cohort = fx.cohort(parts, list(range(6)), num_slots=6, num_steps=5)
  analysis = (
    executors.make_single_program_round_fn(spec, data, chunk_size=6)
    .jitted.lower(state, table, cohort, data)
    .compile()
    .memory_analysis()
  )
  actual = (
    analysis.argument_size_in_bytes
    + analysis.temp_size_in_bytes
    + analysis.output_size_in_bytes
    - analysis.alias_size_in_bytes
  )
  predicted = fixed + 6 * per_slot
  if jax.default_backend() == 'cpu':
    np.testing.assert_allclose(actual, predicted, rtol=0.15)
  else:
    # A GPU's buffer assignment is not linear in k for programs this small
    # (an H100: 119 kB at k = 6 against 174 kB from the line through k = 1
    # and 2). The chunk size only needs an upper bound that is not wildly
    # loose: what it must never do is promise less than XLA then takes.
    assert actual <= 1.15 * predicted and predicted <= 2.0 * actual


def abstract_variables(model, shape):
  return jax.eval_shape(
    model.init, jax.random.key(0), jnp.zeros((1, *shape), jnp.float32)
  )


def test_moon_table_at_10000_clients_is_sized_without_allocating():
  """MOON keeps one ResNet-18 per client: 10,000 x 44.7 MB = 447 GB."""
  model = models.build('resnet18', 10, (32, 32, 3))
  variables = abstract_variables(model, (32, 32, 3))
  alg = moon.SPEC(model, server_optimizer=SGD_SERVER)
  row = memory.tree_bytes(variables)
  assert memory.client_table_bytes(alg, variables, 10_000) == 10_000 * row
  assert 40e6 < row < 50e6  # 11.2M float32 parameters (+ BN statistics).
  with pytest.raises(memory.MemoryBudgetError) as error:
    memory.check_client_table_fits(
      memory.client_table_bytes(alg, variables, 10_000),
      10_000,
      memory.default_memory_budget(),
    )
  message = str(error.value)
  assert '10,000 clients' in message and 'num_clients' in message
  assert 'memory_budget_gb' in message


def test_a_table_over_budget_is_refused_and_one_at_budget_is_built():
  images, _ = fx.make_data(8)
  model = fx.cnn()
  variables = fx.init_variables(model, images)
  alg = moon.SPEC(model, server_optimizer=SGD_SERVER)
  need = memory.client_table_bytes(alg, variables, 10_000)
  with pytest.raises(memory.MemoryBudgetError, match='10,000 clients'):
    memory.check_client_table_fits(need, 10_000, need - 1)
  fits = memory.client_table_bytes(alg, variables, 500)
  memory.check_client_table_fits(fits, 500, fits)  # Exactly at the budget.
  _, table = engine.init_state(alg, variables, 500)
  assert memory.tree_bytes(table) == fits


def test_train_refuses_a_table_over_budget_before_allocating(tmp_path):
  """On the device by request, a table over the budget is refused before
  anything is written; 'auto' would put it in host memory
  (tests/test_client_table.py)."""
  config = load_config('moon')
  config.memory_budget_gb = 1e-6
  config.client_table.placement = 'device'
  with pytest.raises(memory.MemoryBudgetError, match='clients'):
    experiment.run(config, str(tmp_path / 'moon'))
  assert not (tmp_path / 'moon').exists()


def test_stateless_algorithms_need_no_table():
  images, _ = fx.make_data(8)
  model = fx.cnn()
  alg = fedavg.build(model, server_optimizer=SGD_SERVER)
  assert (
    memory.client_table_bytes(alg, fx.init_variables(model, images), 10_000)
    == 0
  )


def test_train_picks_the_chunk_size_from_the_budget(tmp_path):
  config = load_config('fedavg')
  config.num_rounds = 1
  config.executor = 'chunked'
  config.chunk_size = 0
  roomy = experiment.run(config, str(tmp_path / 'roomy'))
  assert roomy['executor'] == 'chunked'
  assert roomy['chunk_size'] == assemble.num_cohort_slots(
    config, jax.device_count()
  )


def test_train_fails_clearly_when_one_client_cannot_fit(tmp_path):
  config = load_config('fedavg')
  config.executor = 'chunked'
  config.chunk_size = 0
  config.memory_budget_gb = 1e-6  # 1 KiB: not even the model fits.
  with pytest.raises(memory.MemoryBudgetError, match='batch_size'):
    experiment.run(config, str(tmp_path / 'tight'))


def test_auto_falls_back_to_chunks_that_fit_for_fedquad():
  """`auto` on an accelerator: vmap when the cohort fits the budget, else
  the largest chunk that does. FedQuad's steps are 4B rows wide (anchor,
  positive, two negatives): the memory model sees that width, and the
  chunked round it picks equals the vmapped one."""
  images, labels = fx.make_data(96)
  parts = partition_lib.iid(labels, 8, seed=0)
  model = fx.cnn()
  alg = algorithms.REGISTRY['fedquad'](model, server_optimizer=SGD_SERVER)
  data = engine.DeviceData(jnp.asarray(images), jnp.asarray(labels))
  spec = fx.make_spec(alg)
  variables = fx.init_variables(model, images)
  cohort = cohort_lib.make_cohort(
    np.arange(8),
    parts,
    num_slots=8,
    num_steps=2,
    batch_size=4,
    local_epochs=1,
    local_steps=2,
    seed=0,
    round_idx=0,
    labels=labels,
    batches_fn=alg.client_batches,
  )
  assert cohort.example_idx.shape[2] == 16  # 4 groups of B = 4.
  state, table = engine.init_state(alg, variables, 8)
  fixed, per_slot = executors.chunk_memory_model(
    spec, data, state, table, cohort.example_idx.shape[1:]
  )
  auto = executors.choose_executor('auto', backend='gpu', process_count=1)
  assert auto.name == 'vmap' and auto.fit_to_memory
  model_fn = lambda: (fixed, per_slot)
  roomy = executors.fit_to_memory(
    auto, model_fn, num_slots=8, memory_budget=fixed + 100 * per_slot
  )
  assert (roomy.name, roomy.chunk_size) == ('vmap', 0)
  tight = executors.fit_to_memory(
    auto, model_fn, num_slots=8, memory_budget=fixed + 3 * per_slot + 1
  )
  assert (tight.name, tight.chunk_size) == ('chunked', 3)
  results = []
  for choice in (roomy, tight):
    state, table = engine.init_state(alg, variables, 8)
    round_fn = executors.make_round_fn(spec, data, executor=choice)
    state, _, _ = round_fn(state, table, cohort)
    results.append(state.variables)
  assert fx.max_abs_diff(*results) < 1e-5


def test_client_table_sizes_and_memory_check():
  model = fx.linear()
  images, _ = fx.make_data(8)
  variables = fx.init_variables(model, images)
  model_bytes = memory.tree_bytes(variables)
  for name in ('mifa', 'fedvarp'):
    alg = algorithms.REGISTRY[name](model, server_optimizer=server(1.0))
    assert memory.client_table_bytes(alg, variables, 250) == 250 * model_bytes
  alg = algorithms.REGISTRY['pmfl'](
    model, server_optimizer=server(1.0), buffer_size=5
  )
  # Five buffered models, the previous local model, two int32 counters.
  assert memory.client_table_bytes(alg, variables, 250) == 250 * (
    6 * model_bytes + 8
  )
  with pytest.raises(memory.MemoryBudgetError, match='250 clients'):
    memory.check_client_table_fits(
      memory.client_table_bytes(alg, variables, 250), 250, model_bytes
    )
