"""FedMLB: multi-level branched regularisation with hybrid pathways.

Kim, Kim and Han, 'Multi-Level Branched Regularization for Federated
Learning', ICML 2022. Each local model grows auxiliary branches: at branch
point b (after the stem and after each stage) the local model's activation
enters the received global model's remaining blocks, which are frozen, and
gives hybrid logits h_b. With z the main pathway's logits, the client
objective (Eq. 4) is

  L = CE(z, y) + lambda_1 / B sum_b CE(h_b, y)
               + lambda_2 / B sum_b KL(softmax(h_b / tau) || softmax(z / tau)),

B the number of branches. The global blocks are not trained, but gradients
flow through them into the local blocks below each branch point; neither
side of the KL term is detached. The authors' code
(github.com/jinkyu032/FedMLB) uses lambda_1 = lambda_2 = 1 and tau = 1 (the
defaults here) and, for their ResNet-18, 5 branch points: after the stem
and after each of the four stages (the last: only the global classifier).
Models here expose their branch points as ``outputs['stages']`` and take a
``graft`` (`layers.graft_at`): ResNet-18 has those 5, the small CNN 3 (after
each conv stage and after its dense layer). The hybrid passes run the
global model in evaluation mode (BatchNorm's running statistics): it is
frozen, and FedMLB's own models use GroupNorm. Aggregation is FedAvg's.
"""

import dataclasses
import functools

import jax

from fedjax_metric import losses
from fedjax_metric.algorithms import fedavg
from fedjax_metric.algorithms.spec import AlgorithmSpec
from fedjax_metric.models import split_variables


@dataclasses.dataclass(frozen=True)
class Options:
  """FedMLB's options (defaults of the authors' code).

  Attributes:
    ce_weight: lambda_1 of Eq. 4, the hybrid pathways' cross-entropy (>= 0).
    kl_weight: lambda_2 of Eq. 4, their distillation into the main pathway
      (>= 0).
    temperature: tau of Eq. 4's KL term (> 0).
  """

  ce_weight: float = 1.0
  kl_weight: float = 1.0
  temperature: float = 1.0

  def __post_init__(self):
    for name in ('ce_weight', 'kl_weight'):
      value = getattr(self, name)
      if not value >= 0:
        raise ValueError(
          f'FedMLB {name} must be >= 0, got {value} '
          f'(--config.algorithm_kwargs.{name}).'
        )
    if not self.temperature > 0:
      raise ValueError(
        f'FedMLB temperature must be > 0, got {self.temperature} '
        '(--config.algorithm_kwargs.temperature).'
      )


def hybrid_logits(model, global_variables, images, local_stages):
  """Logits of every hybrid pathway: [len(local_stages)] x [B, K].

  Branch b runs the frozen global model from branch point b on, fed with the
  local model's activation ``local_stages[b]`` there; gradients reach the
  local activations, not the global parameters.
  """
  params, model_state = split_variables(jax.lax.stop_gradient(global_variables))
  return [
    model.apply(
      params, model_state, images, train=False, graft=(level, activation)
    )[0]['logits']
    for level, activation in enumerate(local_stages)
  ]


def fedmlb_loss(main_logits, hybrid, labels, mask, *, weights, temperature):
  """Eq. 4 of FedMLB over a batch: (loss, aux).

  Args:
    main_logits: [B, K], the local model's.
    hybrid: list of [B, K], one per branch (`hybrid_logits`).
    labels: [B] int.
    mask: [B] bool; False rows are padding.
    weights: (lambda_1, lambda_2).
    temperature: tau of the KL term.

  Returns:
    (scalar, {'ce', 'ce_hybrid', 'kl'}): each term a masked mean over
    examples, the branch terms also averaged over branches.
  """
  ce = losses.masked_mean(
    losses.softmax_cross_entropy(main_logits, labels), mask
  )
  ce_hybrid = sum(
    losses.masked_mean(losses.softmax_cross_entropy(h, labels), mask)
    for h in hybrid
  ) / len(hybrid)
  kl = sum(
    losses.masked_mean(
      losses.branch_distillation(main_logits, h, temperature), mask
    )
    for h in hybrid
  ) / len(hybrid)
  total = ce + weights[0] * ce_hybrid + weights[1] * kl
  return total, {'ce': ce, 'ce_hybrid': ce_hybrid, 'kl': kl}


def client_loss(options, model, params, model_state, batch, ctx):
  """Eq. 4 on the batch: the main pathway's forward pass (training mode),
  then one hybrid pathway per branch point through the frozen global model."""
  outputs, model_state = model.apply(
    params, model_state, batch.images, train=True, mask=batch.mask
  )
  if 'stages' not in outputs:
    raise ValueError(
      "FedMLB needs a model with branch points (outputs['stages'] and a "
      "graft argument): use --config.model.name='small_cnn' or 'resnet18'."
    )
  hybrid = hybrid_logits(
    model, ctx.server_state.variables, batch.images, outputs['stages']
  )
  loss, aux = fedmlb_loss(
    outputs['logits'],
    hybrid,
    batch.labels,
    batch.mask,
    weights=(options.ce_weight, options.kl_weight),
    temperature=options.temperature,
  )
  return loss, (model_state, aux)


def build(model, options, *, server_optimizer, weighting='num_examples'):
  """FedMLB: FedAvg with the Eq. 4 client loss. ``model``: `ModelFns`
  whose outputs have 'logits' and 'stages' and whose apply takes ``graft``
  ('small_cnn', 'resnet18')."""
  return fedavg.build(
    model, server_optimizer=server_optimizer, weighting=weighting
  )._replace(client_loss=functools.partial(client_loss, options, model))


SPEC = AlgorithmSpec(
  'fedmlb',
  build,
  Options,
  description='FedMLB (Kim et al., 2022): hybrid pathways through the '
  "global model's upper blocks, distilled into the local model.",
)
SPECS = (SPEC,)
