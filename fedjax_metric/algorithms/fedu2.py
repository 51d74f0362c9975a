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
as many steps as the largest (`fedalignuniform.ssl_batch_schedules`).

Server (EUA): with g_i = theta - theta_i the cohort's parameter updates
(BatchNorm statistics excluded) and v_i = 2 g_i / ||g_i|| (norm over the
whole flattened parameter vector), the min-norm convex combination

  lambda* = argmin_{lambda in simplex} || sum_i lambda_i v_i ||^2

is found by the MGDA solver of the released code (Sener & Koltun,
'Multi-Task Learning as Multi-Objective Optimization', NeurIPS 2018;
`min_norm_weights`), started from the clients' weights, and the server
takes one SGD step theta <- theta - eta_g sum_i lambda*_i v_i with
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

import jax
import jax.numpy as jnp

from fedjax_metric import engine, losses
from fedjax_metric.algorithms import fedalignuniform as fau
from fedjax_metric.algorithms import fedavg
from fedjax_metric.contract import NO_RUN_FACTS, RunFacts
from fedjax_metric.models import split_variables

AGGREGATIONS = ('eua', 'avg')
_HIGHEST = jax.lax.Precision.HIGHEST
# MinNormSolver's constants (the released min_norm_solvers.py).
_STOP_CRIT = 1e-5
_STEP_FLOOR = 1e-7


def _min_norm_two(v11, v12, v22):
  """``MinNormSolver._min_norm_element_from2``: the c in [0, 1] minimising
  ||c x1 + (1 - c) x2||^2 from the three inner products, as coded (0.999 and
  0.001 at the ends, not 1 and 0)."""
  denom = v11 + v22 - 2.0 * v12
  interior = -(v12 - v22) / jnp.where(denom > 0, denom, 1.0)
  return jnp.where(v12 >= v11, 0.999, jnp.where(v12 >= v22, 0.001, interior))


def _projection_to_simplex(y, real):
  """``MinNormSolver._projection2simplex`` over the ``real`` entries; the
  others are 0."""
  size = y.shape[0]
  m = jnp.sum(real.astype(y.dtype))
  ordered = -jnp.sort(jnp.where(real, -y, jnp.inf))  # descending, pad last
  i = jnp.arange(size, dtype=y.dtype)
  csum = jnp.cumsum(jnp.where(i < m, ordered, 0.0))
  tmax = (csum - 1.0) / (i + 1.0)
  following = jnp.concatenate([ordered[1:], jnp.full((1,), -jnp.inf, y.dtype)])
  hit = (i < m - 1.0) & (tmax > following)
  fallback = (jnp.sum(jnp.where(real, y, 0.0)) - 1.0) / jnp.maximum(m, 1.0)
  tmax_f = jnp.where(jnp.any(hit), tmax[jnp.argmax(hit)], fallback)
  return jnp.where(real, jnp.maximum(y - tmax_f, 0.0), 0.0)


def _next_point(current, grad, real):
  """``MinNormSolver._next_point``: a projected-gradient step on the
  simplex, its length set by the first coordinate that hits a bound."""
  n = jnp.maximum(jnp.sum(real.astype(grad.dtype)), 1.0)
  proj = jnp.where(real, grad - jnp.sum(jnp.where(real, grad, 0.0)) / n, 0.0)
  neg, pos = real & (proj < 0), real & (proj > 0)
  tm1 = jnp.where(neg, -current / jnp.where(neg, proj, 1.0), jnp.inf)
  tm2 = jnp.where(pos, (1.0 - current) / jnp.where(pos, proj, 1.0), jnp.inf)
  ok1, ok2 = neg & (tm1 > _STEP_FLOOR), pos & (tm2 > _STEP_FLOOR)
  t = jnp.where(jnp.any(ok1), jnp.min(jnp.where(ok1, tm1, jnp.inf)), 1.0)
  t = jnp.where(
    jnp.any(ok2), jnp.minimum(t, jnp.min(jnp.where(ok2, tm2, jnp.inf))), t
  )
  return _projection_to_simplex(proj * t + current, real)


