"""FedQuad and its metric-learning baselines: FedAvg with a metric term.

FedQuad (Goksu & Pugeault, 'FedQuad: Federated Stochastic Quadruplet
Learning to Mitigate Data Heterogeneity', arXiv:2509.04107, 2025, Eq. 3 and
Algorithm 1): each client minimises
``CE(F(x_a), y_a) + beta * l_quad*(f(x_a), f(x_p), f(x_n1), f(x_n2))`` on the
model's non-normalised embeddings, with quadruplets drawn per client by
`data.quadruplets` (the host-side `client_batches` slot); aggregation is
FedAvg weighted by |D_i|. The baselines of the paper's Tables I-IV replace the
metric term only:

  * ``quadrupletfl``: the quadruplet loss of Chen et al., 'Beyond Triplet
    Loss: A Deep Quadruplet Network for Person Re-identification', CVPR 2017
    (second term d(n1, n2));
  * ``tripletfl``: triplet loss on (a, p, n1);
  * ``supconfl``: supervised contrastive loss on the batch's L2-normalised
    embeddings (no sampled companions).

Slots replaced relative to FedAvg: ``client_loss`` and (except SupConFL)
``client_batches`` / ``cohort_batches``. The distance defaults to Eq. 5's Euclidean norm
(``squared=False``); ``squared=True`` is Algorithm 1's squared distance. The
distance readings, the sampling fallbacks and the baselines' defaults are
discussed in docs/methods.md, FedQuad.
"""

import functools

from fedjax_metric import losses
from fedjax_metric.algorithms import fedavg
from fedjax_metric.contract import NO_RUN_FACTS, RunFacts
from fedjax_metric.data import quadruplets


def make_sampled_metric_loss(
  model, metric_fn, num_negatives, beta, cross_entropy=True
):
  """client_loss for batches laid out [anchors | positives | negatives...].

  ``CE(anchors) + beta * metric`` (Goksu & Pugeault, arXiv 2025, Eq. 3), or
  ``beta * metric`` alone with ``cross_entropy=False`` (the "without l_ce"
  rows of their Table V). CE is taken on the anchors only; the metric term on
  every anchor whose companions are valid (mask of the positive column).
  """
  groups = 2 + num_negatives

  def client_loss(params, model_state, batch, ctx):
    del ctx
    b = batch.labels.shape[0] // groups
    outputs, ce, model_state = fedavg.forward_and_cross_entropy(
      model, params, model_state, batch, rows=b
    )
    embeddings = [
      outputs['embedding'][g * b : (g + 1) * b] for g in range(groups)
    ]
    companion_mask = batch.mask[b : 2 * b]
    metric = losses.masked_mean(metric_fn(*embeddings), companion_mask)
    loss = beta * metric + (ce if cross_entropy else 0.0)
    return loss, (model_state, {'ce': ce, 'metric': metric})

  return client_loss


def _make_sampled(
  metric_fn,
  num_negatives,
  model,
  *,
  server_optimizer,
  weighting='num_examples',
  beta=0.5,
  cross_entropy=True,
  **metric_kwargs,
):
  if beta < 0:
    raise ValueError(f'beta must be >= 0, got {beta}.')
  if not cross_entropy and beta <= 0:
    raise ValueError(
      'cross_entropy=False needs beta > 0: otherwise the '
      'client loss is 0. Set algorithm_kwargs.beta > 0.'
    )
  loss = make_sampled_metric_loss(
    model,
    functools.partial(metric_fn, **metric_kwargs),
    num_negatives,
    beta,
    cross_entropy,
  )
  return fedavg.build(
    model, server_optimizer=server_optimizer, weighting=weighting
  )._replace(client_loss=loss, **quadruplets.batch_schedules(num_negatives))


def make_fedquad(
  model,
  *,
  server_optimizer,
  run: RunFacts = NO_RUN_FACTS,
  weighting='num_examples',
  beta=0.5,
  margin_1=1.0,
  margin_2=0.5,
  squared=False,
  cross_entropy=True,
):
  """FedQuad: CE + beta * fedquad_loss (paper's beta 0.5, m1 1, m2 0.5).

  Goksu & Pugeault, 'FedQuad: Federated Stochastic Quadruplet Learning to
  Mitigate Data Heterogeneity', arXiv:2509.04107, 2025, Eq. 3 and Eq. 5.
  ``squared=False`` (default) is Eq. 5's Euclidean distance,
  ``squared=True`` Algorithm 1's squared one. ``cross_entropy=False`` drops
  the CE term (Table V's "without l_ce"); evaluate such a model on its
  embeddings (``eval_protocol='embedding_knn'``), its classifier is untrained.
  """
  return _make_sampled(
    losses.fedquad_loss,
    2,
    model,
    server_optimizer=server_optimizer,
    weighting=weighting,
    beta=beta,
    cross_entropy=cross_entropy,
    margin_1=margin_1,
    margin_2=margin_2,
    squared=squared,
  )


def make_quadrupletfl(
  model,
  *,
  server_optimizer,
  run: RunFacts = NO_RUN_FACTS,
  weighting='num_examples',
  beta=0.5,
  margin_1=1.0,
  margin_2=0.5,
  squared=False,
  cross_entropy=True,
):
  """QuadrupletFL: CE + beta * Chen et al.'s quadruplet loss.

  Chen, Chen, Zhang and Huang, 'Beyond Triplet Loss: A Deep Quadruplet
  Network for Person Re-identification', CVPR 2017, Eq. 5; ``squared`` and
  ``cross_entropy`` as in `make_fedquad`.
  """
  return _make_sampled(
    losses.quadruplet_loss,
    2,
    model,
    server_optimizer=server_optimizer,
    weighting=weighting,
    beta=beta,
    cross_entropy=cross_entropy,
    margin_1=margin_1,
    margin_2=margin_2,
    squared=squared,
  )


def make_tripletfl(
  model,
  *,
  server_optimizer,
  run: RunFacts = NO_RUN_FACTS,
  weighting='num_examples',
  beta=0.5,
  margin=1.0,
  squared=False,
  cross_entropy=True,
):
  """TripletFL: CE + beta * triplet loss on (anchor, positive, negative_1).

  Hoffer & Ailon, 'Deep Metric Learning Using Triplet Network', SIMBAD 2015;
  ``squared`` and ``cross_entropy`` as in `make_fedquad`.
  """
  return _make_sampled(
    losses.triplet_loss,
    1,
    model,
    server_optimizer=server_optimizer,
    weighting=weighting,
    beta=beta,
    cross_entropy=cross_entropy,
    margin=margin,
    squared=squared,
  )


def make_supconfl(
  model,
  *,
  server_optimizer,
  run: RunFacts = NO_RUN_FACTS,
  weighting='num_examples',
  beta=0.5,
  temperature=0.07,
):
  """SupConFL: CE + beta * SupCon (Khosla et al., NeurIPS 2020, Eq. 2, the
  mean over positives) over the batch's embeddings."""

  def supcon(outputs, batch):
    return losses.supcon_loss(
      outputs['embedding'],
      batch.labels,
      temperature=temperature,
      mask=batch.mask,
    )

  return fedavg.build_with_term(
    model,
    supcon,
    server_optimizer=server_optimizer,
    weighting=weighting,
    weight=beta,
  )
