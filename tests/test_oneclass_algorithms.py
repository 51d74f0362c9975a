"""FedMetric, Deep SVDD, FedAwS and FedUV inside real rounds, vs NumPy.

Every algorithm runs on a bias-free linear embedding e = x K (a Dense layer
without bias on the flattened image), whose gradient is x^T dl/de, so each
round is re-derived in float64 NumPy with explicit loops over examples,
clients and proxies, from the papers' equations: Park, Hosseini and Yun,
'Federated Learning with Metric Loss', FL-ICML workshop 2021 (Algorithm 1,
Eq. 4-6); Ruff et al., 'Deep One-Class Classification', ICML 2018; Yu et
al., 'Federated Learning with Only Positive Labels', ICML 2020; Hosseini et
al., 'Federated Learning of User Verification Models Without Sharing
Embeddings', ICML 2021.
"""

import fl_fixtures as fx
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fedjax_metric import algorithms, engine, executors, models, optimizers
from fedjax_metric.algorithms import fedmetric
from fedjax_metric.data import partition as partition_lib

SERVER = optimizers.make_server_optimizer('sgd')
DIM = 3
SHAPE = (1, 3, 3, 1)  # 9 input features: small enough for float32 to agree.


class LinearEmbedding(nn.Module):
  """e = flatten(x) K, no bias: the gradient is x^T dl/de."""

  num_classes: int = fx.NUM_CLASSES

  @nn.compact
  def __call__(self, images, *, train, mask=None):
    del train, mask
    x = images.reshape(images.shape[0], -1)
    return {'embedding': nn.Dense(DIM, use_bias=False)(x), 'features': []}


def linear_model():
  return models.make_model_fns(LinearEmbedding(), SHAPE)


def federation(clients_per_class=1, num_examples=30, seed=0):
  rng = np.random.default_rng(seed)
  images = rng.integers(0, 256, (num_examples,) + SHAPE[1:]).astype(np.uint8)
  labels = (np.arange(num_examples) % fx.NUM_CLASSES).astype(np.int32)
  parts = partition_lib.one_class(
    labels, clients_per_class=clients_per_class, seed=seed
  )
  data = engine.DeviceData(jnp.asarray(images), jnp.asarray(labels))
  x = images.reshape(num_examples, -1).astype(np.float64) / 255.0
  return x, labels, parts, data


def run_rounds(
  alg, model, parts, data, *, rounds, lr, batch_size=4, steps=0, executor='vmap'
):
  """Runs ``rounds`` rounds with every client; returns states and cohorts."""
  variables = model.init(jax.random.key(1))
  state, table = engine.init_state(alg, variables, len(parts))
  # Host copies: the round donates (deletes) its input buffers.
  copy = lambda tree: jax.tree.map(np.array, tree)
  states = [copy((state, table))]
  round_fn = executors.make_round_fn(
    fx.make_spec(alg, lr=lr), data, executor=executor
  )
  cohorts = []
  for r in range(rounds):
    c = fx.cohort(
      parts,
      list(range(len(parts))),
      num_slots=len(parts),
      batch_size=batch_size,
      steps=steps,
      round_idx=r,
    )
    cohorts.append(jax.tree.map(np.asarray, c))
    state, table, _ = round_fn(state, table, c)
    states.append(copy((state, table)))
  return states, cohorts


def kernel(state):
  return np.asarray(state.variables['params']['Dense_0']['kernel'], np.float64)


def client_batches(cohort, slot):
  """[(example indices, mask)] of the slot's real steps."""
  return [
    (idx, m)
    for idx, m in zip(cohort.example_idx[slot], cohort.example_mask[slot])
    if m.any()
  ]


def local_sgd(k, x, batches, grad_e, lr, reduction='mean'):
  """Plain SGD on the linear embedding, one step per batch (NumPy loops).

  grad_e(e, i) is dl_i/de for example i at embedding e (float64 [D]).
  """
  k = k.copy()
  for idx, m in batches:
    g = np.zeros_like(k)
    for i, real in zip(idx, m):
      if real:
        e = x[i] @ k
        g += np.outer(x[i], grad_e(e, i))
    k -= lr * g / (1.0 if reduction == 'sum' else m.sum())
  return k


def unit(v):
  """v / |v|; 0 for v = 0 (the subgradient the safe square root picks: a
  one-example batch sits exactly on its own batch center)."""
  n = np.linalg.norm(v)
  return v / n if n > 0 else 0 * v


# ---------------------------------------------------------------------------
# FedMetric.
# ---------------------------------------------------------------------------


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


# ---------------------------------------------------------------------------
# Deep SVDD.
# ---------------------------------------------------------------------------


def test_deepsvdd_each_client_trains_its_own_model_to_a_fixed_center():
  x, _, parts, data = federation()
  eps, lr = 0.1, 0.05
  model = linear_model()
  alg = algorithms.REGISTRY['deepsvdd'](model, server_optimizer=SERVER, eps=eps)
  with jax.default_matmul_precision('highest'):
    states, cohorts = run_rounds(alg, model, parts, data, rounds=2, lr=lr)
  k0 = kernel(states[0][0])
  for j in range(len(parts)):
    real = [
      i for idx, m in client_batches(cohorts[0], j) for i, r in zip(idx, m) if r
    ]
    mean = np.mean([x[i] @ k0 for i in real], axis=0)
    # Ruff et al.'s rule: coordinates within eps of 0 move to +-eps.
    center = np.where(np.abs(mean) < eps, np.sign(mean) * eps, mean)
    k = k0
    for r in range(2):  # The center stays fixed after the first round.
      k = local_sgd(
        k, x, client_batches(cohorts[r], j), lambda e, i: 2 * (e - center), lr
      )
    table = states[2][1]
    np.testing.assert_allclose(table['center'][j], center, rtol=1e-5, atol=1e-6)
    got = table['variables']['params']['Dense_0']['kernel'][j]
    np.testing.assert_allclose(got, k, rtol=1e-4, atol=1e-5)
  # Nothing is averaged: the server's model never moves.
  np.testing.assert_array_equal(kernel(states[2][0]), k0)
  assert int(states[2][0].round) == 2


