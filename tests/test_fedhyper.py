"""FedHyper-G (Wang, Wang and Li, ICLR 2024) against a NumPy re-derivation.

alpha_t = clip(alpha_{t-1} + <Delta_t, Delta_{t-1}>, 0.2, 5) and
x_{t+1} = x_t + alpha_t Delta_t, Delta the round's averaged model update
(the authors' code, github.com/ATP-1010/FedHyper, federated_main.py);
the first round steps with the initial rate.
"""

import fl_fixtures as fx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fedjax_metric import engine, executors, optimizers
from fedjax_metric.algorithms import fedavg
from fedjax_metric.data import cohort as cohort_lib


def numpy_fedhyper(deltas, initial=1.0, low=0.2, high=5.0):
  """Models and rates after each round, from the list of averaged updates."""
  x, rate, previous = np.zeros_like(deltas[0]), initial, None
  models, rates = [], []
  for delta in deltas:
    if not delta.any():  # nobody joined: nothing moves
      models.append(x.copy())
      rates.append(rate)
      continue
    if previous is not None:
      rate = min(max(rate + float(delta.ravel() @ previous.ravel()), low), high)
    x = x + rate * delta
    previous = delta
    models.append(x.copy())
    rates.append(rate)
  return models, rates


def test_global_rate_follows_the_hypergradient_and_its_bounds():
  rng = np.random.default_rng(0)
  # Aligned updates raise the rate to the upper bound, opposed ones drop it
  # to the lower, and an empty round leaves everything alone.
  deltas = [rng.normal(size=(3, 2)) * 0.5 for _ in range(3)]
  deltas += [deltas[-1] * 3, deltas[-1] * 3, np.zeros((3, 2))]
  deltas += [-deltas[-2] * 2, rng.normal(size=(3, 2)) * 0.3]
  want_models, want_rates = numpy_fedhyper(deltas)
  assert max(want_rates) == 5.0 and min(want_rates) == 0.2  # both bounds hit
  opt = optimizers.make_server_optimizer('fedhyper')
  params = {'w': jnp.zeros((3, 2))}
  state = opt.init(params)
  for delta, model, rate in zip(deltas, want_models, want_rates, strict=True):
    # The server optimizer sees the pseudo-gradient -Delta.
    updates, state = opt.update({'w': -jnp.asarray(delta, jnp.float32)}, state)
    params = jax.tree.map(lambda p, u: p + u, params, updates)
    np.testing.assert_allclose(params['w'], model, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(state.learning_rate, rate, rtol=1e-6)


def test_initial_rate_is_the_configured_one_and_momentum_is_refused():
  opt = optimizers.make_server_optimizer('fedhyper', learning_rate=0.5)
  state = opt.init({'w': jnp.zeros(2)})
  updates, _ = opt.update({'w': jnp.ones(2)}, state)
  np.testing.assert_allclose(updates['w'], -0.5)
  with pytest.raises(ValueError, match='server.momentum=0'):
    optimizers.make_server_optimizer('fedhyper', momentum=0.9)


def test_fedavg_with_fedhyper_matches_the_equations_over_four_rounds():
  """Softmax-regression clients of unequal size, two full-batch steps, a
  round nobody joins in between: the server's models and rates are the
  hand-derived ones (the rate moves from 1 after round 2)."""
  images, labels = fx.make_data(30, seed=4)
  parts = [np.arange(12), np.arange(12, 30)]
  model = fx.linear()
  server = optimizers.make_server_optimizer('fedhyper')
  alg = fedavg.make(model, server_optimizer=server)
  joined = [[0, 1], [0, 1], [], [1]]
  cohorts = [
    cohort_lib.make_cohort(
      np.array(ids, np.int64),
      parts,
      num_slots=2,
      num_steps=2,
      batch_size=18,
      local_epochs=0,
      local_steps=2,
      seed=0,
      round_idx=r,
    )
    for r, ids in enumerate(joined)
  ]
  variables = fx.init_variables(model, images)
  state, table = engine.init_state(alg, variables, 2)
  data = engine.DeviceData(jnp.asarray(images), jnp.asarray(labels))
  dense = variables['params']['Dense_0']
  theta = [np.asarray(dense['kernel'], np.float64), np.asarray(dense['bias'])]
  rate, previous = 1.0, None
  with jax.default_matmul_precision('highest'):
    round_fn = executors.make_round_fn(
      fx.make_spec(alg, lr=5.0), data, executor='vmap'
    )
    for cohort in cohorts:
      state, table, _ = round_fn(state, table, cohort)
      delta = fx.ref_softmax_regression_round(
        theta, images, labels, cohort, lr=5.0
      )
      flat = np.concatenate([d.ravel() for d in delta])
      if flat.any():
        if previous is not None:
          rate = min(max(rate + float(flat @ previous), 0.2), 5.0)
        theta = [t + rate * d for t, d in zip(theta, delta)]
        previous = flat
      got = state.variables['params']['Dense_0']
      np.testing.assert_allclose(got['kernel'], theta[0], rtol=1e-4, atol=1e-5)
      np.testing.assert_allclose(got['bias'], theta[1], rtol=1e-4, atol=1e-5)
      np.testing.assert_allclose(state.opt_state.learning_rate, rate, rtol=1e-4)
  assert rate != 1.0  # the schedule moved
