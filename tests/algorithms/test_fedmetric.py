"""FedMetric inside real rounds, vs NumPy.

Park, Hosseini and Yun, 'Federated Learning with Metric Loss', FL-ICML
workshop 2021 (Algorithm 1, Eq. 4-6), re-derived in float64 NumPy with
explicit loops over examples, clients and proxies on the bias-free linear
embedding (algorithms/oneclass_helpers.py).
"""

import fl_fixtures as fx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fedjax_metric import algorithms, engine
from fedjax_metric.algorithms import fedmetric
from fedjax_metric.data import partition as partition_lib

from .oneclass_helpers import (
  DIM,
  SERVER,
  SHAPE,
  client_batches,
  federation,
  kernel,
  linear_model,
  local_sgd,
  run_rounds,
  unit,
)


def fedmetric_reference(
  x, cohort, k0, shared, *, lam, squared, reduction, lr, center, client_classes
):
  """One FedMetric round of Algorithm 1 (true centers, s = 0), in NumPy.

  shared: (A [N, D], M [N], reported [N], classes [N]) broadcast by the
  server; returns the averaged kernel and each client's (C, R).
  """
  proxies, margins, reported, classes = shared
  kernels, rows = [], []
  for k_id in cohort.client_ids:
    batches = client_batches(cohort, k_id)
    real = np.concatenate([idx[m] for idx, m in batches])
    c_round = np.mean([x[i] @ k0 for i in real], axis=0)

    def grad_e(e, i, c=None):
      del i
      g = unit(e - c)
      for j in range(len(proxies)):
        if not reported[j] or j == k_id or classes[j] == client_classes[k_id]:
          continue
        d = np.linalg.norm(e - proxies[j])
        hinge = margins[j] - d
        if hinge > 0:
          slope = 2 * hinge if squared else 1.0
          g += lam * slope * -(e - proxies[j]) / d
      return g

    k = k0.copy()
    for idx, m in batches:
      if center == 'batch':
        c_step = np.mean([x[i] @ k for i, r in zip(idx, m) if r], axis=0)
      else:
        c_step = c_round
      k = local_sgd(
        k, x, [(idx, m)], lambda e, i, c=c_step: grad_e(e, i, c), lr, reduction
      )
    c_end = (
      c_round
      if center == 'round_start'
      else np.mean([x[i] @ k for i in real], axis=0)
    )
    radius = max(np.linalg.norm(x[i] @ k - c_end) for i in real)
    kernels.append(k)
    rows.append((c_end, radius))
  return np.mean(kernels, axis=0), rows


@pytest.mark.parametrize(
  'squared,reduction,center',
  [
    (False, 'mean', 'round_start'),
    (True, 'sum', 'round_start'),
    (False, 'mean', 'batch'),
  ],
)
def test_fedmetric_true_centers_two_rounds_match_numpy(
  squared, reduction, center
):
  # Two clients per class: same-class clients are excluded from l_neg.
  x, labels, parts, data = federation(clients_per_class=2)
  lam, lr = 0.7, 0.05 if reduction == 'mean' else 0.01
  model = linear_model()
  alg = algorithms.REGISTRY['fedmetric'](
    model,
    server_optimizer=SERVER,
    negatives='true',
    lam=lam,
    squared_hinge=squared,
    reduction=reduction,
    center=center,
  )
  with jax.default_matmul_precision('highest'):
    states, cohorts = run_rounds(alg, model, parts, data, rounds=2, lr=lr)
  client_classes = partition_lib.one_class_labels(parts, labels)
  n = len(parts)
  shared = (
    np.zeros((n, DIM)),
    np.zeros(n),
    np.zeros(n, bool),
    np.zeros(n, int),
  )
  k = kernel(states[0][0])
  for r in range(2):
    k, rows = fedmetric_reference(
      x,
      cohorts[r],
      k,
      shared,
      lam=lam,
      squared=squared,
      reduction=reduction,
      lr=lr,
      center=center,
      client_classes=client_classes,
    )
    state, table = states[r + 1]
    np.testing.assert_allclose(kernel(state), k, rtol=1e-4, atol=1e-5)
    centers = np.stack([c for c, _ in rows])
    radii = np.array([rad for _, rad in rows])
    np.testing.assert_allclose(
      state.extra['proxy_centers'], centers, rtol=1e-4, atol=1e-5
    )
    np.testing.assert_allclose(
      state.extra['proxy_margins'], radii, rtol=1e-4, atol=1e-5
    )
    np.testing.assert_array_equal(state.extra['classes'], client_classes)
    assert np.all(state.extra['reported'] == 1)
    shared = (centers, radii, np.ones(n, bool), client_classes)
  # Round 2 had active negatives: it differs from the positive loss alone.
  pos = algorithms.REGISTRY['fedmetric'](
    model,
    server_optimizer=SERVER,
    negatives='none',
    reduction=reduction,
    center=center,
  )
  with jax.default_matmul_precision('highest'):
    pos_states, _ = run_rounds(pos, model, parts, data, rounds=2, lr=lr)
  assert np.abs(kernel(pos_states[2][0]) - kernel(states[2][0])).max() > 1e-4
  assert np.all(np.asarray(pos_states[2][0].extra['reported']) == 0)


