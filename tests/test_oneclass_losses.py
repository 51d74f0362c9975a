"""One-class losses and building blocks vs float64 NumPy loops from the papers.

FedMetric (Park, Hosseini and Yun 2021, Eq. 4-6 and Algorithm 1), Deep SVDD
(Ruff et al. 2018), FedAwS (Yu et al. 2020) and FedUV (Hosseini et al.
2021): losses, proxy centers, local center / radius and codewords.
"""

import itertools
from types import SimpleNamespace

import jax
import jax.numpy as jnp
import jitted
import numpy as np
import pytest

from fedjax_metric import losses as library_losses
from fedjax_metric.algorithms import fedaws, fedmetric, feduv

# Each call one jitted program (tests/jitted.py): eager dispatch was slower.
losses = jitted.jitted_module(library_losses)

TOL = dict(rtol=1e-5, atol=1e-5)


def _highest():
  return jax.default_matmul_precision('highest')


def np_norm(x):
  return float(np.sqrt(sum(float(v) ** 2 for v in x)))


def np_dist(x, y):
  return np_norm(np.asarray(x, np.float64) - np.asarray(y, np.float64))


def np_cos(x, y):
  x, y = np.asarray(x, np.float64), np.asarray(y, np.float64)
  return float(sum(a * b for a, b in zip(x, y))) / max(
    np_norm(x) * np_norm(y), 1e-8
  )


def np_unit(x):
  x = np.asarray(x, np.float64)
  return x / max(np_norm(x), 1e-12)


# --------------------------------------------------------------- FedMetric


def ref_fedmetric(e, center, proxies, margins, proxy_mask, lam, squared, mask):
  out = np.zeros(len(e))
  for i in range(len(e)):
    if not mask[i]:
      continue
    neg = 0.0
    for j in range(len(proxies)):
      if proxy_mask[j]:
        h = max(0.0, margins[j] - np_dist(e[i], proxies[j]))
        neg += h**2 if squared else h
    out[i] = np_dist(e[i], center) + lam * neg
  return out


@pytest.mark.parametrize(
  'seed, squared, lam',
  list(itertools.product([0, 1, 2], [True, False], [0.0, 0.3, 1.0])),
)
def test_fedmetric_loss_matches_numpy_loop(seed, squared, lam):
  rng = np.random.default_rng(seed)
  b, d, k = 7, 5, 4
  e = rng.normal(size=(b, d)).astype(np.float32)
  center = rng.normal(size=d).astype(np.float32)
  proxies = rng.normal(size=(k, d)).astype(np.float32)
  # Margins around the typical distance: some hinges on, some off.
  margins = rng.uniform(1.0, 4.0, size=k).astype(np.float32)
  proxy_mask = np.array([True, False, True, True])
  mask = rng.random(b) > 0.3
  with _highest():
    got = losses.fedmetric_loss(
      e,
      center,
      proxies,
      margins,
      proxy_mask=proxy_mask,
      lam=lam,
      squared_hinge=squared,
      mask=mask,
    )
  want = ref_fedmetric(
    e, center, proxies, margins, proxy_mask, lam, squared, mask
  )
  np.testing.assert_allclose(np.asarray(got), want, **TOL)
  # The reference does have active and inactive hinges here.
  dists = [[np_dist(e[i], proxies[j]) for j in range(k)] for i in range(b)]
  assert (np.array(dists) < margins).any() and (np.array(dists) > margins).any()


def test_fedmetric_loss_hand_example_active_and_inactive_hinge():
  e = np.array([[3.0, 4.0]])
  center = np.zeros(2)
  # A_1 at distance 4 with margin 6 (active, hinge 2); A_2 at distance 5
  # with margin 5 (on the boundary, inactive); A_3 masked out.
  proxies = np.array([[3.0, 0.0], [0.0, 0.0], [3.0, 4.0]])
  margins = np.array([6.0, 5.0, 100.0])
  proxy_mask = np.array([True, True, False])
  squared = losses.fedmetric_loss(
    e, center, proxies, margins, proxy_mask=proxy_mask, lam=0.5
  )
  plain = losses.fedmetric_loss(
    e,
    center,
    proxies,
    margins,
    proxy_mask=proxy_mask,
    lam=0.5,
    squared_hinge=False,
  )
  np.testing.assert_allclose(np.asarray(squared), [5.0 + 0.5 * 4.0], **TOL)
  np.testing.assert_allclose(np.asarray(plain), [5.0 + 0.5 * 2.0], **TOL)


