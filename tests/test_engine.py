"""Engine properties: executors agree, one compile, padding is inert, sharding
is transparent, and one FedAvg step equals a hand-derived SGD step."""

import fl_fixtures as fx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fedjax_metric import engine, executors, optimizers, sharding
from fedjax_metric.algorithms import fedavg
from fedjax_metric.data import partition as partition_lib

SGD_SERVER = optimizers.make_server_optimizer('sgd')


def federation(model_fn=fx.cnn, num_clients=6, alpha=0.5, norm='none'):
  images, labels = fx.make_data(72)
  parts = partition_lib.dirichlet(
    labels, num_clients, alpha, seed=1, variant='per_class'
  )
  model = model_fn(norm) if model_fn is fx.cnn else model_fn()
  alg = fedavg.make(model, server_optimizer=SGD_SERVER)
  data = engine.DeviceData(jnp.asarray(images), jnp.asarray(labels))
  return model, alg, data, parts, fx.init_variables(model, images)


def run_rounds(
  executor,
  alg,
  data,
  parts,
  variables,
  cohorts,
  *,
  mesh=None,
  chunk_size=0,
  spec=None,
  steps_per_call=2,
):
  spec = spec or fx.make_spec(alg, momentum=0.9)
  state, table = engine.init_state(alg, variables, len(parts))
  if mesh is not None:
    state, table, data = sharding.replicate((state, table, data), mesh)
  round_fn = executors.make_round_fn(
    spec,
    data,
    executor=executor,
    chunk_size=chunk_size,
    steps_per_call=steps_per_call,
  )
  for c in cohorts:
    c = sharding.shard_cohort(c, mesh) if mesh is not None else c
    state, table, metrics = round_fn(state, table, c)
  return state, metrics, round_fn


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


@pytest.mark.parametrize('executor', ['vmap', 'host'])
def test_padding_slots_change_nothing(executor):
  _, alg, data, parts, variables = federation()
  small = [fx.cohort(parts, [1, 4], num_slots=2, num_steps=5)]
  padded = [fx.cohort(parts, [1, 4], num_slots=6, num_steps=5)]
  a, _, _ = run_rounds(executor, alg, data, parts, variables, small)
  b, _, _ = run_rounds(executor, alg, data, parts, variables, padded)
  # Only float reassociation of the longer weighted sum may differ.
  assert fx.max_abs_diff(a.variables, b.variables) < 1e-6


@pytest.mark.parametrize('norm', ['none', 'batch'])
def test_padded_examples_and_steps_change_nothing(norm):
  """A 10-example client: batch 10 in 1 step == batch 16 (6 padded) in 3 steps
  (2 of them padded). Padded rows point at other clients' examples."""
  _, alg, data, _, variables = federation(norm=norm)
  parts = [np.arange(10), np.arange(10, 72)]
  tight = fx.cohort(parts, [0], num_slots=1, batch_size=10, num_steps=1)
  loose = fx.cohort(parts, [0], num_slots=1, batch_size=16, num_steps=3)
  loose.example_idx[0][~loose.example_mask[0]] = 50  # Junk, masked.
  # Same example order in the real rows.
  np.testing.assert_array_equal(
    np.sort(loose.example_idx[0, 0, :10]), np.sort(tight.example_idx[0, 0])
  )
  loose.example_idx[0, 0, :10] = tight.example_idx[0, 0]
  a, _, _ = run_rounds('vmap', alg, data, parts, variables, [tight])
  b, _, _ = run_rounds('vmap', alg, data, parts, variables, [loose])
  assert fx.max_abs_diff(a.variables, b.variables) < 1e-6


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


def softmax(z):
  z = z - z.max(-1, keepdims=True)
  e = np.exp(z)
  return e / e.sum(-1, keepdims=True)


def softmax_regression():
  """60 examples, FedAvg on the linear model: gradients we can write by hand."""
  images, labels = fx.make_data(60)
  model = fx.linear()
  alg = fedavg.make(model, server_optimizer=SGD_SERVER)
  data = engine.DeviceData(jnp.asarray(images), jnp.asarray(labels))
  return images, labels, alg, fx.init_variables(model, images), data


