"""Pieces shared by the one-class-per-client algorithms.

FedMetric (Park, Hosseini and Yun, 'Federated Learning with Metric Loss',
FL-ICML workshop 2021), Deep SVDD (Ruff et al., 'Deep One-Class
Classification', ICML 2018), FedAwS (Yu et al., 'Federated Learning with
Only Positive Labels', ICML 2020) and FedUV (Hosseini et al., 'Federated
Learning of User Verification Models Without Sharing Embeddings', ICML 2021)
all train an embedding network g on clients that each hold one class. They
share: the embedding width D of the model, the class a client holds (read
from its own labels, never from the server), passes over the client's whole
round of batches with a frozen model (centers, radii), and the reductions of
per-example losses over a batch.
"""

import functools

import jax
import jax.numpy as jnp

from fedjax_metric.algorithms.fedavg import plain_sum_share  # noqa: F401
from fedjax_metric.losses import masked_mean
from fedjax_metric.models import split_variables

REDUCTIONS = ('sum', 'mean')


def _initial_outputs(model, key):
  """The outputs of a freshly initialised ``model`` on a zero input."""
  params, model_state = split_variables(model.init(key))
  outputs, _ = model.apply(
    params,
    model_state,
    jnp.zeros(model.input_shape, jnp.float32),
    train=False,
  )
  return outputs


def embedding_dim(model) -> int:
  """D, the width of ``model``'s 'embedding' output (abstract evaluation).

  Args:
    model: `ModelFns` with a known ``input_shape``.

  Raises:
    ValueError: the model has no input shape or no 'embedding' output.
  """
  if model.input_shape is None:
    raise ValueError(
      'One-class algorithms need a model built with an input '
      'shape (models.build(..., input_shape=...)) to size '
      'their per-client state.'
    )

  outputs = jax.eval_shape(
    functools.partial(_initial_outputs, model), jax.random.key(0)
  )
  if 'embedding' not in outputs:
    raise ValueError(
      f"The model returns {sorted(outputs)}, no 'embedding'; "
      'one-class algorithms train an embedding network.'
    )
  return int(outputs['embedding'].shape[-1])


def num_model_classes(model, default: int) -> int:
  """The model's ``num_classes`` field (set from the dataset by assemble.py)."""
  value = getattr(model.module, 'num_classes', 0) or 0
  return int(value) if value > 0 else int(default)


def frozen_embeddings(model, variables, images):
  """g(x) in eval mode, without gradient: [B, D]."""
  params, model_state = split_variables(variables)
  outputs, _ = model.apply(params, model_state, images, train=False)
  return jax.lax.stop_gradient(outputs['embedding'])


def _largest_label(carry, batch):
  """scan body: the largest real label so far (-1 before any)."""
  labels = jnp.where(batch.mask, batch.labels, -1)
  return jnp.maximum(carry, jnp.max(labels))


def client_class(ctx):
  """The class a client holds: the label of its examples, int32 scalar.

  Read from the client's own round of batches, so no client-to-class table
  is needed. For a client holding several classes (not the one-class
  setting) it is the largest label; 0 for a client with no example.
  """
  label = ctx.scan_batches(_largest_label, jnp.asarray(-1, jnp.int32))
  return jnp.maximum(label, 0).astype(jnp.int32)


def _embedding_sum(model, variables, carry, batch):
  """scan body: (sum of the real examples' embeddings [D], their count)."""
  total, count = carry
  e = frozen_embeddings(model, variables, batch.images)
  w = batch.mask.astype(e.dtype)
  # An elementwise sum, not a matmul, so TF32 on GPUs cannot round it.
  return total + jnp.sum(w[:, None] * e, axis=0), count + jnp.sum(w)


def scan_center(ctx, model, variables, dim):
  """Mean embedding of the client's round of batches under ``variables``.

  In epoch mode the round holds every local example once, so this is the
  local center of all local data; in step mode it is the mean over the
  round's batches. ``dim`` is D (`embedding_dim`). Returns ([D] center,
  float32 count of real examples).
  """
  total, count = ctx.scan_batches(
    functools.partial(_embedding_sum, model, variables),
    (jnp.zeros((dim,), jnp.float32), jnp.zeros((), jnp.float32)),
  )
  return total / jnp.maximum(count, 1.0), count


def _largest_distance(model, variables, center, carry, batch):
  """scan body: the largest ||g(x_i) - center|| of a real example so far."""
  e = frozen_embeddings(model, variables, batch.images)
  d = jnp.sqrt(jnp.sum(jnp.square(e - center[None]), axis=-1))
  return jnp.maximum(carry, jnp.max(jnp.where(batch.mask, d, 0.0)))


def scan_radius(ctx, model, variables, center):
  """max_i ||g(x_i) - center|| over the client's round of batches; 0 if none."""
  return ctx.scan_batches(
    functools.partial(_largest_distance, model, variables, center),
    jnp.zeros((), jnp.float32),
  )


def reduce_batch(per_example, mask, reduction):
  """'sum' over the real examples (the papers' sum over the batch) or their
  'mean' (`masked_mean`)."""
  if reduction == 'sum':
    return jnp.sum(jnp.where(mask, per_example, 0.0))
  return masked_mean(per_example, mask)


def check_choice(knob, value, choices):
  if value not in choices:
    raise ValueError(
      f'{knob} must be one of {choices}, got {value!r} '
      f'(--config.algorithm_kwargs.{knob}).'
    )
