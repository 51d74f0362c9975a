"""FedNTD: cross-entropy plus not-true distillation from the global model.

Lee, Jeong, Shin, Bae and Yun, 'Preservation of the Global Knowledge by
Not-True Distillation in Federated Learning', NeurIPS 2022. The client
objective is

  L = CE(f_l(x), y) + beta tau^2 L_NTD(f_l(x), f_g(x), y)

with f_g the received global model, frozen, and L_NTD the KL divergence
between the two models' temperature-tau softmaxes over the not-true classes
(`losses.not_true_distillation`). The tau^2 is the authors' released code's
(github.com/Lee-Gihun/FedNTD, criterion.py `NTD_Loss._ntd_loss`: the usual
knowledge-distillation scaling that keeps the gradient's size independent
of tau); it is 1 at their configuration (config/fedntd.json: tau = 1,
beta = 1, the defaults here). Checked against that code:
tests/test_golden_baselines.py. Aggregation is FedAvg's.

The global model's logits come from a forward pass in evaluation mode
(BatchNorm's running statistics), as for MOON's frozen global model here;
the authors' code calls the copied global model without switching modes,
which matters only for models with BatchNorm (their CNNs have none).
"""

import dataclasses
import functools

from fedjax_metric import losses
from fedjax_metric.algorithms import fedavg
from fedjax_metric.algorithms.spec import AlgorithmSpec


@dataclasses.dataclass(frozen=True)
class Options:
  """FedNTD's options (the authors' config/fedntd.json).

  Attributes:
    beta: beta, the weight of the not-true distillation term (>= 0; 0 is
      FedAvg).
    temperature: tau > 0 of both not-true softmaxes.
  """

  beta: float = 1.0
  temperature: float = 1.0

  def __post_init__(self):
    if not self.beta >= 0:
      raise ValueError(
        f'FedNTD beta must be >= 0, got {self.beta} '
        '(--config.algorithm_kwargs.beta).'
      )
    if not self.temperature > 0:
      raise ValueError(
        f'FedNTD temperature must be > 0, got {self.temperature} '
        '(--config.algorithm_kwargs.temperature).'
      )


def ntd_term(local_logits, global_logits, labels, mask, *, temperature):
  """tau^2 times the masked mean of `losses.not_true_distillation`: what
  beta weighs in FedNTD's objective (the authors' ``NTD_Loss``: the KL of
  ``KLDivLoss(reduction='batchmean')`` times ``tau ** 2``).

  Args:
    local_logits, global_logits: [B, K]; labels: [B] int; mask: [B] bool.
    temperature: tau > 0.
  """
  kl = losses.not_true_distillation(
    local_logits, global_logits, labels, temperature
  )
  return temperature**2 * losses.masked_mean(kl, mask)


def client_loss(options, model, params, model_state, batch, ctx):
  """CE + beta * `ntd_term`, the teacher the frozen global model (eval
  mode)."""
  outputs, ce, model_state = fedavg.forward_and_cross_entropy(
    model, params, model_state, batch
  )
  teacher = fedavg.frozen_outputs(
    model, ctx.server_state.variables, batch.images
  )['logits']
  ntd = ntd_term(
    outputs['logits'],
    teacher,
    batch.labels,
    batch.mask,
    temperature=options.temperature,
  )
  return ce + options.beta * ntd, (model_state, {'ce': ce, 'ntd': ntd})


def build(model, options, *, server_optimizer, weighting='num_examples'):
  """FedNTD as an `engine.Algorithm`: FedAvg with its client loss.

  Args:
    model: `ModelFns` with 'logits'.
    options: `Options`.
    server_optimizer: optax transformation of the pseudo-gradient.
    weighting: 'num_examples' or 'uniform'.
  """
  return fedavg.build(
    model, server_optimizer=server_optimizer, weighting=weighting
  )._replace(client_loss=functools.partial(client_loss, options, model))


SPEC = AlgorithmSpec(
  'fedntd',
  build,
  Options,
  description="FedNTD (Lee et al., 2022): distillation of the global model's "
  'not-true class predictions.',
)
SPECS = (SPEC,)
