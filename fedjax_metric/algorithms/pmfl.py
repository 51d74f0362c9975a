"""PMFL: model-contrastive local training with historical models, adaptive
aggregation weights and historical global-model mixing.

Zhang et al., 'Towards Performance-Enhanced Model-Contrastive Federated
Learning using Historical Information in Heterogeneous Scenarios',
preprint, 2025, Algorithms 1 and 2, Eqs. 4-11.

Client (Algorithm 1, Section IV-C). Every node keeps a sliding buffer S_l of
its N most recent local models (N = 5), kept across rounds. At local
iteration e of round t the loss is CE + lambda * l_con (Eq. 5), with l_con
(Eq. 4, `losses.pmfl_contrastive_loss`) contrasting the current
representation z with the global one Z^t (always positive) and with those of
the buffered models, split into positives and negatives by a threshold mu.
The buffer at iteration e is {w^{tE+e-N}, ..., w^{tE+e-1}}: it never holds
the model being trained. After every real local step the model that step
started from is pushed (oldest evicted), so the last N iterates of a node's
latest rounds are kept; the end-of-round model w^{(t+1)E} itself is never an
entry (line 4 replaces it by W^{t+1} before the next iteration).

Server (Algorithm 2, Section IV-D). x_k^t from `adaptive_step` (cutoff C =
50); unlike FedAU the interval that ends in round t already counts in x_k^t.
Then (Eqs. 9-11)

  W' = W^t + eta_g (1 / N) sum_k x_k^t Delta_k^t
  W^{t+1} = (1 - psi) W' + psi / (H - 1) sum_{h=1}^{H-1} W^{t-h},
  psi = 1/2 - t / (2 (T - 1)).

Eqs. 9-11 print ``W^t - eta_g sum_k x_k Delta_k`` with Delta_k = w_end -
W^t (Algorithm 1, line 10), which moves the model away from the local models;
this module uses ``+``, the sign of the paper's own Eq. 2 (W^{t+1} = W^t +
h(Delta)) and of FedAU. The 1 / N is FedAU's normalisation (the released
code, github.com/IBM/fedau, main.py); with x_k ~ 1 / p_k the printed sum is
about N times a mean update, so ``normalize='none'`` (the printed form)
needs eta_g ~ 1 / N. docs/methods.md, Heterogeneous participation, gives
the reasoning.

The weight bookkeeping (`adaptive_step`, pure JAX, usable inside a jitted
round; `adaptive_weights` over a whole participation mask on the host) and
psi (`history_mixing_weight`, `mixing_step_factor`) are pmfl_server.py,
re-exported here; this module holds the client's buffer and the algorithm
(`make`).
"""

from typing import Optional

import jax
import jax.numpy as jnp

from fedjax_metric import losses
from fedjax_metric.algorithms import fedau, fedavg
from fedjax_metric.algorithms.pmfl_server import (  # re-exported
  AdaptiveState as AdaptiveState,
)
from fedjax_metric.algorithms.pmfl_server import (
  adaptive_step as adaptive_step,
)
from fedjax_metric.algorithms.pmfl_server import (
  adaptive_weight as adaptive_weight,
)
from fedjax_metric.algorithms.pmfl_server import (
  adaptive_weights as adaptive_weights,
)
from fedjax_metric.algorithms.pmfl_server import (
  history_mixing_weight as history_mixing_weight,
)
from fedjax_metric.algorithms.pmfl_server import (
  init_adaptive_state as init_adaptive_state,
)
from fedjax_metric.algorithms.pmfl_server import (
  mixing_step_factor as mixing_step_factor,
)
from fedjax_metric.contract import NO_RUN_FACTS, RunFacts
from fedjax_metric.losses.metric import _cosine
from fedjax_metric.models import merge_variables, split_variables

# ---------------------------------------------------------------------------
# The algorithm.
# ---------------------------------------------------------------------------

