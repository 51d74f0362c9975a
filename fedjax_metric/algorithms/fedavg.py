"""FedAvg (McMahan et al., AISTATS 2017) and the default piece of every slot.

McMahan, Moore, Ramage, Hampson and Aguera y Arcas, 'Communication-Efficient
Learning of Deep Networks from Decentralized Data', AISTATS 2017, Algorithm 1
(longer notes: docs/methods.md, FedAvg).

Clients minimise the masked mean cross-entropy from the global model; the
server averages the deltas ``w_k - w`` weighted by client size (Eq. in Alg. 1:
``w <- sum_k n_k/n w_k``) or uniformly, then applies a server optimizer to the
pseudo-gradient ``-mean delta`` (sgd(1.0) reproduces plain averaging).
Non-trainable model state (BatchNorm statistics) is averaged the same way.
Other algorithms reuse these pieces and `_replace` the slots they change.
"""

import functools

import jax
import jax.numpy as jnp

from fedjax_metric import engine
from fedjax_metric.algorithms.spec import NO_OPTIONS, AlgorithmSpec
from fedjax_metric.losses import masked_mean, softmax_cross_entropy
from fedjax_metric.models import split_variables

WEIGHTINGS = ('num_examples', 'uniform')


def no_client_state(variables, key):
  del variables, key
  return ()


def init_server(server_optimizer, init_extra, variables, num_clients, key):
  """init_server: the global model, the server optimizer's state, round 0.

  ``init_extra(variables, num_clients, key) -> extra`` builds the
  algorithm's own server state (None: ``()``).
  """
  params, _ = split_variables(variables)
  extra = () if init_extra is None else init_extra(variables, num_clients, key)
  return engine.ServerState(
    variables=variables,
    opt_state=server_optimizer.init(params),
    round=jnp.zeros((), jnp.int32),
    extra=extra,
  )


def make_init_server(server_optimizer, init_extra=None):
  """`init_server` bound to a server optimizer and an ``init_extra``."""
  return functools.partial(init_server, server_optimizer, init_extra)


def start_from_global(ctx):
  """client_begin: train from the global model; no per-round state."""
  return ctx.server_state.variables, ()


def unchanged_local_state(params, model_state, ctx):
  del params, model_state
  return ctx.local_state


def forward_and_cross_entropy(model, params, model_state, batch, *, rows=None):
  """The training forward pass and its masked mean cross-entropy.

  Args:
    model: `ModelFns`.
    params, model_state: the variables being trained.
    batch: `engine.Batch`; BatchNorm statistics use its real examples.
    rows: take the cross-entropy over the first ``rows`` examples only
      (FedQuad's anchors); None means all.

  Returns:
    ``(outputs, ce, new_model_state)``.
  """
  outputs, model_state = model.apply(
    params, model_state, batch.images, train=True, mask=batch.mask
  )
  rows = slice(None) if rows is None else slice(0, rows)
  ce = masked_mean(
    softmax_cross_entropy(outputs['logits'][rows], batch.labels[rows]),
    batch.mask[rows],
  )
  return outputs, ce, model_state


def frozen_outputs(model, variables, images):
  """The model's evaluation-mode outputs under ``variables`` (BatchNorm's
  running statistics), as constants: no gradient flows into them. The
  frozen global or previous models of MOON and FedNTD."""
  params, model_state = split_variables(variables)
  outputs, _ = model.apply(params, model_state, images, train=False)
  return jax.lax.stop_gradient(outputs)


def cross_entropy_loss(model, params, model_state, batch, ctx):
  """client_loss: masked mean softmax cross-entropy of the model's logits."""
  del ctx
  _, ce, model_state = forward_and_cross_entropy(
    model, params, model_state, batch
  )
  return ce, (model_state, {})


def ce_plus_term_loss(model, term_fn, weight, params, model_state, batch, ctx):
  """client_loss = masked CE + weight * masked mean of ``term_fn``.

  ``term_fn(outputs, batch) -> [B]`` is a per-example metric or contrastive
  term computed from the model's outputs (embedding, features) on the batch.
  """
  del ctx
  outputs, ce, model_state = forward_and_cross_entropy(
    model, params, model_state, batch
  )
  term = masked_mean(term_fn(outputs, batch), batch.mask)
  return ce + weight * term, (model_state, {'ce': ce, 'metric': term})


def plain_sum_share(tree, weight):
  """``tree / weight`` (0 where weight is 0), so the engine's weighted sum
  of what a client returns is the plain sum over clients."""
  safe = jnp.where(weight > 0, weight, 1.0)
  return jax.tree.map(lambda x: jnp.where(weight > 0, x / safe, 0.0), tree)


