"""FedDecorr in federated unsupervised learning ('feddecorr') and as
proposed, for supervised FL ('feddecorr_supervised').

Shi et al., 'Towards Understanding and Mitigating Dimensional Collapse in
Heterogeneous Federated Learning', ICLR 2023: each client adds a
decorrelation penalty on its local representations (`fedjax_metric.losses.
decorrelation_loss`, the mean squared off-diagonal entry of the batch's
standardised correlation matrix) to its training loss.

FedDecorr was proposed for supervised FL (cross-entropy + 0.1 x
decorrelation, github.com/bytedance/FedDecorr); FedU2's repository copy
(github.com/XeniaLLL/FedU2, src/my/algo/feddecorr/local_client.py) also
trains supervised cross-entropy. How SSD (Fang et al., ICCV 2025, Table 1)
ran it without labels is not in its released code. Here it is the
self-supervised base loss plus the penalty (our choice, not a verified
transcription):

  L = L_base(z1, z2) + lambda (R(h1) + R(h2)) / 2,

with L_base FedAlignUniform's alignment + uniformity (default; SSD's base,
so the comparison isolates the regulariser) or SimCLR's NT-Xent
(``base='nt_xent'``), R the decorrelation of the encoder features h (as
FedDecorr applies it to the backbone's output), averaged over the views,
lambda = 0.1 (FedDecorr's coefficient). Aggregation as FedAlignUniform.

The two are separate specs over separate builds, not variants of one: they
share only lambda and the form of R, and differ in loss, batch schedule,
aggregation weight and default weighting, so neither takes the other's
options.
"""

import dataclasses
import functools
from typing import Literal

from fedjax_metric import losses
from fedjax_metric.algorithms import fedalignuniform as fau
from fedjax_metric.algorithms import fedavg, ssl_common, ssl_schedules
from fedjax_metric.algorithms.spec import AlgorithmSpec

BASES = ('align_uniform', 'nt_xent')
FEATURES = ('embedding', 'projection')


@dataclasses.dataclass(frozen=True)
class SupervisedOptions:
  """FedDecorr's options as proposed (defaults of the released code).

  Attributes:
    decorr_weight: lambda, the weight of the decorrelation term (>= 0).
    decorr_form: 'code' or 'paper' (`losses.decorrelation_loss`).
  """

  decorr_weight: float = 0.1
  decorr_form: Literal['code', 'paper'] = 'code'

  def __post_init__(self):
    ssl_common.check_positive('decorr_weight', self.decorr_weight)
    if self.decorr_form not in ('code', 'paper'):
      raise ValueError(
        f"decorr_form must be 'code' or 'paper', got {self.decorr_form!r} "
        '(--config.algorithm_kwargs.decorr_form).'
      )


@dataclasses.dataclass(frozen=True)
class Options:
  """FedDecorr's options on a self-supervised base loss.

  Attributes:
    decorr_weight: lambda, the weight of R (>= 0; 0.1, FedDecorr's released
      code).
    decorr_form: 'code' or 'paper' (`losses.decorrelation_loss`).
    features: the output h that R decorrelates: 'embedding' (the encoder,
      default) or 'projection'.
    base: L_base, 'align_uniform' (default) or 'nt_xent'.
    uniform_weight: beta of the align-uniform base.
    uniformity_t: t of the align-uniform base's uniformity.
    temperature: tau of the NT-Xent base (> 0).
    view_order: 'ssd' or 'fedu2' augmentation order (`ssl_common.two_views`).
    drop_last: drop partial batches.
  """

  decorr_weight: float = 0.1
  decorr_form: Literal['code', 'paper'] = 'code'
  features: Literal['embedding', 'projection'] = 'embedding'
  base: Literal['align_uniform', 'nt_xent'] = 'align_uniform'
  uniform_weight: float = 1.0
  uniformity_t: float = 2.0
  temperature: float = 0.1
  view_order: Literal['ssd', 'fedu2'] = 'ssd'
  drop_last: bool = False

  def __post_init__(self):
    ssl_common.check_positive('decorr_weight', self.decorr_weight)
    ssl_common.check_positive('temperature', self.temperature, allow_zero=False)
    if self.base not in BASES:
      raise ValueError(
        f'base must be one of {BASES}, got {self.base!r} '
        '(--config.algorithm_kwargs.base).'
      )
    if self.features not in FEATURES:
      raise ValueError(
        f'features must be one of {FEATURES}, got {self.features!r}.'
      )


