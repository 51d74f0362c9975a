"""Models: flax.linen modules that return a dict of named outputs.

Every model's ``__call__(images, *, train, mask=None)`` returns
``{'logits': [B, num_classes], 'embedding': [B, D], 'features': [levels]}``.
The engine never sees a module: it sees `ModelFns`, two pure functions over
``variables = {'params': ..., 'batch_stats': ...}`` (``batch_stats`` only for
BatchNorm models), so local training, aggregation and checkpointing all work on
plain pytrees.
"""

from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp

from fedjax_metric.models import small_cnn


class ModelFns(NamedTuple):
  """Pure functions around a linen module.

  Attributes:
    init: ``(key, images [B,H,W,C] float) -> variables``.
    apply: ``(params, model_state, images, *, train, mask=None) ->
      (outputs dict, new_model_state)``; ``model_state`` is the non-trainable
      part of the variables (``{}`` or ``{'batch_stats': ...}``). With
      ``train=True`` BatchNorm uses and updates batch statistics, computed only
      over examples where ``mask`` [B] is True.
    module: the linen module, for inspection.
  """
  init: Callable[..., Any]
  apply: Callable[..., Any]
  module: Any


def split_variables(variables):
  """``variables -> (params, model_state)``; model_state holds the rest."""
  model_state = {k: v for k, v in variables.items() if k != 'params'}
  return variables['params'], model_state


def merge_variables(params, model_state):
  return {'params': params, **model_state}


def make_model_fns(module) -> ModelFns:
  """Wraps a linen module whose __call__ takes (images, *, train, mask)."""

  def init(key, images):
    return dict(module.init(key, images, train=False))

  def apply(params, model_state, images, *, train, mask=None):
    variables = merge_variables(params, model_state)
    if train and model_state:
      outputs, updated = module.apply(
          variables, images, train=True, mask=mask, mutable=list(model_state))
      return outputs, dict(updated)
    outputs = module.apply(variables, images, train=train, mask=mask)
    return outputs, model_state

  return ModelFns(init=init, apply=apply, module=module)


# name -> constructor(num_classes, **kwargs); explicit and grep-able.
REGISTRY = {
    'small_cnn': small_cnn.SmallCNN,
}


def build(name: str, num_classes: int, **kwargs) -> ModelFns:
  """Builds a registered model by name; kwargs go to the module."""
  if name not in REGISTRY:
    raise ValueError(
        f'Unknown model {name!r}; known models: {sorted(REGISTRY)}. '
        'Set --config.model.name to one of them.')
  fields = set(REGISTRY[name].__dataclass_fields__) - {'parent', 'name'}
  unknown = sorted(set(kwargs) - fields)
  if unknown:
    raise TypeError(f'{name} has no field(s) {unknown}; its fields are '
                    f'{sorted(fields - {"num_classes"})}')
  return make_model_fns(REGISTRY[name](num_classes=num_classes, **kwargs))


def count_params(params) -> int:
  return int(sum(jnp.size(x) for x in jax.tree.leaves(params)))
