"""Deep SVDD per client: the non-federated baseline of the one-class setting.

Ruff, Vandermeulen, Goernitz, Deecke, Siddiqui, Binder, Mueller and Kloft,
'Deep One-Class Classification', ICML 2018 (One-Class Deep SVDD), as the
DeepSVDD column of Park, Hosseini and Yun, 'Federated Learning with Metric
Loss', FL-ICML workshop 2021, Table 2 ("DeepSVDD is not FL method ... each
client has different model").

Every client trains its own model, held in its row of the client table (the
engine vmaps the rows like any per-client state), to minimise the squared
distance of its embeddings to a center c fixed when it first trains: the
mean embedding of its data under its initial model, with coordinates closer
to 0 than ``eps`` moved to +-eps (`fedjax_metric.losses.deepsvdd_center`, as
the authors' released code, github.com/lukasruff/Deep-SVDD-PyTorch,
src/optim/deepSVDD_trainer.py, init_center_c). Nothing is averaged: the
server only counts rounds. Evaluation scores class c with the model of the
client(s) holding c (`fedjax_metric.evaluation.oneclass`).

Slots replaced relative to FedAvg: ``init_client`` (the initial model, an
empty center), ``client_begin`` (start from the row's model; the center is
computed in the client's first round), ``client_loss``, ``client_final``
(writes model and center back; the update is empty), ``server_update``.

Not reproduced: the autoencoder pre-training of Ruff et al. (the FedMetric
paper does not mention it) and their Adam optimiser; the optimiser is the
config's (SGD lr 0.1 in the one-class setting).
"""

import dataclasses
import functools
from typing import Literal

import jax
import jax.numpy as jnp
import optax

from fedjax_metric.algorithms import fedavg
from fedjax_metric.algorithms import oneclass_common as common
from fedjax_metric.algorithms.spec import AlgorithmSpec
from fedjax_metric.losses.oneclass import deepsvdd_center, deepsvdd_loss

# What the server state's opt_state is built with: the plain averaging
# server's (no leaves). Nothing steps it; it keeps the layout of the server
# state (and of checkpoints) that of every other algorithm.
_UNUSED_SERVER_OPTIMIZER = optax.sgd(1.0)


@dataclasses.dataclass(frozen=True)
class Options:
  """Deep SVDD's options.

  Attributes:
    eps: the center rule's threshold: coordinates of c closer to 0 than eps
      move to +-eps (0.1 in the authors' code; 0 = the plain mean; >= 0).
    reduction: 'mean' over the batch (the authors' code) or 'sum'.
  """

  eps: float = 0.1
  reduction: Literal['sum', 'mean'] = 'mean'

  def __post_init__(self):
    common.check_choice('reduction', self.reduction, common.REDUCTIONS)
    if not self.eps >= 0:
      raise ValueError(
        f'eps must be >= 0, got {self.eps} (--config.algorithm_kwargs.eps).'
      )


def init_client(dim, variables, key):
  """The row: the client's model (at first the common initial one), its
  center c [D] and whether c is fixed yet."""
  del key
  return {
    'variables': variables,
    'center': jnp.zeros((dim,), jnp.float32),
    # int32, not bool: 1 once the center is fixed.
    'initialised': jnp.zeros((), jnp.int32),
  }


def first_center(options, model, dim, ctx):
  """c from the mean embedding of the client's data under its model."""
  mean, _ = common.scan_center(ctx, model, ctx.client_row['variables'], dim)
  return deepsvdd_center(mean[None], eps=options.eps)


def client_begin(options, model, dim, ctx):
  """client_begin: from the row's model; c computed in the first round."""
  row = ctx.client_row
  # A cond, so that one client at a time (the host executor) skips the pass
  # over its data after its first round; under vmap both run.
  center = jax.lax.cond(
    row['initialised'] > 0,
    lambda: row['center'],
    functools.partial(first_center, options, model, dim, ctx),
  )
  return row['variables'], {'center': center}


def client_loss(options, model, params, model_state, batch, ctx):
  """||phi(x_i; W) - c||^2, reduced over the batch."""
  outputs, model_state = model.apply(
    params, model_state, batch.images, train=True, mask=batch.mask
  )
  per_example = deepsvdd_loss(
    outputs['embedding'], ctx.local_state['center'], mask=batch.mask
  )
  return (
    common.reduce_batch(per_example, batch.mask, options.reduction),
    (model_state, {}),
  )


def client_final(end_variables, ctx):
  """Model and center back to the row (unchanged for a client without
  data); nothing goes to the server, the weight only counts participants."""
  has_data = ctx.num_examples > 0
  row = {
    'variables': end_variables,
    'center': ctx.local_state['center'],
    'initialised': jnp.ones((), jnp.int32),
  }
  row = jax.tree.map(
    lambda new, old: jnp.where(has_data, new, old), row, ctx.client_row
  )
  return (), jnp.ones((), jnp.float32), row


def server_update(server_state, aggregate, cohort_rows):
  """Nothing is averaged: the server only counts rounds."""
  del aggregate, cohort_rows
  return server_state._replace(round=server_state.round + 1)


def build(model, options, *, weighting='uniform'):
  """Deep SVDD with one model per client, as an `engine.Algorithm`.

  Ruff et al., 'Deep One-Class Classification', ICML 2018, the One-Class
  Deep SVDD objective (its weight decay is the optimiser's)::

    min_W  1/n sum_i ||phi(x_i; W) - c||^2

  Args:
    model: `ModelFns` with an 'embedding' output. Ruff et al. remove every
      bias so that the hypersphere cannot collapse trivially (the 'lenet'
      model does by default).
    options: `Options`.
    weighting: 'uniform' only (nothing is averaged; anything else is
      refused). There is no server optimizer (the spec does not read one).
  """
  fedavg.refuse_weighting(
    'deepsvdd',
    weighting,
    'every client keeps its own model; nothing is averaged',
  )
  dim = common.embedding_dim(model)
  base = fedavg.build(model, server_optimizer=_UNUSED_SERVER_OPTIMIZER)
  return base._replace(
    init_client=functools.partial(init_client, dim),
    client_begin=functools.partial(client_begin, options, model, dim),
    client_loss=functools.partial(client_loss, options, model),
    client_final=client_final,
    server_update=server_update,
  )


SPEC = AlgorithmSpec(
  'deepsvdd',
  build,
  Options,
  reads=frozenset({'weighting'}),
  description='Deep SVDD (Ruff et al., 2018): one model per client.',
)
SPECS = (SPEC,)
