"""Federated unsupervised algorithms (SSD family) vs independent references.

Client losses: the value and gradient of each method's ``client_loss`` on a
two-layer linear encoder + projector, against a float64 NumPy re-derivation
of the method's equations written here with explicit loops, and central
finite differences for the gradient (stop-gradient targets held fixed, as
the equations detach them). The views are drawn with the same key by
`make_two_view_augment` (tested in tests/test_ssl_augment.py) and passed to
the reference as data.

Server sides: EUA (FedU2) against a float64 NumPy transcription of the
released MGDA solver and a brute-force minimum; L-DAWA against a NumPy loop
over layers; batch schedules and aggregation weights against hand counts.
"""

import importlib
import math

import fl_fixtures as fx
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fedjax_metric import algorithms, engine, optimizers
from fedjax_metric.algorithms import (
  fedu2,
  fedu2_eua,
  fedx,
  l_dawa,
  ssd,
  ssl_schedules,
)
from fedjax_metric.data import cohort as cohort_lib
from fedjax_metric.data import views
from fedjax_metric.models import make_model_fns

SERVER = optimizers.make_server_optimizer('sgd')
HIGHEST = 'highest'
D_IN, DIM = 36, 4  # 6x6x1 images; encoder and projector widths


class TwoLinear(nn.Module):
  """h = x W1 + b1 (encoder), p = h W2 + b2 (projector): no normalisation,
  so a NumPy re-derivation is a few lines."""

  @nn.compact
  def __call__(self, images, *, train, mask=None):
    del train, mask
    x = images.reshape(images.shape[0], -1)
    h = nn.Dense(DIM, name='enc')(x)
    return {
      'embedding': h,
      'projection': nn.Dense(DIM, name='proj')(h),
      'features': [],
    }


def two_linear():
  return make_model_fns(TwoLinear(), (1, 6, 6, 1))


def init(model, seed=0):
  return model.init(jax.random.key(seed))


def raw_batch(size=8, seed=0, padded=2):
  rng = np.random.default_rng(seed)
  raw = rng.integers(0, 256, (size, 6, 6, 1)).astype(np.uint8)
  mask = np.arange(size) < size - padded
  return raw, mask


def make_ctx(
  server_state,
  *,
  client_id=0,
  slot=0,
  key=None,
  num_steps=3.0,
  num_examples=20.0,
  client_row=(),
):
  return fx.client_context(
    server_state,
    client_row=client_row,
    key=jax.random.key(7) if key is None else key,
    client_id=client_id,
    slot=slot,
    num_steps=num_steps,
    num_examples=num_examples,
  )


def batch_of(raw, mask):
  return engine.Batch(
    jnp.zeros(raw.shape, jnp.float32),
    jnp.zeros(len(raw), jnp.int32),
    jnp.asarray(mask),
    jnp.asarray(raw),
  )


# ---------------------------------------------------------------------------
# NumPy references (float64, loops).
# ---------------------------------------------------------------------------


def np_params(variables):
  p = variables['params']
  return {
    k: {n: np.asarray(v, np.float64) for n, v in p[k].items()}
    for k in ('enc', 'proj')
  }


def np_forward(theta, x):
  h = x.reshape(len(x), -1) @ theta['enc']['kernel'] + theta['enc']['bias']
  return h, h @ theta['proj']['kernel'] + theta['proj']['bias']


def unit(v):
  return v / max(np.linalg.norm(v), 1e-12)


def np_align(p1, p2, real):
  return np.mean([np.sum((unit(p1[i]) - unit(p2[i])) ** 2) for i in real])


def np_uniform(p, real, t=2.0):
  vals = [
    np.exp(-t * np.sum((unit(p[i]) - unit(p[j])) ** 2))
    for i in real
    for j in real
    if i != j
  ]
  return math.log(np.mean(vals))


def np_dsr(p, p_frozen, scaling, real):
  total = 0.0
  for i in real:
    target = unit(unit(p_frozen[i]) @ scaling @ scaling.T)
    total += np.sum((unit(p[i]) - target) ** 2)
  return math.sqrt(total) / len(real)


