"""Baselines of FedRCL's Table 1 against NumPy re-derivations.

FedNTD (Lee, Jeong, Shin, Bae and Yun, NeurIPS 2022): L = CE + beta
KL(q~_g || q~_l), q~ the temperature softmax over the classes other than the
true one. FedDecorr (Shi et al., ICLR 2023), supervised: L = CE + lambda
R(z), R the mean squared off-diagonal entry of the batch's standardised
correlation matrix over n (the authors' code).
"""

import fl_fixtures as fx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fedjax_metric import (
  algorithms,
  contract,
  engine,
  executors,
  losses,
  optimizers,
)
from fedjax_metric.algorithms import fedproc
from fedjax_metric.data import cohort as cohort_lib
from fedjax_metric.models import split_variables


def linear_client_loss(alg, local_vars, global_vars, x, images, labels, mask):
  """(loss, aux) of ``alg``'s client loss for the linear model ``local_vars``
  on the flat inputs x [B, 36] (reshaped as ``images``), the server holding
  ``global_vars``, at full matmul precision."""
  params, state = split_variables(local_vars)
  batch = engine.Batch(
    jnp.asarray(x.reshape(images.shape), jnp.float32),
    jnp.asarray(labels),
    jnp.asarray(mask),
    jnp.asarray(images),
  )
  ctx = fx.client_context(engine.ServerState(global_vars, (), jnp.int32(0)))
  with jax.default_matmul_precision('highest'):
    loss, (_, aux) = alg.client_loss(params, state, batch, ctx)
  return loss, aux


def linear_logits(variables, x):
  """The linear model's logits in float64."""
  dense = variables['params']['Dense_0']
  return x @ np.asarray(dense['kernel']) + np.asarray(dense['bias'])


def ref_cross_entropy(logits, labels, mask):
  """Mean softmax cross-entropy over the real (mask) rows, float64."""
  shifted = logits - logits.max(1, keepdims=True)
  log_p = shifted - np.log(np.exp(shifted).sum(1, keepdims=True))
  return -log_p[np.arange(len(labels)), labels][mask].mean()


def ref_ntd(local, teacher, labels, tau):
  """Per example, by a loop: drop the true class, softmax at tau, KL."""
  out = []
  for l_row, g_row, y in zip(local, teacher, labels):
    keep = [c for c in range(len(l_row)) if c != y]
    ql = np.exp(l_row[keep] / tau - np.max(l_row[keep] / tau))
    qg = np.exp(g_row[keep] / tau - np.max(g_row[keep] / tau))
    ql, qg = ql / ql.sum(), qg / qg.sum()
    out.append(np.sum(qg * (np.log(qg) - np.log(ql))))
  return np.array(out)


@pytest.mark.parametrize('tau', [1.0, 3.0])
def test_not_true_distillation_matches_numpy(tau):
  rng = np.random.default_rng(0)
  local, teacher = (rng.normal(size=(7, 5)) for _ in range(2))
  labels = np.array([0, 4, 2, 2, 1, 3, 0])
  got = losses.not_true_distillation(
    jnp.asarray(local, jnp.float32),
    jnp.asarray(teacher, jnp.float32),
    jnp.asarray(labels),
    tau,
  )
  np.testing.assert_allclose(
    got, ref_ntd(local, teacher, labels, tau), rtol=1e-5, atol=1e-6
  )


def test_the_true_class_and_the_teacher_get_no_gradient():
  rng = np.random.default_rng(1)
  local, teacher = (
    jnp.asarray(rng.normal(size=(4, 5)), jnp.float32) for _ in range(2)
  )
  labels = jnp.array([1, 0, 4, 2])
  d_local, d_teacher = jax.grad(
    lambda a, b: jnp.sum(losses.not_true_distillation(a, b, labels, 2.0)),
    argnums=(0, 1),
  )(local, teacher)
  np.testing.assert_array_equal(d_teacher, 0.0)
  np.testing.assert_array_equal(d_local[jnp.arange(4), labels], 0.0)
  # Equal not-true logits (the true one may differ): no divergence.
  same = losses.not_true_distillation(
    local, local.at[jnp.arange(4), labels].add(5.0), labels, 1.0
  )
  np.testing.assert_allclose(same, 0.0, atol=1e-6)


