"""L-DAWA: layer-wise divergence aware weight aggregation.

Rehman et al., 'L-DAWA: Layer-wise Divergence Aware Weight Aggregation in
Federated Self-Supervised Visual Representation Learning', ICCV 2023. The
server scales each client's layer by its angular agreement with the global
model the client started from,

  delta_k^l = cos(w_k^l, w_g^l)  (clipped to <= 1),
  w_g^l <- (1 / |S|) sum_{k in S} delta_k^l w_k^l,

as in the authors' released code (github.com/yasar-rehman/L-DAWA,
L-DAWA-Agg.py ``my_aggregate`` and FL_Pretraining/main_CIFAR10_LDAWA.py):
a 'layer' is every tensor of the model's state with at least one dimension
(weights, biases and BatchNorm statistics alike); the weights are not
normalised to sum to one (their sum is the mean cosine, <= 1); and the
first rounds are plain FedAvg (the released strategy aggregates with FedAvg
while its start round is <= 2, i.e. ``warmup_rounds = 3``). We could not
read the paper's equation itself; the form above is the released code's.
FedU2's repository copy (github.com/XeniaLLL/FedU2,
src/my/algo/LDAWA/functional.py ``layer_aggregate``) instead takes one
cosine over the whole flattened model (``scope='model'``), with no warm-up.

Local training: SimCLR's NT-Xent on two views, as the L-DAWA paper's
SimCLR experiments and FedU2's copy (``FedSimclrClient``, tau = 0.07, the
self-similarity kept in the denominator).

Everything the server needs is computable per client, so this is a
``client_final`` (the update is delta_k w_k - w_g with weight 1; the
engine's sum divided by the number of participants is then the formula
above minus w_g) and FedAvg's ``server_update``. A layer where either norm
is 0 keeps delta = 1 (the released code would divide by zero).
"""

import jax
import jax.numpy as jnp

from fedjax_metric import losses
from fedjax_metric.algorithms import ssl_common, ssl_schedules
from fedjax_metric.contract import NO_RUN_FACTS, RunFacts

SCOPES = ('layer', 'model')


def _cosine(dot, a_sq, b_sq):
  """<a, b> / (|a| |b|) from the inner product and squared norms; 1 where a
  norm is 0; clipped to <= 1 as the released code does."""
  ok = (a_sq > 0) & (b_sq > 0)
  cos = dot / jnp.sqrt(jnp.where(ok, a_sq * b_sq, 1.0))
  return jnp.where(ok, jnp.minimum(cos, 1.0), 1.0)


def divergence_weights(local_variables, global_variables, *, scope='layer'):
  """delta_k^l for every leaf: cos(w_k^l, w_g^l), clipped to <= 1.

  Args:
    local_variables, global_variables: pytrees of the same structure.
    scope: 'layer' (one cosine per tensor, the released L-DAWA code) or
      'model' (one cosine over all tensors, FedU2's copy).

  Returns:
    A pytree of scalars like the inputs; 0-d leaves get 1 (the released
    code leaves scalars unscaled).
  """
  if scope not in SCOPES:
    raise ValueError(f'scope must be one of {SCOPES}, got {scope!r}.')
  dots = jax.tree.map(
    lambda a, b: jnp.vdot(a, b).astype(jnp.float32),
    local_variables,
    global_variables,
  )
  a_sq = jax.tree.map(
    lambda a: jnp.vdot(a, a).astype(jnp.float32), local_variables
  )
  b_sq = jax.tree.map(
    lambda b: jnp.vdot(b, b).astype(jnp.float32), global_variables
  )
  if scope == 'model':
    total = lambda t: sum(jax.tree.leaves(t))
    whole = _cosine(total(dots), total(a_sq), total(b_sq))
    return jax.tree.map(
      lambda x: whole if x.ndim > 0 else jnp.ones((), jnp.float32),
      local_variables,
    )
  return jax.tree.map(
    lambda x, d, s1, s2: (
      _cosine(d, s1, s2) if x.ndim > 0 else jnp.ones((), jnp.float32)
    ),
    local_variables,
    dots,
    a_sq,
    b_sq,
  )


def make(
  model,
  *,
  server_optimizer,
  run: RunFacts = NO_RUN_FACTS,
  weighting='num_batches',
  scope='layer',
  warmup_rounds=3,
  temperature=0.07,
  self_in_denominator=True,
  view_order='fedu2',
  drop_last=False,
):
  """L-DAWA with SimCLR clients.

  Args:
    model: `ModelFns` with a 'projection' output.
    server_optimizer: optax transformation of the pseudo-gradient
      (sgd(1.0): the aggregate above is the new model).
    weighting: the warm-up rounds' FedAvg weights: 'num_batches',
      'num_examples' (the released Flower strategy) or 'uniform'.
    scope: 'layer' (released code) or 'model' (FedU2's copy).
    warmup_rounds: rounds of plain FedAvg before L-DAWA (3, released code;
      0 starts at once).
    temperature: NT-Xent tau (0.07).
    self_in_denominator: NT-Xent form (True: FedU2's copy).
    view_order: augmentation order.
    drop_last: drop partial batches.
  """
  ssl_common.check_positive('temperature', temperature, allow_zero=False)
  ssl_common.check_positive('warmup_rounds', warmup_rounds)
  ssl_common.check_weighting(weighting)
  if scope not in SCOPES:
    raise ValueError(
      f'scope must be one of {SCOPES}, got {scope!r} '
      '(--config.algorithm_kwargs.scope).'
    )
  views = ssl_common.two_views(view_order)

  def client_loss(params, model_state, batch, ctx):
    mask = batch.mask
    out1, out2, model_state = ssl_common.two_view_forward(
      model, params, model_state, batch.raw_images, mask, ctx.key, views
    )
    loss = losses.masked_mean(
      losses.nt_xent_loss(
        out1['projection'],
        out2['projection'],
        temperature=temperature,
        self_in_denominator=self_in_denominator,
        mask=mask,
      ),
      mask,
    )
    return loss, (model_state, {'nt_xent': loss})

  def client_final(end_variables, ctx):
    global_variables = ctx.server_state.variables
    deltas = divergence_weights(end_variables, global_variables, scope=scope)
    scaled = jax.tree.map(
      lambda d, w, g: d * w - g, deltas, end_variables, global_variables
    )
    plain = jax.tree.map(jnp.subtract, end_variables, global_variables)
    warm = ctx.server_state.round < warmup_rounds
    update = jax.tree.map(lambda p, s: jnp.where(warm, p, s), plain, scaled)
    # Weight 1 after the warm-up: the engine's weighted mean is then the
    # plain mean over participants, the released 1 / |S|.
    weight = jnp.where(warm, ssl_common.aggregation_weight(ctx, weighting), 1.0)
    # A client that trained on nothing sends nothing (the engine's other
    # methods give it weight 0 through its step count).
    weight = jnp.where(ctx.num_steps > 0, weight, 0.0)
    return update, weight, ctx.client_row

  return ssl_common.build_algorithm(
    client_loss,
    server_optimizer=server_optimizer,
    weighting=weighting,
    schedules=ssl_schedules.ssl_batch_schedules(drop_last=drop_last),
  )._replace(client_final=client_final)