def np_softmax(v):
  e = np.exp(v - v.max())
  return e / e.sum()


def np_kl_projector_to_encoder(h, p, real, t=0.5):
  vals = []
  for i in real:
    q, r = np_softmax(p[i] / t), np_softmax(h[i] / t)
    vals.append(np.sum(q * (np.log(q) - np.log(r))))
  return np.mean(vals)


def np_decorrelation(z, real, eps=1e-8):
  x = z[real]
  n, d = x.shape
  xh = (x - x.mean(0)) / np.sqrt(eps + x.var(0, ddof=1))
  corr = xh.T @ xh
  off = sum(corr[i, j] ** 2 for i in range(d) for j in range(d) if i != j)
  return off / (d * (d - 1)) / n


def np_nt_xent(z1, z2, real, t, self_in_denominator):
  u = [unit(v) for v in list(z1) + list(z2)]
  b = len(z1)
  rows = list(real) + [i + b for i in real]
  per = {}
  for a in rows:
    partner = a + b if a < b else a - b
    terms = []
    for c in rows:
      if c == a:
        if self_in_denominator:
          terms.append(1.0)  # the zeroed diagonal: exp(0)
        continue
      terms.append(math.exp(np.dot(u[a], u[c]) / t))
    per[a] = -(np.dot(u[a], u[partner]) / t) + math.log(sum(terms))
  return np.mean([(per[i] + per[i + b]) / 2 for i in real])


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


def flatten(theta):
  return np.concatenate(
    [theta[k][n].ravel() for k in sorted(theta) for n in sorted(theta[k])]
  )


def unflatten(vec, like):
  out, at = {}, 0
  for k in sorted(like):
    out[k] = {}
    for n in sorted(like[k]):
      size = like[k][n].size
      out[k][n] = vec[at : at + size].reshape(like[k][n].shape)
      at += size
  return out


def sampled_coordinates(size, count=40, seed=0):
  """A fixed random choice of ``count`` of ``size`` flat coordinates (all of
  them when there are fewer): finite differences of a NumPy loss cost two
  evaluations a coordinate, and a sample catches a wrong gradient as surely
  as the full sweep unless the error sits in a few entries only."""
  if size <= count:
    return np.arange(size)
  return np.sort(np.random.default_rng(seed).choice(size, count, replace=False))


def fd_grad(fn, theta, eps=1e-6):
  """Central differences of fn(theta) (float64) at `sampled_coordinates`
  of the flattened parameters; NaN at the others."""
  flat = flatten(theta)
  grad = np.full_like(flat, np.nan)
  for i in sampled_coordinates(flat.size):
    up, down = flat.copy(), flat.copy()
    up[i] += eps
    down[i] -= eps
    grad[i] = (fn(unflatten(up, theta)) - fn(unflatten(down, theta))) / (
      2 * eps
    )
  return unflatten(grad, theta)


def jax_value_and_grad(alg, variables, batch, ctx):
  params = variables['params']
  with jax.default_matmul_precision(HIGHEST):
    (loss, _), grads = fx.jit_client_loss_and_grad(alg, params, {}, batch, ctx)
  return float(loss), {
    k: {n: np.asarray(v, np.float64) for n, v in grads[k].items()}
    for k in ('enc', 'proj')
  }


def assert_grads_close(got, want, atol=2e-4):
  """``got`` matches ``want`` wherever ``want`` was computed (not NaN)."""
  checked = 0
  for k in want:
    for n in want[k]:
      known = np.isfinite(want[k][n])
      checked += known.sum()
      np.testing.assert_allclose(
        np.asarray(got[k][n])[known],
        want[k][n][known],
        atol=atol,
        err_msg=f'{k}/{n}',
      )
  assert checked > 0


def views_np(raw, key, order='ssd'):
  with jax.default_matmul_precision(HIGHEST):
    v1, v2 = views.make_two_view_augment(order=order)(jnp.asarray(raw), key)
  return np.asarray(v1, np.float64), np.asarray(v2, np.float64)


# ---------------------------------------------------------------------------
# Client losses.
# ---------------------------------------------------------------------------


