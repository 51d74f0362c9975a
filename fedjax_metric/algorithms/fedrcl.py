"""FedRCL and its FedSCL baseline (Seo, Kim, Kim and Han, 'Relaxed Contrastive
Learning for Federated Learning', CVPR 2024).

FedRCL's local objective: ``CE + mean over feature levels of (l_scl + beta *
l_penalty)``, the relaxed supervised contrastive loss on the L2-normalised,
globally average-pooled, pre-ReLU features of every stage (the model's
'features' list; Sec. 4.4 and Algorithm 1 line 8). ``form='code'``
(default) is the authors' released loss (github.com/skynbe/FedRCL,
utils/loss.py CLLoss: hard positive, top-2 negatives, single-partner
penalty); ``form='paper'`` the paper's Eq. 5 (docs/methods.md, FedRCL).
FedSCL is the same without the penalty (Table 3), in the same two forms
(plus Khosla et al.'s mean over positives as ``form='khosla'``).
The reference aggregates unweighted: ``build``'s weighting defaults to
'uniform' (``server.weighting='uniform'``; the configs set it too).

Slot replaced relative to FedAvg: ``client_loss``.
"""

import dataclasses
import functools
from typing import Literal

from fedjax_metric import losses
from fedjax_metric.algorithms import fedavg
from fedjax_metric.algorithms.spec import AlgorithmSpec


@dataclasses.dataclass(frozen=True)
class Options:
  """FedRCL's and FedSCL's options. The defaults are the authors' released
  configs/client/fedrcl.yaml (github.com/skynbe/FedRCL).

  Attributes:
    variant: 'rcl' (FedRCL) or 'scl' (FedSCL: no penalty; its spec fixes
      threshold and beta).
    temperature: tau of the (relaxed) supervised contrastive loss (Eq. 2, 5).
    threshold: lambda of Eq. 5, the similarity above which a negative pair
      is penalised (FedRCL).
    beta: beta of Eq. 5, the weight of the divergence penalty (FedRCL; the
      FedSCL spec fixes it at 0, no penalty).
    form: 'code' (the released CLLoss), 'paper' (Eq. 5, or Eq. 2's sum over
      positives for FedSCL) or, FedSCL only, 'khosla' (Khosla et al.'s mean
      over positives); `losses.multilevel_supcon_loss`.
  """

  variant: Literal['rcl', 'scl'] = 'rcl'
  temperature: float = 0.05
  threshold: float = 0.7
  beta: float = 1.0
  form: Literal['code', 'paper', 'khosla'] = 'code'

  def __post_init__(self):
    if self.variant == 'rcl' and self.form not in ('code', 'paper'):
      raise ValueError(f"form must be 'code' or 'paper', got {self.form!r}.")
    if self.form not in losses.SCL_FORMS:
      raise ValueError(
        f'form must be one of {losses.SCL_FORMS}, got {self.form!r}.'
      )


def multilevel_term(options, outputs, batch):
  """The per-level loss averaged over the model's feature levels (a list of
  [B, D_l] arrays, ``outputs['features']``): relaxed SupCon (FedRCL) or
  SupCon (FedSCL)."""
  if not outputs['features']:
    raise ValueError(
      "FedRCL and FedSCL contrast the model's feature levels "
      "(outputs['features']); this model has none. Use a model with "
      "feature taps (--config.model.name='small_cnn', 'resnet18', or "
      "'mlp' for vectors)."
    )
  if options.variant == 'scl':
    return losses.multilevel_supcon_loss(
      outputs['features'],
      batch.labels,
      temperature=options.temperature,
      form=options.form,
      mask=batch.mask,
    )
  return losses.multilevel_relaxed_supcon_loss(
    outputs['features'],
    batch.labels,
    temperature=options.temperature,
    threshold=options.threshold,
    beta=options.beta,
    form=options.form,
    mask=batch.mask,
  )


def build(model, options, *, server_optimizer, weighting='uniform'):
  """FedRCL or FedSCL: FedAvg with CE + `multilevel_term` (weight 1).

  Args:
    model: `ModelFns` with 'logits' and a non-empty 'features' list.
    options: `Options`.
    server_optimizer: optax transformation of the pseudo-gradient.
    weighting: 'uniform' (the reference's plain mean) or 'num_examples'.
  """
  return fedavg.build_with_term(
    model,
    functools.partial(multilevel_term, options),
    server_optimizer=server_optimizer,
    weighting=weighting,
  )


FEDRCL = AlgorithmSpec(
  'fedrcl',
  build,
  Options,
  description='FedRCL (Seo et al., 2024): relaxed supervised contrastive loss.',
  fixed={'variant': 'rcl'},
)
# FedSCL: FedRCL without the penalty (beta 0; threshold unused).
FEDSCL = AlgorithmSpec(
  'fedscl',
  build,
  Options,
  description='FedSCL: supervised contrastive loss on multi-level features.',
  fixed={'variant': 'scl', 'threshold': 0.7, 'beta': 0.0},
)
SPEC = FEDRCL
SPECS = (FEDRCL, FEDSCL)