@pytest.mark.parametrize('executor', ['vmap', 'host', 'chunked'])
def test_local_epoch_decay_scales_each_epochs_steps(executor):
  """FedRCL's per-epoch LambdaLR: a 12-example client, batch 8 (2 steps per
  epoch, the second half full), 2 epochs, decay 0.5: steps 0-1 at lr, steps
  2-3 at lr / 2. Reference: the same four SGD steps in NumPy."""
  images, labels, alg, variables, data = softmax_regression()
  parts = [np.arange(12), np.arange(12, 60)]
  c = fx.cohort(parts, [0], num_slots=1, batch_size=8, epochs=2, num_steps=4)
  assert c.example_mask[0].sum(1).tolist() == [8, 4, 8, 4]
  spec = fx.make_spec(alg, lr=0.3)._replace(local_epoch_decay=0.5)
  state, _, _ = run_rounds(
    executor, alg, data, parts, variables, [c], spec=spec, chunk_size=1
  )

  w = np.asarray(variables['params']['Dense_0']['kernel'], np.float64)
  b = np.asarray(variables['params']['Dense_0']['bias'], np.float64)
  for step, lr in enumerate([0.3, 0.3, 0.15, 0.15]):
    real = c.example_mask[0, step]
    idx = c.example_idx[0, step][real]
    x = images[idx].reshape(len(idx), -1).astype(np.float64) / 255.0
    err = softmax(x @ w + b) - np.eye(fx.NUM_CLASSES)[labels[idx]]
    w, b = w - lr * x.T @ err / len(idx), b - lr * err.mean(0)
  got = state.variables['params']['Dense_0']
  np.testing.assert_allclose(got['kernel'], w, atol=1e-5)
  np.testing.assert_allclose(got['bias'], b, atol=1e-5)


@pytest.mark.parametrize('executor', ['vmap', 'host'])
def test_one_client_one_step_is_one_sgd_step(executor):
  """Independent reference: softmax regression, gradient derived by hand:
  dL/dW = X^T (softmax(XW + b) - Y) / B, dL/db = mean(softmax - Y)."""
  images, labels, alg, variables, data = softmax_regression()
  parts = [np.arange(8), np.arange(8, 60)]
  c = fx.cohort(parts, [0], num_slots=1, batch_size=8, num_steps=1)
  state, _, _ = run_rounds(
    executor, alg, data, parts, variables, [c], spec=fx.make_spec(alg, lr=0.3)
  )

  w = np.asarray(variables['params']['Dense_0']['kernel'], np.float64)
  b = np.asarray(variables['params']['Dense_0']['bias'], np.float64)
  idx = c.example_idx[0, 0]
  x = images[idx].reshape(8, -1).astype(np.float64) / 255.0
  y = np.eye(fx.NUM_CLASSES)[labels[idx]]
  err = softmax(x @ w + b) - y
  expected_w = w - 0.3 * x.T @ err / 8
  expected_b = b - 0.3 * err.mean(0)
  got = state.variables['params']['Dense_0']
  np.testing.assert_allclose(got['kernel'], expected_w, atol=1e-5)
  np.testing.assert_allclose(got['bias'], expected_b, atol=1e-5)


def test_aggregation_weights_by_client_size():
  """Two clients, one full-batch step each: server = size-weighted mean of the
  two hand-computed local models."""
  images, labels = fx.make_data(60)
  model = fx.linear()
  variables = fx.init_variables(model, images)
  parts = [np.arange(4), np.arange(4, 16)]
  data = engine.DeviceData(jnp.asarray(images), jnp.asarray(labels))
  w = np.asarray(variables['params']['Dense_0']['kernel'], np.float64)
  b = np.asarray(variables['params']['Dense_0']['bias'], np.float64)
  for weighting, weights in [('num_examples', (4, 12)), ('uniform', (1, 1))]:
    alg = fedavg.make(model, server_optimizer=SGD_SERVER, weighting=weighting)
    c = fx.cohort(parts, [0, 1], num_slots=2, batch_size=12, num_steps=1)
    state, _, _ = run_rounds(
      'vmap', alg, data, parts, variables, [c], spec=fx.make_spec(alg, lr=0.5)
    )
    local = []
    for slot, n in enumerate((4, 12)):
      idx = c.example_idx[slot, 0, :n]
      x = images[idx].reshape(n, -1).astype(np.float64) / 255.0
      err = softmax(x @ w + b) - np.eye(fx.NUM_CLASSES)[labels[idx]]
      local.append(w - 0.5 * x.T @ err / n)
    expected = (weights[0] * local[0] + weights[1] * local[1]) / sum(weights)
    np.testing.assert_allclose(
      state.variables['params']['Dense_0']['kernel'],
      expected,
      atol=1e-5,
      err_msg=weighting,
    )


def test_client_table_gather_and_scatter_drop_padding():
  table = {'count': jnp.zeros((5,), jnp.int32)}
  ids = jnp.asarray([3, 0, 5, 5])  # 5 == N: padding.
  rows = engine.gather_rows(table, ids)
  table = engine.scatter_rows(table, ids, jax.tree.map(lambda r: r + 1, rows))
  np.testing.assert_array_equal(table['count'], [1, 0, 0, 1, 0])


