"""Memory: the client table's size before it exists, and the chunk size.

Two things run out of memory in a simulation of many clients: the client
table (N rows of per-client state, every round reads and writes it) and a
round's working memory (grows with the number of slots trained at once).
`check_client_table_fits` refuses a table over budget before it is
allocated; `choose_chunk_size` picks the largest chunk of slots that fits,
from the line of bytes per slot that executors.chunk_memory_model reads off
XLA's own buffer assignment of the chunked round. Budgets are bytes per
device.

Public API: `MemoryBudgetError`, `default_memory_budget`, `device_budget`,
`tree_bytes`, `client_table_bytes`, `check_client_table_fits`,
`choose_chunk_size`.
"""

import os

import jax
import numpy as np

from fedjax_metric import contract


class MemoryBudgetError(MemoryError):
  """The run cannot fit the memory budget; the message says what to change."""


def default_memory_budget(device=None) -> int:
  """Bytes one device may use: 80% of an accelerator's memory limit, or on
  CPU half the machine's RAM split over the (simulated) CPU devices."""
  device = device or jax.local_devices()[0]
  stats = device.memory_stats() if hasattr(device, 'memory_stats') else None
  if stats and stats.get('bytes_limit'):
    return int(0.8 * stats['bytes_limit'])
  ram = os.sysconf('SC_PHYS_PAGES') * os.sysconf('SC_PAGE_SIZE')
  return int(0.5 * ram / max(1, len(jax.local_devices(backend='cpu'))))


def tree_bytes(tree) -> int:
  """Bytes of a pytree of arrays or ShapeDtypeStructs."""
  return sum(
    int(np.prod(x.shape)) * np.dtype(x.dtype).itemsize
    for x in jax.tree.leaves(tree)
  )


def client_table_bytes(
  algorithm: contract.Algorithm, variables, num_clients: int
) -> int:
  """Bytes of the N-row client table, found without allocating it."""
  row = jax.eval_shape(algorithm.init_client, variables, jax.random.key(0))
  return num_clients * tree_bytes(row)


def device_budget(memory_budget_gb: float = 0.0) -> int:
  """A run's memory budget per device in bytes: ``memory_budget_gb`` (the
  config's ``memory_budget_gb``), or 0 for `default_memory_budget`. Where
  the client table goes within it: client_table.choose_placement."""
  return int(memory_budget_gb * 1024**3) or default_memory_budget()


def check_client_table_fits(
  table_bytes: int, num_clients: int, budget_bytes: int
):
  """Raises `MemoryBudgetError` (with the options) if the table cannot fit.

  The table is replicated on every device of the mesh, so the budget is one
  device's. Checked before allocation: the alternative is an out-of-memory
  crash minutes into a run.
  """
  if table_bytes <= budget_bytes:
    return
  gb = 1024**3
  row = table_bytes / max(num_clients, 1)
  raise MemoryBudgetError(
    f'The per-client state table needs {table_bytes / gb:.2f} GiB '
    f'({num_clients:,} clients x {row / 1024**2:.2f} MiB per client), more '
    f'than the memory budget of {budget_bytes / gb:.2f} GiB per device. '
    'Options: fewer clients (--config.num_clients); fewer history/buffer '
    'slots for algorithms that keep several models per client; a smaller '
    'model; or a larger --config.memory_budget_gb if the device really has '
    "the memory. (Chunking bounds the round's working memory, not the "
    'table, which every round reads and writes.)'
  )


def choose_chunk_size(
  fixed_bytes: int,
  bytes_per_slot: int,
  budget_bytes: int,
  num_slots: int,
  num_devices: int = 1,
) -> int:
  """The largest chunk size k whose round fits ``budget_bytes`` per device.

  A chunk's k slots split over the D devices, so one device holds
  ``fixed + (k / D) * per_slot``. k is a multiple of D (each device gets the
  same share) and at most the cohort size rounded up to one.
  """
  per_device = (budget_bytes - fixed_bytes) // bytes_per_slot
  if per_device < 1:
    gb = 1024**3
    raise MemoryBudgetError(
      f'Even one client per device needs {(fixed_bytes + bytes_per_slot) / gb:.2f} '
      f'GiB, over the memory budget of {budget_bytes / gb:.2f} GiB per '
      'device. Lower --config.local.batch_size, use a smaller model, or '
      'raise --config.memory_budget_gb if the device has the memory.'
    )
  most = num_devices * -(-num_slots // num_devices)
  return int(min(per_device * num_devices, most))
