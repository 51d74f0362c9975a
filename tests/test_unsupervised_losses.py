"""Unsupervised (SSD family) losses and SSD's scaling matrices.

Each loss is compared with an independent float64 NumPy re-derivation written
from the paper's equation or as a literal transcription of the authors'
released code, with explicit Python loops; gradients with central finite
differences of those references; degenerate inputs must give finite values and
gradients with no NaN even internally (checkify's NaN checks instrument
every primitive of the jitted gradient, forward and backward).
"""

import functools
import math

import jax
from jax.experimental import checkify
import jax.numpy as jnp
import jitted
import numpy as np
import pytest

from fedjax_metric import losses as library_losses
from fedjax_metric.algorithms import ssd_scaling

# Each call one jitted program (tests/jitted.py): eager dispatch was slower.
losses = jitted.jitted_module(library_losses)

TOL = dict(rtol=2e-5, atol=2e-5)
HIGHEST = 'highest'


# ---------------------------------------------------------------------------
# float64 NumPy references.
# ---------------------------------------------------------------------------


def n64(v):
  v = np.asarray(v, np.float64)
  return v / max(np.sqrt(np.sum(v * v)), 1e-12)


def real_rows(mask, b):
  return [True] * b if mask is None else [bool(m) for m in mask]


def ref_alignment(p1, p2, mask=None):
  m = real_rows(mask, len(p1))
  return np.array(
    [
      np.sum((n64(p1[i]) - n64(p2[i])) ** 2) if m[i] else 0.0
      for i in range(len(p1))
    ]
  )


def ref_uniformity(p, t, mask=None):
  m = real_rows(mask, len(p))
  rows = [n64(p[i]) for i in range(len(p)) if m[i]]
  vals = [
    np.exp(-t * np.sum((rows[i] - rows[j]) ** 2))
    for i in range(len(rows))
    for j in range(i + 1, len(rows))
  ]
  return float(np.log(np.mean(vals))) if vals else 0.0


def ref_dsr(p, s, form, mask=None, target=None):
  """SSD Eq. 7 / the released subspace_loss; ``target`` fixes the target."""
  m = real_rows(mask, len(p))
  s = np.asarray(s, np.float64)
  total, n = 0.0, 0
  for i in range(len(p)):
    if not m[i]:
      continue
    z = n64(p[i])
    if target is not None:
      tgt = target[i]
    else:
      tgt = z @ s @ s.T
      tgt = n64(tgt) if form == 'code' else tgt
    total += np.sum((z - tgt) ** 2)
    n += 1
  if n == 0:
    return 0.0
  return np.sqrt(total) / n if form == 'code' else total / n


def ref_pd(e, p, temp, mask=None):
  m = real_rows(mask, len(e))
  out = np.zeros(len(e))
  for i in range(len(e)):
    if not m[i]:
      continue
    q = np.exp(np.asarray(p[i], np.float64) / temp)
    q /= q.sum()
    r = np.exp(np.asarray(e[i], np.float64) / temp)
    r /= r.sum()
    out[i] = sum(q[d] * (np.log(q[d]) - np.log(r[d])) for d in range(len(q)))
  return out


def ref_nt_xent(z1, z2, temp, self_in, mask=None):
  """Loops over anchors; self term e^0 (FedU2) or excluded (SimCLR)."""
  b = len(z1)
  m = real_rows(mask, b) * 2
  u = [n64(v) for v in list(z1) + list(z2)]
  per_anchor = np.zeros(2 * b)
  for a in range(2 * b):
    if not m[a]:
      continue
    pos = (a + b) % (2 * b)
    denom = 0.0
    for c in range(2 * b):
      if not m[c]:
        continue
      if c == a:
        denom += 1.0 if self_in else 0.0
      else:
        denom += np.exp(np.dot(u[a], u[c]) / temp)
    per_anchor[a] = -np.log(np.exp(np.dot(u[a], u[pos]) / temp) / denom)
  return (per_anchor[:b] + per_anchor[b:]) / 2


def ref_nt_xent_fedu2_code(z1, z2, temp):
  """Literal transcription of FedU2's nt_xent_loss (inputs normalised)."""
  z = np.concatenate(
    [np.stack([n64(v) for v in z1]), np.stack([n64(v) for v in z2])]
  )
  b = len(z1)
  sim = (z @ z.T) * (1 - np.eye(2 * b))
  logits = sim / temp
  target = np.concatenate([np.arange(b, 2 * b), np.arange(b)])
  log_p = logits - np.log(np.exp(logits).sum(1, keepdims=True))
  return -np.mean(log_p[np.arange(2 * b), target])