def test_fedmetric_loss_all_proxies_masked_is_the_positive_loss():
  rng = np.random.default_rng(3)
  e = rng.normal(size=(5, 4))
  center = rng.normal(size=4)
  proxies = e[:3] + 0.01  # Would give large hinges if not masked.
  got = losses.fedmetric_loss(
    e, center, proxies, np.full(3, 10.0), proxy_mask=np.zeros(3, bool), lam=2.0
  )
  np.testing.assert_allclose(
    np.asarray(got), [np_dist(x, center) for x in e], **TOL
  )
  # No proxies at all (K = 0) is the same.
  none = losses.fedmetric_loss(e, center, np.zeros((0, 4)), np.zeros(0))
  np.testing.assert_allclose(np.asarray(none), np.asarray(got), **TOL)


def test_fedmetric_loss_gradient_finite_at_zero_distance():
  center = jnp.array([1.0, -2.0, 0.5])
  e = jnp.stack([center, center + 1.0])  # Row 0 exactly on C and on A_0.
  proxies = jnp.stack([center, center - 1.0])

  def total(x):
    return jnp.sum(
      losses.fedmetric_loss(x, center, proxies, jnp.array([1.0, 1.0]))
    )

  g = jax.jit(jax.grad(total))(e)
  assert np.isfinite(np.asarray(g)).all()
  # Row 1 is 1.73 from C: its gradient is the unit direction from C plus the
  # (inactive) hinges' zero, so it is nonzero and finite.
  assert np.abs(np.asarray(g[1])).sum() > 0
  # Gradient w.r.t. the proxies too (the caller never needs it, but it
  # must not be NaN).
  gp = jax.jit(
    jax.grad(
      lambda a: jnp.sum(
        losses.fedmetric_loss(e, center, a, jnp.array([1.0, 1.0]))
      )
    )
  )(proxies)
  assert np.isfinite(np.asarray(gp)).all()


def test_fedmetric_loss_masked_examples_are_zero_and_have_zero_gradient():
  rng = np.random.default_rng(4)
  e = jnp.asarray(rng.normal(size=(4, 3)), jnp.float32)
  mask = jnp.array([True, False, True, False])
  fn = lambda x: losses.fedmetric_loss(
    x, jnp.zeros(3), x[:2] * 0.5, jnp.ones(2), mask=mask
  )
  out = fn(e)
  assert float(out[1]) == 0.0 and float(out[3]) == 0.0
  g = jax.jit(jax.grad(lambda x: jnp.sum(fn(x))))(e)
  assert np.isfinite(np.asarray(g)).all()
  all_masked = jax.jit(
    jax.grad(
      lambda x: jnp.sum(
        losses.fedmetric_loss(
          x, jnp.zeros(3), x[:2], jnp.ones(2), mask=jnp.zeros(4, bool)
        )
      )
    )
  )(e)
  assert np.isfinite(np.asarray(all_masked)).all()


# --------------------------------------------------------------- Deep SVDD


def test_deepsvdd_loss_is_squared_distance():
  rng = np.random.default_rng(5)
  e = rng.normal(size=(6, 4)).astype(np.float32)
  c = rng.normal(size=4).astype(np.float32)
  mask = np.array([1, 1, 0, 1, 0, 1], bool)
  got = losses.deepsvdd_loss(e, c, mask=mask)
  want = [np_dist(e[i], c) ** 2 if mask[i] else 0.0 for i in range(6)]
  np.testing.assert_allclose(np.asarray(got), want, **TOL)
  g = jax.grad(lambda x: jnp.sum(losses.deepsvdd_loss(x, jnp.asarray(c))))(
    jnp.tile(jnp.asarray(c), (2, 1))
  )
  np.testing.assert_array_equal(np.asarray(g), 0.0)


