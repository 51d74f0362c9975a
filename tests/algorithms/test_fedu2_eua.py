"""FedU2's EUA: the min-norm weights against a float64 NumPy transcription
of the released MGDA solver and a brute-force minimum, and the server update
against NumPy."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fedjax_metric import engine
from fedjax_metric.algorithms import fedu2, fedu2_eua

from .ssl_helpers import HIGHEST, SERVER, init, two_linear


class NumpyMinNormSolver:
  """The released ``MinNormSolver.find_min_norm_element`` (FedU2,
  src/my/algo/commons/min_norm_solvers.py) re-typed in float64, with a
  finite iteration cap."""

  @staticmethod
  def from2(v11, v12, v22):
    if v12 >= v11:
      return 0.999, v11
    if v12 >= v22:
      return 0.001, v22
    gamma = -1.0 * ((v12 - v22) / (v11 + v22 - 2 * v12))
    return gamma, v22 + gamma * (v12 - v22)

  @staticmethod
  def simplex(y):
    m = len(y)
    sorted_y = np.flip(np.sort(y), axis=0)
    tmpsum = 0.0
    tmax_f = (np.sum(y) - 1.0) / m
    for i in range(m - 1):
      tmpsum += sorted_y[i]
      tmax = (tmpsum - 1) / (i + 1.0)
      if tmax > sorted_y[i + 1]:
        tmax_f = tmax
        break
    return np.maximum(y - tmax_f, np.zeros(y.shape))

  @classmethod
  def next_point(cls, cur, grad, n):
    proj = grad - (np.sum(grad) / n)
    tm1 = -1.0 * cur[proj < 0] / proj[proj < 0]
    tm2 = (1.0 - cur[proj > 0]) / (proj[proj > 0])
    t = 1
    if len(tm1[tm1 > 1e-7]) > 0:
      t = np.min(tm1[tm1 > 1e-7])
    if len(tm2[tm2 > 1e-7]) > 0:
      t = min(t, np.min(tm2[tm2 > 1e-7]))
    return cls.simplex(proj * t + cur)

  @classmethod
  def solve(cls, gram, init, max_iter=250):
    n = len(init)
    sol = np.array(init, np.float64)
    if n < 3:
      return sol
    for _ in range(max_iter):
      new = cls.next_point(sol, -gram @ sol, n)
      nc, _ = cls.from2(sol @ gram @ sol, sol @ gram @ new, new @ gram @ new)
      new_sol = nc * sol + (1 - nc) * new
      if np.sum(np.abs(new_sol - sol)) < 1e-5:
        return sol
      sol = new_sol
    return sol


def brute_min_norm(gram, iters=20000):
  """min ||sum l_i v_i||^2 on the simplex by Frank-Wolfe with exact line
  search, many iterations (independent of the solver above)."""
  n = len(gram)
  lam = np.ones(n) / n
  for _ in range(iters):
    i = int(np.argmin(gram @ lam))
    d = np.eye(n)[i] - lam
    denom = d @ gram @ d
    if denom <= 0:
      break
    step = np.clip(-(lam @ gram @ d) / denom, 0, 1)
    lam = lam + step * d
  return lam @ gram @ lam


@pytest.mark.parametrize('n,seed', [(3, 0), (4, 1), (6, 2)])
def test_min_norm_weights_match_released_solver(n, seed):
  rng = np.random.default_rng(seed)
  vecs = rng.normal(size=(n, 12)) + 0.3 * rng.normal(size=12)
  vecs = 2 * vecs / np.linalg.norm(vecs, axis=1, keepdims=True)
  gram = vecs @ vecs.T
  init = rng.uniform(0.5, 2.0, n)
  init /= init.sum()
  # Padding slots interleaved with the real ones.
  slots = 2 * n
  where = np.sort(rng.choice(slots, n, replace=False))
  g = np.zeros((slots, slots))
  g[np.ix_(where, where)] = gram
  w0 = np.zeros(slots)
  w0[where] = init
  real = np.zeros(slots, bool)
  real[where] = True
  with jax.default_matmul_precision(HIGHEST):
    got = np.asarray(
      fedu2_eua.min_norm_weights(
        jnp.asarray(g, jnp.float32),
        jnp.asarray(w0, jnp.float32),
        jnp.asarray(real),
      ),
      np.float64,
    )
  want = NumpyMinNormSolver.solve(gram, init)
  np.testing.assert_allclose(got[where], want, atol=2e-4)
  assert np.all(got[~real] == 0)
  assert got.sum() == pytest.approx(1.0, abs=1e-5)
  # The solver's point is near the hull's min-norm point (the released
  # stopping rule, an L1 change < 1e-5, can stop ~0.3% above it) and well
  # below the starting point. Where the solver lands on the minimum itself,
  # float32 rounding of its weights can put its objective a relative ~1e-6
  # on either side of the float64 reference's, hence the 1e-5 slack.
  lam = got[where]
  best = brute_min_norm(gram)
  assert best * (1 - 1e-5) <= lam @ gram @ lam <= best * 1.01
  assert lam @ gram @ lam < init @ gram @ init - 0.1


def test_min_norm_weights_two_clients_keep_their_weights():
  gram = jnp.asarray([[4.0, -1.0], [-1.0, 4.0]])
  got = fedu2_eua.min_norm_weights(
    gram, jnp.asarray([0.25, 0.75]), jnp.asarray([True, True])
  )
  np.testing.assert_allclose(got, [0.25, 0.75], atol=1e-7)


def test_eua_server_update_matches_numpy():
  """theta <- theta + eta_g sum l_i 2 d_i / |d_i| (d_i = theta_i - theta,
  l from the solver started at the normalised weights); BatchNorm
  statistics averaged with the weights."""
  model = two_linear()
  variables = init(model)
  variables = {**variables, 'batch_stats': {'bn': {'mean': jnp.zeros(3)}}}
  alg = fedu2.SPEC(model, server_optimizer=SERVER, server_lr=8.0)
  num_clients = 5
  state, table = engine.init_state(alg, variables, num_clients)
  rng = np.random.default_rng(0)
  ids = np.array([0, 2, 3, num_clients], np.int32)  # last slot: padding
  slot_mask = np.array([True, True, True, False])
  weights = np.array([3.0, 1.0, 2.0, 0.0])
  deltas, rows = [], []
  for c in range(3):
    d = jax.tree.map(
      lambda v: jnp.asarray(rng.normal(size=v.shape), jnp.float32), variables
    )
    deltas.append(d)
    rows.append({'delta': d['params'], 'weight': jnp.float32(weights[c])})
  stacked = jax.tree.map(lambda *x: jnp.stack(x), *rows)
  table = engine.scatter_rows(table, jnp.asarray(ids[:3]), stacked)
  update_sum = jax.tree.map(
    lambda *x: sum(w * v for w, v in zip(weights[:3], x)), *deltas
  )
  aggregate = engine.Aggregate(
    update_sum,
    jnp.float32(weights.sum()),
    jnp.float32(3),
    jnp.asarray(ids),
    jnp.asarray(slot_mask),
  )
  rows = engine.gather_rows(table, jnp.asarray(ids))  # the cohort's rows
  with jax.default_matmul_precision(HIGHEST):
    new = alg.server_update(state, aggregate, rows)
  flat = [
    np.concatenate(
      [
        np.ravel(np.asarray(x, np.float64))
        for x in jax.tree.leaves(d['params'])
      ]
    )
    for d in deltas
  ]
  vecs = [2 * f / np.linalg.norm(f) for f in flat]
  gram = np.array([[a @ b for b in vecs] for a in vecs])
  lam = NumpyMinNormSolver.solve(gram, weights[:3] / weights[:3].sum())
  step = 8.0 * sum(l * v for l, v in zip(lam, vecs))
  old = np.concatenate(
    [
      np.ravel(np.asarray(x, np.float64))
      for x in jax.tree.leaves(variables['params'])
    ]
  )
  got = np.concatenate(
    [
      np.ravel(np.asarray(x, np.float64))
      for x in jax.tree.leaves(new.variables['params'])
    ]
  )
  np.testing.assert_allclose(got, old + step, atol=2e-4)
  want_mean = (
    sum(
      w * np.asarray(d['batch_stats']['bn']['mean'])
      for w, d in zip(weights[:3], deltas)
    )
    / weights.sum()
  )
  np.testing.assert_allclose(
    new.variables['batch_stats']['bn']['mean'], want_mean, atol=1e-6
  )
  assert int(new.round) == 1