def ref_nt_xent_fedx_code(x1, x2, t):
  """Literal transcription of FedX's nt_xent (github Sungwon-Han/FEDX)."""
  x1 = np.stack([n64(v) for v in x1])
  x2 = np.stack([n64(v) for v in x2])
  b = len(x1)
  out = np.concatenate([x1, x2])
  sim = np.exp(out @ out.T / t)
  sim = sim[~np.eye(2 * b, dtype=bool)].reshape(2 * b, -1)
  pos = np.exp(np.sum(x1 * x2, -1) / t)
  pos = np.concatenate([pos, pos])
  return np.mean(-np.log(pos / sim.sum(-1)))


def ref_decorr(z, form, mask=None, eps=1e-8):
  """FedDecorrLoss step by step on the real rows (torch var: ddof=1)."""
  m = real_rows(mask, len(z))
  x = np.asarray([z[i] for i in range(len(z)) if m[i]], np.float64)
  n, d = x.shape if len(x) else (0, np.shape(z)[1])
  if n <= 1:
    return 0.0
  x = x - x.mean(0, keepdims=True)
  x = x / np.sqrt(eps + x.var(0, ddof=1, keepdims=True))
  c = np.zeros((d, d))
  for i in range(d):
    for j in range(d):
      c[i, j] = sum(x[r, i] * x[r, j] for r in range(n))
  if form == 'code':
    if d < 2:
      return 0.0
    off = [c[i, j] ** 2 for i in range(d) for j in range(d) if i != j]
    return float(np.mean(off) / n)
  return float(np.sum((c / n) ** 2) / d**2)


def softmax64(v):
  v = np.asarray(v, np.float64)
  e = np.exp(v - v.max())
  return e / e.sum()


def ref_relational(z1, z2, a, t, t2, form, mask=None, anchor_mask=None):
  m = real_rows(mask, len(z1))
  am = real_rows(anchor_mask, len(a))
  anchors = [n64(a[j]) for j in range(len(a)) if am[j]]
  out = np.zeros(len(z1))
  for i in range(len(z1)):
    if not m[i] or not anchors:
      continue
    s1 = np.array([np.dot(n64(z1[i]), v) for v in anchors])
    s2 = np.array([np.dot(n64(z2[i]), v) for v in anchors])
    r1, r2 = softmax64(s1 / t), softmax64(s2 / t)
    if form == 'code':
      tgt = (softmax64(s1 / t2) + softmax64(s2 / t2)) / 2
      kl1 = sum(
        tgt[k] * (np.log(tgt[k]) - np.log(r1[k])) for k in range(len(tgt))
      )
      kl2 = sum(
        tgt[k] * (np.log(tgt[k]) - np.log(r2[k])) for k in range(len(tgt))
      )
    else:
      mid = (r1 + r2) / 2
      kl1 = sum(
        r1[k] * (np.log(r1[k]) - np.log(mid[k])) for k in range(len(mid))
      )
      kl2 = sum(
        r2[k] * (np.log(r2[k]) - np.log(mid[k])) for k in range(len(mid))
      )
    out[i] = (kl1 + kl2) / 2
  return out


def geoopt_logmap(x, y):
  """geoopt Sphere.logmap: proju(x, y - x) scaled to arccos(<x, y>)."""
  x, y = np.asarray(x, np.float64), np.asarray(y, np.float64)
  u = (y - x) - np.dot(x, y - x) * x
  dist = np.arccos(np.clip(np.dot(x, y), -1, 1))
  return u * dist / np.linalg.norm(u) if dist > 1e-6 else u


def ref_fur(z, tangent, reference, projections, num_tangent_space, mask=None):
  """RepresentationTagentCollapse with given draws, loop by loop."""
  m = real_rows(mask, len(z))
  rows = [i for i in range(len(z)) if m[i]]
  total = 0.0
  for b in rows:
    log_r = np.stack(
      [geoopt_logmap(tangent[b], n64(reference[i])) for i in rows]
    )
    log_z = np.stack([geoopt_logmap(tangent[b], n64(z[i])) for i in rows])
    w = np.asarray(projections[b], np.float64)  # [K, D]
    sq = []
    for k in range(len(w)):
      a = np.sort(log_r @ w[k])
      c = np.sort(log_z @ w[k])
      sq.extend((a - c) ** 2)
    total += np.mean(sq)
  return total / num_tangent_space


