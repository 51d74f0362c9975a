"""FedX's client loss (local and global NT-Xent and relational losses) vs a
float64 NumPy re-derivation with finite differences."""

import fl_fixtures as fx
import jax
import numpy as np
import pytest

from fedjax_metric.algorithms import fedx

from .ssl_helpers import (
  HIGHEST,
  SERVER,
  batch_of,
  init,
  make_ctx,
  np_forward,
  np_nt_xent,
  np_softmax,
  raw_batch,
  sampled_coordinates,
  two_linear,
  unit,
  views_np,
)


def np_relational(z1, z2, anchors, real, anchor_real, t, t2):
  total = []
  for i in real:
    s1 = np.array([np.dot(unit(z1[i]), unit(anchors[a])) for a in anchor_real])
    s2 = np.array([np.dot(unit(z2[i]), unit(anchors[a])) for a in anchor_real])
    r1, r2 = np_softmax(s1 / t), np_softmax(s2 / t)
    m = (np_softmax(s1 / t2) + np_softmax(s2 / t2)) / 2
    kl = lambda p, q: np.sum(p * (np.log(p) - np.log(q)))
    total.append((kl(m, r1) + kl(m, r2)) / 2)
  return np.mean(total)


def test_fedx_loss_matches_numpy():
  """Local + global NT-Xent (tau 0.1) and relational losses; the global
  model (server variables) is frozen, the prediction head is trained."""
  model = two_linear()
  variables = init(model, seed=0)
  alg = fedx.SPEC(model, server_optimizer=SERVER)
  state = alg.init_server(variables, 2, jax.random.key(5))
  params = state.variables['params']
  assert fedx.PREDICTOR in params
  # The local model differs from the global one.
  local = jax.tree.map(lambda v: v * 1.1 + 0.01, params)
  raw_a, mask_a = raw_batch(size=6, seed=3, padded=1)
  raw_r, _ = raw_batch(size=6, seed=4, padded=1)
  raw = np.concatenate([raw_a, raw_r])
  mask = np.concatenate([mask_a, mask_a])
  ctx = make_ctx(state)
  with jax.default_matmul_precision(HIGHEST):
    (got, _), grads = fx.jit_client_loss_and_grad(
      alg, local, {}, batch_of(raw, mask), ctx
    )
  k_views, k_random = jax.random.split(ctx.key)
  x1, x2 = views_np(raw_a, k_views, order='fedu2')
  xr = views_np(raw_r, k_random, order='fedu2')[0]
  real = np.flatnonzero(mask_a)
  to_np = lambda tree: jax.tree.map(lambda v: np.asarray(v, np.float64), tree)
  theta_global = to_np(params)
  theta_local = to_np(local)

  def pred(theta, z):
    q = theta[fedx.PREDICTOR]
    hidden = np.maximum(z @ q['fc1']['kernel'] + q['fc1']['bias'], 0)
    return hidden @ q['fc2']['kernel'] + q['fc2']['bias']

  def loss(theta):
    z1, z2, zr = (np_forward(theta, x)[1] for x in (x1, x2, xr))
    q1, q2 = pred(theta, z1), pred(theta, z2)
    g2, gr = (np_forward(theta_global, x)[1] for x in (x2, xr))
    return (
      np_nt_xent(z1, z2, real, 0.1, False)
      + np_nt_xent(q1, g2, real, 0.1, False)
      + np_relational(z1, z2, zr, real, real, 0.1, 0.1)
      + np_relational(q1, q2, gr, real, real, 0.1, 0.1)
    )

  assert float(got) == pytest.approx(loss(theta_local), rel=1e-5)
  eps = 1e-6
  for key, name in (
    ('enc', 'kernel'),
    ('proj', 'bias'),
    (fedx.PREDICTOR, 'fc1'),
  ):
    leaf = theta_local[key][name]
    if isinstance(leaf, dict):
      leaf, path = leaf['kernel'], (key, name, 'kernel')
    else:
      path = (key, name)
    want = np.full_like(leaf, np.nan)
    for flat_idx in sampled_coordinates(leaf.size, count=12):
      idx = np.unravel_index(flat_idx, leaf.shape)
      want[idx] = 0.0
      for sign in (1, -1):
        theta = jax.tree.map(np.copy, theta_local)
        target = theta
        for part in path[:-1]:
          target = target[part]
        target[path[-1]][idx] += sign * eps
        want[idx] += sign * loss(theta) / (2 * eps)
    got_leaf = grads
    for part in path:
      got_leaf = got_leaf[part]
    known = np.isfinite(want)
    np.testing.assert_allclose(
      np.asarray(got_leaf)[known], want[known], atol=2e-4, err_msg=str(path)
    )
