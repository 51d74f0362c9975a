"""Metric / contrastive losses vs independent float64 NumPy loops written from the equations."""

import functools

import jax
import jax.numpy as jnp
import jitted
import numpy as np
import pytest

from fedjax_metric import losses as library_losses

# Each call one jitted program: eager op-by-op dispatch was most of the time.
losses = jitted.jitted_module(library_losses)

SEEDS = [0, 1, 2, 3]
TOL = dict(rtol=2e-5, atol=2e-5)


# ---------------------------------------------------------------------------------------
# NumPy references: explicit Python loops over anchors and pairs, float64.
# ---------------------------------------------------------------------------------------


def np_dist(x, y, squared):
  d2 = float(
    np.sum((np.asarray(x, np.float64) - np.asarray(y, np.float64)) ** 2)
  )
  return d2 if squared else np.sqrt(d2)


def ref_triplet(a, p, n, margin, squared):
  return np.array(
    [
      max(
        np_dist(a[i], p[i], squared) - np_dist(a[i], n[i], squared) + margin,
        0.0,
      )
      for i in range(len(a))
    ]
  )


def ref_quad(a, p, n1, n2, m1, m2, squared, fedquad):
  out = []
  for i in range(len(a)):
    d_ap = np_dist(a[i], p[i], squared)
    second = (
      np_dist(a[i], n2[i], squared)
      if fedquad
      else np_dist(n1[i], n2[i], squared)
    )
    out.append(
      max(d_ap - np_dist(a[i], n1[i], squared) + m1, 0.0)
      + max(d_ap - second + m2, 0.0)
    )
  return np.array(out)


def np_sim(f):
  f = np.asarray(f, np.float64)
  b = len(f)
  z = [f[i] / max(np.sqrt(np.sum(f[i] ** 2)), 1e-12) for i in range(b)]
  return np.array(
    [[float(np.dot(z[i], z[j])) for j in range(b)] for i in range(b)]
  )


def np_mask(mask, b):
  return [True] * b if mask is None else [bool(m) for m in mask]


def ref_supcon(f, y, t, mask=None):
  s, m, b = np_sim(f), np_mask(mask, len(f)), len(f)
  out = np.zeros(b)
  for i in range(b):
    if not m[i]:
      continue
    denom = sum(np.exp(s[i, a] / t) for a in range(b) if a != i and m[a])
    pos = [p for p in range(b) if p != i and m[p] and y[p] == y[i]]
    if pos:
      out[i] = -np.mean([np.log(np.exp(s[i, p] / t) / denom) for p in pos])
  return out


def ref_relaxed_code(f, y, t, thr, beta, mask=None):
  """Step-by-step CLLoss control flow of github.com/skynbe/FedRCL utils/loss.py.

  The authors' released loss (Seo et al., CVPR 2024): (a) hardest positive
  and top-2 negatives, (b) the constant-positive penalty; docs/methods.md,
  FedRCL.
  """
  s, m, b = np_sim(f), np_mask(mask, len(f)), len(f)
  out = np.zeros(b)
  for i in range(b):
    if not m[i]:
      continue
    same = [j for j in range(b) if m[j] and y[j] == y[i]]  # includes i
    s_pos = min(s[i, j] for j in same)
    negs = sorted(
      [s[i, j] for j in range(b) if m[j] and y[j] != y[i]], reverse=True
    )[:2]
    scl = 0.0
    if negs:
      scl = -np.log(
        np.exp(s_pos / t)
        / (np.exp(s_pos / t) + sum(np.exp(n / t) for n in negs))
      )
    partners = [s[i, j] for j in same if j != i]
    neg_pen = min(partners) if partners and min(partners) >= thr else -1.0
    pen = -np.log(np.exp(1 / t) / (np.exp(1 / t) + np.exp(neg_pen / t)))
    out[i] = scl + beta * pen
  return out


def ref_relaxed_paper(f, y, t, thr, beta, mask=None):
  s, m, b = np_sim(f), np_mask(mask, len(f)), len(f)
  out = np.zeros(b)
  for i in range(b):
    if not m[i]:
      continue
    denom = sum(np.exp(s[i, k] / t) for k in range(b) if k != i and m[k])
    scl, over = 0.0, 0.0
    for j in range(b):
      if j != i and m[j] and y[j] == y[i]:
        scl -= np.log(np.exp(s[i, j] / t) / denom)
        if s[i, j] > thr:
          over += np.exp(s[i, j] / t)
    pen = -np.log(np.exp(1 / t) / (np.exp(1 / t) + over))
    out[i] = scl + beta * pen
  return out