def test_unknown_executor_is_a_clear_error():
  _, alg, data, _, _ = federation()
  with pytest.raises(ValueError, match='Unknown executor'):
    executors.make_round_fn(fx.make_spec(alg), data, executor='pmap')
  with pytest.raises(ValueError, match='chunk_size'):
    executors.make_round_fn(fx.make_spec(alg), data, executor='chunked')


def counting_algorithm(model):
  """FedAvg plus every stateful slot, each counting something checkable:
  table row = (times sampled, live steps taken so far, last slot); local
  state = steps this round; server extra = participants per client seen by
  server_update. The context's step count, slot and example count are
  recorded too."""
  base = fedavg.make(model, server_optimizer=SGD_SERVER)

  def init_client(variables, key):
    del variables, key
    zero = jnp.zeros((), jnp.int32)
    return {
      'sampled': zero,
      'steps': zero,
      'slot': zero - 1,
      'ctx_steps': jnp.zeros((), jnp.float32),
      'examples': jnp.zeros((), jnp.float32),
      'label_sum': zero,
    }

  def init_server(variables, num_clients, key):
    state = base.init_server(variables, num_clients, key)
    return state._replace(extra=jnp.zeros((num_clients,), jnp.int32))

  def client_begin(ctx):
    variables, _ = base.client_begin(ctx)
    # Sum of the labels of the round's real examples, through scan_batches.
    label_sum = ctx.scan_batches(
      lambda total, batch: (
        total + jnp.sum(jnp.where(batch.mask, batch.labels, 0))
      ),
      jnp.zeros((), jnp.int32),
    )
    return variables, {
      'steps': jnp.zeros((), jnp.int32),
      'label_sum': label_sum,
    }

  def client_step_end(ctx, params, model_state):
    del params, model_state
    return {**ctx.local_state, 'steps': ctx.local_state['steps'] + 1}

  def client_final(ctx, end_variables):
    update, weight, _ = base.client_final(ctx, end_variables)
    row = ctx.client_row
    return (
      update,
      weight,
      {
        'sampled': row['sampled'] + 1,
        'steps': row['steps'] + ctx.local_state['steps'],
        'slot': ctx.slot,
        'ctx_steps': ctx.num_steps,
        'examples': ctx.num_examples,
        'label_sum': ctx.local_state['label_sum'],
      },
    )

  def server_update(server_state, aggregate, client_table):
    state = base.server_update(server_state, aggregate, client_table)
    seen = state.extra.at[aggregate.client_ids].add(
      aggregate.slot_mask.astype(jnp.int32), mode='drop'
    )
    return state._replace(extra=seen)

  return base._replace(
    init_client=init_client,
    init_server=init_server,
    client_begin=client_begin,
    client_step_end=client_step_end,
    client_final=client_final,
    server_update=server_update,
  )


@pytest.mark.parametrize('executor', ['vmap', 'host', 'chunked'])
def test_client_table_step_hook_and_server_extra(executor):
  model, _, data, parts, variables = federation()
  labels = np.asarray(data.labels)
  alg = counting_algorithm(model)
  rounds = [[0, 2, 5], [2, 3], [5, 2, 1, 0]]
  cohorts = [
    fx.cohort(parts, ids, num_slots=4, round_idx=r, batch_size=4)
    for r, ids in enumerate(rounds)
  ]
  state, table = engine.init_state(alg, variables, len(parts))
  round_fn = executors.make_round_fn(
    fx.make_spec(alg), data, executor=executor, chunk_size=2, steps_per_call=3
  )
  for c in cohorts:
    state, table, _ = round_fn(state, table, c)
  sampled = np.bincount(np.concatenate(rounds), minlength=len(parts))
  np.testing.assert_array_equal(table['sampled'], sampled)
  np.testing.assert_array_equal(state.extra, sampled)
  live_steps = np.zeros(len(parts), int)
  for c in cohorts:
    for slot in np.flatnonzero(c.slot_mask):
      live_steps[c.client_ids[slot]] += c.example_mask[slot].any(-1).sum()
  np.testing.assert_array_equal(table['steps'], live_steps)
  # The context of each client's last round: its slot, real steps, size.
  last = cohorts[-1]
  for slot in np.flatnonzero(last.slot_mask):
    client = last.client_ids[slot]
    assert int(table['slot'][client]) == slot
    assert (
      float(table['ctx_steps'][client]) == last.example_mask[slot].any(-1).sum()
    )
    assert float(table['examples'][client]) == len(parts[client])
    assert int(table['label_sum'][client]) == labels[parts[client]].sum()
