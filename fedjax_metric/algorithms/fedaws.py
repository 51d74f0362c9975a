"""FedAwS: Federated Averaging with Spreadout.

Yu, Rawat, Menon and Kumar, 'Federated Learning with Only Positive Labels',
ICML 2020, Algorithm 1. Each client holds one class y. The server keeps a
class-embedding matrix W [C, D]; a client receives the shared network and
only its own row w_y, trains both with the positive-only loss
`fedjax_metric.losses.fedaws_positive_loss`, and returns them. The server
averages the networks (FedAvg), averages the returned rows per class, and
then takes gradient steps on the spreadout regulariser
`spreadout_regularizer` over the whole of W (Eq. 2 of Park, Hosseini and
Yun, 'Federated Learning with Metric Loss', FL-ICML workshop 2021, restates
it), so that the classes do not collapse onto one point.

Slots replaced relative to FedAvg:
  * ``init_server``: W (rows drawn from a Gaussian, L2-normalised) in the
    server extra;
  * ``client_begin``: the client's class from its labels; the trained
    variables are ``{'params': {'model': ..., 'class_embedding': w_y}}``
    so the local optimiser updates w_y with the network;
  * ``client_loss``: the positive loss;
  * ``client_final``: the model delta, and w_y scattered into a [C, D]
    per-class sum with a [C] count;
  * ``server_update``: FedAvg on the model; per-class means of W; spreadout
    steps with step size lr_multiplier x the round's local learning rate
    (the server step lambda eta of Yu et al., Algorithm 1).
"""

import dataclasses
import functools
from typing import Literal, Optional

import jax
import jax.numpy as jnp

from fedjax_metric.algorithms import fedavg
from fedjax_metric.algorithms import oneclass_common as common
from fedjax_metric.algorithms.spec import AlgorithmSpec
from fedjax_metric.losses.metric import _l2_normalize
from fedjax_metric.losses.oneclass import (
  FEDAWS_FORMS,
  SPREADOUT_DISTANCES,
  fedaws_positive_loss,
  spreadout_regularizer,  # noqa: F401
)
from fedjax_metric.models import merge_variables, split_variables


@dataclasses.dataclass(frozen=True)
class Options:
  """FedAwS's options.

  Attributes:
    num_classes: C, rows of W; None reads the model's ``num_classes``
      (assemble.py sets it from the dataset), which takes precedence.
    positive_margin: margin of the cosine positive loss
      (max(0, margin - cos)^2; 0.9).
    positive_form: 'cosine' or 'euclidean' (see `fedaws_positive_loss`).
    spreadout_distance: 'cosine' (d = 1 - cos) or 'euclidean' on
      normalised rows.
    spreadout_margin: nu (>= 0); with 'cosine' and nu = 1 every pair with a
      positive cosine is pushed towards orthogonality (fluke's setting).
    spreadout_reduction: 'sum' (Yu et al.'s double sum) or 'mean'.
    spreadout_steps_per_round: server gradient steps per round (>= 0; 1 =
      Yu et al.; fluke takes 100).
    lr_multiplier: lambda (>= 0), the server step is lambda x the local
      learning rate eta.
    reduction: the client loss over a batch, 'mean' or 'sum'.
  """

  num_classes: Optional[int] = None
  positive_margin: float = 0.9
  positive_form: Literal['cosine', 'euclidean'] = 'cosine'
  spreadout_distance: Literal['euclidean', 'cosine'] = 'cosine'
  spreadout_margin: float = 1.0
  spreadout_reduction: Literal['sum', 'mean'] = 'sum'
  spreadout_steps_per_round: int = 1
  lr_multiplier: float = 10.0
  reduction: Literal['sum', 'mean'] = 'mean'

  def __post_init__(self):
    common.check_choice('positive_form', self.positive_form, FEDAWS_FORMS)
    common.check_choice(
      'spreadout_distance', self.spreadout_distance, SPREADOUT_DISTANCES
    )
    common.check_choice(
      'spreadout_reduction', self.spreadout_reduction, common.REDUCTIONS
    )
    common.check_choice('reduction', self.reduction, common.REDUCTIONS)
    for knob in (
      'spreadout_steps_per_round',
      'lr_multiplier',
      'spreadout_margin',
    ):
      value = getattr(self, knob)
      if not value >= 0:
        raise ValueError(
          f'{knob} must be >= 0, got {value} (--config.algorithm_kwargs.{knob}).'
        )


def spreadout_steps(
  class_embeddings, *, step_size, num_steps, margin, distance, reduction
):
  """``num_steps`` plain gradient steps on `spreadout_regularizer`.

  Yu et al., 'Federated Learning with Only Positive Labels', ICML 2020,
  Algorithm 1 (server): W <- W - lambda eta grad reg_sp(W); the
  third-party implementation in fluke (github.com/makgyver/fluke,
  fluke/algorithms/fedaws.py) takes 100 such steps.

  Args:
    class_embeddings: [C, D] W, not necessarily normalised (the
      regulariser normalises its rows; W keeps its scale, as in fluke).
    step_size: lambda eta (scalar, may be traced).
    num_steps: number of steps (Python int >= 0).
    margin, distance, reduction: see `spreadout_regularizer`.

  Returns:
    [C, D].
  """
  grad = jax.grad(
    lambda w: spreadout_regularizer(
      w, margin=margin, distance=distance, reduction=reduction
    )
  )
  return jax.lax.fori_loop(
    0, num_steps, lambda _, w: w - step_size * grad(w), class_embeddings
  )


