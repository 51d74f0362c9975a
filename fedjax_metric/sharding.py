"""Sharding the clients axis over a device mesh, in one or several processes.

Clients sit on a 1-D mesh axis named ``clients``. The cohort is split along
it; the server state, client table and dataset are replicated. With several
processes (`jax.distributed.initialize`) every process runs the same program
and holds the same host values (cohorts, data and the initial state are
functions of the seed), so global arrays are assembled from local shards.

Public API: `make_mesh`, `shard_cohort`, `replicate`, `put_global`,
`local_copy`.
"""

import jax
from jax.experimental import multihost_utils
import numpy as np

from fedjax_metric.data.cohort import Cohort


def make_mesh(num_devices: int | None = None, *, backend: str | None = None):
  """A 1-D mesh over the ``clients`` axis, over every process's devices.

  Axis type Auto, not the Explicit default of `jax.make_mesh`: indexing the
  replicated dataset with client-sharded indices raises a ShardingTypeError
  under Explicit axes. With several processes (`jax.distributed.initialize`)
  each runs the same program, so the mesh must hold all their devices.
  ``backend`` ('cpu', 'gpu', ...) picks devices other than the default
  backend's, e.g. simulated CPU devices on a one-GPU machine.
  """
  if (
    num_devices
    and jax.process_count() > 1
    and num_devices != jax.device_count()
  ):
    raise ValueError(
      f'num_devices={num_devices} with {jax.process_count()} processes: a '
      f'multi-process mesh spans all {jax.device_count()} devices. Set '
      '--config.num_devices=0.'
    )
  devices = jax.devices(backend)
  if num_devices:
    if num_devices > len(devices):
      raise ValueError(
        f'num_devices={num_devices}, but only {len(devices)} '
        f'{devices[0].platform} device(s) exist. Lower --config.num_devices '
        '(0 = all).'
      )
    devices = devices[:num_devices]
  return jax.sharding.Mesh(
    np.asarray(devices), ('clients',), axis_types=(jax.sharding.AxisType.Auto,)
  )


def shard_cohort(cohort: Cohort, mesh, *, stacked: bool = False) -> Cohort:
  """Puts every cohort array on the mesh, split along its [C] axis.

  ``stacked``: the arrays carry a leading [R] rounds axis (`engine.
  multi_round`'s input); [C] is then the second axis and R is not split.
  """
  spec = ('clients',) if not stacked else (None, 'clients')
  sharding = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec(*spec))
  return put_global(cohort, sharding)


def replicate(tree, mesh):
  sharding = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
  return put_global(tree, sharding)


def put_global(tree, sharding):
  """`jax.device_put` onto ``sharding``, also when it spans several processes.

  One process: exactly `jax.device_put`. Several: every process holds the
  same full host value (cohorts, data and initial state are functions of the
  seed), so each builds only its own devices' shards with
  `jax.make_array_from_callback`. `jax.device_put` would first check that
  equality with a cross-process all-gather of every array, every round.
  """
  if jax.process_count() == 1:
    return jax.device_put(tree, sharding)
  return jax.tree.map(lambda x: _global_array(x, sharding), tree)


def _global_array(x, sharding):
  if isinstance(x, jax.Array) and not x.is_fully_addressable:
    return jax.device_put(x, sharding)  # Already global: a reshard.
  if isinstance(x, jax.Array) and jax.dtypes.issubdtype(
    x.dtype, jax.dtypes.prng_key
  ):
    data = _global_array(jax.random.key_data(x), sharding)
    return jax.random.wrap_key_data(data, impl=jax.random.key_impl(x))
  value = np.asarray(x)
  return jax.make_array_from_callback(
    value.shape, sharding, lambda index: value[index]
  )


def local_copy(tree):
  """Process-local copies of global arrays, for code outside the round.

  Evaluation jits over the test set held by this process; arrays spanning
  other processes' devices cannot enter that program. A replicated array's
  first local shard is its whole value; anything else is all-gathered, a
  collective every process must reach. Local arrays pass through unchanged.
  """

  def one(x):
    if not isinstance(x, jax.Array) or x.is_fully_addressable:
      return x
    if x.is_fully_replicated:
      return x.addressable_data(0)
    return multihost_utils.process_allgather(x, tiled=True)

  return jax.tree.map(one, tree)