# ---------------------------------------------------------------------------
# FedAwS.
# ---------------------------------------------------------------------------


def cosine_grads(e, w):
  """cos(e, w) and its gradients with respect to e and w."""
  ne, nw = np.linalg.norm(e), np.linalg.norm(w)
  cos = e @ w / (ne * nw)
  return cos, w / (ne * nw) - cos * e / ne**2, e / (ne * nw) - cos * w / nw**2


def spreadout_numpy(w, margin):
  """Yu et al.'s double sum with d = 1 - cos on normalised rows (loops)."""
  total = 0.0
  for a in range(len(w)):
    for b in range(len(w)):
      if a != b:
        d = 1 - unit(w[a]) @ unit(w[b])
        total += max(0.0, margin - d) ** 2
  return total


def numeric_grad(f, w, h=1e-6):
  g = np.zeros_like(w)
  for idx in np.ndindex(*w.shape):
    step = np.zeros_like(w)
    step[idx] = h
    g[idx] = (f(w + step) - f(w - step)) / (2 * h)
  return g


def test_fedaws_round_matches_numpy():
  x, labels, parts, data = federation(clients_per_class=2)
  lr, margin, multiplier, pos_margin = 0.1, 1.0, 5.0, 0.9
  model = linear_model()
  alg = algorithms.REGISTRY['fedaws'](
    model,
    server_optimizer=SERVER,
    positive_margin=pos_margin,
    spreadout_distance='cosine',
    spreadout_margin=margin,
    spreadout_steps_per_round=1,
    lr_multiplier=multiplier,
  )
  with jax.default_matmul_precision('highest'):
    states, cohorts = run_rounds(alg, model, parts, data, rounds=1, lr=lr)
  k0 = kernel(states[0][0])
  w0 = np.asarray(states[0][0].extra['class_embeddings'], np.float64)
  classes = partition_lib.one_class_labels(parts, labels)
  kernels, sums, counts = [], np.zeros_like(w0), np.zeros(len(w0))
  for j in range(len(parts)):
    k, w = k0.copy(), w0[classes[j]].copy()
    for idx, m in client_batches(cohorts[0], j):
      gk, gw = np.zeros_like(k), np.zeros_like(w)
      for i, r in zip(idx, m):
        if r:
          e = x[i] @ k
          cos, d_e, d_w = cosine_grads(e, w)
          slope = -2 * max(0.0, pos_margin - cos)
          gk += np.outer(x[i], slope * d_e)
          gw += slope * d_w
      k, w = k - lr * gk / m.sum(), w - lr * gw / m.sum()
    kernels.append(k)
    sums[classes[j]] += w
    counts[classes[j]] += 1
  averaged = sums / counts[:, None]
  expected_w = averaged - multiplier * lr * numeric_grad(
    lambda v: spreadout_numpy(v, margin), averaged
  )
  with jax.default_matmul_precision('highest'):
    state = states[1][0]
  np.testing.assert_allclose(
    kernel(state), np.mean(kernels, axis=0), rtol=1e-4, atol=1e-5
  )
  np.testing.assert_allclose(
    state.extra['class_embeddings'], expected_w, rtol=1e-4, atol=1e-5
  )
  # The spreadout step did something.
  assert np.abs(expected_w - averaged).max() > 1e-4


# ---------------------------------------------------------------------------
# FedUV.
# ---------------------------------------------------------------------------


def test_feduv_round_matches_numpy_with_random_codewords():
  x, labels, parts, data = federation()
  lr = 0.1
  model = linear_model()
  alg = algorithms.REGISTRY['feduv'](
    model, server_optimizer=SERVER, codeword_kind='random', codeword_seed=3
  )
  with jax.default_matmul_precision('highest'):
    states, cohorts = run_rounds(alg, model, parts, data, rounds=1, lr=lr)
  code = np.asarray(states[0][0].extra['codewords'], np.float64)
  assert code.shape == (fx.NUM_CLASSES, DIM)
  assert set(np.unique(code)) <= {-1.0, 1.0}
  # Minimum Hamming distance by explicit loops.
  hamming = min(
    int(np.sum(code[a] != code[b]))
    for a in range(len(code))
    for b in range(len(code))
    if a != b
  )
  assert int(states[0][0].extra['min_distance']) == hamming
  classes = partition_lib.one_class_labels(parts, labels)
  k0, kernels = kernel(states[0][0]), []
  for j in range(len(parts)):
    v = code[classes[j]]

    def grad_e(e, i, v=v):
      del i
      cos, d_e, _ = cosine_grads(e, v)
      return -d_e if cos < 1 else 0 * e

    kernels.append(local_sgd(k0, x, client_batches(cohorts[0], j), grad_e, lr))
  np.testing.assert_allclose(
    kernel(states[1][0]), np.mean(kernels, axis=0), rtol=1e-4, atol=1e-5
  )
