"""FedQuad and its metric-learning baselines: FedAvg with a metric term.

FedQuad (Goksu & Pugeault, 'FedQuad: Federated Stochastic Quadruplet
Learning to Mitigate Data Heterogeneity', arXiv:2509.04107, 2025, Eq. 3 and
Algorithm 1): each client minimises
``CE(F(x_a), y_a) + beta * l_quad*(f(x_a), f(x_p), f(x_n1), f(x_n2))`` on the
model's non-normalised embeddings, with quadruplets drawn per client by
`data.quadruplets` (the host-side `client_batches` slot); aggregation is
FedAvg weighted by |D_i|. The baselines of the paper's Tables I-IV replace the
metric term only (``Options.variant``, one registry name each):

  * ``quadrupletfl``: the quadruplet loss of Chen et al., 'Beyond Triplet
    Loss: A Deep Quadruplet Network for Person Re-identification', CVPR 2017
    (second term d(n1, n2), left out where the two negatives share a class);
  * ``tripletfl``: the margin triplet loss on (a, p, n1) (FaceNet's hinge;
    FedQuad cites Hoffer & Ailon, SIMBAD 2015, for triplets);
  * ``supconfl``: supervised contrastive loss on the batch's L2-normalised
    embeddings (Khosla et al., NeurIPS 2020, Eq. 2, the mean over positives;
    no sampled companions).

Slots replaced relative to FedAvg: ``client_loss`` and (except SupConFL)
``client_batches`` / ``cohort_batches``. The distance defaults to Eq. 5's
Euclidean norm (``squared=False``); ``squared=True`` is Algorithm 1's squared
distance. The distance readings, the sampling fallbacks and the baselines'
defaults are discussed in docs/methods.md, FedQuad.
"""

import dataclasses
import functools
from typing import Literal

from fedjax_metric import losses
from fedjax_metric.algorithms import fedavg
from fedjax_metric.algorithms.spec import AlgorithmSpec
from fedjax_metric.data import quadruplets


@dataclasses.dataclass(frozen=True)
class Options:
  """The options of FedQuad and its baselines (the paper's beta 0.5, m1 1,
  m2 0.5). A registry name fixes ``variant`` and the options its loss does
  not read (`SPECS`), so e.g. ``tripletfl`` refuses ``margin_1``.

  Attributes:
    variant: the metric term: 'fedquad' (Eq. 5's l_quad*), 'quadruplet'
      (Chen et al.'s Eq. 5), 'triplet' (on a, p, n1) or 'supcon'.
    beta: beta of Eq. 3, the weight of the metric term (>= 0).
    margin_1: m1 of Eq. 5, the margin of d(a, p) - d(a, n1) (quadruplet
      variants).
    margin_2: m2 of Eq. 5, the margin of the second term (d(a, n2) for
      FedQuad, d(n1, n2) for QuadrupletFL).
    margin: the triplet loss's margin (TripletFL).
    squared: d is Algorithm 1's squared Euclidean distance if True, else
      Eq. 5's Euclidean norm.
    cross_entropy: keep the CE term of Eq. 3; False is Table V's "without
      l_ce" (beta * metric alone; evaluate such a model on its embeddings,
      ``eval_protocol='embedding_knn'``: its classifier is untrained).
    temperature: tau of SupCon (SupConFL; > 0).
  """

  variant: Literal['fedquad', 'quadruplet', 'triplet', 'supcon'] = 'fedquad'
  beta: float = 0.5
  margin_1: float = 1.0
  margin_2: float = 0.5
  margin: float = 1.0
  squared: bool = False
  cross_entropy: bool = True
  temperature: float = 0.07

  def __post_init__(self):
    if self.beta < 0:
      raise ValueError(f'beta must be >= 0, got {self.beta}.')
    if not self.cross_entropy and self.beta <= 0:
      raise ValueError(
        'cross_entropy=False needs beta > 0: otherwise the '
        'client loss is 0. Set algorithm_kwargs.beta > 0.'
      )
    if not self.temperature > 0:
      raise ValueError(f'temperature must be > 0, got {self.temperature}.')


# Per sampled variant: the metric loss, its number of negatives, and the
# options it takes besides the embeddings.
_QUAD = ('margin_1', 'margin_2', 'squared')
_SAMPLED = {
  'fedquad': (losses.fedquad_loss, 2, _QUAD),
  'quadruplet': (losses.quadruplet_loss, 2, _QUAD),
  'triplet': (losses.triplet_loss, 1, ('margin', 'squared')),
}
# The options each variant reads (its spec fixes the others).
_READS = {
  'fedquad': ('beta', 'cross_entropy', *_QUAD),
  'quadruplet': ('beta', 'cross_entropy', *_QUAD),
  'triplet': ('beta', 'cross_entropy', 'margin', 'squared'),
  'supcon': ('beta', 'temperature'),
}


