"""PMFL's historical information: each client's buffer of its recent local
models (Algorithm 1) and the server's past global models (Eqs. 9-11).

Zhang et al., 'Towards Performance-Enhanced Model-Contrastive Federated
Learning using Historical Information in Heterogeneous Scenarios',
preprint, 2025. pmfl.py binds these hooks; the contrastive loss that reads
the buffer is there, Algorithm 2's weights and psi are pmfl_server.py.

Client: a ring buffer S_l of the N most recent local models, kept across
rounds; after every real local step the model that step started from is
pushed (the oldest evicted), so the buffer never holds the model being
trained. Server (Eqs. 9-11):

  W' = W^t + eta_g (1 / N) sum_k x_k^t Delta_k^t
  W^{t+1} = (1 - psi) W' + psi / h sum_{j=1}^{h} W^{t-j},

over the h <= H - 1 past global models there are (psi = 0 while there are
none, so in round 0).

Eqs. 9-11 print ``W^t - eta_g sum_k x_k Delta_k`` with Delta_k = w_end -
W^t (Algorithm 1, line 10), which moves the model away from the local
models; `server_update` uses ``+``, the sign of the paper's own Eq. 2
(W^{t+1} = W^t + h(Delta)) and of FedAU. The 1 / N is FedAU's normalisation
(the released code, github.com/IBM/fedau, main.py); with x_k ~ 1 / p_k the
printed sum is about N times a mean update, so ``normalize='none'`` (the
printed form) needs eta_g ~ 1 / N. docs/methods.md, Heterogeneous
participation, gives the reasoning.
"""

import jax
import jax.numpy as jnp

from fedjax_metric.algorithms import fedau, fedavg, pmfl_server
from fedjax_metric.models import merge_variables

# ---------------------------------------------------------------------------
# The client's buffer.
# ---------------------------------------------------------------------------


def push(buffer, head, fill, model):
  """Ring-buffer push: writes ``model`` into slot ``head``.

  Args:
    buffer: a tuple of N model pytrees (the slots); slots 0 .. fill - 1 are
      filled, since writes start at slot 0, and once fill = N the oldest
      entry is the one overwritten.
    head, fill: int32 scalars, the next slot to write and the filled count.
    model: the pytree to store.

  Returns:
    (buffer, head, fill) after the push. One select per slot: a tuple of
    slots, unlike a stacked [N, ...] array written at a traced index, never
    makes XLA copy the client table around it (with N = 1 the stacked form
    copied the whole 250-client table at every client).
  """
  size = len(buffer)
  buffer = tuple(
    jax.tree.map(lambda b, m, j=j: jnp.where(head == j, m, b), slot, model)
    for j, slot in enumerate(buffer)
  )
  return buffer, (head + 1) % size, jnp.minimum(fill + 1, size)


def init_client(buffer_size, keep_previous, variables, key):
  """init_client: the row {'buffer' (N zero model slots), 'fill', 'head'}
  and, with ``keep_previous``, the node's 'previous' local model."""
  del key
  row = {
    'buffer': tuple(
      jax.tree.map(jnp.zeros_like, variables) for _ in range(buffer_size)
    ),
    'fill': jnp.zeros((), jnp.int32),
    'head': jnp.zeros((), jnp.int32),
  }
  if keep_previous:
    row['previous'] = jax.tree.map(jnp.zeros_like, variables)
  return row


def client_begin(keep_previous, ctx):
  """client_begin: train from W^t (Algorithm 1, line 4), carrying the row
  and the model the next step starts from ('current')."""
  global_variables = ctx.server_state.variables
  local = dict(ctx.client_row)
  # The model the next step starts from: pushed once the step is taken.
  local['current'] = global_variables
  if keep_previous:
    # A node that never trained has no previous model: z_k^{tE} is then
    # the global one (Algorithm 1, line 4).
    local['previous'] = jax.tree.map(
      lambda p, g: jnp.where(local['fill'] > 0, p, g),
      local['previous'],
      global_variables,
    )
  return global_variables, local