def init_extra(num_classes, dim, variables, num_clients, key):
  """W [C, D]: Gaussian rows, L2-normalised."""
  del variables, num_clients
  return {
    'class_embeddings': _l2_normalize(
      jax.random.normal(key, (num_classes, dim))
    )
  }


def client_begin(ctx):
  """client_begin: train ``{'model': global params, 'class_embedding':
  w_y}``, y the client's class (local_state)."""
  label = common.client_class(ctx)
  params, model_state = split_variables(ctx.server_state.variables)
  w = ctx.server_state.extra['class_embeddings'][label]
  trained = {'model': params, 'class_embedding': w}
  return merge_variables(trained, model_state), {'class': label}


def client_loss(options, model, params, model_state, batch, ctx):
  """The positive loss of g(x_i) against w_y, reduced over the batch."""
  del ctx
  outputs, model_state = model.apply(
    params['model'], model_state, batch.images, train=True, mask=batch.mask
  )
  per_example = fedaws_positive_loss(
    outputs['embedding'],
    params['class_embedding'],
    margin=options.positive_margin,
    form=options.positive_form,
    mask=batch.mask,
  )
  return (
    common.reduce_batch(per_example, batch.mask, options.reduction),
    (model_state, {}),
  )


def client_final(num_classes, weighting, end_variables, ctx):
  """The model delta; w_y in a [C, D] per-class sum with a [C] count, and
  the local learning rate, each a plain sum over the cohort."""
  trained, model_state = split_variables(end_variables)
  delta, weight, row = fedavg.delta_final(
    weighting, merge_variables(trained['model'], model_state), ctx
  )
  present = (ctx.num_examples > 0).astype(jnp.float32)
  one_hot = jax.nn.one_hot(ctx.local_state['class'], num_classes) * present
  shares = common.plain_sum_share(
    {
      'class_sum': one_hot[:, None] * trained['class_embedding'][None],
      'class_count': one_hot,
      'lr_sum': ctx.learning_rate * present,
      'clients': present,
    },
    weight,
  )
  return {'model': delta, **shares}, weight, row


def server_update(
  options, server_optimizer, server_state, aggregate, cohort_rows
):
  """FedAvg on the model; W's rows averaged per class, then spreadout steps
  of size lambda eta (W unchanged in a round nobody took part in)."""
  sums = aggregate.update_sum
  state = fedavg.server_update(
    server_optimizer,
    server_state,
    aggregate._replace(update_sum=sums['model']),
    cohort_rows,
  )
  old = server_state.extra['class_embeddings']
  counts = sums['class_count'][:, None]
  averaged = jnp.where(
    counts > 0, sums['class_sum'] / jnp.maximum(counts, 1.0), old
  )
  learning_rate = sums['lr_sum'] / jnp.maximum(sums['clients'], 1.0)
  spread = spreadout_steps(
    averaged,
    step_size=options.lr_multiplier * learning_rate,
    num_steps=int(options.spreadout_steps_per_round),
    margin=options.spreadout_margin,
    distance=options.spreadout_distance,
    reduction=options.spreadout_reduction,
  )
  w = jnp.where(aggregate.num_participants > 0, spread, old)
  return state._replace(extra={'class_embeddings': w})


def build(model, options, *, server_optimizer, weighting='uniform'):
  """FedAwS as an `engine.Algorithm`.

  Args:
    model: `ModelFns` with an 'embedding' output.
    options: `Options`.
    server_optimizer: optax transformation of the model pseudo-gradient.
    weighting: 'uniform' or 'num_examples' (the model average; W's rows are
      averaged over the clients holding each class with equal weights).

  Raises:
    ValueError: neither the model nor the options give num_classes.
  """
  num_classes = common.num_model_classes(model, options.num_classes or 0)
  if num_classes < 1:
    raise ValueError(
      'FedAwS needs num_classes >= 1 (the model has none; '
      'pass --config.algorithm_kwargs.num_classes).'
    )
  dim = common.embedding_dim(model)
  base = fedavg.build(
    model, server_optimizer=server_optimizer, weighting=weighting
  )
  return base._replace(
    init_server=fedavg.make_init_server(
      server_optimizer, functools.partial(init_extra, num_classes, dim)
    ),
    client_begin=client_begin,
    client_loss=functools.partial(client_loss, options, model),
    client_final=functools.partial(client_final, num_classes, weighting),
    server_update=functools.partial(server_update, options, server_optimizer),
  )


SPEC = AlgorithmSpec(
  'fedaws',
  build,
  Options,
  description='FedAwS (Yu et al., 2020): server-side spreadout of class '
  'embeddings.',
)
SPECS = (SPEC,)
