"""The client table off the device (fedjax_metric/client_table.py).

* Its pieces: the row layout, a call's rows, the undo journal (a record cut
  short is ignored), the rows file rolled back to a checkpoint, the
  placement decision and its one-line refusals.
* Bit-identity: every algorithm with a non-empty client row, run with its
  table on the device, in host memory and on disk, under participation
  patterns (rounds of different sizes, padding slots, clients in
  consecutive rounds and calls), gives the same server state and the same
  table, bit for bit; also across a checkpoint and a reopen of the table.
"""

import errno
import os
import subprocess
import sys

import conftest
import fl_fixtures as fx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fedjax_metric import (
  algorithms,
  client_table,
  engine,
  executors,
  memory,
  optimizers,
  row_file,
)
from fedjax_metric.data import cohort as cohort_lib
from fedjax_metric.data import participation

SERVER = optimizers.make_server_optimizer('sgd')

# ---------------------------------------------------------------------------
# Pieces.
# ---------------------------------------------------------------------------


def _row():
  return {
    'w': jnp.zeros((3, 2), jnp.float32),
    'count': jnp.zeros((), jnp.int32),
    'flag': jnp.zeros((2,), jnp.bool_),
    'half': jnp.zeros((3,), jnp.float16),
  }


def _random_rows(n, seed=0):
  rng = np.random.default_rng(seed)
  return {
    'w': rng.normal(size=(n, 3, 2)).astype(np.float32),
    'count': rng.integers(-5, 5, n).astype(np.int32),
    'flag': rng.random((n, 2)) < 0.5,
    'half': rng.normal(size=(n, 3)).astype(np.float16),
  }


def test_row_layout_packs_and_unpacks_every_dtype_exactly():
  layout = client_table.RowLayout.of(_row())
  rows = _random_rows(7)
  back = layout.unpack(layout.pack(rows))
  for key in rows:
    np.testing.assert_array_equal(back[key], rows[key])
    assert back[key].dtype == rows[key].dtype
  assert layout.row_bytes % 8 == 0
  # Each leaf at an offset aligned to its item size, none overlapping.
  spans = sorted(
    (o, o + int(np.prod(s)) * d.itemsize)
    for o, s, d in zip(layout.offsets, layout.shapes, layout.dtypes)
  )
  assert all(a[1] <= b[0] for a, b in zip(spans, spans[1:]))
  assert all(o % d.itemsize == 0 for o, d in zip(layout.offsets, layout.dtypes))


def _cohort(ids, num_slots):
  ids = list(ids)
  client_ids = np.full(num_slots, 99, np.int32)
  client_ids[: len(ids)] = ids
  zeros = np.zeros((num_slots, 1, 1))
  return cohort_lib.Cohort(
    client_ids,
    np.arange(num_slots) < len(ids),
    zeros.astype(np.int32),
    zeros.astype(bool),
    np.zeros(num_slots, np.float32),
  )


def test_call_rows_are_the_union_and_slots_point_into_it():
  cohorts = [_cohort([4, 1], 3), _cohort([1, 7, 2], 3), _cohort([], 3)]
  rows = client_table.call_rows(cohorts, 10)
  np.testing.assert_array_equal(rows.ids, [4, 1, 7, 2])
  capacity = 9  # R * C: padding slots point past every row.
  np.testing.assert_array_equal(
    rows.row_ids, [[0, 1, capacity], [1, 2, 3], [capacity] * 3]
  )


def test_patch_takes_the_previous_calls_new_rows_for_shared_clients():
  packed = np.arange(4 * 8, dtype=np.uint8).reshape(4, 8)
  previous = np.full((2, 8), 200, np.uint8)
  out = client_table.patch_from(
    np.array([5, 3, 9, 1]), packed, np.array([9, 2]), previous
  )
  np.testing.assert_array_equal(out[2], previous[0])
  np.testing.assert_array_equal(out[[0, 1, 3]], packed[[0, 1, 3]])