# ---------------------------------------------------------------------------
# Helpers.
# ---------------------------------------------------------------------------


def rand(seed, *shape):
  return np.random.default_rng(seed).normal(size=shape).astype(np.float32)


def unit_rows(seed, b, d):
  return np.stack([n64(v) for v in rand(seed, b, d)]).astype(np.float32)


def assert_finite_grads(fn, *args):
  """Gradients of sum(fn) w.r.t. every argument: finite, and no primitive of
  the forward or backward pass produced a NaN (also one a `where` drops)."""
  grad = jax.grad(lambda *a: jnp.sum(fn(*a)), argnums=tuple(range(len(args))))
  err, grads = jax.jit(checkify.checkify(grad, errors=checkify.nan_checks))(
    *args
  )
  err.throw()
  for g in grads:
    assert np.isfinite(np.asarray(g)).all()
  return grads


def numeric_grad(f, x, h=1e-6):
  x = np.asarray(x, np.float64)
  g = np.zeros_like(x)
  for idx in np.ndindex(*x.shape):
    up, down = x.copy(), x.copy()
    up[idx] += h
    down[idx] -= h
    g[idx] = (f(up) - f(down)) / (2 * h)
  return g


def assert_grad_close(jax_grad, num):
  np.testing.assert_allclose(
    np.asarray(jax_grad),
    num,
    rtol=2e-3,
    atol=2e-3 * max(1.0, np.abs(num).max()),
  )


MASK = np.array([1, 1, 0, 1, 1, 0, 1], bool)

# name -> (jax fn of (x, mask), NumPy reference of (x, mask), input shapes)
# Each entry closes over fixed extra inputs so that the shared tests below can
# run on every loss.
_S = ssd_scaling.scaling_matrices(3, 5, seed=4)[1]
_E = rand(50, 7, 5)
_P2 = rand(51, 7, 5)
_ANCHORS = rand(52, 6, 5)
_TANGENT = unit_rows(53, 7, 5)
_REF = unit_rows(54, 7, 5)
_PROJ = rand(55, 7, 3, 5)

LOSSES = {
  'alignment': (
    lambda x, m: losses.alignment_loss(x, _P2, mask=m),
    lambda x, m: ref_alignment(x, _P2, m),
  ),
  'uniformity': (
    lambda x, m: losses.uniformity_loss(x, mask=m),
    lambda x, m: ref_uniformity(x, 2.0, m),
  ),
  'uniformity_t5': (
    lambda x, m: losses.uniformity_loss(x, t=5.0, mask=m),
    lambda x, m: ref_uniformity(x, 5.0, m),
  ),
  'dsr_code': (
    lambda x, m: losses.dsr_loss(x, _S, mask=m),
    lambda x, m: ref_dsr(x, _S, 'code', m),
  ),
  'dsr_paper': (
    lambda x, m: losses.dsr_loss(x, _S, form='paper', mask=m),
    lambda x, m: ref_dsr(x, _S, 'paper', m),
  ),
  'pd': (
    lambda x, m: losses.projector_distillation_loss(_E, x, mask=m),
    lambda x, m: ref_pd(_E, x, 0.5, m),
  ),
  'pd_paper': (
    lambda x, m: losses.projector_distillation_loss(
      _E, x, temperature=1.0, form='paper', mask=m
    ),
    lambda x, m: ref_pd(x, _E, 1.0, m),
  ),
  'pd_encoder_side': (
    lambda x, m: losses.projector_distillation_loss(x, _E, mask=m),
    lambda x, m: ref_pd(x, _E, 0.5, m),
  ),
  'nt_xent_fedu2': (
    lambda x, m: losses.nt_xent_loss(x, _P2, mask=m),
    lambda x, m: ref_nt_xent(x, _P2, 0.07, True, m),
  ),
  'nt_xent_simclr': (
    lambda x, m: losses.nt_xent_loss(
      x, _P2, temperature=0.5, self_in_denominator=False, mask=m
    ),
    lambda x, m: ref_nt_xent(x, _P2, 0.5, False, m),
  ),
  'decorr_code': (
    lambda x, m: losses.decorrelation_loss(x, mask=m),
    lambda x, m: ref_decorr(x, 'code', m),
  ),
  'decorr_paper': (
    lambda x, m: losses.decorrelation_loss(x, form='paper', mask=m),
    lambda x, m: ref_decorr(x, 'paper', m),
  ),
  'relational_code': (
    lambda x, m: losses.relational_loss(
      x, _P2, _ANCHORS, temperature=0.2, target_temperature=0.05, mask=m
    ),
    lambda x, m: ref_relational(x, _P2, _ANCHORS, 0.2, 0.05, 'code', m),
  ),
  'relational_js': (
    lambda x, m: losses.relational_loss(x, _P2, _ANCHORS, form='js', mask=m),
    lambda x, m: ref_relational(x, _P2, _ANCHORS, 0.1, 0.1, 'js', m),
  ),
  'fur': (
    lambda x, m: losses.tangent_sliced_wasserstein(
      x, _TANGENT, _REF, _PROJ, mask=m
    ),
    lambda x, m: ref_fur(x, _TANGENT, _REF, _PROJ, 6, m),
  ),
}