def test_client_loss_is_ce_plus_beta_ntd_against_the_global_model():
  images, labels = fx.make_data(8)
  model = fx.linear()
  global_vars = fx.init_variables(model, images, seed=0)
  local_vars = fx.init_variables(model, images, seed=1)
  alg = algorithms.REGISTRY['fedntd'](
    model,
    server_optimizer=optimizers.make_server_optimizer('sgd'),
    beta=0.7,
    temperature=2.0,
  )
  mask = np.arange(8) < 6  # two padded examples
  x = images.reshape(8, -1).astype(np.float64)
  loss, aux = linear_client_loss(
    alg, local_vars, global_vars, x, images, labels, mask
  )
  local, teacher = linear_logits(local_vars, x), linear_logits(global_vars, x)
  ce = ref_cross_entropy(local, labels, mask)
  # tau^2 times the KL, as the authors' NTD_Loss (fedntd.ntd_term).
  ntd = 2.0**2 * ref_ntd(local, teacher, labels, 2.0)[mask].mean()
  assert float(aux['ce']) == pytest.approx(ce, rel=1e-5)
  assert float(aux['ntd']) == pytest.approx(ntd, rel=1e-4, abs=1e-7)
  assert float(loss) == pytest.approx(ce + 0.7 * ntd, rel=1e-5)


@pytest.mark.parametrize(
  'kwargs, match', [({'beta': -1.0}, 'beta'), ({'temperature': 0.0}, 'temp')]
)
def test_bad_options_are_named(kwargs, match):
  with pytest.raises(ValueError, match=match):
    algorithms.REGISTRY['fedntd'](
      fx.linear(),
      server_optimizer=optimizers.make_server_optimizer('sgd'),
      **kwargs,
    )


def ref_decorrelation_code(z):
  """FedDecorr's released regulariser, by hand: standardise each feature
  over the rows (unbiased variance, eps 1e-8), C = Z^T Z, mean of the
  squared off-diagonal entries, divided by n."""
  n, d = z.shape
  zs = (z - z.mean(0)) / np.sqrt(1e-8 + z.var(0, ddof=1))
  c = zs.T @ zs
  off = c[~np.eye(d, dtype=bool)]
  return np.sum(off**2) / (d * (d - 1)) / n


def test_feddecorr_supervised_is_ce_plus_lambda_decorrelation():
  images, labels = fx.make_data(8)
  model = fx.linear()  # 'embedding' is the flattened image
  variables = fx.init_variables(model, images, seed=1)
  alg = algorithms.REGISTRY['feddecorr_supervised'](
    model,
    server_optimizer=optimizers.make_server_optimizer('sgd'),
    decorr_weight=0.3,
  )
  mask = np.arange(8) < 6
  x = images.reshape(8, -1).astype(np.float64)
  x = x + np.random.default_rng(0).normal(size=x.shape)  # no constant column
  loss, aux = linear_client_loss(
    alg, variables, variables, x, images, labels, mask
  )
  ce = ref_cross_entropy(linear_logits(variables, x), labels, mask)
  decorr = ref_decorrelation_code(x[mask])
  assert float(aux['ce']) == pytest.approx(ce, rel=1e-5)
  assert float(aux['decorrelation']) == pytest.approx(decorr, rel=1e-4)
  assert float(loss) == pytest.approx(ce + 0.3 * decorr, rel=1e-5)


# ---------------------------------------------------------------------------
# FedLC (Zhang et al., ICML 2022): CE of z_k - tau n_k^(-1/4).
# ---------------------------------------------------------------------------


def ref_calibrated_ce(logits, labels, counts, tau):
  """Per example, by a loop over the classes the client holds: the margin
  tau n^(-1/4) subtracted, then -log softmax at the label."""
  out = []
  for row, y in zip(logits, labels):
    held = [k for k in range(len(row)) if counts[k] > 0]
    z = {k: row[k] - tau * counts[k] ** -0.25 for k in held}
    top = max(z.values())
    log_norm = top + np.log(sum(np.exp(v - top) for v in z.values()))
    out.append(log_norm - z[y])
  return np.array(out)


