"""FedHyper (Wang, Wang and Li, ICLR 2024) against NumPy re-derivations.

FedHyper-G: alpha_t = clip(alpha_{t-1} + <Delta_t, Delta_{t-1}>, 0.2, 5) and
x_{t+1} = x_t + alpha_t Delta_t, Delta the round's averaged model update
(the authors' code, github.com/ATP-1010/FedHyper, federated_main.py); the
first round steps with the initial rate. FedHyper-CL (src/update.py): after
every local step but the first, with u the step taken,
gamma = min(1.1, 1 + 0.1 <u, Delta_{t-1}> / K + <u, g_prev>) and
beta = clip(gamma beta, 0.1, 10); the next step runs at eta_l beta.
"""

import fl_fixtures as fx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import fedjax_metric as fm
from fedjax_metric import algorithms, assemble, engine, executors, optimizers
from fedjax_metric.algorithms import fedavg, fedhyper
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


def numpy_local_rate_steps(lr, global_update, k):
  """FedHyper-CL's client loop in float64, as ``client_steps`` of
  `fl_fixtures.ref_softmax_regression_round`; records each client's betas."""
  betas = []

  def client_steps(start, batches, grad):
    w, b = start
    beta, previous = 1.0, global_update
    for step, (rows, real) in enumerate(batches):
      gw, gb = grad(w, b, rows, real)
      u = np.concatenate([(-lr * beta * gw).ravel(), (-lr * beta * gb).ravel()])
      w, b = w - lr * beta * gw, b - lr * beta * gb
      if step >= 1:
        gamma = min(
          1.1, 1 + 0.1 * float(u @ global_update) / k + float(u @ previous)
        )
        beta = min(max(gamma * beta, 0.1), 10.0)
        previous = u
    betas.append(beta)
    return w, b

  return client_steps, betas


@pytest.mark.parametrize('local', [False, True], ids=['G', 'G+CL'])
def test_fedavg_with_fedhyper_matches_the_equations_over_four_rounds(local):
  """Softmax-regression clients of unequal size, three full-batch steps, a
  round nobody joins in between: the server's models and rates (and with
  CL the clients' rate multipliers) are the hand-derived ones."""
  images, labels = fx.make_data(30, seed=4)
  parts = [np.arange(12), np.arange(12, 30)]
  model = fx.linear()
  server = optimizers.make_server_optimizer('fedhyper')
  alg = fedavg.build(model, server_optimizer=server)
  if local:
    alg = fedhyper.schedule_local(alg, expected_clients=2)
  joined = [[0, 1], [0, 1], [], [1]]
  cohorts = [
    cohort_lib.make_cohort(
      np.array(ids, np.int64),
      parts,
      num_slots=2,
      num_steps=3,
      batch_size=18,
      local_epochs=0,
      local_steps=3,
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
  rate, previous = 1.0, np.zeros(theta[0].size + theta[1].size)
  all_betas = []
  with jax.default_matmul_precision('highest'):
    round_fn = executors.make_round_fn(
      fx.make_spec(alg, lr=0.3), data, executor='vmap'
    )
    for r, cohort in enumerate(cohorts):
      state, table, _ = round_fn(state, table, cohort)
      steps, betas = numpy_local_rate_steps(0.3, previous, 2)
      delta = fx.ref_softmax_regression_round(
        theta,
        images,
        labels,
        cohort,
        lr=0.3,
        client_steps=steps if local else None,
      )
      all_betas += betas
      flat = np.concatenate([d.ravel() for d in delta])
      if flat.any():
        if r:
          rate = min(max(rate + float(flat @ previous), 0.2), 5.0)
        theta = [t + rate * d for t, d in zip(theta, delta)]
        previous = flat
      got = state.variables['params']['Dense_0']
      np.testing.assert_allclose(got['kernel'], theta[0], rtol=1e-4, atol=1e-5)
      np.testing.assert_allclose(got['bias'], theta[1], rtol=1e-4, atol=1e-5)
      np.testing.assert_allclose(state.opt_state.learning_rate, rate, rtol=1e-4)
  assert rate != 1.0  # the global schedule moved
  if local:  # the local one too, both ways
    assert max(all_betas) > 1.0 and min(all_betas) < 1.0, all_betas


def test_the_local_scheduler_needs_fedhyper_g():
  config = fm.get_config('fedavg', 'runlocal')
  config.unlock()
  config.server.fedhyper_local = True
  with pytest.raises(ValueError, match='server.optimizer=fedhyper'):
    assemble.build_algorithm(config, fx.linear())
  config.server.optimizer = 'fedhyper'
  alg = assemble.build_algorithm(config, fx.linear())
  state = alg.init_server(
    fx.init_variables(fx.linear(), fx.make_data(2)[0]), 2, jax.random.key(0)
  )
  assert isinstance(state.opt_state, optimizers.FedHyperState)
  with pytest.raises(ValueError, match='expected clients per round > 0'):
    fedhyper.schedule_local(alg, expected_clients=0)


def test_local_scheduler_wraps_a_stateful_method_the_same_under_every_executor():
  """FedHyper-CL over a method with its own per-step local state and client
  rows (PMFL's model buffer): finite, trains, the same state from the vmap,
  chunked and host executors, with a padding slot and a round nobody
  joins."""
  name = 'pmfl'
  images, labels, parts, data = fx.dirichlet_federation()
  model = fx.all_outputs()
  server = optimizers.make_server_optimizer('fedhyper')
  base = algorithms.REGISTRY[name](
    model, server_optimizer=server, weighting='uniform'
  )
  alg = fedhyper.schedule_local(base, expected_clients=3)
  variables = fx.init_variables(model, images)
  cohorts = fx.round_cohorts(alg, parts, labels, [[0, 1, 3], [1, 2], []])
  spec = fx.make_spec(alg, lr=0.05)
  results = {}
  for run in ('vmap', 'chunked', 'host'):
    state, table = engine.init_state(alg, variables, len(parts))
    round_fn = executors.make_round_fn(
      spec, data, executor=run, chunk_size=2, steps_per_call=1
    )
    for cohort in cohorts:
      state, table, metrics = round_fn(state, table, cohort)
      assert np.isfinite(float(metrics['train_loss_sum'])), (name, run)
    results[run] = (state, table)
  assert fx.max_abs_diff(results['vmap'][0].variables, variables) > 1e-4
  for run in ('chunked', 'host'):
    difference = fx.max_abs_diff(results['vmap'], results[run])
    assert difference < fx.executor_tolerance(), (run, difference)