THRESHOLDS = ('previous', 'current', 'start')
NORMALIZATIONS = ('num_clients', 'none')


def participant_weight(extra, client_id):
  """x_k^t of a node that participates in round t, from the state before it.

  Algorithm 2 lines 3-9 for A_k^t = 1: Q* = Q_k + 1 and x_k^t = (R_k
  x_k^{t-1} + Q*) / (R_k + 1) (= Q* when R_k = 0). Equals `adaptive_step`'s
  x for a participant; the cutoff does not matter here because a
  participation always records its interval.

  Args:
    extra: the server extra (int32 [N] 'interval', 'count', 'interval_sum').
    client_id: int32 scalar (an out-of-range padding id reads the last row).
  """
  interval = extra['interval'].at[client_id].get(mode='clip') + 1
  count = extra['count'].at[client_id].get(mode='clip')
  total = extra['interval_sum'].at[client_id].get(mode='clip')
  return ((total + interval) / (count + 1)).astype(jnp.float32)


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


def _stacked_zeros(variables, size):
  return jax.tree.map(
    lambda v: jnp.zeros((size,) + v.shape, v.dtype), variables
  )


def _mix(a, b, weight):
  """(1 - weight) a + weight b, leaf by leaf."""
  return jax.tree.map(lambda x, y: (1.0 - weight) * x + weight * y, a, b)


def _check_positive_int(name, value, minimum=1):
  if int(value) != value or value < minimum:
    raise ValueError(
      f'{name} must be an integer >= {minimum}, got {value} '
      f'(algorithm_kwargs.{name}).'
    )
  return int(value)