def test_deepsvdd_center_eps_rule():
  # Column means: 0.05 -> 0.1, -0.02 -> -0.1, 0.0 stays 0, 0.5 stays.
  e = np.array(
    [[0.1, -0.04, 0.0, 1.0], [0.0, 0.0, 0.0, 0.0], [9.0, 9.0, 9.0, 9.0]]
  )
  mask = np.array([True, True, False])
  got = np.asarray(losses.deepsvdd_center(e, mask, eps=0.1))
  want = []
  for col in range(4):
    m = sum(e[i, col] for i in range(3) if mask[i]) / 2
    if 0 < abs(m) < 0.1:
      m = 0.1 if m > 0 else -0.1
    want.append(m)
  np.testing.assert_allclose(got, want, **TOL)
  np.testing.assert_allclose(got, [0.1, -0.1, 0.0, 0.5], **TOL)
  np.testing.assert_allclose(
    np.asarray(losses.deepsvdd_center(e, mask, eps=0.0)),
    [0.05, -0.02, 0.0, 0.5],
    **TOL,
  )


# --------------------------------------------------------------- FedAwS


@pytest.mark.parametrize('form', ['cosine', 'euclidean'])
def test_fedaws_positive_loss_matches_numpy(form):
  rng = np.random.default_rng(6)
  e = rng.normal(size=(8, 5)).astype(np.float32)
  w = rng.normal(size=5).astype(np.float32)
  e[0] = 3.0 * w  # cos = 1: the cosine hinge is off.
  mask = np.array([1, 1, 1, 0, 1, 1, 1, 1], bool)
  with _highest():
    got = losses.fedaws_positive_loss(e, w, margin=0.9, form=form, mask=mask)
  want = []
  for i in range(8):
    if not mask[i]:
      want.append(0.0)
    elif form == 'cosine':
      want.append(max(0.0, 0.9 - np_cos(e[i], w)) ** 2)
    else:
      want.append(np_dist(np_unit(e[i]), np_unit(w)) ** 2)
  np.testing.assert_allclose(np.asarray(got), want, **TOL)
  assert want[0] == pytest.approx(0.0, abs=1e-10) and max(want) > 0.1


@pytest.mark.parametrize('form', ['cosine', 'euclidean'])
def test_fedaws_positive_loss_gradient_finite_at_zero(form):
  w = jnp.array([1.0, 0.0, 0.0])
  g = jax.jit(
    jax.grad(lambda x: jnp.sum(losses.fedaws_positive_loss(x, w, form=form)))
  )(jnp.zeros((2, 3)))
  assert np.isfinite(np.asarray(g)).all()
  gw = jax.jit(
    jax.grad(
      lambda v: jnp.sum(
        losses.fedaws_positive_loss(jnp.ones((2, 3)), v, form=form)
      )
    )
  )(jnp.zeros(3))
  assert np.isfinite(np.asarray(gw)).all()


def test_fedaws_unknown_form():
  with pytest.raises(ValueError, match='form'):
    losses.fedaws_positive_loss(np.ones((1, 2)), np.ones(2), form='dot')


# --------------------------------------------------------------- FedUV


@pytest.mark.parametrize('squared', [False, True])
def test_feduv_loss_matches_numpy(squared):
  rng = np.random.default_rng(7)
  c = 8
  e = rng.normal(size=(6, c)).astype(np.float32)
  v = rng.choice([-1.0, 1.0], size=c).astype(np.float32)
  e[0] = 0.2 * v  # f(x) = v: score 1, loss 0.
  e[1] = -v  # score -1, loss 2 (or 4).
  with _highest():
    got = losses.feduv_loss(e, v, squared=squared)
  want = []
  for i in range(6):
    f = np.sqrt(c) * np_unit(e[i])
    score = sum(float(a) * float(b) for a, b in zip(v, f)) / c
    h = max(0.0, 1.0 - score)
    want.append(h**2 if squared else h)
  np.testing.assert_allclose(np.asarray(got), want, **TOL)
  assert want[0] == pytest.approx(0.0, abs=1e-6)
  assert want[1] == pytest.approx(4.0 if squared else 2.0)
  # For a +-1 codeword the score is the cosine.
  cos_form = [max(0.0, 1.0 - np_cos(x, v)) for x in e]
  if not squared:
    np.testing.assert_allclose(np.asarray(got), cos_form, **TOL)