def np_cos(x, y):
  x, y = np.asarray(x, np.float64), np.asarray(y, np.float64)
  return float(np.dot(x, y) / max(np.linalg.norm(x) * np.linalg.norm(y), 1e-8))


def ref_moon(z, zg, zp, t):
  zp = np.asarray(zp)
  zp = zp[None] if zp.ndim == 2 else zp
  out = []
  for i in range(len(z)):
    logits = [np_cos(z[i], zg[i]) / t] + [
      np_cos(z[i], zp[k, i]) / t for k in range(len(zp))
    ]
    out.append(-np.log(np.exp(logits[0]) / sum(np.exp(l) for l in logits)))
  return np.array(out)


# ---------------------------------------------------------------------------------------
# Helpers.
# ---------------------------------------------------------------------------------------


def batch(seed, b=None, d=5, classes=3, clustered=False):
  rng = np.random.default_rng(seed)
  b = b or int(rng.integers(6, 13))
  y = rng.integers(0, classes, b)
  if (
    clustered
  ):  # Tight class clusters so that some pairs exceed the 0.7 threshold.
    centres = rng.normal(size=(classes, d))
    f = centres[y] + rng.uniform(0.1, 0.9) * rng.normal(size=(b, d))
  else:
    f = rng.normal(size=(b, d))
  f = f * rng.uniform(0.5, 3.0, size=(b, 1))  # Unnormalised on purpose.
  return f.astype(np.float32), y.astype(np.int32)


def grad_of_masked_sum(fn, args, mask):
  """Gradient of sum(mask * fn(*args)) w.r.t. every float array in args; asserts finite."""
  mask = jnp.ones(len(args[0]), bool) if mask is None else jnp.asarray(mask)

  def total(*a):
    return jnp.sum(jnp.where(mask, fn(*a), 0.0))

  grads = jax.grad(total, argnums=tuple(range(len(args))))(
    *map(jnp.asarray, args)
  )
  for g in grads:
    assert np.all(np.isfinite(np.asarray(g))), g
  return grads


def relaxed(form, **kw):
  return functools.partial(losses.relaxed_supcon_loss, form=form, **kw)


def v(theta, r=1.0):
  return [r * np.cos(theta), r * np.sin(theta)]


# ---------------------------------------------------------------------------------------
# Triplet / quadruplet / FedQuad.
# ---------------------------------------------------------------------------------------

TUPLE_LOSSES = {
  'triplet': (
    losses.triplet_loss,
    3,
    lambda x, sq: ref_triplet(*x, 0.7, sq),
    dict(margin=0.7),
  ),
  'quadruplet': (
    losses.quadruplet_loss,
    4,
    lambda x, sq: ref_quad(*x, 1.3, 0.4, sq, False),
    dict(margin_1=1.3, margin_2=0.4),
  ),
  'fedquad': (
    losses.fedquad_loss,
    4,
    lambda x, sq: ref_quad(*x, 1.3, 0.4, sq, True),
    dict(margin_1=1.3, margin_2=0.4),
  ),
}


@pytest.mark.parametrize('name', sorted(TUPLE_LOSSES))
@pytest.mark.parametrize('squared', [True, False])
@pytest.mark.parametrize('seed', SEEDS)
def test_tuple_losses_match_reference(name, squared, seed):
  fn, n, ref, kw = TUPLE_LOSSES[name]
  rng = np.random.default_rng(seed)
  x = [rng.normal(size=(10, 4)).astype(np.float32) for _ in range(n)]
  got = fn(*x, squared=squared, **kw)
  assert got.shape == (10,)
  np.testing.assert_allclose(got, ref(x, squared), **TOL)