@pytest.mark.parametrize('assign', ['client_id', 'position'])
def test_ssd_client_loss_matches_numpy(assign):
  """SSD Eq. 10 with the released code's DSR (Frobenius / n, detached and
  re-normalised target) and KL projector distillation (T = 0.5)."""
  model = two_linear()
  variables = init(model)
  alg = ssd.SPEC(model, server_optimizer=SERVER, assign=assign)
  state = alg.init_server(variables, 3, jax.random.key(1))
  scalings = np.asarray(state.extra['scaling'], np.float64)
  assert scalings.shape == (3, DIM, DIM)
  raw, mask = raw_batch()
  ctx = make_ctx(state, client_id=2, slot=0)
  got_loss, got_grad = jax_value_and_grad(
    alg, variables, batch_of(raw, mask), ctx
  )
  x1, x2 = views_np(raw, ctx.key)
  real = np.flatnonzero(mask)
  s = scalings[2] if assign == 'client_id' else scalings[0]
  theta0 = np_params(variables)

  def loss(theta, frozen=theta0):
    h1, p1 = np_forward(theta, x1)
    h2, p2 = np_forward(theta, x2)
    _, f1 = np_forward(frozen, x1)
    _, f2 = np_forward(frozen, x2)
    return (
      np_align(p1, p2, real)
      + (np_uniform(p1, real) + np_uniform(p2, real)) / 2
      + (np_dsr(p1, f1, s, real) + np_dsr(p2, f2, s, real)) / 2
      + 0.1
      * (
        np_kl_projector_to_encoder(h1, p1, real)
        + np_kl_projector_to_encoder(h2, p2, real)
      )
      / 2
    )

  assert got_loss == pytest.approx(loss(theta0), rel=1e-5, abs=1e-6)
  assert_grads_close(got_grad, fd_grad(loss, theta0))
  # The two assignments pick different matrices for client 2 in slot 0.
  other = scalings[0] if assign == 'client_id' else scalings[2]
  assert (
    abs(
      np_dsr(np_forward(theta0, x1)[1], np_forward(theta0, x1)[1], other, real)
      - np_dsr(np_forward(theta0, x1)[1], np_forward(theta0, x1)[1], s, real)
    )
    > 1e-4
  )


def test_ssd_scaling_matrices_live_in_server_extra():
  model = two_linear()
  alg = ssd.SPEC(model, server_optimizer=SERVER, scale=10.0)
  with jax.default_matmul_precision(HIGHEST):
    state = alg.init_server(init(model), 2, jax.random.key(3))
  s = np.asarray(state.extra['scaling'], np.float64)
  # m = floor(4 / 2) = 2 directions with eigenvalue 10 per client, disjoint.
  for k in range(2):
    eig = np.sort(np.linalg.eigvalsh(s[k] @ s[k].T))
    np.testing.assert_allclose(eig, [1, 1, 10, 10], atol=1e-4)
  prod = (s[0] @ s[0].T - np.eye(DIM)) @ (s[1] @ s[1].T - np.eye(DIM))
  np.testing.assert_allclose(prod, 0, atol=1e-3)


def test_fedalignuniform_and_feddecorr_losses_match_numpy():
  model = two_linear()
  variables = init(model)
  raw, mask = raw_batch(seed=1)
  real = np.flatnonzero(mask)
  theta0 = np_params(variables)
  for name in ('fedalignuniform', 'feddecorr'):
    alg = algorithms.REGISTRY[name](model, server_optimizer=SERVER)
    ctx = make_ctx(alg.init_server(variables, 2, jax.random.key(0)))
    got_loss, got_grad = jax_value_and_grad(
      alg, variables, batch_of(raw, mask), ctx
    )
    x1, x2 = views_np(raw, ctx.key)

    def loss(theta, name=name, x1=x1, x2=x2):
      h1, p1 = np_forward(theta, x1)
      h2, p2 = np_forward(theta, x2)
      value = (
        np_align(p1, p2, real)
        + (np_uniform(p1, real) + np_uniform(p2, real)) / 2
      )
      if name == 'feddecorr':
        value += (
          0.1 * (np_decorrelation(h1, real) + np_decorrelation(h2, real)) / 2
        )
      return value

    assert got_loss == pytest.approx(loss(theta0), rel=1e-5), name
    assert_grads_close(got_grad, fd_grad(loss, theta0))


