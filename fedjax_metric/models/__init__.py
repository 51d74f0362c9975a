"""Models: flax.linen modules that return a dict of named outputs.

Every model's ``__call__(images, *, train, mask=None)`` returns
``{'logits': [B, num_classes], 'embedding': [B, D], 'features': [levels]}``,
and the models with FedMLB's branch points also ``'stages'`` (the
activations a ``graft`` replaces).
The engine never sees a module: it sees `ModelFns`, two pure functions over
``variables = {'params': ..., 'batch_stats': ...}`` (``batch_stats`` only for
BatchNorm models), so local training, aggregation and checkpointing all work on
plain pytrees.
"""

import functools
from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp

from fedjax_metric.models import (
  fedquad_cnn,
  lenet,
  linear,
  moon_cnn,
  resnet,
  resnet32,
  small_cnn,
  ssl,
)


class ModelFns(NamedTuple):
  """Pure functions around a linen module.

  Attributes:
    init: ``(key, images=None) -> variables``; without images, zeros of
      ``input_shape`` (algorithms that re-initialise per client use that).
    apply: ``(params, model_state, images, *, train, mask=None,
      graft=None) -> (outputs dict, new_model_state)``; ``graft`` (models
      with FedMLB branch points: 'small_cnn', 'resnet18') is
      ``(level, activation)`` replacing ``outputs['stages'][level]``;
      ``model_state`` is the non-trainable part of the variables (``{}`` or
      ``{'batch_stats': ...}``). With
      ``train=True`` BatchNorm uses and updates batch statistics, computed only
      over examples where ``mask`` [B] is True.
    module: the linen module, for inspection.
  """

  init: Callable[..., Any]
  apply: Callable[..., Any]
  module: Any
  input_shape: Any = None  # (1, H, W, C) when known


def split_variables(variables):
  """``variables -> (params, model_state)``; model_state holds the rest."""
  model_state = {k: v for k, v in variables.items() if k != 'params'}
  return variables['params'], model_state


def merge_variables(params, model_state):
  return {'params': params, **model_state}


def _cast_floats(tree, dtype):
  return jax.tree.map(
    lambda x: x.astype(dtype) if jnp.issubdtype(x.dtype, jnp.floating) else x,
    tree,
  )


def make_model_fns(module, input_shape=None, compute_dtype=None) -> ModelFns:
  """Wraps a linen module whose __call__ takes (images, *, train, mask).

  ``compute_dtype`` (e.g. ``jnp.bfloat16``) runs the forward pass in that
  dtype while the stored variables stay float32: params and images are cast
  on the way in (gradients flow back through the cast to the float32
  params), outputs and updated BatchNorm statistics are cast back to
  float32. None computes in the variables' own dtype.
  """

  # One program: flax's init run op by op compiles every initialiser alone.
  jitted_init = jax.jit(
    lambda key, images: module.init(key, images, train=False)
  )

  def init(key, images=None):
    if images is None:
      if input_shape is None:
        raise ValueError('init needs images: this ModelFns has no input_shape.')
      images = jnp.zeros(input_shape, jnp.float32)
    return dict(jitted_init(key, images))

  def apply(params, model_state, images, *, train, mask=None, graft=None):
    level, activation = (None, None) if graft is None else graft
    return jitted_forward(
      params,
      model_state,
      images,
      mask,
      activation,
      train=train,
      graft_level=level,
    )

  # The forward pass as a jitted function of its own (inlined when called
  # inside a jitted program, so the compiled round is unchanged). Why: JAX
  # caches the traced forward pass by this function and the argument shapes,
  # so every program built from this ModelFns (the vmap, chunked and host
  # executors, R rounds a call and its remainder, evaluation) and every
  # transformation of it (grad, vmap) reuses one trace instead of tracing
  # the flax module again; and a call outside jit runs as one compiled
  # program, not op by op. The graft's level picks a branch point in Python
  # (`layers.graft_at`), so a graft is static: its level and its
  # activation's shape, not the activation, enter the cache key.
  @functools.partial(jax.jit, static_argnames=('train', 'graft_level'))
  def jitted_forward(
    params, model_state, images, mask, graft_activation, *, train, graft_level
  ):
    # ``graft`` only reaches modules that take it (FedMLB's hybrid passes).
    extra = (
      {} if graft_level is None else {'graft': (graft_level, graft_activation)}
    )
    if compute_dtype is not None:
      outputs, updated = apply_in_dtype(
        _cast_floats(params, compute_dtype),
        model_state,
        images.astype(compute_dtype),
        train=train,
        mask=mask,
        **extra,
      )
      updated = jax.tree.map(
        lambda new, old: new.astype(old.dtype), updated, model_state
      )
      return _cast_floats(outputs, jnp.float32), updated
    return apply_in_dtype(
      params, model_state, images, train=train, mask=mask, **extra
    )

  def apply_in_dtype(params, model_state, images, *, train, mask, **extra):
    variables = merge_variables(params, model_state)
    if train and model_state:
      outputs, updated = module.apply(
        variables,
        images,
        train=True,
        mask=mask,
        mutable=list(model_state),
        **extra,
      )
      return outputs, dict(updated)
    outputs = module.apply(variables, images, train=train, mask=mask, **extra)
    return outputs, model_state

  return ModelFns(
    init=init, apply=apply, module=module, input_shape=input_shape
  )