@pytest.mark.parametrize('squared', [True, False])
def test_random_tuples_exercise_active_and_inactive_hinges(squared):
  """Each hinge term of the references above is active on some rows and not on others."""
  terms = []
  for seed in SEEDS:
    a, p, n1, n2 = np.random.default_rng(seed).normal(size=(4, 10, 4))
    for i in range(10):
      d_ap = np_dist(a[i], p[i], squared)
      terms.append(
        [
          d_ap - np_dist(a[i], n1[i], squared) + 1.3 > 0,
          d_ap - np_dist(a[i], n2[i], squared) + 0.4 > 0,
          d_ap - np_dist(n1[i], n2[i], squared) + 0.4 > 0,
        ]
      )
  frac = np.mean(terms, axis=0)
  assert np.all((frac > 0.05) & (frac < 0.95)), frac


def test_tuple_loss_defaults_are_the_fedquad_papers():
  """Defaults: m1 1, m2 0.5 (Table V) and Eq. 5's plain Euclidean distance."""
  rng = np.random.default_rng(5)
  x = [rng.normal(size=(8, 3)).astype(np.float32) for _ in range(4)]
  np.testing.assert_allclose(
    losses.fedquad_loss(*x), ref_quad(*x, 1.0, 0.5, False, True), **TOL
  )
  np.testing.assert_allclose(
    losses.quadruplet_loss(*x), ref_quad(*x, 1.0, 0.5, False, False), **TOL
  )
  np.testing.assert_allclose(
    losses.triplet_loss(*x[:3]), ref_triplet(*x[:3], 1.0, False), **TOL
  )
  # The two readings really differ on these inputs.
  assert not np.allclose(
    ref_quad(*x, 1.0, 0.5, False, True), ref_quad(*x, 1.0, 0.5, True, True)
  )


def test_fedquad_differs_from_classic_quadruplet_in_the_second_term():
  a, p = np.zeros((1, 2), np.float32), np.zeros((1, 2), np.float32)
  n1, n2 = (
    np.array([[3.0, 0.0]], np.float32),
    np.array([[3.0, 0.5]], np.float32),
  )
  # Squared: FedQuad d(a, n2) = 9.25 -> second hinge 0.  Classic: d(n1, n2) = 0.25 -> 0.25.
  np.testing.assert_allclose(
    losses.fedquad_loss(a, p, n1, n2, squared=True), [0.0]
  )
  np.testing.assert_allclose(
    losses.quadruplet_loss(a, p, n1, n2, squared=True), [0.25]
  )
  # Euclidean: d(n1, n2) = 0.5 -> 0.5 - 0.5 = 0; with m2 = 0.75 the classic term is 0.25.
  np.testing.assert_allclose(
    losses.fedquad_loss(a, p, n1, n2, margin_2=0.75), [0.0]
  )
  np.testing.assert_allclose(
    losses.quadruplet_loss(a, p, n1, n2, margin_2=0.75), [0.25]
  )


def test_quadruplet_second_term_needs_negatives_of_two_classes():
  a, p = np.zeros((2, 2), np.float32), np.zeros((2, 2), np.float32)
  n1 = np.array([[3.0, 0.0], [3.0, 0.0]], np.float32)
  n2 = np.array([[3.0, 0.5], [3.0, 0.5]], np.float32)
  full = losses.quadruplet_loss(a, p, n1, n2, margin_2=0.75)
  np.testing.assert_allclose(full, [0.25, 0.25])
  got = losses.quadruplet_loss(
    a, p, n1, n2, margin_2=0.75, distinct_negatives=np.array([True, False])
  )
  np.testing.assert_allclose(got, [0.25, 0.0])  # Row 2: the triplet term, 0.


@pytest.mark.parametrize('name', sorted(TUPLE_LOSSES))
@pytest.mark.parametrize('squared', [True, False])
def test_tuple_losses_ties_have_finite_gradients(name, squared):
  fn, n, ref, kw = TUPLE_LOSSES[name]
  x = np.ones((3, 4), np.float32)
  args = [x] * n  # Every distance is 0 (sqrt at 0 for squared=False).
  got = fn(*args, squared=squared, **kw)
  np.testing.assert_allclose(got, ref(args, squared), **TOL)
  grad_of_masked_sum(functools.partial(fn, squared=squared, **kw), args, None)


