"""A round as one traceable function, and R rounds as one program.

`single_program_round` runs every cohort slot's local training side by side
(``vmap``) or as a scan over chunks of k vmapped slots (k = 1 is the
sequential form), reduces the updates and applies the server update: the
whole round one XLA program. `multi_round` is a scan of it over R rounds'
stacked cohorts, so the host returns only to evaluate, log and checkpoint.
Both are built from the engine's client update (`engine.client_update`) and
server step (`engine.finish_round`); executors.py decides which runs.

Shape letters: N clients, C cohort slots, S local steps, B batch size.
"""

import functools

import jax
import jax.numpy as jnp

from fedjax_metric.data.cohort import Cohort, table_rows
from fedjax_metric.engine import (
  RoundSpec,
  client_report,
  client_update,
  finish_round,
  gathered,
  mask_slots,
  scatter_rows,
  weighted_sum,
  zero_update,
)


def single_program_round(
  spec: RoundSpec,
  data,
  server_state,
  client_table,
  cohort: Cohort,
  *,
  chunk_size: int = 0,
  unroll: int | bool = 1,
):
  """The whole round as one traceable function (``vmap`` / ``chunked``).

  ``chunk_size = 0`` vmaps all C slots; k > 0 scans over ceil(C / k) chunks of
  k vmapped slots (`_chunked_round`; k = 1 is the sequential form).
  """
  if chunk_size:
    return _chunked_round(
      spec,
      data,
      server_state,
      client_table,
      cohort,
      chunk_size=chunk_size,
      unroll=unroll,
    )
  slots = jnp.arange(cohort.client_ids.shape[0], dtype=jnp.int32)
  client_table, sums, per_slot = _vmapped_slots(
    spec, data, server_state, client_table, cohort, slots, unroll=unroll
  )
  return finish_round(
    spec, server_state, client_table, cohort, *sums, per_slot=per_slot
  )


def multi_round(
  spec: RoundSpec,
  data,
  server_state,
  client_table,
  cohorts: Cohort,
  *,
  chunk_size: int = 0,
  unroll: int | bool = 1,
):
  """R rounds as one traceable function: a ``lax.scan`` of
  `single_program_round` over the leading [R] axis of ``cohorts``.

  Every key, learning rate and schedule inside a round is a function of
  ``server_state.round``, which each round advances, so R rounds here
  compute what R separate calls compute; the host only returns every R
  rounds (to evaluate, log, checkpoint). Why: with tiny rounds (one local
  step of a few clients) the host round trip, not the arithmetic, is the
  cost of a round.

  Args:
    cohorts: a `Cohort` whose leaves have a leading [R] axis (round r's
      cohort at index r).

  Returns:
    ``(server_state, client_table, metrics)``; each metric has shape [R].
  """

  def one_round(carry, cohort):
    state, table = carry
    state, table, metrics = single_program_round(
      spec, data, state, table, cohort, chunk_size=chunk_size, unroll=unroll
    )
    return (state, table), metrics

  (server_state, client_table), metrics = jax.lax.scan(
    one_round, (server_state, client_table), cohorts
  )
  return server_state, client_table, metrics


def _vmapped_slots(
  spec: RoundSpec,
  data,
  server_state,
  client_table,
  cohort: Cohort,
  slots,
  *,
  unroll,
):
  """Trains the cohort's slots side by side (vmap) and reduces over them.

  Returns ``(client_table with the new rows, (update_sum, weight_sum,
  loss_sum, example_count, term_sums), per_slot)``; padding slots get
  weight 0 and write no row. ``per_slot`` is {} unless ``spec.per_client``:
  then [C] arrays of `engine.client_report`, zero for padding slots.
  """
  rows = gathered(client_table, table_rows(cohort))
  per_client = functools.partial(
    client_update, spec, data, server_state, unroll=unroll
  )
  updates, weights, new_rows, (loss_sums, counts, term_sums) = jax.vmap(
    per_client
  )(
    rows,
    cohort.client_ids,
    slots,
    cohort.example_idx,
    cohort.example_mask,
    cohort.num_examples,
  )
  # Padding is removed by selection, not by a zero weight: 0 * inf is NaN,
  # and a hook may divide by a padding slot's zero example count.
  weights = jnp.where(cohort.slot_mask, weights, 0.0)
  updates = mask_slots(cohort.slot_mask, updates)
  per_slot = {}
  if spec.per_client:
    per_slot = mask_slots(
      cohort.slot_mask, jax.vmap(client_report)(updates, loss_sums, counts)
    )
  sums = (
    weighted_sum(weights, updates),
    jnp.sum(weights),
    jnp.sum(loss_sums),
    jnp.sum(counts),
    jax.tree.map(jnp.sum, term_sums),
  )
  return (
    scatter_rows(client_table, table_rows(cohort), new_rows),
    sums,
    per_slot,
  )