# name -> constructor(num_classes, **kwargs); explicit and grep-able.
REGISTRY = {
  'small_cnn': small_cnn.SmallCNN,
  'fedquad_cnn': fedquad_cnn.FedQuadCNN,
  'moon_cnn': moon_cnn.MoonCNN,
  'resnet18': resnet.ResNet18,
  'ssl_resnet18': ssl.SSLResNet18,
  'ssl_cnn': ssl.SSLSmallCNN,
  # Vector inputs [B, d] (data/synthetic.py); [B, ...] is flattened.
  'logistic_regression': linear.LogisticRegression,
  'mlp': linear.MLP,
  # Embedding networks of the one-class family: no 'logits' output.
  'lenet': lenet.LeNet,
  'resnet32': resnet32.ResNet32,
}


# Models of vectors ([B, d] inputs; images are flattened).
VECTOR_MODELS = ('logistic_regression', 'mlp')
# The model a dataset of vectors brings where the config's model expects
# images (a packaged config's CNN): the FedProx paper's for Synthetic.
DATASET_MODELS = {'synthetic': 'logistic_regression'}


def model_for_dataset(model_config, dataset_name: str):
  """The model block a run builds: ``model_config``, or for a dataset of
  vectors its own model where the config's takes images. A vector model
  named on such a dataset keeps only the fields it declares (the config's
  block was written for another model)."""
  own = DATASET_MODELS.get(dataset_name)
  if own is None:
    return model_config
  name = model_config.name if model_config.name in VECTOR_MODELS else own
  fields = set(REGISTRY[name].__dataclass_fields__)
  kept = {k: v for k, v in model_config.items() if k in fields}
  if name != model_config.name:
    kept = {}
  return type(model_config)({'name': name, **kept})


def build(
  name: str, num_classes: int, input_shape=None, *, compute_dtype=None, **kwargs
) -> ModelFns:
  """Builds a registered model by name; kwargs go to the module.

  ``input_shape`` (H, W, C) lets ``init(key)`` run without sample images;
  ``compute_dtype`` see `make_model_fns`.
  """
  if name not in REGISTRY:
    raise ValueError(
      f'Unknown model {name!r}; known models: {sorted(REGISTRY)}. '
      'Set --config.model.name to one of them.'
    )
  fields = set(REGISTRY[name].__dataclass_fields__) - {'parent', 'name'}
  unknown = sorted(set(kwargs) - fields)
  if unknown:
    raise TypeError(
      f'{name} has no field(s) {unknown}; its fields are '
      f'{sorted(fields - {"num_classes"})}'
    )
  shape = None if input_shape is None else (1,) + tuple(input_shape)
  return make_model_fns(
    REGISTRY[name](num_classes=num_classes, **kwargs), shape, compute_dtype
  )


def count_params(params) -> int:
  return int(sum(jnp.size(x) for x in jax.tree.leaves(params)))