@pytest.mark.parametrize('name', sorted(TUPLE_LOSSES))
def test_tuple_losses_mask(name):
  fn, n, _, kw = TUPLE_LOSSES[name]
  rng = np.random.default_rng(0)
  x = [rng.normal(size=(6, 3)).astype(np.float32) for _ in range(n)]
  mask = np.array([1, 0, 1, 1, 0, 1], bool)
  full = fn(*x, **kw)
  np.testing.assert_allclose(fn(*x, mask=mask, **kw), np.where(mask, full, 0.0))
  none = np.zeros(6, bool)
  np.testing.assert_array_equal(fn(*x, mask=none, **kw), np.zeros(6))
  grads = grad_of_masked_sum(
    functools.partial(fn, mask=none, squared=False, **kw), x, none
  )
  assert all(np.all(np.asarray(g) == 0) for g in grads)


# ---------------------------------------------------------------------------------------
# SupCon and FedRCL against the references on random batches.
# ---------------------------------------------------------------------------------------

SET_LOSSES = {
  'supcon': (
    functools.partial(losses.supcon_loss, temperature=0.1),
    lambda f, y, m: ref_supcon(f, y, 0.1, m),
  ),
}
for _form, _ref in [('code', ref_relaxed_code), ('paper', ref_relaxed_paper)]:
  for _thr in [
    0.7,
    -1.0,
  ]:  # -1.0: the penalty is active for every same-class pair.
    SET_LOSSES[f'rcl_{_form}_{_thr}'] = (
      relaxed(_form, threshold=_thr, beta=0.8),
      functools.partial(
        lambda f, y, m, r, thr: r(f, y, 0.05, thr, 0.8, m), r=_ref, thr=_thr
      ),
    )


@pytest.mark.parametrize('name', sorted(SET_LOSSES))
@pytest.mark.parametrize('clustered', [False, True])
@pytest.mark.parametrize('seed', SEEDS)
def test_set_losses_match_reference(name, clustered, seed):
  fn, ref = SET_LOSSES[name]
  f, y = batch(seed, clustered=clustered)
  np.testing.assert_allclose(fn(f, y), ref(f, y, None), **TOL)
  mask = np.random.default_rng(seed + 100).random(len(y)) < 0.7
  got = fn(f, y, mask=mask)
  np.testing.assert_allclose(got, ref(f, y, mask), **TOL)
  grad_of_masked_sum(lambda x: fn(x, y, mask=mask), [f], mask)


def test_random_batches_exercise_both_penalty_branches():
  """The clustered batches above really contain firing and non-firing code penalties."""
  fired = idle = 0
  for seed in SEEDS:
    f, y = batch(seed, clustered=True)
    pen = ref_relaxed_code(f, y, 0.05, 0.7, 1.0) - ref_relaxed_code(
      f, y, 0.05, 0.7, 0.0
    )
    fired += np.sum(pen > 1e-10)
    idle += np.sum(pen < 1e-10)
  assert fired > 0 and idle > 0


@pytest.mark.parametrize('name', sorted(SET_LOSSES))
def test_set_losses_padding_invariant(name):
  fn, _ = SET_LOSSES[name]
  f, y = batch(7, b=8, clustered=True)
  pad_f = np.concatenate(
    [f, np.zeros((3, 5), np.float32)]
  )  # Zero rows: worst case.
  pad_y = np.concatenate([y, y[:3]])
  mask = np.arange(11) < 8
  got = fn(pad_f, pad_y, mask=mask)
  np.testing.assert_allclose(got[:8], fn(f, y), **TOL)
  np.testing.assert_array_equal(got[8:], 0.0)
  grads = grad_of_masked_sum(lambda x: fn(x, pad_y, mask=mask), [pad_f], mask)
  np.testing.assert_array_equal(np.asarray(grads[0])[8:], 0.0)


@pytest.mark.parametrize('name', sorted(SET_LOSSES))
def test_set_losses_gradient_matches_finite_differences_of_reference(name):
  fn, ref = SET_LOSSES[name]
  f, y = batch(11, b=7, clustered=True)
  g = np.asarray(grad_of_masked_sum(lambda x: fn(x, y), [f], None)[0])
  f64, h = f.astype(np.float64), 1e-6
  num = np.zeros_like(f64)
  for idx in np.ndindex(*f.shape):
    up, down = f64.copy(), f64.copy()
    up[idx] += h
    down[idx] -= h
    num[idx] = (ref(up, y, None).sum() - ref(down, y, None).sum()) / (2 * h)
  np.testing.assert_allclose(
    g, num, rtol=2e-3, atol=2e-3 * max(1.0, np.abs(num).max())
  )


