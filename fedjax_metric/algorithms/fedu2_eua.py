"""FedU2's server aggregation, EUA: the min-norm combination of the
cohort's normalised updates.

Liao et al., 'Rethinking the Representation in Federated Unsupervised
Learning with Non-IID Data', CVPR 2024, as in the authors' released code
(github.com/XeniaLLL/FedU2: src/my/algo/fedU2/server.py,
src/my/algo/commons/mtl.py and min_norm_solvers.py). With g_i the cohort's
parameter updates and v_i = 2 g_i / ||g_i||, the convex weights

  lambda* = argmin_{lambda in simplex} || sum_i lambda_i v_i ||^2

come from the MGDA solver (Sener & Koltun, 'Multi-Task Learning as
Multi-Objective Optimization', NeurIPS 2018; `min_norm_weights`) and the
step direction is sum_i lambda*_i v_i (`eua_direction`).
"""

import jax
import jax.numpy as jnp

from fedjax_metric import engine

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