def _numpy_init(layout):
  """init_rows of a table whose row k is filled with k (for counting)."""

  def init_rows(ids):
    ids = np.asarray(ids)
    n = len(ids)
    return {
      'w': np.broadcast_to(ids[:, None, None], (n, 3, 2)).astype(np.float32),
      'count': ids.astype(np.int32),
      'flag': np.stack([ids % 2 == 0, ids % 3 == 0], axis=1),
      'half': np.broadcast_to(ids[:, None], (n, 3)).astype(np.float16),
    }

  return init_rows


def _table(tmp_path, placement, n=20):
  layout = client_table.RowLayout.of(_row())
  return client_table.OffDeviceTable(
    placement,
    str(tmp_path / 'client_table'),
    layout,
    n,
    _numpy_init(layout),
    init_batch=4,
  )


@pytest.mark.parametrize('placement', ['host', 'disk'])
def test_rows_start_at_their_initial_value_and_keep_what_is_written(
  tmp_path, placement
):
  table = _table(tmp_path, placement)
  table.open(None)
  ids = np.array([3, 17, 0])
  rows = table.layout.unpack(table.gather(ids))
  np.testing.assert_array_equal(rows['count'], ids)
  new = table.layout.pack(_random_rows(3, seed=1))
  table.scatter(1, ids, new, table.gather(ids))
  np.testing.assert_array_equal(table.gather(ids[::-1]), new[::-1])
  np.testing.assert_array_equal(
    table.layout.unpack(table.gather(np.array([5])))['count'], [5]
  )
  assert table.nonfinite_round is None
  bad = _random_rows(1)
  bad['w'][0, 0, 0] = np.nan
  table.scatter(2, ids[:1], table.layout.pack(bad), table.gather(ids[:1]))
  assert table.nonfinite_round == 2
  table.close()


@pytest.mark.parametrize('placement', ['host', 'disk'])
def test_a_reopened_table_is_rolled_back_to_its_checkpoint(tmp_path, placement):
  """Writes after checkpoint 2 (and after a checkpoint 4 that the resume
  does not use, as after a fallback) are undone; rows first written after
  the checkpoint read as initial again."""
  table = _table(tmp_path, placement)
  table.open(None)
  layout = table.layout
  first = layout.pack(_random_rows(3, seed=1))
  table.scatter(
    1, np.array([1, 2, 3]), first, table.gather(np.array([1, 2, 3]))
  )
  bits_2 = table.before_checkpoint(2)
  table.after_checkpoint(2, [2])
  expected = table.gather(np.arange(20))
  second = layout.pack(_random_rows(3, seed=2))
  ids = np.array([2, 3, 9])  # two written before round 2, one fresh
  table.scatter(3, ids, second, table.gather(ids))
  table.before_checkpoint(4)
  table.after_checkpoint(4, [2, 4])
  third = layout.pack(_random_rows(2, seed=3))
  table.scatter(5, np.array([1, 11]), third, table.gather(np.array([1, 11])))
  if placement == 'host':
    table.before_checkpoint(6)  # flushed, then killed before the save
  table.close()

  reopened = _table(tmp_path, placement)
  reopened.open(2, bits_2)
  np.testing.assert_array_equal(reopened.gather(np.arange(20)), expected)
  assert (
    os.listdir(tmp_path / 'client_table').count('undo_000000000004.log') == 0
  )
  reopened.close()


def test_a_journal_record_cut_short_is_ignored(tmp_path):
  directory = str(tmp_path)
  journal = row_file.Journal(directory, 0, 8)
  ids = np.array([1, 2])
  journal.append(1, ids, np.ones((2, 8), np.uint8))
  journal.append(2, ids, np.full((2, 8), 7, np.uint8))
  journal.close()
  path = row_file.journal_path(directory, 0)
  records = row_file.read_records(path, 8)
  assert [int(r[1][0, 0]) for r in records] == [1, 7]
  size = os.path.getsize(path)
  with open(path, 'r+b') as f:
    f.truncate(size - 3)  # the second record's end never reached the disk
  assert len(row_file.read_records(path, 8)) == 1
  with open(path, 'r+b') as f:  # a flipped byte in the first record's body
    f.seek(row_file._HEADER.size + 3)
    f.write(b'\xff')
  assert row_file.read_records(path, 8) == []