@functools.lru_cache(maxsize=None)
def jitted(name):
  """Jitted value, gradient and NaN-checked gradient of LOSSES[name].

  Compiling whole losses instead of dispatching op by op keeps the tests
  fast; the mask is a traced argument, so one compilation serves every mask.
  """
  fn = LOSSES[name][0]
  grad = jax.grad(lambda v, m: jnp.sum(fn(v, m)))
  return (
    jax.jit(fn),
    jax.jit(grad),
    jax.jit(checkify.checkify(grad, errors=checkify.nan_checks)),
  )


# ---------------------------------------------------------------------------
# Values, masks, gradients: every loss.
# ---------------------------------------------------------------------------


@pytest.mark.parametrize('use_mask', [False, True])
@pytest.mark.parametrize('name', sorted(LOSSES))
def test_matches_float64_reference(name, use_mask):
  _, ref = LOSSES[name]
  fn = jitted(name)[0]
  mask = MASK if use_mask else None
  for seed in (0, 1):
    x = rand(seed, 7, 5) * 1.5
    with jax.default_matmul_precision(HIGHEST):
      got = np.asarray(fn(x, mask))
    np.testing.assert_allclose(got, ref(x, mask), **TOL)
    if got.ndim == 1 and mask is not None:
      np.testing.assert_array_equal(got[~MASK], 0.0)


@pytest.mark.parametrize('name', sorted(LOSSES))
def test_gradient_matches_finite_differences_of_reference(name):
  if name.startswith('dsr'):
    pytest.skip('DSR detaches its target: test_dsr_target_is_detached')
  _, ref = LOSSES[name]
  grad = jitted(name)[1]
  x = rand(7, 7, 5)
  with jax.default_matmul_precision(HIGHEST):
    g = grad(x, MASK)
  num = numeric_grad(lambda v: np.sum(ref(v, MASK)), x)
  assert_grad_close(g, num)
  np.testing.assert_array_equal(np.asarray(g)[~MASK], 0.0)


@pytest.mark.parametrize('name', sorted(LOSSES))
def test_degenerate_inputs_finite_without_nan(name):
  fn, grad, checked_grad = jitted(name)
  one = np.ones((7, 5), np.float32)
  cases = [
    (one, None),  # coincident rows
    (np.zeros((7, 5), np.float32), None),  # zero rows
    (rand(3, 7, 5), np.zeros(7, bool)),  # all masked
    (rand(3, 7, 5), np.eye(7, dtype=bool)[0]),  # one real row
    (np.concatenate([one[:3], -one[:4]]), None),  # antipodal rows
  ]
  for x, mask in cases:
    mask = np.ones(7, bool) if mask is None else mask
    value = np.asarray(fn(x, mask))
    assert np.isfinite(value).all(), (name, x[0], mask)
    err, g = checked_grad(x, mask)
    err.throw()  # a NaN anywhere in the forward or backward pass
    assert np.isfinite(np.asarray(g)).all(), (name, x[0], mask)
  # All masked: every loss is exactly 0 with a zero gradient.
  x = rand(3, 7, 5)
  none = np.zeros(7, bool)
  np.testing.assert_array_equal(np.asarray(fn(x, none)), 0.0)
  np.testing.assert_array_equal(np.asarray(grad(x, none)), 0.0)


