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

import dataclasses
import functools
import typing
from typing import Literal

import jax
import jax.numpy as jnp

from fedjax_metric import losses
from fedjax_metric.algorithms import ssl_common, ssl_schedules
from fedjax_metric.algorithms.spec import AlgorithmSpec
from fedjax_metric.data import views as views_lib

Scope = Literal['layer', 'model']
SCOPES = typing.get_args(Scope)


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


@dataclasses.dataclass(frozen=True)
class Options:
  """L-DAWA's options (the released code's, tau of FedU2's copy).

  Attributes:
    scope: what one delta_k^l covers: 'layer' (one cosine per tensor, the
      released code) or 'model' (one over the whole model, FedU2's copy).
    warmup_rounds: rounds of plain FedAvg before L-DAWA (3, the released
      code's start round <= 2; 0 starts at once; >= 0).
    temperature: NT-Xent tau (0.07; > 0).
    self_in_denominator: NT-Xent form (True: FedU2's copy keeps the
      self-similarity in the denominator).
    view_order: augmentation order, 'fedu2' or 'ssd' (`ssl_common.two_views`).
    drop_last: drop partial batches.
  """

  scope: Scope = 'layer'
  warmup_rounds: int = 3
  temperature: float = 0.07
  self_in_denominator: bool = True
  view_order: Literal['ssd', 'fedu2'] = 'fedu2'
  drop_last: bool = False

  def __post_init__(self):
    ssl_common.check_positive('temperature', self.temperature, allow_zero=False)
    ssl_common.check_positive('warmup_rounds', self.warmup_rounds)
    if self.scope not in SCOPES:
      raise ValueError(
        f'scope must be one of {SCOPES}, got {self.scope!r} '
        '(--config.algorithm_kwargs.scope).'
      )
    if self.view_order not in views_lib.VIEW_ORDERS:
      raise ValueError(
        f'Unknown order {self.view_order!r}; use one of '
        f'{views_lib.VIEW_ORDERS}.'
      )


def client_loss(options, model, views, params, model_state, batch, ctx):
  """SimCLR's NT-Xent between the projections of two views of the batch."""
  mask = batch.mask
  out1, out2, model_state = ssl_common.two_view_forward(
    model, params, model_state, batch.raw_images, mask, ctx.key, views
  )
  loss = losses.masked_mean(
    losses.nt_xent_loss(
      out1['projection'],
      out2['projection'],
      temperature=options.temperature,
      self_in_denominator=options.self_in_denominator,
      mask=mask,
    ),
    mask,
  )
  return loss, (model_state, {'nt_xent': loss})


def client_final(options, weighting, end_variables, ctx):
  """The update delta_k w_k - w_g with weight 1 (plain w_k - w_g with the
  FedAvg weight during the warm-up)."""
  global_variables = ctx.server_state.variables
  deltas = divergence_weights(
    end_variables, global_variables, scope=options.scope
  )
  scaled = jax.tree.map(
    lambda d, w, g: d * w - g, deltas, end_variables, global_variables
  )
  plain = jax.tree.map(jnp.subtract, end_variables, global_variables)
  warm = ctx.server_state.round < options.warmup_rounds
  update = jax.tree.map(lambda p, s: jnp.where(warm, p, s), plain, scaled)
  # Weight 1 after the warm-up: the engine's weighted mean is then the
  # plain mean over participants, the released 1 / |S|.
  weight = jnp.where(warm, ssl_common.aggregation_weight(ctx, weighting), 1.0)
  # A client that trained on nothing sends nothing (the engine's other
  # methods give it weight 0 through its step count).
  weight = jnp.where(ctx.num_steps > 0, weight, 0.0)
  return update, weight, ctx.client_row


def build(model, options, *, server_optimizer, weighting='num_batches'):
  """L-DAWA with SimCLR clients.

  Args:
    model: `ModelFns` with a 'projection' output.
    options: `Options`.
    server_optimizer: optax transformation of the pseudo-gradient
      (sgd(1.0): the aggregate above is the new model).
    weighting: the warm-up rounds' FedAvg weights: 'num_batches',
      'num_examples' (the released Flower strategy) or 'uniform'.
  """
  ssl_common.check_weighting(weighting)
  views = ssl_common.two_views(options.view_order)
  return ssl_common.build_algorithm(
    functools.partial(client_loss, options, model, views),
    server_optimizer=server_optimizer,
    weighting=weighting,
    schedules=ssl_schedules.ssl_batch_schedules(drop_last=options.drop_last),
  )._replace(client_final=functools.partial(client_final, options, weighting))


SPEC = AlgorithmSpec(
  'l_dawa',
  build,
  Options,
  description='L-DAWA (Rehman et al., 2023): layer-wise divergence-aware '
  'weights.',
)
SPECS = (SPEC,)