def test_a_disk_too_small_for_the_rows_file_is_one_line_before_round_1(
  tmp_path, monkeypatch
):
  """The rows file reserves its blocks when it is made: a full disk is
  found there, and said in one line with what to change."""

  def no_space(fd, offset, length):
    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

  monkeypatch.setattr(os, 'posix_fallocate', no_space)
  with pytest.raises(client_table.TableSizeError) as error:
    _table(tmp_path, 'disk', n=1000)
  message = str(error.value)
  assert '\n' not in message and 'free disk space' in message
  assert 'GiB' in message and '--workdir' in message

  # A filesystem without fallocate is not taken for a full disk.
  def unsupported(fd, offset, length):
    raise OSError(errno.EOPNOTSUPP, os.strerror(errno.EOPNOTSUPP))

  monkeypatch.setattr(os, 'posix_fallocate', unsupported)
  table = _table(tmp_path, 'disk', n=1000)
  assert os.path.getsize(table.rows_file.path) == 1000 * table.layout.row_bytes
  table.close()


def _choose(requested, **kwargs):
  args = dict(
    row_bytes=1000,
    num_clients=1000,
    device_budget=10**9,
    host_budget=10**9,
    free_disk=10**9,
    workdir='/w',
  )
  args.update(kwargs)
  return client_table.choose_placement(requested, **args)


def test_auto_takes_the_device_then_host_then_disk_and_refuses_nowhere():
  assert _choose('auto').name == 'device'
  assert _choose('auto', device_budget=10**5).name == 'host'
  assert _choose('auto', device_budget=10**5, host_budget=10**5).name == 'disk'
  with pytest.raises(memory.MemoryBudgetError) as error:
    _choose('auto', device_budget=1, host_budget=1, free_disk=10**5)
  message = str(error.value)
  assert '\n' not in message
  assert '1,000 clients' in message and 'num_clients' in message
  assert _choose('auto', row_bytes=0).name == 'device'  # stateless
  assert _choose('disk').name == 'disk'
  with pytest.raises(memory.MemoryBudgetError, match='placement=auto'):
    _choose('device', device_budget=1)
  with pytest.raises(memory.MemoryBudgetError, match='host memory budget'):
    _choose('host', host_budget=1)
  with pytest.raises(ValueError, match='one process'):
    _choose('disk', process_count=2)


def test_a_resumed_workdir_keeps_its_placement():
  assert _choose('auto', stored='disk').name == 'disk'
  assert _choose('auto', has_checkpoints=True).name == 'device'
  with pytest.raises(
    client_table.TableError, match="kept its client table on 'disk'"
  ):
    _choose('host', stored='disk')


# ---------------------------------------------------------------------------
# Bit-identity with the device table.
# ---------------------------------------------------------------------------

NUM_CLIENTS = 6


def _stateful():
  """Every registered algorithm whose client row is not empty."""
  images, labels = fx.make_data(12)
  variables = fx.init_variables(fx.all_outputs(), images)
  names = []
  for name in sorted(algorithms.REGISTRY):
    alg = _algorithm(name, fx.all_outputs(), labels, [np.arange(2)] * 6)
    row = jax.eval_shape(alg.init_client, variables, jax.random.key(0))
    if jax.tree.leaves(row):
      names.append(name)
  return names


def _algorithm(name, model, labels, parts):
  kwargs = {}
  if name in ('fedppo',):
    kwargs = dict(select_fraction=1.0, reward_examples=5)
  if name == 'fedu2':
    kwargs = dict(aggregation='eua')
  return algorithms.REGISTRY[name](
    model,
    server_optimizer=SERVER,
    run=fx.partition_facts(parts, labels),
    weighting='uniform',
    **kwargs,
  )


