"""FedAlignUniform's client loss (and FedDecorr's on top of it) vs a float64
NumPy re-derivation with finite differences."""

import jax
import numpy as np
import pytest

from fedjax_metric import algorithms

from .ssl_helpers import (
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
  np_uniform,
  raw_batch,
  two_linear,
  views_np,
)


def np_decorrelation(z, real, eps=1e-8):
  x = z[real]
  n, d = x.shape
  xh = (x - x.mean(0)) / np.sqrt(eps + x.var(0, ddof=1))
  corr = xh.T @ xh
  off = sum(corr[i, j] ** 2 for i in range(d) for j in range(d) if i != j)
  return off / (d * (d - 1)) / n


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