def test_fedu2_loss_is_nt_xent_plus_weighted_regulariser():
  """NT-Xent (tau 0.07, self-similarity kept as e^0) vs NumPy; the FUR term
  enters linearly with its weight and is positive."""
  model = two_linear()
  variables = init(model)
  raw, mask = raw_batch(seed=2)
  real = np.flatnonzero(mask)
  values = {}
  for weight in (0.0, 0.01, 1.0):
    alg = fedu2.SPEC(model, server_optimizer=SERVER, fur_weight=weight)
    ctx = make_ctx(alg.init_server(variables, 2, jax.random.key(0)))
    values[weight], grad = jax_value_and_grad(
      alg, variables, batch_of(raw, mask), ctx
    )
    if weight == 0.0:
      k_views = jax.random.split(ctx.key, 3)[0]
      x1, x2 = views_np(raw, k_views, order='fedu2')
      theta0 = np_params(variables)

      def loss(theta, x1=x1, x2=x2):
        _, p1 = np_forward(theta, x1)
        _, p2 = np_forward(theta, x2)
        return np_nt_xent(p1, p2, real, 0.07, True)

      assert values[0.0] == pytest.approx(loss(theta0), rel=1e-5)
      assert_grads_close(grad, fd_grad(loss, theta0), atol=1e-3)
  fur = values[1.0] - values[0.0]
  assert fur > 0
  assert values[0.01] == pytest.approx(values[0.0] + 0.01 * fur, rel=1e-5)


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


# ---------------------------------------------------------------------------
# Batch schedules and weights.
# ---------------------------------------------------------------------------


SCHEDULE_FORMS = ('client_batches', 'cohort_batches')


def schedule(schedules, n, *, batch_size, epochs, num_steps, form, seed=0):
  """One client's (idx [S, B'], mask) from either slot of the schedule."""
  shape = dict(
    num_steps=num_steps,
    batch_size=batch_size,
    local_epochs=epochs,
    local_steps=0,
  )
  indices = np.arange(100, 100 + n)
  if form == 'client_batches':
    return schedules[form](indices, None, np.random.default_rng(seed), **shape)
  clients = cohort_lib.gather_clients(np.array([3]), {3: indices})
  idx, mask = schedules[form](clients, None, seed=seed, round_idx=0, **shape)
  return idx[0], mask[0]


@pytest.mark.parametrize('form', SCHEDULE_FORMS)
def test_drop_last_and_single_example_batches(form):
  # n = 10, B = 4: batches of 4, 4, 2 per epoch.
  idx, mask = schedule(
    ssl_schedules.ssl_batch_schedules(drop_last=True),
    10,
    batch_size=4,
    epochs=2,
    num_steps=6,
    form=form,
  )
  assert mask.sum(1).tolist() == [4, 4, 0, 4, 4, 0]
  # n = 9, B = 4: batches of 4, 4, 1; the one-example batch is skipped.
  idx, mask = schedule(
    ssl_schedules.ssl_batch_schedules(),
    9,
    batch_size=4,
    epochs=1,
    num_steps=3,
    form=form,
  )
  assert mask.sum(1).tolist() == [4, 4, 0]
  assert sorted(idx[mask].tolist()) != list(range(100, 109))  # one left out
  assert len(set(idx[mask].tolist())) == 8


@pytest.mark.parametrize('form', SCHEDULE_FORMS)
def test_random_batch_is_an_independent_epoch_of_the_same_shape(form):
  fn = ssl_schedules.ssl_batch_schedules(random_batch=True)
  idx, mask = schedule(fn, 10, batch_size=4, epochs=1, num_steps=3, form=form)
  assert idx.shape == (3, 8)
  first, second = idx[:, :4][mask[:, :4]], idx[:, 4:][mask[:, 4:]]
  np.testing.assert_array_equal(mask[:, :4], mask[:, 4:])
  assert (
    sorted(first.tolist()) == sorted(second.tolist()) == list(range(100, 110))
  )
  assert first.tolist() != second.tolist()