def min_norm_weights(gram, init, real, *, max_iter=250):
  """Convex weights of the min-norm element of the vectors' hull (MGDA).

  ``MinNormSolver.find_min_norm_element`` of FedU2's released code
  (github.com/XeniaLLL/FedU2, src/my/algo/commons/min_norm_solvers.py,
  after Sener & Koltun, NeurIPS 2018), on the Gram matrix of the vectors:
  starting from ``init`` (the clients' weights, as FedU2 passes them),
  repeat a projected-gradient step on the simplex followed by the exact
  line search between the current and the new point, until the L1 change
  is below 1e-5. As coded, with fewer than three vectors the starting
  weights are returned unchanged (the code returns its initial guess for
  n < 3). The released loop has no iteration cap (its counter is never
  incremented); here at most ``max_iter`` iterations run.

  Args:
    gram: [C, C] inner products <v_i, v_j>.
    init: [C] non-negative starting weights (normalised over ``real``).
    real: bool [C]; vectors that take part (padding slots do not).
    max_iter: iteration cap.

  Returns:
    [C] weights on the simplex over ``real``, 0 elsewhere.
  """
  dtype = gram.dtype
  init = jnp.where(real, init, 0.0).astype(dtype)
  sol = init / jnp.maximum(jnp.sum(init), 1e-30)
  n = jnp.sum(real.astype(jnp.int32))

  def quad(a, b):
    return jnp.dot(
      a, jnp.matmul(gram, b, precision=_HIGHEST), precision=_HIGHEST
    )

  def body(carry):
    sol, it, _ = carry
    new = _next_point(sol, -jnp.matmul(gram, sol, precision=_HIGHEST), real)
    c = _min_norm_two(quad(sol, sol), quad(sol, new), quad(new, new))
    new_sol = c * sol + (1.0 - c) * new
    done = jnp.sum(jnp.abs(new_sol - sol)) < _STOP_CRIT
    return jnp.where(done, sol, new_sol), it + 1, done

  def cond(carry):
    _, it, done = carry
    return (~done) & (it < max_iter)

  sol, _, _ = jax.lax.while_loop(
    cond, body, (sol, jnp.zeros((), jnp.int32), n < 3)
  )
  return sol


def _tree_gram(rows):
  """[C, C] inner products of the stacked pytrees ``rows`` (leaves [C, ...])."""

  def leaf_gram(x):
    flat = x.reshape(x.shape[0], -1).astype(jnp.float32)
    return jnp.matmul(flat, flat.T, precision=_HIGHEST)

  return sum(leaf_gram(x) for x in jax.tree.leaves(rows))


def eua_direction(deltas, weights, real, *, max_iter=250):
  """EUA's combined step direction from the cohort's parameter updates.

  With delta_i = theta_i - theta (= -g_i) and v_i = 2 g_i / ||g_i||, returns
  ``(sum_i lambda*_i 2 delta_i / ||delta_i||, lambda*)``, i.e. minus
  sum_i lambda*_i v_i, lambda* = `min_norm_weights` of the v_i started
  from ``weights`` (the released ``MTL.update_global_model`` with 'EUA').
  Updates of zero norm are left out (the released code would divide by
  zero).

  Args:
    deltas: pytree with leaves [C, ...], the clients' parameter updates.
    weights: [C] the clients' weights.
    real: bool [C].
    max_iter: see `min_norm_weights`.
  """
  gram = _tree_gram(deltas)
  norms = jnp.sqrt(jnp.maximum(jnp.diag(gram), 0.0))
  real = real & (norms > 0)
  inv = jnp.where(real, 1.0 / jnp.where(real, norms, 1.0), 0.0)
  unit_gram = 4.0 * gram * inv[:, None] * inv[None, :]
  lam = min_norm_weights(unit_gram, weights, real, max_iter=max_iter)
  coef = 2.0 * lam * inv
  return engine.weighted_sum(coef, deltas), lam


