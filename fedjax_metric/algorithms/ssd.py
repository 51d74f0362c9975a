"""SSD: Soft Separation and Distillation.

Fang et al., 'Soft Separation and Distillation: Toward Global Uniformity in
Federated Unsupervised Learning', ICCV 2025. The server gives every client k a
scaling matrix S_k once, before training (Algorithm 1, line 4;
`ssd_scaling.scaling_matrices`); each client minimises (Eq. 10)

  L^k = L_align + beta L_uniform + gamma L_DSR + delta L_distill,

FedAlignUniform's loss (`fedjax_metric.algorithms.fedalignuniform`) plus the
dimension-scaled regulariser (`fedjax_metric.losses.dsr_loss`, Eq. 7), which
pulls the client's normalised embeddings towards n(z S_k S_k^T) and so leans
them towards the client's own directions, and the projector distillation
(`fedjax_metric.losses.projector_distillation_loss`, Eq. 9). The server
averages as FedAlignUniform does.

Slots replaced relative to FedAvg: ``init_server`` (the K scaling matrices
in the server extra, [K, D, D]), ``client_loss`` (two views drawn from
``batch.raw_images`` with ctx.key; S_k picked by ctx.client_id, or by
ctx.slot as the released code does), ``client_final`` (weight = local
batches), ``client_batches`` / ``cohort_batches`` (drop_last / skip
one-example batches).
"""

import dataclasses
import functools
from typing import Literal, Optional

import jax
import jax.numpy as jnp

from fedjax_metric import losses
from fedjax_metric.algorithms import fedalignuniform as fau
from fedjax_metric.algorithms import ssd_scaling, ssl_common, ssl_schedules
from fedjax_metric.algorithms.spec import AlgorithmSpec


@dataclasses.dataclass(frozen=True)
class Options:
  """SSD's options: the paper's (Sec. 4 'Implementation Details', App. A.1)
  and the authors' released code's (github.com/hc-fang/ssd,
  scripts/run_FedAlignUniformSubspace.sh): beta = gamma = 1, delta = 0.1,
  alpha = 10, KL distillation at T = 0.5, m = floor(D / K) rotated
  directions per client.

  Attributes:
    uniform_weight: beta of Eq. 10 (>= 0).
    uniformity_t: t of L_uniform (> 0).
    dsr_weight: gamma of Eq. 10 (>= 0).
    distill_weight: delta of Eq. 10 (>= 0).
    distill_temperature: T of the KL distillation (> 0).
    distill_method: 'kl' (default) or 'mse' (the released code's
      alternative, mean squared difference; SSD Table 5).
    distill_form: 'code' (KL(softmax(z/T) || softmax(h/T))) or 'paper'
      (Eq. 9's direction); see `losses.projector_distillation_loss`.
    dsr_form: 'code' (Frobenius norm / n of the difference to the
      normalised target) or 'paper' (Eq. 7).
    scale: alpha of Eq. 6, the factor on a client's directions (>= 0).
    directions_per_client: m (>= 0); None means floor(D / K).
    random_basis: directions of a random rotation (released code) or
      canonical axes (Eq. 6's literal 'dimensions').
    assign: 'client_id' (client k always gets S_k, the paper) or
      'position' (the i-th client of the round's cohort gets S_i, the
      released code; differs only under partial participation).
    scaling_seed: NumPy seed of the matrices; None derives it from the key
      `init_server` receives (the run's seed).
    view_order: 'ssd' or 'fedu2' augmentation order.
    drop_last: drop partial batches (the released code does when K <= 10).
    loss_on: the output the alignment, uniformity and DSR terms read:
      'projection' (the method) or 'embedding', the representation itself,
      Table 4's "without the projector" (the projector then gets no
      gradient and stays as initialised; projector distillation has nothing
      to distil, so it needs distill_weight=0).
  """

  uniform_weight: float = 1.0
  uniformity_t: float = 2.0
  dsr_weight: float = 1.0
  distill_weight: float = 0.1
  distill_temperature: float = 0.5
  distill_method: Literal['kl', 'mse'] = 'kl'
  distill_form: Literal['code', 'paper'] = 'code'
  dsr_form: Literal['code', 'paper'] = 'code'
  scale: float = 10.0
  directions_per_client: Optional[int] = None
  random_basis: bool = True
  assign: Literal['position', 'client_id'] = 'client_id'
  scaling_seed: Optional[int] = None
  view_order: Literal['ssd', 'fedu2'] = 'ssd'
  drop_last: bool = False
  loss_on: Literal['projection', 'embedding'] = 'projection'

  def __post_init__(self):
    for name in ('uniform_weight', 'dsr_weight', 'distill_weight', 'scale'):
      ssl_common.check_positive(name, getattr(self, name))
    for name in ('uniformity_t', 'distill_temperature'):
      ssl_common.check_positive(name, getattr(self, name), allow_zero=False)
    m = self.directions_per_client
    if m is not None and m < 0:
      raise ValueError(f'directions_per_client must be >= 0, got {m}')
    if self.loss_on == 'embedding' and self.distill_weight > 0:
      raise ValueError(
        "loss_on='embedding' trains without the projector, so projector "
        'distillation has nothing to distil; set '
        '--config.algorithm_kwargs.distill_weight=0.'
      )


