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

import jax
import jax.numpy as jnp

from fedjax_metric.algorithms import fedavg
from fedjax_metric.algorithms import oneclass_common as common
from fedjax_metric.contract import NO_RUN_FACTS, RunFacts
from fedjax_metric.losses.oneclass import deepsvdd_center, deepsvdd_loss


def make(
  model,
  *,
  server_optimizer,
  run: RunFacts = NO_RUN_FACTS,
  weighting='uniform',
  eps=0.1,
  reduction='mean',
):
  """Deep SVDD with one model per client, as an `engine.Algorithm`.

  Ruff et al., 'Deep One-Class Classification', ICML 2018, the One-Class
  Deep SVDD objective (its weight decay is the optimiser's)::

    min_W  1/n sum_i ||phi(x_i; W) - c||^2

  Args:
    model: `ModelFns` with an 'embedding' output. Ruff et al. remove every
      bias so that the hypersphere cannot collapse trivially (the 'lenet'
      model does by default).
    server_optimizer: unused (nothing is averaged); accepted for the
      registry's signature.
    weighting: 'uniform' only (nothing is averaged; anything else is
      refused).
    eps: the center rule's threshold (0.1 in the authors' code; 0 = mean).
    reduction: 'mean' over the batch (the authors' code) or 'sum'.

  Raises:
    ValueError: eps < 0 or an unknown reduction.
  """
  fedavg.refuse_weighting(
    'deepsvdd',
    weighting,
    'every client keeps its own model; nothing is averaged',
  )
  common.check_choice('reduction', reduction, common.REDUCTIONS)
  if not eps >= 0:
    raise ValueError(
      f'eps must be >= 0, got {eps} (--config.algorithm_kwargs.eps).'
    )
  dim = common.embedding_dim(model)
  base = fedavg.build(model, server_optimizer=server_optimizer)

  def init_client(variables, key):
    del key
    return {
      'variables': variables,
      'center': jnp.zeros((dim,), jnp.float32),
      # int32, not bool: 1 once the center is fixed.
      'initialised': jnp.zeros((), jnp.int32),
    }

  def client_begin(ctx):
    row = ctx.client_row

    def first_center():
      mean, _ = common.scan_center(ctx, model, row['variables'], dim)
      return deepsvdd_center(mean[None], eps=eps)

    # A cond, so that one client at a time (the host executor) skips the
    # pass over its data after its first round; under vmap both run.
    center = jax.lax.cond(
      row['initialised'] > 0, lambda: row['center'], first_center
    )
    return row['variables'], {'center': center}

  def client_loss(params, model_state, batch, ctx):
    outputs, model_state = model.apply(
      params, model_state, batch.images, train=True, mask=batch.mask
    )
    per_example = deepsvdd_loss(
      outputs['embedding'], ctx.local_state['center'], mask=batch.mask
    )
    return (
      common.reduce_batch(per_example, batch.mask, reduction),
      (model_state, {}),
    )

  def client_final(end_variables, ctx):
    has_data = ctx.num_examples > 0
    row = {
      'variables': end_variables,
      'center': ctx.local_state['center'],
      'initialised': jnp.ones((), jnp.int32),
    }
    row = jax.tree.map(
      lambda new, old: jnp.where(has_data, new, old), row, ctx.client_row
    )
    # Nothing goes to the server; the weight only counts participants.
    return (), jnp.ones((), jnp.float32), row

  def server_update(server_state, aggregate, cohort_rows):
    del aggregate, cohort_rows
    return server_state._replace(round=server_state.round + 1)

  return base._replace(
    init_client=init_client,
    client_begin=client_begin,
    client_loss=client_loss,
    client_final=client_final,
    server_update=server_update,
  )