def test_calibrated_cross_entropy_matches_numpy_and_drops_absent_classes():
  rng = np.random.default_rng(5)
  logits = rng.normal(size=(6, 4))
  counts = np.array([40.0, 3.0, 0.0, 1.0])  # class 2: not on this client
  labels = np.array([0, 1, 3, 0, 3, 1])
  got = losses.calibrated_cross_entropy(
    jnp.asarray(logits, jnp.float32),
    jnp.asarray(labels),
    jnp.asarray(counts, jnp.float32),
    1.5,
  )
  want = ref_calibrated_ce(logits, labels, counts, 1.5)
  np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
  # The absent class leaves the softmax: its logit changes nothing.
  moved = logits.copy()
  moved[:, 2] += 50.0
  again = losses.calibrated_cross_entropy(
    jnp.asarray(moved, jnp.float32),
    jnp.asarray(labels),
    jnp.asarray(counts, jnp.float32),
    1.5,
  )
  np.testing.assert_allclose(again, got, rtol=1e-6)

  # A padding row labelled with an absent class: finite, and zero under the
  # mask with a zero gradient.
  def padded(z):
    per_example = losses.calibrated_cross_entropy(
      z, jnp.array([2, 0]), jnp.asarray(counts, jnp.float32), 1.5
    )
    return losses.masked_mean(per_example, jnp.array([False, True]))

  value, grad = jax.value_and_grad(padded)(jnp.asarray(logits[:2], jnp.float32))
  assert np.isfinite(float(value)) and np.isfinite(np.asarray(grad)).all()
  assert not np.asarray(grad[0]).any()


def test_fedlc_client_loss_uses_its_own_class_counts():
  """Two clients with different label histograms: the loss of client 1 is
  the calibrated CE under client 1's counts (row 1 of the run's facts)."""
  images, labels = fx.make_data(8)
  model = fx.linear()
  variables = fx.init_variables(model, images, seed=1)
  counts = np.array([[5.0, 1.0, 0.0], [2.0, 9.0, 4.0]])
  alg = algorithms.REGISTRY['fedlc'](
    model,
    server_optimizer=optimizers.make_server_optimizer('sgd'),
    run=contract.RunFacts(class_counts=counts),
    tau=0.8,
  )
  state = alg.init_server(variables, 2, jax.random.key(0))
  params, model_state = split_variables(variables)
  mask = np.arange(8) < 7
  batch = engine.Batch(
    jnp.asarray(images, jnp.float32) / 255.0,
    jnp.asarray(labels),
    jnp.asarray(mask),
    jnp.asarray(images),
  )
  with jax.default_matmul_precision('highest'):
    loss, _ = alg.client_loss(
      params, model_state, batch, fx.client_context(state, client_id=1)
    )
  x = images.reshape(8, -1).astype(np.float64) / 255.0
  want = ref_calibrated_ce(linear_logits(variables, x), labels, counts[1], 0.8)
  assert float(loss) == pytest.approx(want[mask].mean(), rel=1e-5)
  with pytest.raises(ValueError, match='class counts'):
    algorithms.REGISTRY['fedlc'](
      model, server_optimizer=optimizers.make_server_optimizer('sgd')
    )


# ---------------------------------------------------------------------------
# FedAvg + FitNet (Romero et al., ICLR 2015): CE + beta/2 ||u_g - v_l||^2.
# ---------------------------------------------------------------------------


@pytest.mark.parametrize('level, tapped', [(0, 0), (-1, 1)])
def test_fitnet_client_loss_is_ce_plus_half_squared_hint_distance(
  level, tapped
):
  """The hint is the global model's feature tap (evaluation mode, frozen) and
  the guided layer the same tap of the local model (training mode); -1
  picks the middle tap of the two. Two padded examples are left out."""
  images, labels = fx.make_data(8)
  model = fx.all_outputs()
  global_vars = fx.init_variables(model, images, seed=0)
  local_vars = fx.init_variables(model, images, seed=1)
  alg = algorithms.REGISTRY['fitnet'](
    model,
    server_optimizer=optimizers.make_server_optimizer('sgd'),
    beta=0.7,
    level=level,
  )
  mask = np.arange(8) < 6
  float_images = jnp.asarray(images, jnp.float32) / 255.0
  batch = engine.Batch(
    float_images, jnp.asarray(labels), jnp.asarray(mask), jnp.asarray(images)
  )
  params, state = split_variables(local_vars)
  ctx = fx.client_context(engine.ServerState(global_vars, (), jnp.int32(0)))
  with jax.default_matmul_precision('highest'):
    loss, (_, aux) = alg.client_loss(params, state, batch, ctx)
    local, _ = model.apply(
      params, state, float_images, train=True, mask=jnp.asarray(mask)
    )
    g_params, g_state = split_variables(global_vars)
    teacher, _ = model.apply(g_params, g_state, float_images, train=False)
  u = np.asarray(teacher['features'][tapped], np.float64)
  v = np.asarray(local['features'][tapped], np.float64)
  hint = (0.5 * ((u - v) ** 2).sum(1))[mask].mean()
  ce = ref_cross_entropy(np.asarray(local['logits'], np.float64), labels, mask)
  assert float(aux['hint']) == pytest.approx(hint, rel=1e-5)
  assert float(loss) == pytest.approx(ce + 0.7 * hint, rel=1e-5)

  # The teacher is a constant: no gradient reaches the global variables.
  def loss_of_global(g):
    c = ctx._replace(server_state=ctx.server_state._replace(variables=g))
    return alg.client_loss(params, state, batch, c)[0]

  grads = jax.grad(loss_of_global)(global_vars)
  assert not any(np.asarray(x).any() for x in jax.tree.leaves(grads))


