"""FedProc: a prototypical contrastive loss towards the server's class prototypes.

Mu, Shen, Cheng, Geng, Fu, Zhang and Zhang, 'FedProc: Prototypical
Contrastive Federated Learning on Non-IID Data' (arXiv:2109.12273; FGCS
2023). The server keeps one prototype per class, the mean of the clients'
normalised representations of that class; each client pulls its
representations towards their class's prototype and away from the others':

  L_PCL = -1/B sum_i log( exp(z_i . c^_{y_i}) / sum_k exp(z_i . c^_k) ),
  L_i   = alpha_t CE + (1 - alpha_t) L_PCL,     alpha_t = min(t / T, 1),

with z_i the L2-normalised representation (``outputs[feature]``), c^_k the
L2-normalised prototype of class k (a zero vector until some client held
class k) and no temperature. Round 0 has no prototypes yet: CE alone.
After local training each client sums its normalised representations per
class under its trained model (evaluation mode, over the round's batches,
so every local example equally often in epoch mode); the server's new
prototype of a class is the count-weighted mean over the round's clients,
and a class no client of the round held keeps its previous prototype.

These are the authors' code's choices (github.com/MuXutong/FedProc,
train.py ``train_net_fedproc``, ContrastLoss.py ``SupConLoss_new``): alpha
grows with the round, prototypes come from the locally trained models before
aggregation. The sums ride in the client update next to the model delta
(plain sums, whatever the weighting), so no table is kept. docs/methods.md,
FedProc.
"""

import dataclasses
import functools
from typing import Literal

import jax
import jax.numpy as jnp

from fedjax_metric import losses
from fedjax_metric.algorithms import fedavg
from fedjax_metric.algorithms.spec import AlgorithmSpec

# The package's torch-style F.normalize: a zero row (an all-zero ReLU
# representation, an unseen class's prototype) stays zero with a finite
# gradient.
from fedjax_metric.losses.metric import _l2_normalize
from fedjax_metric.models import split_variables


@dataclasses.dataclass(frozen=True)
class Options:
  """FedProc's options.

  Attributes:
    feature: the output z lives in, and the prototypes c_k: 'embedding'
      (default) or 'projection'.
  """

  feature: Literal['embedding', 'projection'] = 'embedding'


def prototype_contrastive_loss(z, labels, prototypes):
  """FedProc's L_PCL per example.

  Args:
    z: [B, D] representations (normalised here).
    labels: [B] int in [0, K).
    prototypes: [K, D] class prototypes (normalised here; zero rows stay
      zero and contribute exp(0) to the denominator, as in the authors' code).

  Returns:
    [B] ``-log softmax(z^ . c^_k)[y]``.
  """
  similarity = _l2_normalize(z) @ _l2_normalize(prototypes).T
  return losses.softmax_cross_entropy(similarity, labels)


def init_extra(options, model, variables, num_clients, key):
  """The server extra: the prototypes [K, D], zero (no class seen yet); K
  and D from the model's output shapes (no computation)."""
  del num_clients, key
  params, state = split_variables(variables)
  outputs = jax.eval_shape(
    lambda p, s: model.apply(
      p, s, jnp.zeros(model.input_shape, jnp.float32), train=False
    )[0],
    params,
    state,
  )
  shape = (outputs['logits'].shape[-1], outputs[options.feature].shape[-1])
  return jnp.zeros(shape, jnp.float32)  # [K, D]: none seen yet.


def client_loss(options, model, num_rounds, params, model_state, batch, ctx):
  """L_i = alpha_t CE + (1 - alpha_t) L_PCL, alpha_t = min(t / T, 1) with
  T = ``num_rounds``; CE alone in round 0 (no prototypes yet)."""
  outputs, ce, model_state = fedavg.forward_and_cross_entropy(
    model, params, model_state, batch
  )
  pcl = losses.masked_mean(
    prototype_contrastive_loss(
      outputs[options.feature], batch.labels, ctx.server_state.extra
    ),
    batch.mask,
  )
  round_ = ctx.server_state.round.astype(jnp.float32)
  alpha = jnp.where(round_ > 0, jnp.minimum(round_ / num_rounds, 1.0), 1.0)
  loss = alpha * ce + (1.0 - alpha) * pcl
  return loss, (model_state, {'ce': ce, 'pcl': pcl})


