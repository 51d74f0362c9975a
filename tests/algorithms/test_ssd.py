"""SSD (Fang et al., ICCV 2025): its client loss vs a float64 NumPy
re-derivation with finite differences, its scaling matrices in the server
extra, its aggregation weight, the ablation without the projector and the
config's ablation rows."""

import importlib
import math

import jax
import numpy as np
import pytest

from fedjax_metric import algorithms
from fedjax_metric.algorithms import ssd

from .ssl_helpers import (
  DIM,
  HIGHEST,
  SERVER,
  assert_grads_close,
  batch_of,
  fd_grad,
  init,
  jax_value_and_grad,
  make_ctx,
  np_align,
  np_forward,
  np_params,
  np_softmax,
  np_uniform,
  raw_batch,
  two_linear,
  unit,
  views_np,
)


def np_dsr(p, p_frozen, scaling, real):
  total = 0.0
  for i in real:
    target = unit(unit(p_frozen[i]) @ scaling @ scaling.T)
    total += np.sum((unit(p[i]) - target) ** 2)
  return math.sqrt(total) / len(real)


def np_kl_projector_to_encoder(h, p, real, t=0.5):
  vals = []
  for i in real:
    q, r = np_softmax(p[i] / t), np_softmax(h[i] / t)
    vals.append(np.sum(q * (np.log(q) - np.log(r))))
  return np.mean(vals)


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
