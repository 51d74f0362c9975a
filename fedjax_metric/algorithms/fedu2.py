"""FedU2: flexible uniform regulariser and efficient unified aggregation.

Liao et al., 'Rethinking the Representation in Federated Unsupervised
Learning with Non-IID Data', CVPR 2024, as in the authors' released code
(github.com/XeniaLLL/FedU2: main.py, src/my/algo/fedU2/fedsimclr_client.py,
src/my/algo/fedU2/server.py, src/my/algo/commons/mtl.py and
min_norm_solvers.py).

Client (SimCLR + FUR): on two views in FedU2's augmentation order,

  L = NT-Xent(z1, z2; tau = 0.07) + 0.01 (FUR(z1) + FUR(z2)),

NT-Xent with the self-similarity kept in the denominator as e^0
(`losses.nt_xent_loss`, self_in_denominator=True) and FUR the flexible
uniform regulariser (`losses.fedu2_uniform_regularizer`: sliced
Wasserstein distance to a uniform sample in random tangent spaces, fresh
random draws per view and step). Clients follow the 'even' schedule:
E_k = min(S // ceil(n_k / B), 10) local epochs, so small clients take about
as many steps as the largest (`ssl_schedules.ssl_batch_schedules`).

Server (EUA): with g_i = theta - theta_i the cohort's parameter updates
(BatchNorm statistics excluded) and v_i = 2 g_i / ||g_i|| (norm over the
whole flattened parameter vector), the min-norm convex combination

  lambda* = argmin_{lambda in simplex} || sum_i lambda_i v_i ||^2

is found by the MGDA solver of the released code (Sener & Koltun,
'Multi-Task Learning as Multi-Objective Optimization', NeurIPS 2018;
`fedu2_eua.min_norm_weights`), started from the clients' weights, and the
server takes one SGD step theta <- theta - eta_g sum_i lambda*_i v_i with
eta_g = 8 (main.py ``gmodel_lr``). BatchNorm statistics are averaged with
the clients' weights (batches per epoch, normalised, sharpened by
p^(1/T) / sum p^(1/T) with T = ``sharpen`` = 1, i.e. unchanged).

Not reproduced: the rotation-prediction head of main.py's ``use_deg=True``
run (a third, rotated view and a 4-way classifier on the projection); the
model has no such head.

Slots replaced relative to FedAvg: ``init_client`` (the client's last
parameter update and weight: EUA needs every cohort member's own update,
which the engine's weighted sum does not keep), ``client_loss``,
``client_final`` (writes the update and weight to the row),
``client_batches`` / ``cohort_batches`` (the even schedule),
``server_update`` (EUA).
"""

import dataclasses
import functools
from typing import Literal

import jax
import jax.numpy as jnp

from fedjax_metric import losses
from fedjax_metric.algorithms import (
  fedavg,
  fedu2_eua,
  ssl_common,
  ssl_schedules,
)
from fedjax_metric.algorithms.spec import AlgorithmSpec
from fedjax_metric.models import split_variables


@dataclasses.dataclass(frozen=True)
class Options:
  """FedU2's options (the released main.py and fedsimclr_client.py).

  Attributes:
    temperature: tau of NT-Xent (> 0).
    fur_weight: the weight of the regulariser FUR (>= 0).
    num_projections: FUR's number of random projections K.
    num_tangent_space: FUR's number of tangent spaces (its divisor).
    aggregation: 'eua' (default) or 'avg' (weighted averaging, for
      ablations).
    server_lr: eta_g, EUA's server step (> 0; main.py ``gmodel_lr``).
    sharpen: T of the weight sharpening p^(1/T) (> 0; 1 = none, main.py).
    even_epochs_cap: the even schedule's epoch cap (>= 0); 0 turns the even
      schedule off (every client runs config.local.epochs).
    max_iter: iteration cap of the min-norm solver (>= 1).
    view_order: augmentation order ('fedu2').
  """

  temperature: float = 0.07
  fur_weight: float = 0.01
  num_projections: int = 6
  num_tangent_space: int = 6
  aggregation: Literal['eua', 'avg'] = 'eua'
  server_lr: float = 8.0
  sharpen: float = 1.0
  even_epochs_cap: int = 10
  max_iter: int = 250
  view_order: Literal['ssd', 'fedu2'] = 'fedu2'

  def __post_init__(self):
    ssl_common.check_positive('temperature', self.temperature, allow_zero=False)
    ssl_common.check_positive('fur_weight', self.fur_weight)
    ssl_common.check_positive('server_lr', self.server_lr, allow_zero=False)
    ssl_common.check_positive('sharpen', self.sharpen, allow_zero=False)
    ssl_common.check_positive('even_epochs_cap', self.even_epochs_cap)
    if self.max_iter < 1:
      raise ValueError(f'max_iter must be >= 1, got {self.max_iter}.')