STATEFUL = _stateful()


def test_the_stateful_algorithms_are_found():
  for name in ('scaffold', 'mifa', 'fedvarp', 'pmfl', 'fedmetric', 'moon'):
    assert name in STATEFUL


def _federation(pattern, num_rounds):
  images, labels = fx.make_data(120)
  from fedjax_metric.data import partition as partition_lib

  parts = partition_lib.dirichlet(
    labels, NUM_CLIENTS, 1.0, seed=2, variant='per_class'
  )
  data = engine.DeviceData(jnp.asarray(images), jnp.asarray(labels))
  probs = np.linspace(0.3, 0.9, NUM_CLIENTS)
  mask = participation.sample(probs, num_rounds, pattern, seed=3, cycle=3)
  return images, labels, parts, data, mask


def _cohorts(alg, parts, labels, mask):
  num_slots = participation.max_active(mask)
  sizes = [len(p) for p in parts]
  s = cohort_lib.num_local_steps(
    sizes, batch_size=8, local_epochs=1, local_steps=0
  )
  return [
    cohort_lib.make_cohort(
      np.flatnonzero(row),
      parts,
      num_slots=num_slots,
      num_steps=s,
      batch_size=8,
      local_epochs=1,
      local_steps=0,
      seed=0,
      round_idx=t,
      labels=labels,
      batches_fn=alg.client_batches,
      cohort_batches_fn=alg.cohort_batches,
    )
    for t, row in enumerate(mask)
  ], num_slots


def _off_device_run(
  tmp_path,
  placement,
  spec,
  data,
  alg,
  variables,
  cohorts,
  num_slots,
  *,
  executor,
  rounds_per_call,
  checkpoint_at=None,
):
  """The rounds with the table off the device; with ``checkpoint_at``, a
  checkpoint there, the table closed, reopened at it, and the rounds after
  it run again on top of writes that must be rolled back."""
  key = jax.random.key(1)
  state = engine.init_server_state(alg, variables, NUM_CLIENTS, key)
  layout = client_table.RowLayout.of(
    jax.eval_shape(alg.init_client, variables, key)
  )

  def make_table():
    return client_table.OffDeviceTable(
      placement,
      str(tmp_path / placement),
      layout,
      NUM_CLIENTS,
      lambda ids: engine.init_rows(alg, variables, key, jnp.asarray(ids)),
      init_batch=8,
    )

  rounds_fn = executors.make_rounds_fn(
    spec,
    data,
    executor=executor,
    rounds_per_call=rounds_per_call,
    steps_per_call=2,
  )
  starts = list(range(0, len(cohorts), rounds_per_call))

  def driver_for(table, first_calls):
    return client_table.OffDeviceRounds(
      rounds_fn,
      table,
      lambda first: (cohorts[first : first + rounds_per_call], None),
      first_calls,
      rounds_per_call=rounds_per_call,
      num_slots=num_slots,
    )

  table = make_table()
  table.open(None)
  driver = driver_for(table, starts)
  saved = None
  for first in starts:
    state, _, _ = driver.run(state, first)
    done = first + rounds_per_call
    if done == checkpoint_at:
      driver.settle()
      saved = (
        jax.tree.map(np.array, state),
        table.before_checkpoint(done),
      )
      table.after_checkpoint(done, [done])
  driver.close()
  if checkpoint_at is not None:
    # As after a kill: reopen at the checkpoint and run the rest again.
    table.close()
    table = make_table()
    state, bits = saved
    table.open(checkpoint_at, bits)
    rest = [f for f in starts if f >= checkpoint_at]
    driver = driver_for(table, rest)
    state = jax.tree.map(jnp.asarray, state)
    for first in rest:
      state, _, _ = driver.run(state, first)
    driver.close()
  rows = table.arrays()
  rows = jax.tree.map(np.array, rows)
  table.close()
  return state, rows