def _pad_cohort(cohort: Cohort, num_slots: int) -> Cohort:
  """Appends padding slots up to ``num_slots``: no steps, no weight.

  Their client id is int32 max: out of range, so gathers clip and scatters
  drop, as for the cohort's own padding slots.
  """
  pad = num_slots - cohort.client_ids.shape[0]
  if pad == 0:
    return cohort

  def pad_leaf(x, value):
    widths = [(0, pad)] + [(0, 0)] * (x.ndim - 1)
    return jnp.pad(x, widths, constant_values=value)

  out_of_range = jnp.iinfo(jnp.int32).max
  if cohort.row_ids is not None:
    cohort = cohort._replace(row_ids=pad_leaf(cohort.row_ids, out_of_range))
  return cohort._replace(
    client_ids=pad_leaf(cohort.client_ids, out_of_range),
    slot_mask=pad_leaf(cohort.slot_mask, False),
    example_idx=pad_leaf(cohort.example_idx, 0),
    example_mask=pad_leaf(cohort.example_mask, False),
    num_examples=pad_leaf(cohort.num_examples, 0),
  )


def _chunked_round(
  spec: RoundSpec,
  data,
  server_state,
  client_table,
  cohort: Cohort,
  *,
  chunk_size: int,
  unroll: int | bool = 1,
):
  """The round as a scan over chunks of k vmapped slots.

  Memory is O(k * one client's training + model + client table) for any C:
  each chunk's weighted updates are summed into the scan carry and its rows
  scattered into the table before the next chunk runs, so no [C, ...] stack
  of updates exists. Chunk j holds slots j, j + m, j + 2m, ... (m = C / k):
  with the clients axis sharded over D devices and D | k, every chunk has
  k / D slots on each device, so all devices work at every scan step.
  """
  k = chunk_size
  num_slots = cohort.client_ids.shape[0]
  num_chunks = -(-num_slots // k)
  padded = _pad_cohort(cohort, num_chunks * k)
  slots = jnp.arange(num_chunks * k, dtype=jnp.int32)
  # [C, ...] -> [k, m, ...] -> [m, k, ...]: the scan runs over m chunks.
  chunks = jax.tree.map(
    lambda x: jnp.swapaxes(x.reshape((k, num_chunks) + x.shape[1:]), 0, 1),
    (padded, slots),
  )

  def one_chunk(carry, chunk):
    table, *sums = carry
    table, chunk_sums, per_slot = _vmapped_slots(
      spec, data, server_state, table, *chunk, unroll=unroll
    )
    return (table, *jax.tree.map(jnp.add, tuple(sums), chunk_sums)), per_slot

  zero = jnp.zeros((), jnp.float32)
  update_zeros, term_zeros = zero_update(
    spec, data, server_state, client_table, cohort.example_idx.shape[1:]
  )
  carry = (client_table, update_zeros, zero, zero, zero, term_zeros)
  (client_table, *sums), per_chunk = jax.lax.scan(one_chunk, carry, chunks)
  # [m, k] back to slot order (chunk j, position i held slot i * m + j).
  per_slot = jax.tree.map(
    lambda x: jnp.swapaxes(x, 0, 1).reshape(-1)[:num_slots], per_chunk
  )
  return finish_round(
    spec, server_state, client_table, cohort, *sums, per_slot=per_slot
  )