# ---------------------------------------------------------------------------------------
# SupCon / FedRCL edge cases.
# ---------------------------------------------------------------------------------------

EDGE_BATCHES = {
  'single_class': (np.random.default_rng(0).normal(size=(6, 4)), np.zeros(6)),
  'all_distinct_classes': (
    np.random.default_rng(1).normal(size=(5, 4)),
    np.arange(5),
  ),
  'identical_embeddings': (np.ones((6, 4)), np.array([0, 0, 1, 1, 2, 2])),
  'zero_embeddings': (np.zeros((6, 4)), np.array([0, 0, 1, 1, 2, 2])),
  'one_sample': (np.ones((1, 4)), np.zeros(1)),
  'two_samples_two_classes': (np.eye(2, 4), np.arange(2)),
}


@pytest.mark.parametrize('batch_name', sorted(EDGE_BATCHES))
@pytest.mark.parametrize('name', sorted(SET_LOSSES))
def test_set_losses_edge_cases(name, batch_name):
  fn, ref = SET_LOSSES[name]
  f, y = EDGE_BATCHES[batch_name]
  f, y = f.astype(np.float32), y.astype(np.int32)
  got = np.asarray(fn(f, y))
  assert np.all(np.isfinite(got))
  np.testing.assert_allclose(got, ref(f, y, None), **TOL)
  grad_of_masked_sum(lambda x: fn(x, y), [f], None)
  # All masked: zero output and exactly zero gradient.
  none = np.zeros(len(y), bool)
  np.testing.assert_array_equal(fn(f, y, mask=none), np.zeros(len(y)))
  grads = grad_of_masked_sum(lambda x: fn(x, y, mask=none), [f], None)
  np.testing.assert_array_equal(np.asarray(grads[0]), 0.0)


@pytest.mark.parametrize('name', ['supcon', 'rcl_code_0.7', 'rcl_paper_0.7'])
def test_set_losses_no_nan_even_internally(name):
  """Under jax_debug_nans no primitive may produce a NaN, forward or backward.

  Stricter than finite final gradients: a NaN that a later `where` drops would still
  abort a run that debugs NaNs, and hides real ones.
  """
  fn, _ = SET_LOSSES[name]
  cases = [(EDGE_BATCHES[k], None) for k in sorted(EDGE_BATCHES)]
  cases.append((EDGE_BATCHES['zero_embeddings'], np.zeros(6, bool)))
  cases.append(
    (EDGE_BATCHES['single_class'], np.array([1, 0, 0, 0, 0, 0], bool))
  )
  with jax.debug_nans(True):
    for (f, y), mask in cases:
      f, y = jnp.asarray(f, jnp.float32), jnp.asarray(y, jnp.int32)
      grad = jax.grad(lambda x: jnp.sum(fn(x, y, mask=mask)))(
        f
      )  # raises on NaN
      assert np.isfinite(np.asarray(grad)).all()


def test_tuple_and_moon_losses_no_nan_even_internally():
  x, zero = jnp.ones((3, 4)), jnp.zeros((3, 4))
  with jax.debug_nans(True):
    for fn, n in [
      (losses.triplet_loss, 3),
      (losses.quadruplet_loss, 4),
      (losses.fedquad_loss, 4),
    ]:
      grad = jax.grad(lambda a: jnp.sum(fn(*[a] * n, squared=False)))(x)
      assert np.isfinite(np.asarray(grad)).all()
    for args in [(x, x, x), (zero, zero, zero), (x, x, jnp.zeros((0, 3, 4)))]:
      grads = jax.grad(
        lambda *a: jnp.sum(losses.moon_contrastive_loss(*a)), argnums=(0, 1, 2)
      )(*args)
      assert all(np.isfinite(np.asarray(g)).all() for g in grads)


def test_supcon_no_positive_gives_zero_and_single_class_is_uniform():
  f = np.random.default_rng(0).normal(size=(5, 3)).astype(np.float32)
  np.testing.assert_array_equal(
    losses.supcon_loss(f, np.arange(5)), np.zeros(5)
  )
  # One class, one direction: every positive has probability 1 / (B - 1).
  same = np.ones((4, 3), np.float32) * np.array(
    [[1.0], [2.0], [0.5], [3.0]], np.float32
  )
  np.testing.assert_allclose(
    losses.supcon_loss(same, np.zeros(4, np.int32)),
    np.full(4, np.log(3.0)),
    rtol=1e-5,
  )