def _bitwise_equal(a, b):
  leaves_a, leaves_b = jax.tree.leaves(a), jax.tree.leaves(b)
  assert len(leaves_a) == len(leaves_b)
  for x, y in zip(leaves_a, leaves_b):
    x, y = np.asarray(x), np.asarray(y)
    assert x.shape == y.shape and x.dtype == y.dtype
    if not np.array_equal(x, y, equal_nan=True):
      return False
  return True


# XLA CPU's old loop emitters (the suite's faster-compiling setting,
# conftest.py) may sum a fused loop in another order in the device-table
# program and the call-table program: the bit-identity tests then run in a
# subprocess with XLA's production emitters
# (`test_bit_identity_runs_under_production_xla`).
needs_production_xla = pytest.mark.skipif(
  bool(conftest.SUITE_XLA_FLAGS),
  reason='run in a subprocess with production XLA emitters',
)


# Slow (a pytest subprocess over every stateful algorithm): make test-all.
@pytest.mark.slow
def test_bit_identity_runs_under_production_xla():
  if not conftest.SUITE_XLA_FLAGS:
    pytest.skip('the suite already uses the production emitters')
  env = dict(os.environ, FEDJAX_METRIC_TEST_PRODUCTION_XLA='1')
  # Without the suite's emitter flag (a blank XLA_FLAGS kills XLA at start).
  flags = env.get('XLA_FLAGS', '').replace(conftest.SUITE_XLA_FLAGS, '')
  env['XLA_FLAGS'] = ' '.join(flags.split())
  result = subprocess.run(
    [
      sys.executable,
      '-m',
      'pytest',
      '-q',
      '-p',
      'no:xdist',
      '-k',
      'bit_identical',
      __file__,
    ],
    env=env,
    stdin=subprocess.DEVNULL,
    capture_output=True,
    text=True,
    timeout=900,
  )
  assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]
  assert ' passed' in result.stdout and 'skipped' not in result.stdout


@needs_production_xla
@pytest.mark.parametrize('name', STATEFUL)
def test_host_and_disk_tables_are_bit_identical_to_the_device_table(
  tmp_path, name
):
  """Bernoulli participation over 6 clients and 6 rounds, two rounds a
  call (vmap): rounds of 1-6 clients with padding slots, clients in both
  rounds of a call and in consecutive calls (read ahead, then taken from
  the previous call's output). The disk run is also checkpointed after
  round 2, its table closed and reopened there, and rounds 3-6 run again."""
  images, labels, parts, data, mask = _federation('bernoulli', 6)
  model = fx.all_outputs()
  alg = _algorithm(name, model, labels, parts)
  variables = fx.init_variables(model, images)
  cohorts, num_slots = _cohorts(alg, parts, labels, mask)
  spec = fx.make_spec(alg, lr=0.05)._replace(num_clients=NUM_CLIENTS)
  state, table = engine.init_state(
    alg, variables, NUM_CLIENTS, key=jax.random.key(1)
  )
  rounds_fn = executors.make_rounds_fn(
    spec, data, executor='vmap', rounds_per_call=2
  )
  for first in range(0, 6, 2):
    state, table, _ = rounds_fn(state, table, cohorts[first : first + 2])
  device = (state, jax.tree.map(np.array, table))
  for placement, checkpoint_at in (('host', None), ('disk', 2)):
    result = _off_device_run(
      tmp_path,
      placement,
      spec,
      data,
      alg,
      variables,
      cohorts,
      num_slots,
      executor='vmap',
      rounds_per_call=2,
      checkpoint_at=checkpoint_at,
    )
    assert _bitwise_equal(result[0], device[0]), (name, placement, 'server')
    assert _bitwise_equal(result[1], device[1]), (name, placement, 'table')