def client_step_end(params, model_state, ctx):
  """client_step_end: pushes the model the step started from."""
  local = dict(ctx.local_state)
  local['buffer'], local['head'], local['fill'] = push(
    local['buffer'], local['head'], local['fill'], local['current']
  )
  local['current'] = merge_variables(params, model_state)
  return local


# ---------------------------------------------------------------------------
# The server's past global models.
# ---------------------------------------------------------------------------


def init_extra(past, variables, num_clients, key):
  """Algorithm 2's Q, R and interval sums, int32 [N], and (``past`` =
  H - 1 > 0) the 'history' [H - 1, ...] of past global models with its
  'history_count'."""
  del key
  # Distinct buffers (not `init_adaptive_state`'s one shared zeros): the
  # round donates the state, and one array donated twice is an error.
  extra = {
    name: jnp.zeros((num_clients,), jnp.int32)
    for name in ('interval', 'count', 'interval_sum')
  }
  if past:
    extra['history'] = jax.tree.map(
      lambda v: jnp.zeros((past,) + v.shape, v.dtype), variables
    )
    extra['history_count'] = jnp.zeros((), jnp.int32)
  return extra


def _mix(a, b, weight):
  """(1 - weight) a + weight b, leaf by leaf."""
  return jax.tree.map(lambda x, y: (1.0 - weight) * x + weight * y, a, b)


def server_update(
  options, server_optimizer, num_rounds, server_state, aggregate, cohort_rows
):
  """server_update: Eqs. 9-11 and Algorithm 2's bookkeeping for all N nodes.

  ``options`` is `pmfl.Options` (cutoff, normalize, history_size,
  mixing_compensation), ``num_rounds`` T of Eq. 11. Before H - 1 past global
  models exist, Eq. 10 averages the ones there are (psi / h over the h
  available). A round nobody joins leaves the model and the history
  unchanged (Algorithm 2's counters still advance); psi is clipped at 0
  past round T - 1.
  """
  del cohort_rows
  extra = server_state.extra
  past = options.history_size - 1
  state = pmfl_server.AdaptiveState(
    extra['interval'], extra['count'], extra['interval_sum']
  )
  num_clients = state.interval.shape[0]
  participated = fedau.participation_vector(aggregate, num_clients)
  state, _ = pmfl_server.adaptive_step(
    state, participated, cutoff=options.cutoff
  )
  divisor = float(num_clients) if options.normalize == 'num_clients' else 1.0
  if past:
    count = extra['history_count']
    psi = jnp.maximum(
      pmfl_server.history_mixing_weight(server_state.round, num_rounds), 0.0
    )
    psi = jnp.where(count > 0, psi, 0.0)
    if options.mixing_compensation:
      divisor = divisor * pmfl_server.mixing_step_factor(psi, count)
  direction = jax.tree.map(lambda u: u / divisor, aggregate.update_sum)
  new_state = fedavg.apply_server_optimizer(
    server_optimizer, server_state, direction
  )
  new_extra = dict(extra)
  if past:
    filled = (jnp.arange(past) < count).astype(jnp.float32)
    past_mean = jax.tree.map(
      lambda h: (
        jnp.tensordot(
          filled.astype(h.dtype),
          h,
          axes=1,
          precision=jax.lax.Precision.HIGHEST,
        )
        / jnp.maximum(count, 1).astype(h.dtype)
      ),
      extra['history'],
    )
    new_state = new_state._replace(
      variables=_mix(new_state.variables, past_mean, psi)
    )
    # Newest first; the order does not matter to the plain mean.
    new_extra['history'] = jax.tree.map(
      lambda h, w: jnp.concatenate([w[None], h[:-1]]),
      extra['history'],
      server_state.variables,
    )
    new_extra['history_count'] = jnp.minimum(count + 1, past)
  new_state = fedavg.skip_if_nobody(
    aggregate, server_state, new_state._replace(extra=new_extra)
  )
  return new_state._replace(
    extra={
      **new_state.extra,
      'interval': state.interval,
      'count': state.count,
      'interval_sum': state.interval_sum,
    }
  )