def test_relaxed_code_by_hand_penalty_fires():
  """Class 0 = {0 deg, a} with cos a = 0.8 >= 0.7 (collapsed); class 1 = {90 deg}."""
  a = np.arccos(0.8)
  f = np.array([v(0.0, 2.0), v(a, 0.3), v(np.pi / 2, 5.0)], np.float32)
  y = np.array([0, 0, 1], np.int32)
  sp = lambda x: np.log1p(np.exp(x))
  t = 0.05
  want = [
    sp((0.0 - 0.8) / t) + sp((0.8 - 1) / t),  # Neg sim 0; penalty fires on 0.8.
    sp((0.6 - 0.8) / t) + sp((0.8 - 1) / t),  # Neg sim sin a = 0.6.
    np.log1p(np.exp(-20.0) + np.exp(-8.0))
    + sp(-40.0),  # Alone: positive = itself.
  ]
  # atol 1e-6: float32 logsumexp of logits ~1/t = 20 resolves ~2e-6 absolute.
  np.testing.assert_allclose(
    losses.relaxed_supcon_loss(f, y), want, rtol=1e-5, atol=1e-6
  )
  assert (
    want[0] > 0.018
  )  # softplus(-4) = 0.01815: the penalty is a visible part.
  grad_of_masked_sum(lambda x: losses.relaxed_supcon_loss(x, y), [f], None)


def test_relaxed_code_by_hand_penalty_idle_and_paper_difference():
  """Class 0 = {0 deg, b, c}: cos(0, b) = 0.9, cos(0, c) = 0.5.

  Code form, anchor 0: the least-similar partner (0.5) is below 0.7, so no penalty even
  though the 0.9 pair is over the threshold. Paper form: the 0.9 pair is penalised.
  """
  b, c = np.arccos(0.9), -np.arccos(0.5)
  f = np.array([v(0.0), v(b, 4.0), v(c, 0.2)], np.float32)
  y = np.zeros(3, np.int32)
  t = 0.05
  code = np.asarray(losses.relaxed_supcon_loss(f, y))
  # Single class: no negatives -> scl 0; penalty ~ softplus(-40) ~ 4e-18.
  np.testing.assert_allclose(code[0], 0.0, atol=1e-12)
  paper = np.asarray(losses.relaxed_supcon_loss(f, y, form='paper'))
  s_bc = np.cos(b - c)
  denom = np.exp(0.9 / t) + np.exp(0.5 / t)
  want0 = -np.log(np.exp(0.9 / t) / denom) - np.log(np.exp(0.5 / t) / denom)
  want0 += np.log1p(np.exp((0.9 - 1) / t))  # Only the 0.9 pair is in P(0).
  np.testing.assert_allclose(paper[0], want0, rtol=1e-5)
  np.testing.assert_allclose(
    paper, ref_relaxed_paper(f, y, t, 0.7, 1.0), rtol=1e-5
  )
  assert (
    s_bc < 0.7
  )  # So anchor 1 has exactly one over-threshold pair (with anchor 0).
  # Anchor 1 (b): partners 0 (0.9) and c (cos(b - c) < 0.7) -> code penalty idle.
  np.testing.assert_allclose(code[1], 0.0, atol=1e-12)


def test_relaxed_paper_equals_code_penalty_with_one_over_threshold_pair():
  a = np.arccos(0.8)
  f = np.array([v(0.0), v(a)], np.float32)
  y = np.zeros(2, np.int32)
  code = losses.relaxed_supcon_loss(f, y, form='code')  # scl 0 (no negatives).
  paper = losses.relaxed_supcon_loss(f, y, form='paper')  # scl = -log(1) = 0.
  np.testing.assert_allclose(paper, code, rtol=1e-6)
  np.testing.assert_allclose(
    code, np.log1p(np.exp(-4.0)) * np.ones(2), rtol=1e-5
  )