def refuse_weighting(algorithm: str, weighting: str, reason: str) -> None:
  """For an algorithm whose weights come from elsewhere: a
  ``server.weighting`` other than 'uniform' would be ignored, so it is an
  error naming the algorithm and why."""
  if weighting != 'uniform':
    raise ValueError(
      f'{algorithm} does not use server.weighting={weighting!r} ({reason}); '
      "leave --config.server.weighting at 'uniform'."
    )


def check_weighting(weighting: str) -> None:
  if weighting not in WEIGHTINGS:
    raise ValueError(
      f'Unknown weighting {weighting!r}; use one of {WEIGHTINGS}.'
    )


def delta_final(weighting, end_variables, ctx):
  """client_final: update = local - global variables; weight by size or 1."""
  delta = jax.tree.map(jnp.subtract, end_variables, ctx.server_state.variables)
  weight = (
    ctx.num_examples
    if weighting == 'num_examples'
    else jnp.ones_like(ctx.num_examples)
  )
  return delta, weight, ctx.client_row


def mean_update(aggregate: engine.Aggregate):
  """Weighted mean of the updates; zero when no client took part."""
  scale = 1.0 / jnp.maximum(aggregate.weight_sum, 1e-12)
  return jax.tree.map(lambda u: u * scale, aggregate.update_sum)


def apply_server_optimizer(server_optimizer, server_state, mean_delta):
  """Server step on params; non-trainable state moves by the mean delta."""
  params, model_state = split_variables(server_state.variables)
  delta_params, delta_state = split_variables(mean_delta)
  pseudo_grad = jax.tree.map(jnp.negative, delta_params)
  updates, opt_state = server_optimizer.update(
    pseudo_grad, server_state.opt_state, params
  )
  params = jax.tree.map(jnp.add, params, updates)
  model_state = jax.tree.map(jnp.add, model_state, delta_state)
  return server_state._replace(
    variables={'params': params, **model_state},
    opt_state=opt_state,
    round=server_state.round + 1,
  )


def skip_if_nobody(aggregate: engine.Aggregate, old_state, new_state):
  """``new_state``, or after a round in which no client took part (possible
  under participation patterns), or only clients of weight 0 (clients
  without examples under example weighting), ``old_state`` with the round
  advanced: a server optimizer with momentum would otherwise still move the
  model."""
  unchanged = old_state._replace(round=new_state.round)
  someone = (aggregate.num_participants > 0) & (aggregate.weight_sum > 0)
  return jax.tree.map(
    lambda new, old: jnp.where(someone, new, old),
    new_state,
    unchanged,
  )


def server_update(server_optimizer, server_state, aggregate, cohort_rows):
  """server_update: the server optimizer's step on the weighted mean delta
  (no step in a round nobody took part in)."""
  del cohort_rows
  new_state = apply_server_optimizer(
    server_optimizer, server_state, mean_update(aggregate)
  )
  return skip_if_nobody(aggregate, server_state, new_state)


def build(
  model, options=NO_OPTIONS, *, server_optimizer, weighting='num_examples'
):
  """FedAvg as an `engine.Algorithm`.

  Args:
    model: `ModelFns`.
    options: none of its own (`spec.NO_OPTIONS`).
    server_optimizer: optax transformation of the pseudo-gradient.
    weighting: 'num_examples' (McMahan et al.) or 'uniform' (FedRCL).
  """
  del options
  check_weighting(weighting)
  return engine.Algorithm(
    init_server=make_init_server(server_optimizer),
    init_client=no_client_state,
    client_begin=start_from_global,
    client_loss=functools.partial(cross_entropy_loss, model),
    client_step_end=unchanged_local_state,
    client_final=functools.partial(delta_final, weighting),
    server_update=functools.partial(server_update, server_optimizer),
  )


def build_with_term(model, term_fn, *, server_optimizer, weighting, weight=1.0):
  """FedAvg whose client loss is CE + weight * ``term_fn`` (see
  `ce_plus_term_loss`): SupConFL, FedRCL and FedSCL."""
  return build(
    model, server_optimizer=server_optimizer, weighting=weighting
  )._replace(
    client_loss=functools.partial(ce_plus_term_loss, model, term_fn, weight)
  )


SPEC = AlgorithmSpec(
  'fedavg',
  build,
  description='FedAvg (McMahan et al., 2017): local SGD, weighted averaging.',
)
SPECS = (SPEC,)
