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

from fedjax_metric import algorithms, engine, losses, optimizers
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
  ntd = ref_ntd(local, teacher, labels, 2.0)[mask].mean()
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
