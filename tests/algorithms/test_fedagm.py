"""FedAGM (Kim, Kim and Han, arXiv:2201.03172; FedACG, CVPR 2024) against a
NumPy re-derivation of its three equations, and over other client methods.

  lookahead  theta~_t = theta_{t-1} + lambda m_{t-1}
  client     L_i = CE + beta/2 ||theta - theta~_t||^2, from theta~_t
  server     m_t = lambda m_{t-1} + tau sum_i p_i (theta_i - theta~_t),
             theta_t = theta_{t-1} + m_t
"""

import functools

import fl_fixtures as fx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import fedjax_metric as fm
from fedjax_metric import algorithms, assemble, engine, executors, optimizers
from fedjax_metric.algorithms import fedagm, fedavg
from fedjax_metric.data import cohort as cohort_lib


def ref_fedagm(
  w, b, images, labels, cohorts, *, lr, beta, lam, tau, lookahead=True
):
  """FedAGM's rounds in float64 by hand: softmax regression on x / 255,
  full-batch masked steps, aggregation weighted by client size. Without
  ``lookahead`` the clients start from theta_{t-1} (FedAvgM's clients)."""
  theta = [w.astype(np.float64), b.astype(np.float64)]
  momentum = [np.zeros_like(t) for t in theta]
  for cohort in cohorts:
    look = [t + lam * m * lookahead for t, m in zip(theta, momentum)]
    mean = fx.ref_softmax_regression_round(
      look, images, labels, cohort, lr=lr, prox_beta=beta
    )
    momentum = [lam * m + tau * d for m, d in zip(momentum, mean)]
    theta = [t + m for t, m in zip(theta, momentum)]
  return theta


def test_three_rounds_match_the_equations():
  """Two clients of unequal size (12 and 18 examples), two full-batch local
  steps, three rounds: after the first round the lookahead, the proximal
  pull towards it and the momentum all change the result."""
  images, labels = fx.make_data(30, seed=4)
  parts = [np.arange(12), np.arange(12, 30)]
  model = fx.linear()
  lr, beta, lam, tau = 0.3, 0.5, 0.6, 0.8
  server = optimizers.make_server_optimizer(
    'fedagm', learning_rate=tau, momentum=lam
  )
  alg = fedagm.accelerate(
    fedavg.build(model, server_optimizer=server), server, beta=beta
  )
  cohorts = [
    cohort_lib.make_cohort(
      np.array([0, 1]),
      parts,
      num_slots=2,
      num_steps=2,
      batch_size=18,
      local_epochs=0,
      local_steps=2,
      seed=0,
      round_idx=r,
    )
    for r in range(3)
  ]
  variables = fx.init_variables(model, images)
  state, table = engine.init_state(alg, variables, 2)
  data = engine.DeviceData(jnp.asarray(images), jnp.asarray(labels))
  with jax.default_matmul_precision('highest'):
    round_fn = executors.make_round_fn(
      fx.make_spec(alg, lr=lr), data, executor='vmap'
    )
    for cohort in cohorts:
      state, table, metrics = round_fn(state, table, cohort)
  dense = variables['params']['Dense_0']
  reference = functools.partial(
    ref_fedagm,
    np.asarray(dense['kernel']),
    np.asarray(dense['bias']),
    images,
    labels,
    cohorts,
    lr=lr,
    lam=lam,
    tau=tau,
  )
  want = reference(beta=beta)
  got = state.variables['params']['Dense_0']
  np.testing.assert_allclose(got['kernel'], want[0], rtol=1e-4, atol=1e-5)
  np.testing.assert_allclose(got['bias'], want[1], rtol=1e-4, atol=1e-5)
  # Without the proximal term, or with clients starting from theta_{t-1}
  # (FedAvgM), the three rounds end elsewhere: the test tells them apart.
  for other in (reference(beta=0.0), reference(beta=beta, lookahead=False)):
    assert np.max(np.abs(other[0] - want[0])) > 1e-3
  assert float(metrics['train_prox_sum']) > 0.0


