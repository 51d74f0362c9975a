"""FedU2's client loss: NT-Xent vs NumPy, plus its weighted regulariser."""

import jax
import numpy as np
import pytest

from fedjax_metric.algorithms import fedu2

from .ssl_helpers import (
  SERVER,
  assert_grads_close,
  batch_of,
  fd_grad,
  init,
  jax_value_and_grad,
  make_ctx,
  np_forward,
  np_nt_xent,
  np_params,
  raw_batch,
  two_linear,
  views_np,
)


def test_fedu2_loss_is_nt_xent_plus_weighted_regulariser():
  """NT-Xent (tau 0.07, self-similarity kept as e^0) vs NumPy; the FUR term
  enters linearly with its weight and is positive."""
  model = two_linear()
  variables = init(model)
  raw, mask = raw_batch(seed=2)
  real = np.flatnonzero(mask)
  values = {}
  for weight in (0.0, 0.01, 1.0):
    alg = fedu2.SPEC(model, server_optimizer=SERVER, fur_weight=weight)
    ctx = make_ctx(alg.init_server(variables, 2, jax.random.key(0)))
    values[weight], grad = jax_value_and_grad(
      alg, variables, batch_of(raw, mask), ctx
    )
    if weight == 0.0:
      k_views = jax.random.split(ctx.key, 3)[0]
      x1, x2 = views_np(raw, k_views, order='fedu2')
      theta0 = np_params(variables)

      def loss(theta, x1=x1, x2=x2):
        _, p1 = np_forward(theta, x1)
        _, p2 = np_forward(theta, x2)
        return np_nt_xent(p1, p2, real, 0.07, True)

      assert values[0.0] == pytest.approx(loss(theta0), rel=1e-5)
      assert_grads_close(grad, fd_grad(loss, theta0), atol=1e-3)
  fur = values[1.0] - values[0.0]
  assert fur > 0
  assert values[0.01] == pytest.approx(values[0.0] + 0.01 * fur, rel=1e-5)