@pytest.mark.parametrize('form', SCHEDULE_FORMS)
def test_fedu2_even_schedule_epochs(form):
  fn = ssl_schedules.ssl_batch_schedules(even_epochs_cap=10)
  # S = 12 steps; n = 10, B = 4: 3 batches per epoch -> 4 epochs.
  _, mask = schedule(fn, 10, batch_size=4, epochs=1, num_steps=12, form=form)
  assert int(mask.any(1).sum()) == 12
  # n = 3: 1 batch per epoch -> min(12, cap 10) = 10 epochs.
  _, mask = schedule(fn, 3, batch_size=4, epochs=1, num_steps=12, form=form)
  assert int(mask.any(1).sum()) == 10


def test_client_final_weights_by_local_batches():
  model = two_linear()
  variables = init(model)
  alg = algorithms.REGISTRY['ssd'](model, server_optimizer=SERVER)
  state = alg.init_server(variables, 2, jax.random.key(0))
  end = jax.tree.map(lambda v: v + 0.5, state.variables)
  delta, weight, _ = alg.client_final(
    end, make_ctx(state, num_steps=7.0, num_examples=900.0)
  )
  assert float(weight) == 7.0
  np.testing.assert_allclose(delta['params']['enc']['bias'], 0.5, atol=1e-6)
  with pytest.raises(ValueError, match='weighting'):
    ssd.SPEC(model, server_optimizer=SERVER, weighting='by_size')
  with pytest.raises(ValueError, match='dsr_weight'):
    ssd.SPEC(model, server_optimizer=SERVER, dsr_weight=-1.0)


# ---------------------------------------------------------------------------
# FedU2's EUA.
# ---------------------------------------------------------------------------


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


# ---------------------------------------------------------------------------
# L-DAWA.
# ---------------------------------------------------------------------------


@pytest.mark.parametrize('scope', ['layer', 'model'])
@pytest.mark.parametrize('round_idx', [0, 3])
def test_l_dawa_aggregation_matches_numpy(scope, round_idx):
  model = two_linear()
  variables = init(model)
  # Every leaf non-zero (flax initialises biases to 0, whose cosine is
  # undefined; that case is tested below).
  variables = jax.tree.map(lambda v: v + 0.1, variables)
  variables = {**variables, 'batch_stats': {'bn': {'var': jnp.ones(3)}}}
  alg = l_dawa.SPEC(
    model, server_optimizer=SERVER, scope=scope, warmup_rounds=3
  )
  state, table = engine.init_state(alg, variables, 3)
  state = state._replace(round=jnp.int32(round_idx))
  rng = np.random.default_rng(1)
  ends, updates, weights = [], [], []
  steps = [2.0, 5.0, 3.0]
  for k in range(3):
    end = jax.tree.map(
      lambda v: v + jnp.asarray(0.3 * rng.normal(size=v.shape), jnp.float32),
      variables,
    )
    ends.append(end)
    with jax.default_matmul_precision(HIGHEST):
      u, w, _ = alg.client_final(end, make_ctx(state, num_steps=steps[k]))
    updates.append(u)
    weights.append(float(w))
  update_sum = jax.tree.map(
    lambda *x: sum(w * v for w, v in zip(weights, x)), *updates
  )
  aggregate = engine.Aggregate(
    update_sum,
    jnp.float32(sum(weights)),
    jnp.float32(3),
    jnp.arange(3),
    jnp.ones(3, bool),
  )
  rows = engine.gather_rows(table, jnp.arange(3))  # the cohort's rows
  with jax.default_matmul_precision(HIGHEST):
    new = alg.server_update(state, aggregate, rows)
  glob = jax.tree.map(lambda v: np.asarray(v, np.float64), variables)
  locs = [jax.tree.map(lambda v: np.asarray(v, np.float64), e) for e in ends]
  leaves_g = jax.tree.leaves(glob)
  leaves_k = [jax.tree.leaves(l) for l in locs]
  got = jax.tree.leaves(new.variables)
  if scope == 'model':
    whole = []
    for lk in leaves_k:
      a = np.concatenate([x.ravel() for x in lk])
      b = np.concatenate([x.ravel() for x in leaves_g])
      whole.append(min(a @ b / (np.linalg.norm(a) * np.linalg.norm(b)), 1.0))
  for i, g in enumerate(leaves_g):
    if round_idx < 3:  # warm-up: FedAvg weighted by local batches
      want = sum(s * lk[i] for s, lk in zip(steps, leaves_k)) / sum(steps)
    else:
      total = np.zeros_like(g)
      for k, lk in enumerate(leaves_k):
        if scope == 'layer':
          cos = np.sum(lk[i] * g) / (np.linalg.norm(lk[i]) * np.linalg.norm(g))
          delta = min(cos, 1.0)
        else:
          delta = whole[k]
        total += delta * lk[i]
      want = total / 3
    np.testing.assert_allclose(got[i], want, atol=1e-5)


