"""FedAlignUniform: alignment + uniformity in FedAvg.

The local objective is Wang & Isola's ('Understanding Contrastive
Representation Learning through Alignment and Uniformity on the
Hypersphere', ICML 2020) on the projections of two augmented views,

  L = L_align + beta (U(z1) + U(z2)) / 2,

as used by Fang et al., 'Soft Separation and Distillation: Toward Global
Uniformity in Federated Unsupervised Learning', ICCV 2025 (SSD; Eq. 3, 4 and
Eq. 10 without its last two terms), where it is the base that SSD extends.
Defaults follow the SSD authors' released code (github.com/hc-fang/ssd,
methods/fedalignuniform/client.py and server.py): t = 2, beta = 1, per-view
uniformity averaged, BatchNorm statistics of each view computed in its own
forward pass, a batch of a single example skipped, and the server averaging
encoder, projector and BatchNorm statistics with weights = the number of
local batches.

The pieces the unsupervised methods share (views, two-view forward pass,
aggregation weight, batch schedule) are in `ssl_common` and
`ssl_schedules`.

Slots replaced relative to FedAvg: ``client_loss`` (the two-view loss),
``client_final`` (weights by ctx.num_steps, the client's real local steps),
``client_batches`` and ``cohort_batches`` (`ssl_schedules`, per client and
for the whole cohort).
"""

import dataclasses
import functools
from typing import Literal

from fedjax_metric import losses
from fedjax_metric.algorithms import ssl_common, ssl_schedules
from fedjax_metric.algorithms.spec import AlgorithmSpec


@dataclasses.dataclass(frozen=True)
class Options:
  """FedAlignUniform's options (the SSD released code's defaults).

  Attributes:
    uniform_weight: beta, the weight of the uniformity term (>= 0).
    uniformity_t: t of the uniformity loss U (> 0).
    view_order: 'ssd' or 'fedu2' augmentation order (`ssl_common.two_views`).
    drop_last: drop partial batches (the released code does when K <= 10).
  """

  uniform_weight: float = 1.0
  uniformity_t: float = 2.0
  view_order: Literal['ssd', 'fedu2'] = 'ssd'
  drop_last: bool = False

  def __post_init__(self):
    ssl_common.check_positive('uniform_weight', self.uniform_weight)
    ssl_common.check_positive(
      'uniformity_t', self.uniformity_t, allow_zero=False
    )


def align_uniform_loss(p1, p2, mask, *, uniform_weight=1.0, t=2.0):
  """``L_align + beta (U(p1) + U(p2)) / 2`` and its two parts.

  Wang & Isola, ICML 2020; SSD Eq. 3-4 (Fang et al., ICCV 2025), with the
  per-view uniformity average of the SSD authors' released code
  (github.com/hc-fang/ssd, methods/fedalignuniform/client.py).

  Args:
    p1, p2: [B, D] projections of the two views (normalised inside).
    mask: bool [B].
    uniform_weight: beta.
    t: the uniformity temperature.

  Returns:
    ``(loss, alignment, uniformity)`` scalars.
  """
  align = losses.masked_mean(losses.alignment_loss(p1, p2, mask=mask), mask)
  uniform = (
    losses.uniformity_loss(p1, t=t, mask=mask)
    + losses.uniformity_loss(p2, t=t, mask=mask)
  ) / 2.0
  return align + uniform_weight * uniform, align, uniform


def client_loss(options, model, views, params, model_state, batch, ctx):
  """L_align + beta (U(z1) + U(z2)) / 2 on the projections z of two views
  of the batch (drawn with ctx.key by ``views``)."""
  out1, out2, model_state = ssl_common.two_view_forward(
    model, params, model_state, batch.raw_images, batch.mask, ctx.key, views
  )
  loss, align, uniform = align_uniform_loss(
    out1['projection'],
    out2['projection'],
    batch.mask,
    uniform_weight=options.uniform_weight,
    t=options.uniformity_t,
  )
  return loss, (model_state, {'alignment': align, 'uniformity': uniform})


def build(model, options, *, server_optimizer, weighting='num_batches'):
  """FedAlignUniform.

  Args:
    model: `ModelFns` with outputs 'embedding' (encoder) and 'projection'.
    options: `Options`.
    server_optimizer: optax transformation of the pseudo-gradient (sgd(1.0)
      is plain averaging, as the released code).
    weighting: 'num_batches' (released code), 'num_examples' (the paper's
      n_k / n, Sec. 3.1) or 'uniform'.
  """
  views = ssl_common.two_views(options.view_order)
  return ssl_common.build_algorithm(
    functools.partial(client_loss, options, model, views),
    server_optimizer=server_optimizer,
    weighting=weighting,
    schedules=ssl_schedules.ssl_batch_schedules(drop_last=options.drop_last),
  )


SPEC = AlgorithmSpec(
  'fedalignuniform',
  build,
  Options,
  description='Alignment + uniformity (Wang & Isola, 2020), federated.',
)
SPECS = (SPEC,)