def test_relaxed_code_penalty_pushes_collapsed_pair_apart():
  a = np.arccos(0.8)
  f = jnp.array([v(0.0), v(a)], jnp.float32)
  y = jnp.zeros(2, jnp.int32)
  pen = lambda x: jnp.sum(losses.relaxed_supcon_loss(x, y))
  step = f - 0.01 * jax.grad(pen)(f)
  assert float(pen(step)) < float(pen(f))
  cos = lambda x: float(
    x[0] @ x[1] / jnp.linalg.norm(x[0]) / jnp.linalg.norm(x[1])
  )
  assert cos(step) < cos(f)


def test_relaxed_rejects_unknown_form():
  f, y = batch(0)
  with pytest.raises(ValueError, match='form'):
    losses.relaxed_supcon_loss(f, y, form='Paper')


# ---------------------------------------------------------------------------------------
# Multi-level.
# ---------------------------------------------------------------------------------------


@pytest.mark.parametrize('form', ['code', 'paper'])
def test_multilevel_relaxed_is_mean_over_levels(form):
  rng = np.random.default_rng(3)
  y = rng.integers(0, 3, 9).astype(np.int32)
  levels = [
    rng.normal(size=(9, d)).astype(np.float32) for d in (4, 4, 8, 16, 32)
  ]
  mask = np.arange(9) < 7
  got = losses.multilevel_relaxed_supcon_loss(
    levels, y, form=form, threshold=0.1, beta=0.5, mask=mask
  )
  ref = ref_relaxed_code if form == 'code' else ref_relaxed_paper
  want = np.mean([ref(f, y, 0.05, 0.1, 0.5, mask) for f in levels], axis=0)
  np.testing.assert_allclose(got, want, **TOL)
  grad_of_masked_sum(
    lambda *ls: losses.multilevel_relaxed_supcon_loss(
      list(ls), y, form=form, mask=mask
    ),
    levels,
    mask,
  )


def test_multilevel_supcon_is_mean_over_levels():
  # form='khosla' (Khosla's mean over positives); the other forms are in
  # tests/test_metric_faithful.py.
  rng = np.random.default_rng(4)
  y = rng.integers(0, 3, 10).astype(np.int32)
  levels = [rng.normal(size=(10, d)).astype(np.float32) for d in (3, 6)]
  got = losses.multilevel_supcon_loss(levels, y, temperature=0.2, form='khosla')
  want = (ref_supcon(levels[0], y, 0.2) + ref_supcon(levels[1], y, 0.2)) / 2
  np.testing.assert_allclose(got, want, **TOL)


def test_multilevel_rejects_no_levels():
  with pytest.raises(ValueError):
    losses.multilevel_relaxed_supcon_loss([], np.zeros(3, np.int32))
  with pytest.raises(ValueError):
    losses.multilevel_supcon_loss([], np.zeros(3, np.int32))


# ---------------------------------------------------------------------------------------
# MOON.
# ---------------------------------------------------------------------------------------


@pytest.mark.parametrize('num_prev', [1, 2, 3])
@pytest.mark.parametrize('seed', SEEDS)
def test_moon_matches_reference(num_prev, seed):
  rng = np.random.default_rng(seed)
  z, zg = (rng.normal(size=(8, 6)).astype(np.float32) for _ in range(2))
  zp = rng.normal(size=(num_prev, 8, 6)).astype(np.float32)
  np.testing.assert_allclose(
    losses.moon_contrastive_loss(z, zg, zp, temperature=0.3),
    ref_moon(z, zg, zp, 0.3),
    **TOL,
  )
  grad_of_masked_sum(losses.moon_contrastive_loss, [z, zg, zp], None)


def test_moon_single_previous_model_accepts_2d():
  rng = np.random.default_rng(0)
  z, zg, zp = (rng.normal(size=(5, 4)).astype(np.float32) for _ in range(3))
  got = losses.moon_contrastive_loss(z, zg, zp)
  np.testing.assert_allclose(got, losses.moon_contrastive_loss(z, zg, zp[None]))
  np.testing.assert_allclose(got, ref_moon(z, zg, zp, 0.5), **TOL)


