"""FedAvg (McMahan et al., AISTATS 2017) and the default piece of every slot.

Clients minimise the masked mean cross-entropy from the global model; the
server averages the deltas ``w_k - w`` weighted by client size (Eq. in Alg. 1:
``w <- sum_k n_k/n w_k``) or uniformly, then applies a server optimizer to the
pseudo-gradient ``-mean delta`` (sgd(1.0) reproduces plain averaging).
Non-trainable model state (BatchNorm statistics) is averaged the same way.
Other algorithms reuse these pieces and `_replace` the slots they change.
"""

import jax
import jax.numpy as jnp

from fedjax_metric import engine
from fedjax_metric.losses import masked_mean, softmax_cross_entropy
from fedjax_metric.models import split_variables

WEIGHTINGS = ('num_examples', 'uniform')


def no_client_state(variables, key):
  del variables, key
  return ()


def no_server_extra(variables, num_clients):
  del variables, num_clients
  return ()


def no_local_state(server_state, client_row, client_id):
  del server_state, client_row, client_id
  return ()


def unchanged_local_state(local_state, params, model_state, ctx):
  del params, model_state, ctx
  return local_state


def make_cross_entropy_loss(model):
  """client_loss: masked mean softmax cross-entropy of the model's logits."""

  def client_loss(params, model_state, batch, ctx):
    del ctx
    outputs, model_state = model.apply(params, model_state, batch.images,
                                       train=True, mask=batch.mask)
    loss = masked_mean(softmax_cross_entropy(outputs['logits'], batch.labels),
                       batch.mask)
    return loss, (model_state, {})

  return client_loss


def make_ce_plus_term_loss(model, term_fn, weight=1.0):
  """client_loss = masked CE + weight * masked mean of ``term_fn``.

  ``term_fn(outputs, batch) -> [B]`` is a per-example metric or contrastive
  term computed from the model's outputs (embedding, features) on the batch.
  """

  def client_loss(params, model_state, batch, ctx):
    del ctx
    outputs, model_state = model.apply(params, model_state, batch.images,
                                       train=True, mask=batch.mask)
    ce = masked_mean(softmax_cross_entropy(outputs['logits'], batch.labels),
                     batch.mask)
    term = masked_mean(term_fn(outputs, batch), batch.mask)
    return ce + weight * term, (model_state, {'ce': ce, 'metric': term})

  return client_loss


def make_delta_final(weighting: str = 'num_examples'):
  """client_final: update = local - global variables; weight by size or 1."""
  if weighting not in WEIGHTINGS:
    raise ValueError(f'Unknown weighting {weighting!r}; use one of {WEIGHTINGS}.')

  def client_final(server_state, client_row, client_id, local_state,
                   end_variables, num_examples):
    del client_id, local_state
    delta = jax.tree.map(jnp.subtract, end_variables, server_state.variables)
    weight = num_examples if weighting == 'num_examples' else jnp.ones_like(
        num_examples)
    return delta, weight, client_row

  return client_final


def mean_update(aggregate: engine.Aggregate):
  """Weighted mean of the updates; zero when no client took part."""
  scale = 1.0 / jnp.maximum(aggregate.weight_sum, 1e-12)
  return jax.tree.map(lambda u: u * scale, aggregate.update_sum)


def apply_server_optimizer(server_optimizer, server_state, mean_delta):
  """Server step on params; non-trainable state moves by the mean delta."""
  params, model_state = split_variables(server_state.variables)
  delta_params, delta_state = split_variables(mean_delta)
  pseudo_grad = jax.tree.map(jnp.negative, delta_params)
  updates, opt_state = server_optimizer.update(pseudo_grad,
                                               server_state.opt_state, params)
  params = jax.tree.map(jnp.add, params, updates)
  model_state = jax.tree.map(jnp.add, model_state, delta_state)
  return server_state._replace(variables={'params': params, **model_state},
                               opt_state=opt_state,
                               round=server_state.round + 1)


def make_server_update(server_optimizer):
  def server_update(server_state, aggregate, client_table):
    del client_table
    return apply_server_optimizer(server_optimizer, server_state,
                                  mean_update(aggregate))
  return server_update


def make(model, *, server_optimizer, weighting='num_examples'):
  """FedAvg as an `engine.Algorithm`.

  Args:
    model: `ModelFns`.
    server_optimizer: optax transformation of the pseudo-gradient.
    weighting: 'num_examples' (McMahan et al.) or 'uniform' (FedRCL).
  """
  return engine.Algorithm(
      init_client=no_client_state,
      init_server_extra=no_server_extra,
      client_begin=no_local_state,
      client_loss=make_cross_entropy_loss(model),
      client_step_end=unchanged_local_state,
      client_final=make_delta_final(weighting),
      server_update=make_server_update(server_optimizer))


def make_with_term(model, term_fn, *, server_optimizer, weighting,
                   weight=1.0):
  """FedAvg whose client loss is CE + weight * ``term_fn`` (see
  `make_ce_plus_term_loss`): SupConFL, FedRCL and FedSCL."""
  return make(model, server_optimizer=server_optimizer,
              weighting=weighting)._replace(
                  client_loss=make_ce_plus_term_loss(model, term_fn, weight))