@pytest.mark.parametrize('name', sorted(LOSSES))
def test_padding_invariant(name):
  """Real rows give the same result with or without masked junk rows."""
  if name in ('fur',):
    pytest.skip('the FUR draws are indexed by row; covered separately')
  fn = jitted(name)[0]
  x = rand(8, 7, 5)
  mask = np.array([1, 1, 1, 1, 0, 0, 0], bool)
  junk = x.copy()
  junk[4:] = 1e3 * rand(9, 3, 5)
  with jax.default_matmul_precision(HIGHEST):
    a, b = np.asarray(fn(x, mask)), np.asarray(fn(junk, mask))
  np.testing.assert_allclose(a, b, **TOL)


class J:
  """The losses, jitted: one compilation per shape instead of one per
  primitive keeps the property tests below fast."""

  uniformity_loss = staticmethod(jax.jit(losses.uniformity_loss))
  nt_xent_loss = staticmethod(
    jax.jit(losses.nt_xent_loss, static_argnames=('self_in_denominator',))
  )
  decorrelation_loss = staticmethod(
    jax.jit(losses.decorrelation_loss, static_argnames=('form',))
  )
  relational_loss = staticmethod(
    jax.jit(losses.relational_loss, static_argnames=('form',))
  )
  fedu2_uniform_regularizer = staticmethod(
    jax.jit(losses.fedu2_uniform_regularizer)
  )
  tangent_sliced_wasserstein = staticmethod(
    jax.jit(losses.tangent_sliced_wasserstein)
  )
  dsr_loss = staticmethod(jax.jit(losses.dsr_loss, static_argnames=('form',)))
  projector_distillation_loss = staticmethod(
    jax.jit(losses.projector_distillation_loss)
  )


def test_fur_padding_invariant():
  x = rand(8, 7, 5)
  mask = np.array([1, 1, 1, 1, 0, 0, 0], bool)
  with jax.default_matmul_precision(HIGHEST):
    padded = J.tangent_sliced_wasserstein(
      np.concatenate([x[:4], 50 * rand(9, 3, 5)]),
      _TANGENT,
      np.concatenate([_REF[:4], unit_rows(10, 3, 5)]),
      _PROJ,
      mask=mask,
    )
    short = J.tangent_sliced_wasserstein(
      x[:4], _TANGENT[:4], _REF[:4], _PROJ[:4]
    )
  np.testing.assert_allclose(padded, short, **TOL)


def test_vmap_over_clients_matches_per_client_calls():
  """Per-client scaling matrices under vmap, as the engine batches clients."""
  scalings = ssd_scaling.scaling_matrices(3, 5, seed=1)
  p = rand(11, 3, 6, 5)
  with jax.default_matmul_precision(HIGHEST):
    batched = jax.jit(jax.vmap(lambda x, s: J.dsr_loss(x, s)))(p, scalings)
    single = [J.dsr_loss(p[k], scalings[k]) for k in range(3)]
  np.testing.assert_allclose(batched, single, **TOL)


# ---------------------------------------------------------------------------
# Loss-specific properties.
# ---------------------------------------------------------------------------


def test_uniformity_small_batches_and_extremes():
  assert float(J.uniformity_loss(rand(0, 1, 4))) == 0.0
  # All rows equal: every pair at distance 0, U = log 1 = 0.
  assert abs(float(J.uniformity_loss(np.ones((5, 3), np.float32)))) < 1e-6
  # Two antipodal rows: U = -4t exactly; large t must not underflow to -inf.
  pair = np.array([[1, 0], [-1, 0]], np.float32)
  np.testing.assert_allclose(J.uniformity_loss(pair, t=50.0), -200.0, rtol=1e-6)


def test_uniformity_equals_evaluation_metric():
  """The training loss and the evaluation metric are the same quantity."""
  from fedjax_metric.evaluation import uniformity

  x = rand(4, 9, 6)
  with jax.default_matmul_precision(HIGHEST):
    np.testing.assert_allclose(
      J.uniformity_loss(x), jax.jit(uniformity)(x), **TOL
    )