def sampled_metric(options, *embeddings, labels=None):
  """The variant's per-anchor metric loss [B] on ``(anchors, positives,
  negatives...)`` embeddings, each [B, D] (Eq. 5 for FedQuad). ``labels``:
  the [G * B] labels of those rows; QuadrupletFL's second term needs its two
  negatives' classes to differ (`losses.quadruplet_loss`)."""
  metric_fn, _, names = _SAMPLED[options.variant]
  kwargs = {n: getattr(options, n) for n in names}
  if options.variant == 'quadruplet' and labels is not None:
    b = embeddings[0].shape[0]
    kwargs['distinct_negatives'] = labels[2 * b : 3 * b] != labels[3 * b :]
  return metric_fn(*embeddings, **kwargs)


def sampled_metric_loss(options, model, params, model_state, batch, ctx):
  """client_loss for batches laid out [anchors | positives | negatives...].

  ``CE(anchors) + beta * metric`` (Goksu & Pugeault, arXiv 2025, Eq. 3), or
  ``beta * metric`` alone with ``cross_entropy=False`` (the "without l_ce"
  rows of their Table V). CE is taken on the anchors only; the metric term on
  every anchor whose companions are valid (mask of the positive column).
  """
  del ctx
  groups = 2 + _SAMPLED[options.variant][1]
  b = batch.labels.shape[0] // groups
  outputs, ce, model_state = fedavg.forward_and_cross_entropy(
    model, params, model_state, batch, rows=b
  )
  embeddings = [
    outputs['embedding'][g * b : (g + 1) * b] for g in range(groups)
  ]
  companion_mask = batch.mask[b : 2 * b]
  metric = losses.masked_mean(
    sampled_metric(options, *embeddings, labels=batch.labels), companion_mask
  )
  loss = options.beta * metric + (ce if options.cross_entropy else 0.0)
  return loss, (model_state, {'ce': ce, 'metric': metric})


def supcon_term(temperature, outputs, batch):
  """SupConFL's term [B]: SupCon over the batch's embeddings."""
  return losses.supcon_loss(
    outputs['embedding'],
    batch.labels,
    temperature=temperature,
    mask=batch.mask,
  )


def build(model, options, *, server_optimizer, weighting='num_examples'):
  """FedQuad or a baseline (``options.variant``) as an `engine.Algorithm`.

  Args:
    model: `ModelFns` with 'logits' and 'embedding'.
    options: `Options`.
    server_optimizer: optax transformation of the pseudo-gradient.
    weighting: 'num_examples' (the paper's |D_i|) or 'uniform'.
  """
  if options.variant == 'supcon':
    return fedavg.build_with_term(
      model,
      functools.partial(supcon_term, options.temperature),
      server_optimizer=server_optimizer,
      weighting=weighting,
      weight=options.beta,
    )
  num_negatives = _SAMPLED[options.variant][1]
  return fedavg.build(
    model, server_optimizer=server_optimizer, weighting=weighting
  )._replace(
    client_loss=functools.partial(sampled_metric_loss, options, model),
    **quadruplets.batch_schedules(num_negatives),
  )


def _spec(name, variant, description):
  """``name``'s spec: ``variant`` and the options it does not read fixed."""
  unread = {
    f.name: f.default
    for f in dataclasses.fields(Options)
    if f.name not in _READS[variant]
  }
  return AlgorithmSpec(
    name,
    build,
    Options,
    description=description,
    fixed={**unread, 'variant': variant},
  )


FEDQUAD = _spec(
  'fedquad',
  'fedquad',
  'FedQuad (2025): stochastic quadruplet loss + cross-entropy.',
)
QUADRUPLETFL = _spec(
  'quadrupletfl',
  'quadruplet',
  'QuadrupletFL: the quadruplet loss of Chen et al. (2017).',
)
TRIPLETFL = _spec(
  'tripletfl', 'triplet', 'TripletFL: triplet loss + cross-entropy.'
)
SUPCONFL = _spec(
  'supconfl',
  'supcon',
  'SupConFL: supervised contrastive loss + cross-entropy.',
)
SPEC = FEDQUAD
SPECS = (FEDQUAD, QUADRUPLETFL, TRIPLETFL, SUPCONFL)
