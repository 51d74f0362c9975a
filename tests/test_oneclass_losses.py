"""One-class losses vs float64 NumPy loops from the papers.

FedMetric (Park, Hosseini and Yun 2021, Eq. 4-6 and Algorithm 1), Deep SVDD
(Ruff et al. 2018), FedAwS (Yu et al. 2020) and FedUV (Hosseini et al.
2021): the losses and FedAwS's spreadout regularizer. The algorithms'
building blocks (proxy centers, local center / radius, codewords) are tested
with the algorithms, in tests/algorithms/.
"""

import itertools

from algorithms.oneclass_helpers import TOL, np_dist, np_norm
import jax
import jax.numpy as jnp
import jitted
import numpy as np
import pytest

from fedjax_metric import losses as library_losses
from fedjax_metric.algorithms import fedaws

# Each call one jitted program (tests/jitted.py): eager dispatch was slower.
losses = jitted.jitted_module(library_losses)


def _highest():
  return jax.default_matmul_precision('highest')


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