def test_l_dawa_zero_global_layer_keeps_weight_one():
  local = {
    'a': jnp.asarray([1.0, 2.0]),
    'b': jnp.asarray([0.0, 0.0]),
    's': jnp.asarray(3.0),
  }
  glob = {
    'a': jnp.asarray([2.0, 4.0]),
    'b': jnp.asarray([0.0, 0.0]),
    's': jnp.asarray(1.0),
  }
  got = l_dawa.divergence_weights(local, glob)
  assert float(got['a']) == pytest.approx(1.0)  # clipped at 1
  assert float(got['b']) == 1.0 and float(got['s']) == 1.0
  glob['a'] = jnp.asarray([2.0, -1.0])
  got = l_dawa.divergence_weights(local, glob)
  assert float(got['a']) == pytest.approx(0.0)


def test_ssd_without_the_projector_trains_the_encoder_alone():
  """loss_on='embedding' (SSD's Table 4 "without the projector"): the loss
  reads the representation, so the projector gets exactly zero gradient
  and the encoder a non-zero one; projector distillation is refused."""
  model = two_linear()
  variables = init(model)
  alg = ssd.SPEC(
    model, server_optimizer=SERVER, loss_on='embedding', distill_weight=0.0
  )
  state = alg.init_server(variables, 3, jax.random.key(1))
  raw, mask = raw_batch()
  _, grads = jax_value_and_grad(
    alg, variables, batch_of(raw, mask), make_ctx(state, client_id=1)
  )
  assert all(np.all(g == 0.0) for g in grads['proj'].values())
  assert any(np.any(g != 0.0) for g in grads['enc'].values())
  with pytest.raises(ValueError, match='distill_weight=0'):
    ssd.SPEC(model, server_optimizer=SERVER, loss_on='embedding')
  with pytest.raises(ValueError, match='loss_on'):
    ssd.SPEC(model, server_optimizer=SERVER, loss_on='logits')


def test_ssd_config_ablations_are_the_papers_rows():
  config_module = importlib.import_module('configs.ssd')

  def kwargs(ablation):
    arg = 'clients=50' + (f',ablation={ablation}' if ablation else '')
    config = config_module.get_config(arg)
    assert config.num_clients == 50  # the other arguments still apply
    return config.algorithm_kwargs

  ssd_kwargs = kwargs('')
  assert (ssd_kwargs.dsr_weight, ssd_kwargs.distill_weight) == (1.0, 0.1)
  assert (kwargs('pd').dsr_weight, kwargs('pd').distill_weight) == (0.0, 0.1)
  assert (kwargs('dsr').dsr_weight, kwargs('dsr').distill_weight) == (1.0, 0.0)
  assert kwargs('mse').distill_method == 'mse'
  no_projector = kwargs('no_projector_dsr')
  assert no_projector.loss_on == 'embedding'
  assert (no_projector.dsr_weight, no_projector.distill_weight) == (1.0, 0.0)
  assert kwargs('no_projector').dsr_weight == 0.0
  with pytest.raises(ValueError, match='ablation must be one of'):
    kwargs('nope')