@pytest.mark.parametrize('form', ['code', 'paper'])
def test_dsr_target_is_detached(form):
  """grad dsr_loss = grad of the formula with its target T held constant.

  Checked by central finite differences in float64 of the NumPy formula with
  the target frozen at its value at p0 (masked rows included); the finite
  differences of the formula with the target recomputed (no stop-gradient)
  must differ, so the check can fail.
  """
  s = ssd_scaling.scaling_matrices(2, 5, scale=10.0, seed=3)[0].astype(
    np.float64
  )
  p0 = rand(12, 7, 5)
  scaled = [n64(v) @ s @ s.T for v in p0]
  frozen = [n64(t) for t in scaled] if form == 'code' else scaled
  with jax.default_matmul_precision(HIGHEST):
    g = np.asarray(
      jax.grad(
        lambda v: J.dsr_loss(v, s.astype(np.float32), form=form, mask=MASK)
      )(p0)
    )
  detached = numeric_grad(
    lambda v: ref_dsr(v, s, form, MASK, target=frozen), p0
  )
  assert_grad_close(g, detached)
  np.testing.assert_array_equal(g[~MASK], 0.0)
  attached = numeric_grad(lambda v: ref_dsr(v, s, form, MASK), p0)
  assert np.abs(attached - detached).max() > 1e-2


def test_dsr_zero_when_target_equals_z_and_gradient_finite():
  """z == target exactly: loss 0 and a zero (not NaN) gradient (safe sqrt).

  Rows are basis vectors, whose normalisation is exact, and S = I.
  """
  p = np.eye(6, 4, dtype=np.float32)[[0, 1, 2, 3, 1, 2]]
  eye = np.eye(4, dtype=np.float32)
  for form in ('code', 'paper'):
    assert float(J.dsr_loss(p, eye, form=form)) == 0.0
    g = assert_finite_grads(
      lambda v: J.dsr_loss(v, eye, form=form), jnp.asarray(p)
    )[0]
    np.testing.assert_array_equal(np.asarray(g), 0.0)
  # A client with an empty direction set: S = Q orthogonal, S S^T = I, so
  # its target is z up to rounding and its loss ~ 0.
  s = ssd_scaling.scaling_matrices(5, 4, seed=0, directions_per_client=1)[4]
  np.testing.assert_allclose(s.astype(np.float64) @ s.T, np.eye(4), atol=1e-5)
  q = rand(13, 6, 4)
  with jax.default_matmul_precision(HIGHEST):
    assert float(J.dsr_loss(q, s)) < 1e-5
  assert_finite_grads(lambda v: J.dsr_loss(v, s), jnp.asarray(q))


def test_dsr_gradient_step_leans_towards_client_directions():
  """One descent step moves unit embeddings towards the scaled subspace."""
  scaling = ssd_scaling.scaling_matrices(4, 8, seed=2)[1]
  eigval, eigvec = np.linalg.eigh(scaling.astype(np.float64) @ scaling.T)
  sub = eigvec[:, eigval > 5]  # client 1's two scaled directions
  z = unit_rows(14, 32, 8)
  energy = lambda v: np.mean(
    np.sum((np.stack([n64(r) for r in v]) @ sub) ** 2, axis=1)
  )
  step = z - 0.5 * np.asarray(
    jax.grad(lambda v: J.dsr_loss(v, scaling))(z)
  ) * len(z)
  assert energy(step) > energy(z) + 1e-3


def test_projector_distillation_gradient_reaches_both_sides():
  e, p = rand(15, 4, 6), rand(16, 4, 6)
  ge, gp = jax.grad(
    lambda a, b: jnp.sum(J.projector_distillation_loss(a, b)), argnums=(0, 1)
  )(e, p)
  assert np.abs(np.asarray(ge)).min() > 0 and np.abs(np.asarray(gp)).max() > 0
  # Direction: KL(softmax(p) || softmax(e)), not the reverse.
  fwd = np.asarray(J.projector_distillation_loss(e, p))
  np.testing.assert_allclose(fwd, ref_pd(e, p, 0.5), **TOL)
  assert np.abs(fwd - ref_pd(p, e, 0.5)).max() > 1e-3
  np.testing.assert_allclose(
    J.projector_distillation_loss(e, e), 0.0, atol=1e-6
  )