# ---------------------------------------------------------------------------
# FedProc (Mu et al. 2021): prototypes and the prototypical contrastive loss.
# ---------------------------------------------------------------------------


def np_unit(x):
  norm = np.linalg.norm(x, axis=-1, keepdims=True)
  return x / np.maximum(norm, 1e-12)


def test_prototype_contrastive_loss_matches_numpy_with_an_unseen_class():
  rng = np.random.default_rng(7)
  z, prototypes = rng.normal(size=(5, 4)), rng.normal(size=(3, 4))
  prototypes[1] = 0.0  # a class no client has held yet
  labels = np.array([0, 2, 1, 0, 2])
  got = fedproc.prototype_contrastive_loss(
    jnp.asarray(z, jnp.float32),
    jnp.asarray(labels),
    jnp.asarray(prototypes, jnp.float32),
  )
  want = []
  for row, y in zip(np_unit(z), labels):
    scores = np_unit(prototypes) @ row  # the zero prototype scores 0
    want.append(np.log(np.exp(scores).sum()) - scores[y])
  np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_fedproc_prototypes_are_count_weighted_means_kept_when_unseen():
  """The linear fixture's 'embedding' is its input, so each round's
  prototypes are NumPy means of normalised inputs: after round 0 over both
  clients; after round 1 only client 0 trains, so class 2 (which client 0
  does not hold) keeps its round-0 prototype. Round 0 trains on CE alone
  (no prototypes yet): its loss is its CE."""
  images, labels = fx.make_data(60, seed=6)
  parts = [
    np.flatnonzero(labels <= 1)[:14],  # classes 0 and 1
    np.flatnonzero(labels >= 1)[:20],  # classes 1 and 2
  ]
  model = fx.linear()
  alg = algorithms.REGISTRY['fedproc'](
    model,
    server_optimizer=optimizers.make_server_optimizer('sgd'),
    run=contract.RunFacts(num_rounds=4),
  )
  cohorts = [
    cohort_lib.make_cohort(
      np.array(ids),
      parts,
      num_slots=2,
      num_steps=3,
      batch_size=8,
      local_epochs=1,
      local_steps=0,
      seed=0,
      round_idx=r,
    )
    for r, ids in enumerate([[0, 1], [0]])
  ]
  variables = fx.init_variables(model, images)
  state, table = engine.init_state(alg, variables, 2)
  data = engine.DeviceData(jnp.asarray(images), jnp.asarray(labels))
  round_fn = executors.make_round_fn(
    fx.make_spec(alg, lr=0.1), data, executor='vmap'
  )
  want = np.zeros((3, 36))
  for r, cohort in enumerate(cohorts):
    state, table, metrics = round_fn(state, table, cohort)
    sums, counts = np.zeros((3, 36)), np.zeros(3)
    for slot in np.flatnonzero(cohort.slot_mask):
      rows = cohort.example_idx[slot][cohort.example_mask[slot]]
      z = np_unit(images[rows].reshape(len(rows), -1) / 255.0)
      for row, y in zip(z, labels[rows]):
        sums[y] += row
        counts[y] += 1
    held = counts > 0
    want[held] = sums[held] / counts[held, None]
    np.testing.assert_allclose(state.extra, want, rtol=1e-5, atol=1e-6)
    if r == 0:
      assert float(metrics['train_loss_sum']) == pytest.approx(
        float(metrics['train_ce_sum']), rel=1e-6
      )
  assert not counts[2] and np.abs(want[2]).sum() > 0  # kept from round 0


def test_prototype_loss_gradient_is_finite_for_a_zero_representation():
  """An all-zero representation row (a dead ReLU layer, or padding) and an
  unseen class's zero prototype give finite gradients, not 0 * inf."""
  z = jnp.zeros((2, 4)).at[1].set(jnp.array([1.0, 2.0, 0.0, -1.0]))
  prototypes = jnp.zeros((3, 4)).at[0].set(jnp.ones(4))
  grad = jax.grad(
    lambda v: fedproc.prototype_contrastive_loss(
      v, jnp.array([0, 2]), prototypes
    ).sum()
  )(z)
  assert np.isfinite(np.asarray(grad)).all()
