"""FedDecorr in federated unsupervised learning (`make`) and as proposed,
for supervised FL (`make_supervised`).

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
"""

from fedjax_metric import losses
from fedjax_metric.algorithms import fedalignuniform as fau
from fedjax_metric.algorithms import fedavg, ssl_common, ssl_schedules
from fedjax_metric.contract import NO_RUN_FACTS, RunFacts

BASES = ('align_uniform', 'nt_xent')
FEATURES = ('embedding', 'projection')


def make(
  model,
  *,
  server_optimizer,
  run: RunFacts = NO_RUN_FACTS,
  weighting='num_batches',
  decorr_weight=0.1,
  decorr_form='code',
  features='embedding',
  base='align_uniform',
  uniform_weight=1.0,
  uniformity_t=2.0,
  temperature=0.1,
  view_order='ssd',
  drop_last=False,
):
  """FedDecorr on a self-supervised base loss.

  Args:
    model: `ModelFns` with 'embedding' and 'projection' outputs.
    server_optimizer: optax transformation of the pseudo-gradient.
    weighting: 'num_batches', 'num_examples' or 'uniform'.
    decorr_weight: lambda (0.1, FedDecorr's released code).
    decorr_form: 'code' or 'paper' (`losses.decorrelation_loss`).
    features: which output is decorrelated: 'embedding' (encoder, default)
      or 'projection'.
    base: 'align_uniform' (default) or 'nt_xent'.
    uniform_weight, uniformity_t: the align-uniform base's beta and t.
    temperature: NT-Xent temperature (base='nt_xent').
    view_order: 'ssd' or 'fedu2' augmentation order.
    drop_last: drop partial batches.
  """
  ssl_common.check_positive('decorr_weight', decorr_weight)
  ssl_common.check_positive('temperature', temperature, allow_zero=False)
  if base not in BASES:
    raise ValueError(
      f'base must be one of {BASES}, got {base!r} '
      '(--config.algorithm_kwargs.base).'
    )
  if features not in FEATURES:
    raise ValueError(f'features must be one of {FEATURES}, got {features!r}.')
  views = ssl_common.two_views(view_order)

  def client_loss(params, model_state, batch, ctx):
    mask = batch.mask
    out1, out2, model_state = ssl_common.two_view_forward(
      model, params, model_state, batch.raw_images, mask, ctx.key, views
    )
    p1, p2 = out1['projection'], out2['projection']
    if base == 'align_uniform':
      loss, _, _ = fau.align_uniform_loss(
        p1, p2, mask, uniform_weight=uniform_weight, t=uniformity_t
      )
    else:
      loss = losses.masked_mean(
        losses.nt_xent_loss(
          p1, p2, temperature=temperature, self_in_denominator=False, mask=mask
        ),
        mask,
      )
    decorr = (
      losses.decorrelation_loss(out1[features], form=decorr_form, mask=mask)
      + losses.decorrelation_loss(out2[features], form=decorr_form, mask=mask)
    ) / 2.0
    return loss + decorr_weight * decorr, (
      model_state,
      {'decorrelation': decorr},
    )

  return ssl_common.build_algorithm(
    client_loss,
    server_optimizer=server_optimizer,
    weighting=weighting,
    schedules=ssl_schedules.ssl_batch_schedules(drop_last=drop_last),
  )


def make_supervised(
  model,
  *,
  server_optimizer,
  run: RunFacts = NO_RUN_FACTS,
  weighting='num_examples',
  decorr_weight=0.1,
  decorr_form='code',
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
    server_optimizer: optax transformation of the pseudo-gradient.
    weighting: 'num_examples' or 'uniform'.
    decorr_weight: lambda >= 0.
    decorr_form: 'code' or 'paper' (`losses.decorrelation_loss`).
  """
  del run
  ssl_common.check_positive('decorr_weight', decorr_weight)
  if decorr_form not in ('code', 'paper'):
    raise ValueError(
      f"decorr_form must be 'code' or 'paper', got {decorr_form!r} "
      '(--config.algorithm_kwargs.decorr_form).'
    )

  def client_loss(params, model_state, batch, ctx):
    del ctx
    outputs, ce, model_state = fedavg.forward_and_cross_entropy(
      model, params, model_state, batch
    )
    decorr = losses.decorrelation_loss(
      outputs['embedding'], form=decorr_form, mask=batch.mask
    )
    return ce + decorr_weight * decorr, (
      model_state,
      {'ce': ce, 'decorrelation': decorr},
    )

  return fedavg.build(
    model, server_optimizer=server_optimizer, weighting=weighting
  )._replace(client_loss=client_loss)