def client_loss(options, model, views, params, model_state, batch, ctx):
  """L_base(z1, z2) + lambda (R(h1) + R(h2)) / 2 over two augmented views
  of the batch's raw images (``views``: `ssl_common.two_views`)."""
  mask = batch.mask
  out1, out2, model_state = ssl_common.two_view_forward(
    model, params, model_state, batch.raw_images, mask, ctx.key, views
  )
  p1, p2 = out1['projection'], out2['projection']
  if options.base == 'align_uniform':
    loss, _, _ = fau.align_uniform_loss(
      p1,
      p2,
      mask,
      uniform_weight=options.uniform_weight,
      t=options.uniformity_t,
    )
  else:
    loss = losses.masked_mean(
      losses.nt_xent_loss(
        p1,
        p2,
        temperature=options.temperature,
        self_in_denominator=False,
        mask=mask,
      ),
      mask,
    )
  form, features = options.decorr_form, options.features
  decorr = (
    losses.decorrelation_loss(out1[features], form=form, mask=mask)
    + losses.decorrelation_loss(out2[features], form=form, mask=mask)
  ) / 2.0
  return loss + options.decorr_weight * decorr, (
    model_state,
    {'decorrelation': decorr},
  )


def build(model, options, *, server_optimizer, weighting='num_batches'):
  """FedDecorr on a self-supervised base loss.

  Args:
    model: `ModelFns` with 'embedding' and 'projection' outputs.
    options: `Options`.
    server_optimizer: optax transformation of the pseudo-gradient.
    weighting: 'num_batches', 'num_examples' or 'uniform'.
  """
  views = ssl_common.two_views(options.view_order)
  return ssl_common.build_algorithm(
    functools.partial(client_loss, options, model, views),
    server_optimizer=server_optimizer,
    weighting=weighting,
    schedules=ssl_schedules.ssl_batch_schedules(drop_last=options.drop_last),
  )


def supervised_client_loss(options, model, params, model_state, batch, ctx):
  """CE(f(x), y) + lambda R(z), R over the batch's real examples."""
  del ctx
  outputs, ce, model_state = fedavg.forward_and_cross_entropy(
    model, params, model_state, batch
  )
  decorr = losses.decorrelation_loss(
    outputs['embedding'], form=options.decorr_form, mask=batch.mask
  )
  return ce + options.decorr_weight * decorr, (
    model_state,
    {'ce': ce, 'decorrelation': decorr},
  )


def build_supervised(
  model, options, *, server_optimizer, weighting='num_examples'
):
  """FedDecorr as proposed, for supervised FL (a row of FedRCL's Table 1).

  Shi et al., ICLR 2023: each client minimises

    L = CE(f(x), y) + lambda R(z),

  z the representation the classifier reads ('embedding' here, the
  backbone's output in the authors' code), R `losses.decorrelation_loss`
  over the batch's real examples, lambda = 0.1 (the released code's
  coefficient). Aggregation is FedAvg's.

  Args:
    model: `ModelFns` with 'logits' and 'embedding'.
    options: `SupervisedOptions`.
    server_optimizer: optax transformation of the pseudo-gradient.
    weighting: 'num_examples' or 'uniform'.
  """
  return fedavg.build(
    model, server_optimizer=server_optimizer, weighting=weighting
  )._replace(
    client_loss=functools.partial(supervised_client_loss, options, model)
  )


SPEC = AlgorithmSpec(
  'feddecorr',
  build,
  Options,
  description='FedDecorr (Shi et al., 2023): decorrelation regulariser.',
)
SUPERVISED_SPEC = AlgorithmSpec(
  'feddecorr_supervised',
  build_supervised,
  SupervisedOptions,
  description='FedDecorr (Shi et al., 2023) as proposed: '
  'cross-entropy + decorrelation of the representations.',
)
SPECS = (SPEC, SUPERVISED_SPEC)