def test_nt_xent_matches_released_code_transcriptions():
  z1, z2 = unit_rows(17, 6, 5), unit_rows(18, 6, 5)
  with jax.default_matmul_precision(HIGHEST):
    fedu2 = float(jnp.mean(J.nt_xent_loss(z1, z2, temperature=0.07)))
    fedx = float(
      jnp.mean(
        J.nt_xent_loss(z1 * 3.0, z2, temperature=0.1, self_in_denominator=False)
      )
    )
  np.testing.assert_allclose(
    fedu2, ref_nt_xent_fedu2_code(z1, z2, 0.07), rtol=2e-5
  )
  np.testing.assert_allclose(
    fedx, ref_nt_xent_fedx_code(z1 * 3.0, z2, 0.1), rtol=2e-5
  )
  # The two forms differ (the self term e^0 = 1 is in FedU2's denominator).
  standard = float(
    jnp.mean(
      J.nt_xent_loss(z1, z2, temperature=0.07, self_in_denominator=False)
    )
  )
  assert fedu2 > standard


def test_decorrelation_zero_for_uncorrelated_features_and_small_batches():
  # Centred columns with disjoint supports are exactly uncorrelated.
  z = np.array(
    [[1, 0, 0], [-1, 0, 0], [0, 1, 0], [0, -1, 0], [0, 0, 2], [0, 0, -2]],
    np.float32,
  )
  assert abs(float(J.decorrelation_loss(z))) < 1e-6
  assert float(J.decorrelation_loss(rand(1, 1, 4))) == 0.0
  assert float(J.decorrelation_loss(rand(1, 5, 1))) == 0.0
  # Perfectly correlated columns: every off-diagonal C_ij = n - 1.
  col = rand(2, 6, 1)
  n = 6
  np.testing.assert_allclose(
    J.decorrelation_loss(np.tile(col, (1, 3))), (n - 1) ** 2 / n, rtol=1e-4
  )


def test_relational_properties():
  z = rand(19, 5, 4)
  anchors = rand(20, 7, 4)
  # Same views and t = t2: target = each view's distribution, loss 0.
  np.testing.assert_allclose(
    J.relational_loss(z, z, anchors, temperature=0.1, target_temperature=0.1),
    0.0,
    atol=1e-5,
  )
  # The target is not detached: the gradient through it is part of the
  # reference match (gradient test above); here, anchors get gradient too.
  ga = jax.grad(lambda a: jnp.sum(J.relational_loss(z, rand(21, 5, 4), a)))(
    anchors
  )
  assert np.abs(np.asarray(ga)).max() > 0
  anchor_mask = np.array([1, 0, 1, 1, 0, 1, 1], bool)
  with jax.default_matmul_precision(HIGHEST):
    got = J.relational_loss(z, rand(21, 5, 4), anchors, anchor_mask=anchor_mask)
  np.testing.assert_allclose(
    got,
    ref_relational(
      z, rand(21, 5, 4), anchors, 0.1, 0.1, 'code', anchor_mask=anchor_mask
    ),
    **TOL,
  )
  with pytest.raises(ValueError):
    J.relational_loss(z, z, anchors, form='paper')


def test_fur_uniform_beats_collapsed_and_draws_follow_the_key():
  key = jax.random.key(0)
  uniform = unit_rows(22, 16, 5)
  collapsed = np.tile(unit_rows(23, 1, 5), (16, 1)) + 0.01 * rand(24, 16, 5)
  u = float(J.fedu2_uniform_regularizer(uniform, key))
  c = float(J.fedu2_uniform_regularizer(collapsed, key))
  assert u < 0.5 * c
  # Same key, same value; another key, another draw.
  assert u == float(J.fedu2_uniform_regularizer(uniform, key))
  assert u != float(J.fedu2_uniform_regularizer(uniform, jax.random.key(1)))


def test_fur_feature_at_or_opposite_its_tangent_point():
  """Angle 0 (geoopt's plain-projection branch) and pi: finite, no NaN."""
  fn, _, checked_grad = jitted('fur')
  z = rand(28, 7, 5)
  z[0] = _TANGENT[0]
  z[1] = -_TANGENT[1]
  mask = np.ones(7, bool)
  with jax.default_matmul_precision(HIGHEST):
    got = float(fn(z, mask))
  assert np.isfinite(got) and got > 0
  err, g = checked_grad(z, mask)
  err.throw()
  assert np.isfinite(np.asarray(g)).all()
  # Without the antipodal row the value matches geoopt's formulas.
  with jax.default_matmul_precision(HIGHEST):
    got = float(fn(z, np.arange(7) != 1))
  np.testing.assert_allclose(
    got, ref_fur(z, _TANGENT, _REF, _PROJ, 6, np.arange(7) != 1), **TOL
  )


