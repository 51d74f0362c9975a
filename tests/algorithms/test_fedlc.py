"""FedLC (Zhang et al., ICML 2022): the client loss is the CE of
z_k - tau n_k^(-1/4) under the client's own class counts."""

import fl_fixtures as fx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fedjax_metric import algorithms, contract, engine, optimizers
from fedjax_metric.models import split_variables

from .supervised_helpers import linear_logits, ref_calibrated_ce


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