def test_feduv_loss_mask_and_zero_embedding_gradient():
  v = jnp.array([1.0, -1.0, 1.0, -1.0])
  out = losses.feduv_loss(
    jnp.ones((3, 4)), v, mask=jnp.array([True, False, True])
  )
  assert float(out[1]) == 0.0 and float(out[0]) == pytest.approx(1.0)
  g = jax.jit(jax.grad(lambda x: jnp.sum(losses.feduv_loss(x, v))))(
    jnp.zeros((2, 4))
  )
  assert np.isfinite(np.asarray(g)).all()


# --------------------------------------------------------------- spreadout


def ref_spreadout(w, margin, distance, reduction):
  u = [np_unit(x) for x in w]
  total, pairs = 0.0, 0
  for a in range(len(w)):
    for b in range(len(w)):
      if a == b:
        continue
      d = (
        np_dist(u[a], u[b])
        if distance == 'euclidean'
        else (1.0 - np_cos(u[a], u[b]))
      )
      total += max(0.0, margin - d) ** 2
      pairs += 1
  return total / pairs if reduction == 'mean' else total


@pytest.mark.parametrize(
  'distance, reduction',
  list(itertools.product(['euclidean', 'cosine'], ['sum', 'mean'])),
)
def test_spreadout_matches_numpy_double_sum(distance, reduction):
  rng = np.random.default_rng(8)
  w = rng.normal(size=(6, 4)).astype(np.float32)
  w[1] = w[0] + 0.05  # A close pair, so some hinge is on.
  with _highest():
    got = fedaws.spreadout_regularizer(
      w, margin=1.2, distance=distance, reduction=reduction
    )
  want = ref_spreadout(w, 1.2, distance, reduction)
  assert want > 0
  np.testing.assert_allclose(float(got), want, **TOL)


def test_spreadout_is_the_losses_function_and_inactive_when_far():
  assert fedaws.spreadout_regularizer is library_losses.spreadout_regularizer
  # Opposite unit vectors are at Euclidean distance 2 > margin 1.5.
  w = np.array([[1.0, 0.0], [-1.0, 0.0]])
  assert float(losses.spreadout_regularizer(w, margin=1.5)) == 0.0
  # Orthogonal: d = sqrt(2); margin 2 gives 2 * (2 - sqrt 2)^2 (both
  # orders of the pair).
  w = np.array([[1.0, 0.0], [0.0, 3.0]])
  np.testing.assert_allclose(
    float(losses.spreadout_regularizer(w, margin=2.0)),
    2 * (2 - np.sqrt(2)) ** 2,
    **TOL,
  )
  assert (
    float(losses.spreadout_regularizer(w[:1], margin=2.0, reduction='mean'))
    == 0.0
  )


@pytest.mark.parametrize('distance', ['euclidean', 'cosine'])
def test_spreadout_gradient_finite_for_coincident_and_zero_rows(distance):
  w = jnp.array([[1.0, 2.0], [1.0, 2.0], [0.0, 0.0], [-1.0, 0.5]])
  g = jax.jit(
    jax.grad(
      lambda x: losses.spreadout_regularizer(x, margin=1.5, distance=distance)
    )
  )(w)
  assert np.isfinite(np.asarray(g)).all()
  # The non-degenerate row (3) is pushed: its gradient is nonzero.
  assert np.abs(np.asarray(g[3])).sum() > 0


def test_spreadout_bad_options():
  with pytest.raises(ValueError, match='distance'):
    losses.spreadout_regularizer(np.eye(2), margin=1.0, distance='l1')
  with pytest.raises(ValueError, match='reduction'):
    losses.spreadout_regularizer(np.eye(2), margin=1.0, reduction='max')


# --------------------------------------------------------------- proxies


@pytest.mark.parametrize(
  'scale, radius', [(0.0, 0.7), (0.5, 0.3), (1.5, 2.0), (3.0, 0.0)]
)
def test_proxy_center_distance_and_margin(scale, radius):
  center = jnp.array([0.3, -1.0, 2.0, 0.0, 0.5])
  a, m = fedmetric.proxy_center(center, radius, scale, jax.random.key(1))
  assert a.shape == center.shape
  assert np_dist(a, center) == pytest.approx(scale * radius, abs=1e-5)
  assert float(m) == pytest.approx(radius * (1 + scale), abs=1e-6)
  if scale * radius == 0:
    np.testing.assert_array_equal(np.asarray(a), np.asarray(center))


