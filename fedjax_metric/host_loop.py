"""The ``host`` executor: a round as a Python loop over its real slots.

Each slot runs the engine's client update (`engine.client_update`) as one
jitted call, or, when its S local steps exceed ``steps_per_call``, the same
update cut at block boundaries (`engine.start_client`, ``ceil(S / k)`` calls
of `engine.run_steps`, `engine.finish_client`), skipping blocks that are all
padding. Results equal the single-program executors' (tests/test_executors.py).
The default on one CPU process (executors.choose_executor says why).
"""

import functools
from typing import Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from fedjax_metric import engine
from fedjax_metric.data.cohort import Cohort, table_rows


def _accumulate(client_table, row_id, slot, accumulator, outputs):
  """Writes a slot's new row (at ``row_id``) and adds ``weight * update``
  (and its loss sums) into the round's running totals; with per-client
  reports on (a non-empty last entry of ``accumulator``), writes the slot's
  report."""
  update, weight, new_row, (loss_sum, count, terms) = outputs
  client_table = engine.scatter_rows(client_table, row_id, new_row)
  (update_sum, weight_sum, loss_total, count_total, term_totals, per_slot) = (
    accumulator
  )
  if per_slot:
    report = engine.client_report(update, loss_sum, count)
    per_slot = {k: v.at[slot].set(report[k]) for k, v in per_slot.items()}
  accumulator = (
    jax.tree.map(lambda s, u: s + weight * u, update_sum, update),
    weight_sum + weight,
    loss_total + loss_sum,
    count_total + count,
    jax.tree.map(jnp.add, term_totals, terms),
    per_slot,
  )
  return client_table, accumulator


class HostLoopFns(NamedTuple):
  """The jitted pieces the ``host`` executor strings together."""

  zero_accumulator: Callable
  begin: Callable
  steps: Callable
  finish: Callable
  whole_client: Callable
  server: Callable


def make_host_loop_round_fn(spec, data, *, steps_per_call: int, unroll=True):
  """A round as a Python loop over real slots of jitted unrolled step blocks.

  Each slot: gather its row and start (one call), ``ceil(S / steps_per_call)``
  calls of `engine.run_steps` (blocks whose steps are all padding are
  skipped; they would be no-ops), then one call that computes the update,
  scatters the row and adds ``weight * update`` into a running sum. When all
  S steps fit one block, the three are fused into one call per slot
  (``whole_client``): dispatch, not arithmetic, dominates small clients.
  Memory stays O(model): no stacked [C, ...] updates exist. Every function
  compiles once per run.
  """

  def begin_body(
    server_state,
    client_table,
    row_id,
    client_id,
    slot,
    num_examples,
    example_idx,
    example_mask,
    data,
  ):
    row = engine.gathered(client_table, row_id)
    inputs = engine.client_inputs(
      row, client_id, slot, num_examples, example_idx, example_mask
    )
    return inputs, engine.start_client(spec, data, server_state, inputs)

  def steps_body(
    server_state, inputs, carry, example_idx, example_mask, first_step, data
  ):
    return engine.run_steps(
      spec,
      data,
      server_state,
      inputs,
      carry,
      example_idx,
      example_mask,
      first_step,
      unroll=unroll,
    )

  def finish_body(
    server_state, client_table, row_id, inputs, accumulator, carry, data
  ):
    outputs = engine.finish_client(spec, data, server_state, inputs, carry)
    return _accumulate(client_table, row_id, inputs.slot, accumulator, outputs)

  @functools.partial(jax.jit, donate_argnums=(1, 2))
  def whole_client(
    server_state,
    client_table,
    accumulator,
    row_id,
    client_id,
    slot,
    num_examples,
    example_idx,
    example_mask,
    data,
  ):
    # All S steps in one call: the engine's client update itself, as the
    # single-program executors run it for each slot.
    outputs = engine.client_update(
      spec,
      data,
      server_state,
      engine.gathered(client_table, row_id),
      client_id,
      slot,
      example_idx,
      example_mask,
      num_examples,
      unroll=unroll,
    )
    return _accumulate(client_table, row_id, slot, accumulator, outputs)

  @functools.partial(jax.jit, static_argnums=(3, 4))
  def zero_accumulator(
    server_state, client_table, data, example_shape, num_slots
  ):
    # Made on the device: a jnp.zeros here would be a host-to-device transfer.
    # The outputs are distinct buffers, as `finish` donates them.
    update, terms = engine.zero_update(
      spec, data, server_state, client_table, example_shape
    )
    per_slot = {}
    if spec.per_client:
      per_slot = {
        name: jnp.zeros((num_slots,), jnp.float32)
        for name in ('loss', 'examples', 'update_norm')
      }
    scalars = (jnp.zeros((), jnp.float32) for _ in range(3))
    return (update, *scalars, terms, per_slot)

  @functools.partial(jax.jit, donate_argnums=(0, 1))
  def server(server_state, client_table, cohort, accumulator):
    *sums, per_slot = accumulator
    return engine.finish_round(
      spec, server_state, client_table, cohort, *sums, per_slot=per_slot
    )

  fns = HostLoopFns(
    zero_accumulator,
    jax.jit(begin_body),
    jax.jit(steps_body),
    jax.jit(finish_body, donate_argnums=(1, 4)),
    whole_client,
    server,
  )

  bound_data = data

  def round_fn(server_state, client_table, cohort: Cohort, call_data=None):
    data = bound_data if call_data is None else call_data
    host = jax.tree.map(np.asarray, cohort)  # The host needs the masks.
    row_ids = table_rows(host)
    num_steps = host.example_idx.shape[1]
    k = min(steps_per_call, num_steps)
    # Pad S to a multiple of k with all-padding steps, which are no-ops.
    pad = (-num_steps) % k
    example_idx = np.pad(host.example_idx, ((0, 0), (0, pad), (0, 0)))
    example_mask = np.pad(host.example_mask, ((0, 0), (0, pad), (0, 0)))
    accumulator = fns.zero_accumulator(
      server_state,
      client_table,
      data,
      host.example_idx.shape[1:],
      host.client_ids.shape[0],
    )
    for slot in np.flatnonzero(host.slot_mask):
      # One transfer per slot of its index arrays, which the round needs anyway.
      client = (
        row_ids[slot],
        host.client_ids[slot],
        np.int32(slot),
        host.num_examples[slot],
        host.example_idx[slot],
        host.example_mask[slot],
      )
      if num_steps + pad == k:
        client_table, accumulator = fns.whole_client(
          server_state, client_table, accumulator, *jax.device_put(client), data
        )
        continue
      live_blocks = [
        first
        for first in range(0, num_steps + pad, k)
        if example_mask[slot, first : first + k].any()
      ]
      client, blocks = jax.device_put(
        (
          client,
          [
            (
              example_idx[slot, f : f + k],
              example_mask[slot, f : f + k],
              np.int32(f),
            )
            for f in live_blocks
          ],
        )
      )
      inputs, carry = fns.begin(server_state, client_table, *client, data)
      for block in blocks:
        carry = fns.steps(server_state, inputs, carry, *block, data)
      client_table, accumulator = fns.finish(
        server_state, client_table, client[0], inputs, accumulator, carry, data
      )
    return fns.server(
      server_state, client_table, jax.device_put(host), accumulator
    )

  round_fn.fns = fns
  return round_fn