def make(
  model,
  *,
  server_optimizer,
  run: RunFacts = NO_RUN_FACTS,
  weighting='uniform',
  contrastive_weight=0.5,
  temperature=0.5,
  buffer_size=5,
  threshold='previous',
  cutoff: Optional[int] = 50,
  history_size=3,
  normalize='num_clients',
  mixing_compensation=False,
):
  """PMFL (Zhang et al., 2025, Algorithms 1 and 2) as an `engine.Algorithm`.

  The representation z is the model's 'projection' output, or its
  'embedding' when it has none: the small CNN's embedding is
  ReLU(Dense(conv features)) with the classifier on top, which is the
  paper's encoder -> projection (MLP + activation) -> classifier (Section
  IV-C1). Frozen models (global, buffered, previous) run in eval mode.

  Slots replaced relative to FedAvg:
    * ``init_client``: the row {'buffer' (N model slots), 'fill', 'head'} (and
      'previous' for threshold='previous'); N x buffer_size models in all,
      checked against the memory budget by train.run;
    * ``init_server``: Algorithm 2's Q, R and interval sums [N] and the
      buffer of the H - 1 past global models in the server extra;
    * ``client_begin`` / ``client_step_end``: carry the buffer through the
      local steps and push the pre-step model after every real step;
    * ``client_loss``: CE + lambda l_con (Eqs. 4-5);
    * ``client_final``: Delta_k with weight x_k^t, the buffer written back;
    * ``server_update``: Eqs. 9-11 and Algorithm 2's bookkeeping for all N
      nodes.

  Threshold mu (Section IV-C2 defines mu = Sim(z_k^{tE}, Z^t), per sample,
  for the node's model w_k^{tE} at the start of the round; but Algorithm 1
  line 4 sets w_k^{tE} = W^t, which makes mu = 1 and Z+ empty, against the
  text's 'this threshold varies across nodes'), ``threshold``:
    'previous' (default): z_k^{tE} from the node's previous local model, the
      end of its last round (what MOON calls the previous model); the global
      model while the node has none. Varies across nodes and rounds, fixed
      within a round, as the text says (docs/methods.md, Heterogeneous
      participation, has the measurements behind the default).
    'current': mu = Sim(z, Z^t) with the current z at every iteration.
    'start': the literal reading, mu = Sim(Z^t, Z^t) (1 for a non-zero
      representation): every buffered model is a negative and l_con is MOON's
      loss with the buffer as negatives.

  Before H - 1 past global models exist, Eq. 10 averages the ones there are
  (psi / h over the h available), and psi = 0 in round 0 where there are
  none. A round nobody joins leaves the model and the history unchanged
  (Algorithm 2's counters still advance); psi is clipped at 0 past round
  T - 1.

  Args:
    model: `ModelFns`.
    server_optimizer: optax transformation of the pseudo-gradient; sgd(eta_g)
      with eta_g = 1 (Section V-C).
    weighting: 'uniform' only (anything else is refused): a node's weight is
      x_k^t alone.
    contrastive_weight: lambda (0.5, Section V-C).
    temperature: tau (0.5).
    buffer_size: N, the local buffer's length (5).
    threshold: 'previous', 'current' or 'start' (above).
    cutoff: C, a positive int (50), or None for no cutoff.
    history_size: H, the global buffer's length (3); 1 turns the history
      mixing off (H - 1 = 0 past models).
    run: the run's facts; ``run.num_rounds`` is T of Eq. 11 (1000, SVHN's
      T in Section V-C, when not given).
    normalize: 'num_clients' (default: the weighted sum divided by N, as
      FedAU's released code does) or 'none' (Eqs. 9-10 as printed).
    mixing_compensation: an ablation, not in the paper: multiply the
      round's update by `mixing_step_factor`'s inverse, so that Eq. 10's
      mixing keeps its smoothing but no longer shortens the step (see
      `mixing_step_factor`).
  """
  fedavg.refuse_weighting(
    'pmfl', weighting, "a client's weight is its participation weight x_k alone"
  )
  if threshold not in THRESHOLDS:
    raise ValueError(
      f'Unknown threshold {threshold!r}; use one of '
      f'{THRESHOLDS} (algorithm_kwargs.threshold).'
    )
  if normalize not in NORMALIZATIONS:
    raise ValueError(
      f'Unknown normalize {normalize!r}; use one of '
      f'{NORMALIZATIONS} (algorithm_kwargs.normalize).'
    )
  if not contrastive_weight >= 0:
    raise ValueError(
      f'contrastive_weight (lambda) must be >= 0, got {contrastive_weight}.'
    )
  if not temperature > 0:
    raise ValueError(f'temperature must be > 0, got {temperature}.')
  buffer_size = _check_positive_int('buffer_size', buffer_size)
  history_size = _check_positive_int('history_size', history_size)
  # T of Eq. 11: the run's (assemble.build_algorithm fills run), else the
  # paper's T = 1000 (SVHN, Section V-C) for a factory called directly.
  num_rounds = _check_positive_int(
    'num_rounds', 1000 if run.num_rounds is None else run.num_rounds
  )
  if cutoff is not None:
    cutoff = _check_positive_int('cutoff', cutoff)
  past = history_size - 1
  base = fedavg.build(
    model, server_optimizer=server_optimizer, weighting='uniform'
  )

  def init_client(variables, key):
    del key
    row = {
      'buffer': tuple(
        jax.tree.map(jnp.zeros_like, variables) for _ in range(buffer_size)
      ),
      'fill': jnp.zeros((), jnp.int32),
      'head': jnp.zeros((), jnp.int32),
    }
    if threshold == 'previous':
      row['previous'] = jax.tree.map(jnp.zeros_like, variables)
    return row

  def init_extra(variables, num_clients, key):
    del key
    # Distinct buffers (not `init_adaptive_state`'s one shared zeros): the
    # round donates the state, and one array donated twice is an error.
    extra = {
      name: jnp.zeros((num_clients,), jnp.int32)
      for name in ('interval', 'count', 'interval_sum')
    }
    if past:
      extra['history'] = _stacked_zeros(variables, past)
      extra['history_count'] = jnp.zeros((), jnp.int32)
    return extra

  def client_begin(ctx):
    global_variables = ctx.server_state.variables
    local = dict(ctx.client_row)
    # The model the next step starts from: pushed once the step is taken.
    local['current'] = global_variables
    if threshold == 'previous':
      # A node that never trained has no previous model: z_k^{tE} is then
      # the global one (Algorithm 1, line 4).
      local['previous'] = jax.tree.map(
        lambda p, g: jnp.where(local['fill'] > 0, p, g),
        local['previous'],
        global_variables,
      )
    return global_variables, local

  def representation(variables, images):
    params, model_state = split_variables(variables)
    outputs, _ = model.apply(params, model_state, images, train=False)
    return jax.lax.stop_gradient(
      outputs.get('projection', outputs['embedding'])
    )

  def client_loss(params, model_state, batch, ctx):
    local = ctx.local_state
    outputs, ce, model_state = fedavg.forward_and_cross_entropy(
      model, params, model_state, batch
    )
    if contrastive_weight == 0:  # 'w/o MCT' (Table V): skip the forwards.
      return ce, (model_state, {'ce': ce, 'metric': jnp.zeros_like(ce)})
    z = outputs.get('projection', outputs['embedding'])
    z_global = representation(ctx.server_state.variables, batch.images)
    # One forward per slot: on CPU, XLA runs convolutions over a mapped
    # axis much slower than N separate ones.
    z_buffer = jnp.stack(
      [representation(slot, batch.images) for slot in local['buffer']]
    )
    filled = jnp.arange(buffer_size) < local['fill']
    if threshold == 'previous':
      mu = _cosine(representation(local['previous'], batch.images), z_global)
    elif threshold == 'current':
      mu = _cosine(jax.lax.stop_gradient(z), z_global)
    else:
      mu = _cosine(z_global, z_global)
    contrastive = losses.masked_mean(
      losses.pmfl_contrastive_loss(
        z,
        z_global,
        z_buffer,
        filled,
        mu,
        temperature=temperature,
        mask=batch.mask,
      ),
      batch.mask,
    )
    loss = ce + contrastive_weight * contrastive
    return loss, (model_state, {'ce': ce, 'metric': contrastive})

  def client_step_end(params, model_state, ctx):
    local = dict(ctx.local_state)
    local['buffer'], local['head'], local['fill'] = push(
      local['buffer'], local['head'], local['fill'], local['current']
    )
    local['current'] = merge_variables(params, model_state)
    return local

  def client_final(end_variables, ctx):
    delta, _, _ = base.client_final(end_variables, ctx)
    local = ctx.local_state
    row = {
      'buffer': local['buffer'],
      'fill': local['fill'],
      'head': local['head'],
    }
    if threshold == 'previous':
      row['previous'] = end_variables
    weight = participant_weight(ctx.server_state.extra, ctx.client_id)
    return delta, weight, row

  def server_update(server_state, aggregate, cohort_rows):
    del cohort_rows
    extra = server_state.extra
    state = AdaptiveState(
      extra['interval'], extra['count'], extra['interval_sum']
    )
    num_clients = state.interval.shape[0]
    participated = fedau.participation_vector(aggregate, num_clients)
    state, _ = adaptive_step(state, participated, cutoff=cutoff)
    divisor = float(num_clients) if normalize == 'num_clients' else 1.0
    if past:
      count = extra['history_count']
      psi = jnp.maximum(
        history_mixing_weight(server_state.round, num_rounds), 0.0
      )
      psi = jnp.where(count > 0, psi, 0.0)
      if mixing_compensation:
        divisor = divisor * mixing_step_factor(psi, count)
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

  return base._replace(
    init_server=fedavg.make_init_server(server_optimizer, init_extra),
    init_client=init_client,
    client_begin=client_begin,
    client_loss=client_loss,
    client_step_end=client_step_end,
    client_final=client_final,
    server_update=server_update,
  )