def test_proxy_center_deterministic_in_key_and_traceable():
  c = jnp.zeros(4)
  a1, _ = fedmetric.proxy_center(c, 1.0, 2.0, jax.random.key(3))
  a2, _ = fedmetric.proxy_center(c, 1.0, 2.0, jax.random.key(3))
  a3, _ = fedmetric.proxy_center(c, 1.0, 2.0, jax.random.key(4))
  np.testing.assert_array_equal(np.asarray(a1), np.asarray(a2))
  assert not np.allclose(np.asarray(a1), np.asarray(a3))
  a4, m4 = jax.jit(fedmetric.proxy_center)(
    c, jnp.float32(1.0), jnp.float32(2.0), jax.random.key(3)
  )
  np.testing.assert_allclose(np.asarray(a4), np.asarray(a1), **TOL)
  assert float(m4) == pytest.approx(3.0)


def test_proxy_center_negative_scale_or_radius():
  with pytest.raises(ValueError, match='scale'):
    fedmetric.proxy_center(jnp.zeros(3), 1.0, -0.1, jax.random.key(0))
  with pytest.raises(ValueError, match='radius'):
    fedmetric.proxy_center(jnp.zeros(3), -1.0, 1.0, jax.random.key(0))


def test_proxy_center_direction_is_uniform_on_the_sphere():
  """Mean direction ~ 0; in 3-D each coordinate of u is uniform on [-1, 1].

  Archimedes' hat-box theorem: for u uniform on S^2, u_1 ~ U[-1, 1]. A
  chi-square test on 10 equal bins (9 dof; 27.9 is the 0.1% point).
  """
  n = 4000
  keys = jax.random.split(jax.random.key(11), n)
  center = jnp.array([5.0, -3.0, 1.0])
  a, _ = jax.vmap(lambda k: fedmetric.proxy_center(center, 2.0, 0.5, k))(keys)
  u = (np.asarray(a, np.float64) - np.asarray(center)) / 1.0  # D = 1.
  np.testing.assert_allclose(np.linalg.norm(u, axis=1), 1.0, atol=1e-5)
  # Each coordinate has variance 1/3: the mean is within 4 standard errors.
  assert np.all(np.abs(u.mean(axis=0)) < 4 * np.sqrt(1 / 3 / n))
  for axis in range(3):
    counts = np.histogram(u[:, axis], bins=10, range=(-1, 1))[0]
    chi2 = sum((c - n / 10) ** 2 / (n / 10) for c in counts)
    assert chi2 < 27.9, (axis, counts)


def test_local_center_matches_numpy():
  rng = np.random.default_rng(9)
  e = rng.normal(size=(7, 3)).astype(np.float32)
  e[5] = 100.0  # A masked outlier must not count.
  mask = np.array([1, 1, 0, 1, 1, 0, 1], bool)
  c = fedmetric.local_center(e, mask)
  real = [i for i in range(7) if mask[i]]
  want_c = [sum(float(e[i, k]) for i in real) / len(real) for k in range(3)]
  np.testing.assert_allclose(np.asarray(c), want_c, **TOL)
  full = fedmetric.local_center(e[:5])
  np.testing.assert_allclose(
    np.asarray(full), e[:5].astype(np.float64).mean(0), **TOL
  )
  none = jnp.zeros(3, bool)
  np.testing.assert_array_equal(
    np.asarray(fedmetric.local_center(jnp.ones((3, 2)), none)), 0.0
  )


class _Identity:
  """A 'model' whose embedding is the flattened input (for scan_radius)."""

  @staticmethod
  def apply(params, model_state, images, train):
    del params, train
    return {'embedding': images.reshape(images.shape[0], -1)}, model_state


def _scan_over(batches):
  """A context's ``scan_batches`` over a fixed list of batches."""

  def scan_batches(body, init):
    carry = init
    for batch in batches:
      carry = body(carry, batch)
    return carry

  return scan_batches