def test_unknown_forms_rejected():
  x = rand(0, 4, 3)
  with pytest.raises(ValueError):
    J.dsr_loss(x, np.eye(3, dtype=np.float32), form='squared')
  with pytest.raises(ValueError):
    J.decorrelation_loss(x, form='other')
  with pytest.raises(ValueError):
    losses.projector_distillation_loss(x, x, form='mse')


# ---------------------------------------------------------------------------
# SSD scaling matrices.
# ---------------------------------------------------------------------------


def scaled_subspace(s, scale):
  eigval, eigvec = np.linalg.eigh(s.astype(np.float64) @ s.T)
  return eigval, eigvec[:, np.abs(eigval - scale) < 1e-3 * scale]


@pytest.mark.parametrize('num_clients,dim', [(3, 10), (4, 8), (10, 32)])
def test_scaling_matrices_spectrum_and_orthogonal_subspaces(num_clients, dim):
  scale = 10.0
  s = ssd_scaling.scaling_matrices(num_clients, dim, scale=scale, seed=5)
  assert s.shape == (num_clients, dim, dim) and s.dtype == np.float32
  m = dim // num_clients
  bases = []
  for k in range(num_clients):
    eigval, sub = scaled_subspace(s[k], scale)
    expected = np.sort([scale] * m + [1.0] * (dim - m))
    np.testing.assert_allclose(eigval, expected, rtol=1e-5)
    assert sub.shape[1] == m
    bases.append(sub)
  for j in range(num_clients):
    for k in range(j + 1, num_clients):
      assert np.abs(bases[j].T @ bases[k]).max() < 1e-4
  # All scaled directions together are orthonormal: num_clients * m of them.
  union = np.concatenate(bases, axis=1)
  np.testing.assert_allclose(union.T @ union, np.eye(union.shape[1]), atol=1e-4)


def test_scaling_matrices_deterministic_and_rotated():
  a = ssd_scaling.scaling_matrices(3, 9, seed=7)
  np.testing.assert_array_equal(a, ssd_scaling.scaling_matrices(3, 9, seed=7))
  assert np.abs(a - ssd_scaling.scaling_matrices(3, 9, seed=8)).max() > 1e-2
  # Released code: directions of a random rotation, not canonical axes.
  eigvecs = scaled_subspace(a[0], 10.0)[1]
  assert np.abs(eigvecs).max() < 0.999
  # random_basis=False: canonical axes, S diagonal with sqrt(scale) entries.
  c = ssd_scaling.scaling_matrices(3, 9, seed=7, random_basis=False)
  for k in range(3):
    diag = np.diag(c[k])
    np.testing.assert_array_equal(c[k], np.diag(diag))
    assert np.sum(np.isclose(diag, math.sqrt(10.0))) == 3
  assert np.all(
    np.sum(np.stack([np.diag(c[k]) > 1 for k in range(3)]), axis=0) <= 1
  )


def test_scaling_matrices_more_directions_than_dims():
  """K m > D: later clients get partial or empty sets (released slicing)."""
  s = ssd_scaling.scaling_matrices(4, 10, seed=1, directions_per_client=4)
  counts = [scaled_subspace(s[k], 10.0)[1].shape[1] for k in range(4)]
  assert counts == [4, 4, 2, 0]
  np.testing.assert_allclose(
    s[3].astype(np.float64) @ s[3].T, np.eye(10), atol=1e-5
  )
  # Default m = floor(D / K): 10 // 3 = 3, one direction unscaled for all.
  s = ssd_scaling.scaling_matrices(3, 10, seed=1)
  assert [scaled_subspace(s[k], 10.0)[1].shape[1] for k in range(3)] == [3] * 3
  with pytest.raises(ValueError):
    ssd_scaling.scaling_matrices(0, 10)


def test_cohort_scaling_position_vs_client_id():
  s = ssd_scaling.scaling_matrices(5, 10, seed=2)
  ids = np.array([3, 0, 4])
  np.testing.assert_array_equal(ssd_scaling.cohort_scaling(s, ids), s[:3])
  np.testing.assert_array_equal(
    ssd_scaling.cohort_scaling(s, ids, assign='client_id'), s[ids]
  )
  with pytest.raises(ValueError):
    ssd_scaling.cohort_scaling(s, np.arange(6))
  with pytest.raises(ValueError):
    ssd_scaling.cohort_scaling(s, ids, assign='random')