def add_class_sums(model, feature, params, state, num_classes, carry, batch):
  """One batch's per-class sums of normalised representations and counts
  (evaluation mode): carry ([K, D], [K]) -> carry."""
  sums, counts = carry
  outputs, _ = model.apply(params, state, batch.images, train=False)
  onehot = jax.nn.one_hot(batch.labels, num_classes) * batch.mask[:, None]
  z = _l2_normalize(outputs[feature])
  # Elementwise products and sums, not a matmul: TF32 cannot round them.
  sums = sums + jnp.sum(onehot[:, :, None] * z[:, None, :], axis=0)
  return sums, counts + jnp.sum(onehot, axis=0)


def client_final(options, model, weighting, end_variables, ctx):
  """FedAvg's delta and weight, plus the trained model's per-class sums
  over the round's batches as shares of a plain sum over the cohort."""
  delta, weight, row = fedavg.delta_final(weighting, end_variables, ctx)
  params, state = split_variables(end_variables)
  num_classes = ctx.server_state.extra.shape[0]
  body = functools.partial(
    add_class_sums, model, options.feature, params, state, num_classes
  )
  sums, counts = ctx.scan_batches(
    body,
    (
      jnp.zeros_like(ctx.server_state.extra),
      jnp.zeros((num_classes,), jnp.float32),
    ),
  )
  # Shares whose weighted sum over the cohort is the plain sum.
  shares = fedavg.plain_sum_share(
    {'feature_sums': sums, 'counts': counts}, weight
  )
  return {'model': delta, **shares}, weight, row


def server_update(server_optimizer, server_state, aggregate, cohort_rows):
  """FedAvg's step on the weighted mean delta; a class's new prototype is
  the count-weighted mean of the round's sums, or the old one if no client
  of the round held it."""
  del cohort_rows
  total = aggregate.update_sum
  model_mean = fedavg.mean_update(aggregate._replace(update_sum=total['model']))
  new_state = fedavg.apply_server_optimizer(
    server_optimizer, server_state, model_mean
  )
  counts = total['counts'][:, None]
  prototypes = jnp.where(
    counts > 0,
    total['feature_sums'] / jnp.maximum(counts, 1e-12),
    server_state.extra,
  )
  new_state = new_state._replace(extra=prototypes)
  return fedavg.skip_if_nobody(aggregate, server_state, new_state)


def build(model, options, *, server_optimizer, run, weighting='num_examples'):
  """FedProc as an `engine.Algorithm`.

  Args:
    model: `ModelFns` with 'logits' and ``options.feature`` outputs and a
      known ``input_shape``.
    options: `Options`.
    server_optimizer: optax transformation of the pseudo-gradient.
    run: its ``num_rounds`` is T of alpha_t; without it T = 100, the
      authors' code's fixed value (its default number of rounds).
    weighting: 'num_examples' or 'uniform' (of the model deltas; the
      prototypes are always count-weighted).

  Raises:
    ValueError: a model without input shape.
  """
  if model.input_shape is None:
    raise ValueError(
      'FedProc sizes its prototypes from the model: build the model with '
      'an input shape.'
    )
  num_rounds = float(run.num_rounds or 100)
  base = fedavg.build(
    model, server_optimizer=server_optimizer, weighting=weighting
  )
  return base._replace(
    init_server=fedavg.make_init_server(
      server_optimizer, functools.partial(init_extra, options, model)
    ),
    client_loss=functools.partial(client_loss, options, model, num_rounds),
    client_final=functools.partial(client_final, options, model, weighting),
    server_update=functools.partial(server_update, server_optimizer),
  )


SPEC = AlgorithmSpec(
  'fedproc',
  build,
  Options,
  reads=frozenset({'server_optimizer', 'weighting', 'run'}),
  description='FedProc (Mu et al., 2021): contrastive loss towards global '
  'class prototypes kept by the server.',
)
SPECS = (SPEC,)