@needs_production_xla
@pytest.mark.parametrize('pattern', ['markov', 'cyclic'])
@pytest.mark.parametrize('executor', ['host', 'chunked'])
def test_bit_identical_under_other_patterns_and_executors(
  tmp_path, pattern, executor
):
  """SCAFFOLD and PMFL (the largest row: a buffer of past models) under
  Markov and cyclic participation, one round a call, with the host loop
  and the chunked executor."""
  for name in ('scaffold', 'pmfl'):
    images, labels, parts, data, mask = _federation(pattern, 5)
    model = fx.all_outputs()
    alg = _algorithm(name, model, labels, parts)
    variables = fx.init_variables(model, images)
    cohorts, num_slots = _cohorts(alg, parts, labels, mask)
    spec = fx.make_spec(alg, lr=0.05)._replace(num_clients=NUM_CLIENTS)
    state, table = engine.init_state(
      alg, variables, NUM_CLIENTS, key=jax.random.key(1)
    )
    round_fn = executors.make_round_fn(
      spec, data, executor=executor, chunk_size=2, steps_per_call=2
    )
    for cohort in cohorts:
      state, table, _ = round_fn(state, table, cohort)
    result = _off_device_run(
      tmp_path / name,
      'disk',
      spec,
      data,
      alg,
      variables,
      cohorts,
      num_slots,
      executor=executors.ExecutorChoice(executor, 2),
      rounds_per_call=1,
    )
    assert _bitwise_equal(result[0], state), (name, pattern, executor)
    assert _bitwise_equal(result[1], jax.tree.map(np.array, table))


def test_a_run_whose_table_fits_nowhere_is_refused_before_writing(
  tmp_path, monkeypatch
):
  from fedjax_metric import api, experiment

  config = api.get_config('scaffold', 'runlocal')
  with config.unlocked():
    config.memory_budget_gb = 1e-9
  monkeypatch.setattr(client_table, 'host_memory_budget', lambda: 1)
  monkeypatch.setattr(client_table, 'disk_free', lambda directory: 1)
  with pytest.raises(memory.MemoryBudgetError) as error:
    experiment.run(config, str(tmp_path / 'run'))
  message = str(error.value)
  assert '\n' not in message and 'num_clients' in message
  assert 'free disk space' in message
  assert not (tmp_path / 'run').exists()


def test_auto_puts_a_table_over_the_device_budget_in_host_memory(tmp_path):
  """And the run is bit-identical to one with the table on the device."""
  from fedjax_metric import api, experiment

  results = {}
  for name, budget in (('device', 0.0), ('auto', 1e-9)):
    config = api.get_config('scaffold', 'runlocal')
    with config.unlocked():
      config.memory_budget_gb = budget
      config.client_table.placement = name
      config.progress = False
    workdir = str(tmp_path / name)
    experiment.run(config, workdir)
    results[name] = api.load_run(workdir).variables
  assert client_table.stored_placement(str(tmp_path / 'auto')) == 'host'
  assert client_table.stored_placement(str(tmp_path / 'device')) is None
  assert _bitwise_equal(results['auto'], results['device'])


def test_a_failed_background_write_stops_the_next_checkpoint():
  """Call i's row write fails (a full disk), call i + 1's succeeds: `wait`,
  which runs before every checkpoint, must still raise call i's error, so
  no checkpoint is saved over rows that were never written."""
  import threading

  first_may_fail = threading.Event()

  class Table:
    def __init__(self):
      self.calls = 0

    def scatter(self, round_idx, ids, new_rows, old_rows):
      self.calls += 1
      if round_idx == 0:
        first_may_fail.wait(5)  # Still running when call 1's is queued.
        raise OSError(errno.ENOSPC, 'No space left on device')

  prefetcher = client_table.RowPrefetcher(Table())
  try:
    prefetcher.write(0, None, None, None)
    prefetcher.write(1, None, None, None)
    first_may_fail.set()
    with pytest.raises(OSError, match='No space left'):
      prefetcher.wait()
    assert prefetcher.table.calls == 2
    # A write queued after a failed one has finished raises at once.
    prefetcher.write(0, None, None, None)
    assert prefetcher.pending_writes[0].exception(5) is not None
    with pytest.raises(OSError, match='No space left'):
      prefetcher.write(1, None, None, None)
  finally:
    first_may_fail.set()
    prefetcher.close()