def test_fedmetric_rescale_divides_each_rounds_step_by_the_mean_radius():
  """rescale=True measures the loss in units of rho, the mean radius shared
  in the previous round (1 before any): with plain SGD, the NumPy round of
  Algorithm 1 at learning rate lr / rho."""
  x, labels, parts, data = federation(clients_per_class=2)
  lam, lr, model = 0.7, 0.05, linear_model()
  alg = algorithms.REGISTRY['fedmetric'](
    model, server_optimizer=SERVER, negatives='true', lam=lam, rescale=True
  )
  with jax.default_matmul_precision('highest'):
    states, cohorts = run_rounds(alg, model, parts, data, rounds=2, lr=lr)
  n = len(parts)
  shared = (np.zeros((n, DIM)), np.zeros(n), np.zeros(n, bool), np.zeros(n))
  k, rho = kernel(states[0][0]), 1.0
  for r in range(2):
    k, rows = fedmetric_reference(
      x,
      cohorts[r],
      k,
      shared,
      lam=lam,
      squared=True,
      reduction='mean',
      lr=lr / rho,
      center='round_start',
      client_classes=partition_lib.one_class_labels(parts, labels),
    )
    np.testing.assert_allclose(
      kernel(states[r + 1][0]), k, rtol=1e-4, atol=1e-5
    )
    radii = np.array([rad for _, rad in rows])
    shared = (
      np.stack([c for c, _ in rows]),
      radii,
      np.ones(n, bool),
      partition_lib.one_class_labels(parts, labels),
    )
    rho = radii.mean()
  assert abs(rho - 1.0) > 0.05  # The second round's step was rescaled.
  with pytest.raises(ValueError, match='rescale'):
    fedmetric.SPEC(
      model, server_optimizer=SERVER, negatives='none', rescale=True
    )


def test_fedmetric_proxy_centers_lie_at_distance_s_r():
  x, labels, parts, data = federation()
  scale, model = 2.5, linear_model()
  alg = algorithms.REGISTRY['fedmetric'](
    model, server_optimizer=SERVER, negatives='proxy', scale=scale
  )
  with jax.default_matmul_precision('highest'):
    states, cohorts = run_rounds(alg, model, parts, data, rounds=1, lr=0.05)
  n = len(parts)
  _, rows = fedmetric_reference(
    x,
    cohorts[0],
    kernel(states[0][0]),
    (np.zeros((n, DIM)), np.zeros(n), np.zeros(n, bool), np.zeros(n, int)),
    lam=1.0,
    squared=True,
    reduction='mean',
    lr=0.05,
    center='round_start',
    client_classes=partition_lib.one_class_labels(parts, labels),
  )
  extra = states[1][0].extra
  for j, (c, radius) in enumerate(rows):
    a = np.asarray(extra['proxy_centers'][j], np.float64)
    assert np.linalg.norm(a - c) == pytest.approx(scale * radius, rel=1e-4)
    assert float(extra['proxy_margins'][j]) == pytest.approx(
      (1 + scale) * radius, rel=1e-4
    )
  # Independent directions per client.
  offsets = [
    unit(np.asarray(extra['proxy_centers'][j]) - rows[j][0]) for j in range(n)
  ]
  assert abs(offsets[0] @ offsets[1]) < 0.999


def test_fedmetric_host_and_vmap_agree_and_gradients_finite_on_center():
  x, _, parts, data = federation()
  del x
  model = linear_model()
  alg = algorithms.REGISTRY['fedmetric'](
    model, server_optimizer=SERVER, negatives='proxy', lam=0.5
  )
  out = {}
  for executor in ('vmap', 'host'):
    states, _ = run_rounds(
      alg, model, parts, data, rounds=2, lr=0.05, executor=executor
    )
    out[executor] = states[-1]
  assert fx.max_abs_diff(out['vmap'], out['host']) < 1e-5
  # An embedding exactly on the center and on a proxy: finite gradient.
  server_state = out['vmap'][0]
  images = jnp.zeros((2,) + SHAPE[1:])  # e = 0 for a bias-free model.
  extra = dict(server_state.extra)
  extra['proxy_centers'] = jnp.zeros_like(extra['proxy_centers'])
  ctx = fx.client_context(
    server_state._replace(extra=extra),
    local_state={'center': jnp.zeros(DIM), 'class': jnp.asarray(0)},
    num_examples=2,
  )
  batch = engine.Batch(
    images, jnp.zeros(2, jnp.int32), jnp.ones(2, bool), images
  )
  params = server_state.variables['params']
  grads = jax.grad(lambda p: alg.client_loss(p, {}, batch, ctx)[0])(params)
  assert all(np.all(np.isfinite(g)) for g in jax.tree.leaves(grads))


def test_fedmetric_bad_knobs():
  model = linear_model()
  make = lambda **kw: fedmetric.SPEC(model, server_optimizer=SERVER, **kw)
  with pytest.raises(ValueError, match='scale'):
    make(scale=-0.5)
  with pytest.raises(ValueError, match="negatives='true'"):
    make(negatives='true', scale=1.0)
  with pytest.raises(ValueError, match='lam'):
    make(lam=-1.0)
  with pytest.raises(ValueError, match='negatives'):
    make(negatives='both')
  with pytest.raises(ValueError, match='center'):
    make(center='moving')
  with pytest.raises(ValueError, match='reduction'):
    make(reduction='max')
  assert fedmetric.resolve_scale('proxy', None) == (
    fedmetric.DEFAULT_PROXY_SCALE
  )
  assert fedmetric.resolve_scale('true', None) == 0.0
  assert fedmetric.resolve_scale('none', 3.0) == 0.0