def init_extra(options, model, variables, num_clients, key):
  """The server extra: ``{'scaling': [K, D, D]}``, D the width of
  ``options.loss_on``, seeded by ``scaling_seed`` or else by ``key``."""
  dim = ssl_common.output_width(model, variables, options.loss_on)
  if (
    options.distill_weight > 0
    and ssl_common.output_width(model, variables, 'embedding') != dim
  ):
    raise ValueError(
      'Projector distillation needs equal encoder and '
      'projector widths; set the model so that '
      "'embedding' and 'projection' match, or "
      'distill_weight=0.'
    )
  seed = options.scaling_seed
  if seed is None:
    seed = int(jax.random.randint(key, (), 0, 2**31 - 1))
  return {
    'scaling': jnp.asarray(
      ssd_scaling.scaling_matrices(
        num_clients,
        dim,
        scale=options.scale,
        seed=seed,
        directions_per_client=options.directions_per_client,
        random_basis=options.random_basis,
      )
    )
  }


def distillation(options, h, p, mask):
  """L_distill of one view (Eq. 9 or the MSE alternative), masked mean over
  the batch; h [B, D] the encoder's output, p [B, D] the projector's."""
  if options.distill_method == 'mse':
    per_row = jnp.mean(jnp.square(h - p), axis=-1)
  else:
    per_row = losses.projector_distillation_loss(
      h,
      p,
      temperature=options.distill_temperature,
      form=options.distill_form,
      mask=mask,
    )
  return losses.masked_mean(per_row, mask)


def client_loss(options, model, views, params, model_state, batch, ctx):
  """Eq. 10, each term averaged over the two views; S_k from the server
  extra by `ssd_scaling.pick_scaling`."""
  mask = batch.mask
  out1, out2, model_state = ssl_common.two_view_forward(
    model, params, model_state, batch.raw_images, mask, ctx.key, views
  )
  p1, p2 = out1[options.loss_on], out2[options.loss_on]
  loss, align, uniform = fau.align_uniform_loss(
    p1, p2, mask, uniform_weight=options.uniform_weight, t=options.uniformity_t
  )
  scaling = ssd_scaling.pick_scaling(
    ctx.server_state.extra['scaling'], ctx, options.assign
  )
  form = options.dsr_form
  dsr = (
    losses.dsr_loss(p1, scaling, form=form, mask=mask)
    + losses.dsr_loss(p2, scaling, form=form, mask=mask)
  ) / 2.0
  distill = (
    distillation(options, out1['embedding'], p1, mask)
    + distillation(options, out2['embedding'], p2, mask)
  ) / 2.0
  loss = loss + options.dsr_weight * dsr + options.distill_weight * distill
  return loss, (
    model_state,
    {
      'alignment': align,
      'uniformity': uniform,
      'dsr': dsr,
      'distillation': distill,
    },
  )


def build(model, options, *, server_optimizer, weighting='num_batches'):
  """SSD as an `engine.Algorithm`.

  Args:
    model: `ModelFns` with 'embedding' (encoder, h) and 'projection' (z)
      outputs of equal width (projector distillation compares them).
    options: `Options`.
    server_optimizer: optax transformation of the pseudo-gradient.
    weighting: 'num_batches' (released code), 'num_examples', 'uniform'.
  """
  views = ssl_common.two_views(options.view_order)
  return ssl_common.build_algorithm(
    functools.partial(client_loss, options, model, views),
    server_optimizer=server_optimizer,
    weighting=weighting,
    init_extra=functools.partial(init_extra, options, model),
    schedules=ssl_schedules.ssl_batch_schedules(drop_last=options.drop_last),
  )


SPEC = AlgorithmSpec(
  'ssd',
  build,
  Options,
  description='SSD (Fang et al., 2025): dimension-scaled uniformity + '
  'projector distillation.',
)
SPECS = (SPEC,)