def test_moon_round_zero_no_previous_model_is_exactly_zero():
  rng = np.random.default_rng(0)
  z, zg = (rng.normal(size=(5, 4)).astype(np.float32) for _ in range(2))
  zp = np.zeros((0, 5, 4), np.float32)
  np.testing.assert_array_equal(
    losses.moon_contrastive_loss(z, zg, zp), np.zeros(5)
  )
  grads = grad_of_masked_sum(losses.moon_contrastive_loss, [z, zg, zp], None)
  np.testing.assert_array_equal(np.asarray(grads[0]), 0.0)


def test_moon_edge_cases():
  z = np.ones((4, 3), np.float32)
  zero = np.zeros((4, 3), np.float32)
  for args in [
    (z, z, z),
    (zero, zero, zero[None]),
    (z, zero, np.stack([z, zero])),
  ]:
    got = losses.moon_contrastive_loss(*args)
    np.testing.assert_allclose(got, ref_moon(*args, 0.5), **TOL)
    grad_of_masked_sum(losses.moon_contrastive_loss, list(args), None)
  none = np.zeros(4, bool)
  np.testing.assert_array_equal(
    losses.moon_contrastive_loss(z, zero, z, mask=none), 0.0
  )
  grads = grad_of_masked_sum(
    lambda *a: losses.moon_contrastive_loss(*a, mask=none), [z, zero, z], None
  )
  assert all(np.all(np.asarray(g) == 0) for g in grads)


def test_moon_uses_cosine_not_dot():
  rng = np.random.default_rng(1)
  z, zg, zp = (rng.normal(size=(5, 4)).astype(np.float32) for _ in range(3))
  base = losses.moon_contrastive_loss(z, zg, zp)
  np.testing.assert_allclose(
    losses.moon_contrastive_loss(3 * z, 0.2 * zg, 7 * zp), base, rtol=1e-5
  )


# ---------------------------------------------------------------------------------------
# jit(vmap) over a leading client axis equals per-client calls.
# ---------------------------------------------------------------------------------------


def test_jit_vmap_over_clients_equals_per_client_calls():
  rng = np.random.default_rng(9)
  c, b = 3, 8
  f = rng.normal(size=(c, b, 5)).astype(np.float32)
  y = rng.integers(0, 3, (c, b)).astype(np.int32)
  m = rng.random((c, b)) < 0.8
  tup = [rng.normal(size=(c, b, 4)).astype(np.float32) for _ in range(4)]
  prev = rng.normal(size=(c, 2, b, 4)).astype(np.float32)
  cases = {
    'triplet': (
      lambda a, p, n, mk: losses.triplet_loss(a, p, n, squared=False, mask=mk),
      (*tup[:3], m),
    ),
    'quadruplet': (
      lambda a, p, n1, n2, mk: losses.quadruplet_loss(a, p, n1, n2, mask=mk),
      (*tup, m),
    ),
    'fedquad': (
      lambda a, p, n1, n2, mk: losses.fedquad_loss(a, p, n1, n2, mask=mk),
      (*tup, m),
    ),
    'supcon': (lambda x, yy, mk: losses.supcon_loss(x, yy, mask=mk), (f, y, m)),
    'rcl_code': (
      lambda x, yy, mk: losses.relaxed_supcon_loss(
        x, yy, threshold=0.0, mask=mk
      ),
      (f, y, m),
    ),
    'rcl_paper': (
      lambda x, yy, mk: losses.relaxed_supcon_loss(
        x, yy, threshold=0.0, form='paper', mask=mk
      ),
      (f, y, m),
    ),
    'multilevel_rcl': (
      lambda x, yy, mk: losses.multilevel_relaxed_supcon_loss(
        [x, 2 * x[:, :3]], yy, mask=mk
      ),
      (f, y, m),
    ),
    'multilevel_supcon': (
      lambda x, yy, mk: losses.multilevel_supcon_loss(
        [x, x[:, :3]], yy, mask=mk
      ),
      (f, y, m),
    ),
    'moon': (
      lambda z, zg, zp, mk: losses.moon_contrastive_loss(z, zg, zp, mask=mk),
      (tup[0], tup[1], prev, m),
    ),
  }
  for name, (fn, args) in cases.items():
    batched = jax.jit(jax.vmap(fn))(*args)
    for k in range(c):
      np.testing.assert_allclose(
        batched[k],
        fn(*(a[k] for a in args)),
        rtol=1e-5,
        atol=1e-6,
        err_msg=name,
      )
