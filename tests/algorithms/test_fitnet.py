"""FedAvg + FitNet (Romero et al., ICLR 2015): CE + beta/2 ||u_g - v_l||^2,
against a NumPy re-derivation."""

import fl_fixtures as fx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fedjax_metric import algorithms, engine, optimizers
from fedjax_metric.models import split_variables

from .supervised_helpers import ref_cross_entropy


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