def client_loss(options, model, views, params, model_state, batch, ctx):
  """NT-Xent(z1, z2; tau) + fur_weight (FUR(z1) + FUR(z2)) on the
  projections of two views; FUR's random draws are fresh per view and
  step."""
  mask = batch.mask
  k_views, k_fur1, k_fur2 = jax.random.split(ctx.key, 3)
  out1, out2, model_state = ssl_common.two_view_forward(
    model, params, model_state, batch.raw_images, mask, k_views, views
  )
  z1, z2 = out1['projection'], out2['projection']
  nt = losses.masked_mean(
    losses.nt_xent_loss(
      z1,
      z2,
      temperature=options.temperature,
      self_in_denominator=True,
      mask=mask,
    ),
    mask,
  )
  fur_kwargs = dict(
    num_projections=options.num_projections,
    num_tangent_space=options.num_tangent_space,
    mask=mask,
  )
  fur = losses.fedu2_uniform_regularizer(
    z1, k_fur1, **fur_kwargs
  ) + losses.fedu2_uniform_regularizer(z2, k_fur2, **fur_kwargs)
  return nt + options.fur_weight * fur, (
    model_state,
    {'nt_xent': nt, 'fur': fur},
  )


def client_weight(options, weighting, ctx):
  """The client's weight p^(1/T): batches per local epoch under the even
  schedule (the released len(loader)), else `aggregation_weight`."""
  if weighting == 'num_batches' and options.even_epochs_cap:
    weight = ssl_schedules.batches_per_epoch(ctx)
  else:
    weight = ssl_common.aggregation_weight(ctx, weighting)
  return weight ** (1.0 / options.sharpen)


def init_client(variables, key):
  """The row: the client's last parameter update and weight (zeros)."""
  del key
  params, _ = split_variables(variables)
  return {
    'delta': jax.tree.map(jnp.zeros_like, params),
    'weight': jnp.zeros((), jnp.float32),
  }


def client_final(options, weighting, end_variables, ctx):
  """client_final under EUA: the update and `client_weight`, both also
  written to the row (EUA needs each cohort member's own update)."""
  delta = jax.tree.map(jnp.subtract, end_variables, ctx.server_state.variables)
  weight = client_weight(options, weighting, ctx)
  delta_params, _ = split_variables(delta)
  return delta, weight, {'delta': delta_params, 'weight': weight}


def avg_client_final(options, weighting, end_variables, ctx):
  """client_final under 'avg': the update weighted by `client_weight`."""
  return (
    jax.tree.map(jnp.subtract, end_variables, ctx.server_state.variables),
    client_weight(options, weighting, ctx),
    ctx.client_row,
  )


def server_update(options, server_optimizer, server_state, aggregate, rows):
  """EUA: the parameters move by server_lr * sum_i lambda*_i 2 delta_i /
  ||delta_i|| (`fedu2_eua.eua_direction` on the cohort's rows), through the
  server optimizer; BatchNorm statistics by the weighted mean update."""
  mean_delta = fedavg.mean_update(aggregate)
  real = aggregate.slot_mask & (rows['weight'] > 0)
  direction, _ = fedu2_eua.eua_direction(
    rows['delta'], rows['weight'], real, max_iter=options.max_iter
  )
  _, delta_state = split_variables(mean_delta)
  mean_delta = {
    'params': jax.tree.map(lambda d: options.server_lr * d, direction),
    **delta_state,
  }
  new_state = fedavg.apply_server_optimizer(
    server_optimizer, server_state, mean_delta
  )
  return fedavg.skip_if_nobody(aggregate, server_state, new_state)


def build(model, options, *, server_optimizer, weighting='num_batches'):
  """FedU2 (SimCLR + FUR, EUA aggregation).

  Args:
    model: `ModelFns` with a 'projection' output.
    options: `Options`.
    server_optimizer: applied to EUA's pseudo-gradient server_lr * sum
      lambda_i v_i (sgd(1.0) is the released code's one SGD step).
    weighting: 'num_batches' (batches per local epoch, the released
      len(loader)), 'num_examples' or 'uniform': EUA's starting weights and
      the BatchNorm statistics' averaging weights.
  """
  views = ssl_common.two_views(options.view_order)
  base = ssl_common.build_algorithm(
    functools.partial(client_loss, options, model, views),
    server_optimizer=server_optimizer,
    weighting=weighting,
    schedules=ssl_schedules.ssl_batch_schedules(
      even_epochs_cap=options.even_epochs_cap
    ),
  )
  if options.aggregation == 'avg':
    return base._replace(
      client_final=functools.partial(avg_client_final, options, weighting)
    )
  return base._replace(
    init_client=init_client,
    client_final=functools.partial(client_final, options, weighting),
    server_update=functools.partial(server_update, options, server_optimizer),
  )


SPEC = AlgorithmSpec(
  'fedu2',
  build,
  Options,
  description='FedU2 (Liao et al., 2024): flexible uniform regulariser and '
  'efficient aggregation.',
)
SPECS = (SPEC,)
