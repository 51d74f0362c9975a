"""Engine properties: padding is inert, local epochs decay, the client table
and hooks behave, and one FedAvg step equals a hand-derived SGD step.
(Executors: test_executors.py; sharding: test_sharding.py.)"""

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
  alg = fedavg.build(model, server_optimizer=SGD_SERVER)
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


def softmax(z):
  z = z - z.max(-1, keepdims=True)
  e = np.exp(z)
  return e / e.sum(-1, keepdims=True)


def softmax_regression():
  """60 examples, FedAvg on the linear model: gradients we can write by hand."""
  images, labels = fx.make_data(60)
  model = fx.linear()
  alg = fedavg.build(model, server_optimizer=SGD_SERVER)
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
    alg = fedavg.build(model, server_optimizer=SGD_SERVER, weighting=weighting)
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


def test_weighted_sum_keeps_each_leafs_dtype_and_averages_integer_leaves():
  weights = jnp.array([0.25, 0.75], jnp.float32)
  stacked = {
    'w': jnp.array([[1.0, 2.0], [5.0, 6.0]], jnp.float32),
    'count': jnp.array([4, 8], jnp.int32),  # e.g. a client's step counter
  }
  out = engine.weighted_sum(weights, stacked)
  np.testing.assert_allclose(out['w'], [4.0, 5.0])
  assert out['count'].dtype == jnp.int32
  assert int(out['count']) == 7  # 0.25 * 4 + 0.75 * 8, not 0


def test_client_table_gather_and_scatter_drop_padding():
  table = {'count': jnp.zeros((5,), jnp.int32)}
  ids = jnp.asarray([3, 0, 5, 5])  # 5 == N: padding.
  rows = engine.gather_rows(table, ids)
  table = engine.scatter_rows(table, ids, jax.tree.map(lambda r: r + 1, rows))
  np.testing.assert_array_equal(table['count'], [1, 0, 0, 1, 0])


def counting_algorithm(model):
  """FedAvg plus every stateful slot, each counting something checkable:
  table row = (times sampled, live steps taken so far, last slot); local
  state = steps this round; server extra = participants per client seen by
  server_update. The context's step count, slot and example count are
  recorded too."""
  base = fedavg.build(model, server_optimizer=SGD_SERVER)

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

  def client_step_end(params, model_state, ctx):
    del params, model_state
    return {**ctx.local_state, 'steps': ctx.local_state['steps'] + 1}

  def client_final(end_variables, ctx):
    update, weight, _ = base.client_final(end_variables, ctx)
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