def test_scan_radius_is_the_largest_real_distance_over_the_round():
  """R^k = max_i ||g(x_i) - C^k|| over every real example of the client's
  round (Park et al. 2021, Algorithm 1), as training computes it: batch by
  batch, padded examples (a far outlier here) left out; 0 with none."""
  from fedjax_metric import engine  # pylint: disable=g-import-not-at-top
  from fedjax_metric.algorithms import oneclass_common

  rng = np.random.default_rng(3)
  x = rng.normal(size=(3, 4, 2, 1)).astype(np.float32)  # 3 batches of 4
  mask = np.array([[1, 1, 0, 1], [1, 0, 0, 0], [1, 1, 1, 1]], bool)
  x[0, 2] = 50.0  # padding: must not count
  batches = [
    engine.Batch(jnp.asarray(x[b]), None, jnp.asarray(mask[b]), None)
    for b in range(3)
  ]
  center = np.array([0.3, -0.2], np.float32)
  ctx = SimpleNamespace(scan_batches=_scan_over(batches))
  radius = oneclass_common.scan_radius(
    ctx, _Identity, {'params': {}}, jnp.asarray(center)
  )
  want = max(
    np_dist(x[b, i].reshape(-1), center)
    for b in range(3)
    for i in range(4)
    if mask[b, i]
  )
  assert float(radius) == pytest.approx(want, rel=1e-5)
  empty = [b._replace(mask=jnp.zeros(4, bool)) for b in batches]
  ctx = SimpleNamespace(scan_batches=_scan_over(empty))
  assert (
    float(oneclass_common.scan_radius(ctx, _Identity, {'params': {}}, center))
    == 0.0
  )


def loop_min_hamming(v):
  best = None
  for a in range(len(v)):
    for b in range(a + 1, len(v)):
      d = sum(1 for x, y in zip(v[a], v[b]) if x != y)
      best = d if best is None else min(best, d)
  return best


@pytest.mark.parametrize(
  'num_classes, dim', [(10, 16), (10, 32), (16, 16), (3, 4)]
)
def test_hadamard_codewords_orthogonal(num_classes, dim):
  v, dmin = feduv.codewords(num_classes, dim)
  assert v.shape == (num_classes, dim) and v.dtype == np.float32
  assert set(np.unique(v).tolist()) <= {-1.0, 1.0}
  gram = [
    [
      sum(float(x) * float(y) for x, y in zip(v[a], v[b]))
      for b in range(num_classes)
    ]
    for a in range(num_classes)
  ]
  np.testing.assert_array_equal(np.array(gram), dim * np.eye(num_classes))
  assert dmin == loop_min_hamming(v) == dim // 2
  if num_classes < dim:  # The all-ones row is skipped: balanced rows.
    np.testing.assert_array_equal(v.sum(axis=1), 0.0)


@pytest.mark.parametrize('num_classes, dim', [(10, 24), (20, 16), (5, 7)])
def test_random_codewords_min_distance_by_loops(num_classes, dim):
  v, dmin = feduv.codewords(num_classes, dim, seed=2)
  assert v.shape == (num_classes, dim)
  assert set(np.unique(v).tolist()) == {-1.0, 1.0}
  assert dmin == loop_min_hamming(v) > 0
  again, _ = feduv.codewords(num_classes, dim, seed=2)
  other, _ = feduv.codewords(num_classes, dim, seed=3)
  np.testing.assert_array_equal(v, again)
  assert not np.array_equal(v, other)


def test_codewords_kinds_and_errors():
  v, dmin = feduv.codewords(4, 16, kind='random', seed=0)
  assert dmin == loop_min_hamming(v)
  assert feduv.codewords(1, 8)[1] == 8
  with pytest.raises(ValueError, match='Hadamard'):
    feduv.codewords(4, 12, kind='hadamard')
  with pytest.raises(ValueError, match='distinct'):
    feduv.codewords(5, 2)
  with pytest.raises(ValueError, match='num_classes'):
    feduv.codewords(0, 8)
  with pytest.raises(ValueError, match='kind'):
    feduv.codewords(2, 8, kind='bch')
