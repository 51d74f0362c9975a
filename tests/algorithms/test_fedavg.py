"""FedAvg with a server optimizer inside a real round, vs NumPy."""

import numpy as np

from fedjax_metric import optimizers
from fedjax_metric.algorithms import fedavg

from .helpers import one_client_round, softmax_regression_grad


def test_fedadam_round_matches_numpy():
  """Server Adam on the pseudo-gradient -delta (Reddi et al. 2021, Alg. 2)."""
  server = optimizers.make_server_optimizer(
    'adam', learning_rate=0.05, eps=1e-3
  )
  make = lambda model: fedavg.build(model, server_optimizer=server)
  state, w0, b0, x, y = one_client_round(make, server, steps=1, lr=0.3)
  gw, _ = softmax_regression_grad(w0, b0, x, y)
  delta = -0.3 * gw
  expected = w0 - 0.05 * (-delta) / (np.abs(delta) + 1e-3)
  np.testing.assert_allclose(
    state.variables['params']['Dense_0']['kernel'], expected, atol=1e-5
  )
  assert int(state.round) == 1


def test_a_round_of_only_zero_weight_clients_leaves_the_server_as_it_was():
  """Under example weighting, a cohort of clients without examples has
  weight 0: like a round nobody joins, its server step (momentum) is
  skipped, only the round counter advances."""
  import jax.numpy as jnp

  from fedjax_metric import engine

  server = optimizers.make_server_optimizer('sgd', momentum=0.9)
  variables = {'params': {'w': jnp.array([1.0])}}
  state = engine.ServerState(
    variables, server.init(variables['params']), jnp.int32(0)
  )
  # A real round: the momentum now holds a step.
  moved = fedavg.apply_server_optimizer(
    server, state, {'params': {'w': jnp.array([0.5])}}
  )

  def aggregate(weight, participants):
    return engine.Aggregate(
      {'params': {'w': jnp.zeros(1)}},
      jnp.float32(weight),
      jnp.int32(participants),
      jnp.zeros(1, jnp.int32),
      jnp.ones(1, bool),
    )

  for weight, participants, stays in [
    (0.0, 1, True),  # clients without examples only
    (0.0, 0, True),  # nobody
    (3.0, 1, False),  # a real client with a zero update: momentum moves it
  ]:
    after = fedavg.server_update(
      server, moved, aggregate(weight, participants), ()
    )
    assert int(after.round) == int(moved.round) + 1
    same = np.allclose(
      after.variables['params']['w'], moved.variables['params']['w']
    )
    assert same == stays, (weight, participants)