def make(
  model,
  *,
  server_optimizer,
  run: RunFacts = NO_RUN_FACTS,
  weighting='num_batches',
  temperature=0.07,
  fur_weight=0.01,
  num_projections=6,
  num_tangent_space=6,
  aggregation='eua',
  server_lr=8.0,
  sharpen=1.0,
  even_epochs_cap=10,
  max_iter=250,
  view_order='fedu2',
):
  """FedU2 (SimCLR + FUR, EUA aggregation).

  Args:
    model: `ModelFns` with a 'projection' output.
    server_optimizer: applied to EUA's pseudo-gradient server_lr * sum
      lambda_i v_i (sgd(1.0) is the released code's one SGD step).
    weighting: 'num_batches' (batches per local epoch, the released
      len(loader)), 'num_examples' or 'uniform': EUA's starting weights and
      the BatchNorm statistics' averaging weights.
    temperature: NT-Xent tau (0.07).
    fur_weight: weight of the regulariser (0.01).
    num_projections, num_tangent_space: FUR's K and divisor (6, 6).
    aggregation: 'eua' (default) or 'avg' (weighted averaging, for
      ablations).
    server_lr: eta_g (8, main.py ``gmodel_lr``).
    sharpen: T of the weight sharpening p^(1/T) (1 = none, main.py).
    even_epochs_cap: the even schedule's epoch cap (10); 0 turns the even
      schedule off (every client runs config.local.epochs).
    max_iter: iteration cap of the min-norm solver.
    view_order: augmentation order ('fedu2').
  """
  fau.check_positive('temperature', temperature, allow_zero=False)
  fau.check_positive('fur_weight', fur_weight)
  fau.check_positive('server_lr', server_lr, allow_zero=False)
  fau.check_positive('sharpen', sharpen, allow_zero=False)
  fau.check_weighting(weighting)
  if aggregation not in AGGREGATIONS:
    raise ValueError(
      f'aggregation must be one of {AGGREGATIONS}, got '
      f'{aggregation!r} (--config.algorithm_kwargs.'
      'aggregation).'
    )
  if max_iter < 1:
    raise ValueError(f'max_iter must be >= 1, got {max_iter}.')
  views = fau.make_views(view_order)

  def client_loss(params, model_state, batch, ctx):
    mask = batch.mask
    k_views, k_fur1, k_fur2 = jax.random.split(ctx.key, 3)
    out1, out2, model_state = fau.two_view_forward(
      model, params, model_state, batch.raw_images, mask, k_views, views
    )
    z1, z2 = out1['projection'], out2['projection']
    nt = losses.masked_mean(
      losses.nt_xent_loss(
        z1, z2, temperature=temperature, self_in_denominator=True, mask=mask
      ),
      mask,
    )
    fur_kwargs = dict(
      num_projections=num_projections,
      num_tangent_space=num_tangent_space,
      mask=mask,
    )
    fur = losses.fedu2_uniform_regularizer(
      z1, k_fur1, **fur_kwargs
    ) + losses.fedu2_uniform_regularizer(z2, k_fur2, **fur_kwargs)
    return nt + fur_weight * fur, (model_state, {'nt_xent': nt, 'fur': fur})

  def client_weight(ctx):
    if weighting == 'num_batches' and even_epochs_cap:
      weight = fau.batches_per_epoch(ctx)
    else:
      weight = fau.aggregation_weight(ctx, weighting)
    return weight ** (1.0 / sharpen)

  def init_client(variables, key):
    del key
    params, _ = split_variables(variables)
    return {
      'delta': jax.tree.map(jnp.zeros_like, params),
      'weight': jnp.zeros((), jnp.float32),
    }

  def client_final(end_variables, ctx):
    delta = jax.tree.map(
      jnp.subtract, end_variables, ctx.server_state.variables
    )
    weight = client_weight(ctx)
    delta_params, _ = split_variables(delta)
    return delta, weight, {'delta': delta_params, 'weight': weight}

  def server_update(server_state, aggregate, cohort_rows):
    mean_delta = fedavg.mean_update(aggregate)
    if aggregation == 'eua':
      rows = cohort_rows
      real = aggregate.slot_mask & (rows['weight'] > 0)
      direction, _ = eua_direction(
        rows['delta'], rows['weight'], real, max_iter=max_iter
      )
      _, delta_state = split_variables(mean_delta)
      mean_delta = {
        'params': jax.tree.map(lambda d: server_lr * d, direction),
        **delta_state,
      }
    new_state = fedavg.apply_server_optimizer(
      server_optimizer, server_state, mean_delta
    )
    return fedavg.skip_if_nobody(aggregate, server_state, new_state)

  base = fau.make_algorithm(
    model,
    client_loss,
    server_optimizer=server_optimizer,
    weighting=weighting,
    schedules=fau.ssl_batch_schedules(even_epochs_cap=even_epochs_cap),
  )
  if aggregation == 'avg':
    return base._replace(
      client_final=lambda v, ctx: (
        jax.tree.map(jnp.subtract, v, ctx.server_state.variables),
        client_weight(ctx),
        ctx.client_row,
      )
    )
  return base._replace(
    init_client=init_client,
    client_final=client_final,
    server_update=server_update,
  )