@pytest.mark.parametrize('name', ['scaffold', 'moon', 'fedrcl', 'pmfl'])
def test_wraps_any_client_method_the_same_under_every_executor(name):
  """FedAGM over stateful client methods (control variates, previous local
  models, multi-level features, participation counters): finite, trains,
  the same state from the vmap and host executors, a padding slot and a
  round nobody joins included."""
  images, labels, parts, data = fx.dirichlet_federation()
  model = fx.all_outputs()
  server = optimizers.make_server_optimizer('fedagm', momentum=0.85)
  kwargs = {'weighting': 'uniform'}
  base = algorithms.REGISTRY[name](model, server_optimizer=server, **kwargs)
  alg = fedagm.accelerate(base, server, beta=0.01)
  variables = fx.init_variables(model, images)
  cohorts = fx.round_cohorts(alg, parts, labels, [[0, 1, 3], [1, 2], []])
  spec = fx.make_spec(alg, lr=0.05)
  results = {}
  for run in ('vmap', 'host'):
    state, table = engine.init_state(alg, variables, len(parts))
    round_fn = executors.make_round_fn(
      spec, data, executor=run, steps_per_call=1
    )
    for cohort in cohorts:
      state, table, metrics = round_fn(state, table, cohort)
      assert np.isfinite(float(metrics['train_loss_sum'])), (name, run)
    results[run] = (state, table)
  assert fx.max_abs_diff(results['vmap'][0].variables, variables) > 1e-4
  difference = fx.max_abs_diff(results['vmap'], results['host'])
  assert difference < fx.executor_tolerance(), difference


def test_no_momentum_and_no_proximal_term_is_the_client_method_itself():
  """With lambda = 0 the lookahead is the global model and with beta = 0
  the loss is unchanged: one FedAvg round, to float rounding."""
  images, labels, parts, data = fx.dirichlet_federation()
  model = fx.all_outputs()
  server = optimizers.make_server_optimizer('sgd')
  variables = fx.init_variables(model, images)
  ends = []
  for alg in (
    fedavg.build(model, server_optimizer=server),
    fedagm.accelerate(
      fedavg.build(model, server_optimizer=server), server, beta=0.0
    ),
  ):
    (cohort,) = fx.round_cohorts(alg, parts, labels, [[0, 2]])
    state, table = engine.init_state(alg, variables, len(parts))
    round_fn = executors.make_round_fn(
      fx.make_spec(alg, lr=0.05), data, executor='vmap'
    )
    ends.append(round_fn(state, table, cohort)[0].variables)
  assert fx.max_abs_diff(*ends) < 1e-6


def test_a_packaged_config_takes_fedagm_from_its_argument():
  """``:server=fedagm`` puts any supervised config's clients behind FedAGM
  at the authors' values; without momentum it is refused in one line."""
  config = fm.get_config('fedrcl', 'server=fedagm,runlocal')
  assert (config.server.optimizer, config.server.momentum) == ('fedagm', 0.85)
  assert config.server.fedagm_beta == 0.002
  images, labels, parts, data = fx.dirichlet_federation()
  model = fx.all_outputs()
  alg = assemble.build_algorithm(config, model)
  (cohort,) = fx.round_cohorts(alg, parts, labels, [[0, 2]])
  state, table = engine.init_state(
    alg, fx.init_variables(model, images), len(parts)
  )
  round_fn = executors.make_round_fn(
    fx.make_spec(alg, lr=0.05), data, executor='vmap'
  )
  _, _, metrics = round_fn(state, table, cohort)
  assert float(metrics['train_prox_sum']) > 0.0  # The wrapper is on.
  with config.unlocked():
    config.server.momentum = 0.0
  with pytest.raises(ValueError, match='server.momentum > 0'):
    assemble.build_algorithm(config, model)
  with pytest.raises(ValueError, match='Unknown server method'):
    fm.get_config('fedavg', 'server=fedadamm')
