"""FedAU, MIFA, FedVarp and PMFL inside real rounds, vs float64 NumPy loops.

Every reference below is written from the papers' update rules and the
released FedAU code's bookkeeping (explicit interval lists, stored updates,
Algorithm 2's Q / R / x with Eq. 8 as a float running mean), with local
training re-derived by hand: softmax regression with full-batch SGD, and for
PMFL's contrastive term a linear projection model whose gradient is taken
by central finite differences of a loop-based l_con (Eq. 4).
"""

import fl_fixtures as fx
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fedjax_metric import (
  algorithms,
  engine,
  executors,
  memory,
  models,
  optimizers,
)
from fedjax_metric.algorithms import fedau, fedau_intervals, pmfl
from fedjax_metric.contract import RunFacts

PARTS = [np.arange(0, 6), np.arange(6, 16), np.arange(16, 24)]
NUM_CLIENTS = len(PARTS)
# Round 2 has nobody; client 0 is closed by the cutoff K = 2 in round 2.
ROUNDS = [[0, 2], [1], [], [0, 1, 2], [2], [0]]
STEPS, LR = 2, 0.4


def softmax_regression_grad(w, b, x, y):
  z = x @ w + b
  p = np.exp(z - z.max(-1, keepdims=True))
  err = p / p.sum(-1, keepdims=True) - y
  return x.T @ err / len(x), err.mean(0)


def client_xy(images, labels, k):
  x = images[PARTS[k]].reshape(len(PARTS[k]), -1).astype(np.float64) / 255
  return x, np.eye(fx.NUM_CLASSES)[labels[PARTS[k]]]


def local_delta(w, b, x, y, steps=STEPS, lr=LR):
  """Full-batch SGD from (w, b): the returned (dw, db) = local - global."""
  w_k, b_k = w.copy(), b.copy()
  for _ in range(steps):
    gw, gb = softmax_regression_grad(w_k, b_k, x, y)
    w_k, b_k = w_k - lr * gw, b_k - lr * gb
  return w_k - w, b_k - b


def run_rounds(
  alg,
  rounds,
  *,
  lr=LR,
  steps=STEPS,
  model=None,
  parts=PARTS,
  images=None,
  labels=None,
):
  """Runs ``rounds`` (lists of client ids) under the vmap executor."""
  if images is None:
    images, labels = fx.make_data(40)
  model = model or fx.linear()
  variables = fx.init_variables(model, images)
  data = engine.DeviceData(jnp.asarray(images), jnp.asarray(labels))
  state, table = engine.init_state(alg, variables, len(parts))
  round_fn = executors.make_round_fn(
    fx.make_spec(alg, lr=lr), data, executor='vmap'
  )
  with jax.default_matmul_precision('highest'):
    for r, ids in enumerate(rounds):
      c = fx.cohort(
        parts,
        ids,
        num_slots=len(parts),
        batch_size=10,
        epochs=steps,
        num_steps=steps,
        round_idx=r,
      )
      state, table, _ = round_fn(state, table, c)
  assert round_fn.jitted._cache_size() == 1  # Cohort sizes differ: 1 compile.
  return variables, state, table, images, labels


def kernel_bias(variables):
  p = variables['params']['Dense_0']
  return np.asarray(p['kernel'], np.float64), np.asarray(p['bias'], np.float64)


def server(eta):
  return optimizers.make_server_optimizer('sgd', learning_rate=eta)


# ---------------------------------------------------------------------------
# FedAU and the other aggregations of its released code.
# ---------------------------------------------------------------------------

PROBS = np.array([0.5, 0.25, 0.8])


def ref_fedau(images, labels, w, b, aggregation, *, eta, cutoff):
  """The released code's loop (github.com/IBM/fedau, main.py) in NumPy."""
  counters, intervals = [0] * NUM_CLIENTS, [[] for _ in range(NUM_CLIENTS)]
  omegas = []
  for ids in ROUNDS:
    sum_w, sum_b, round_omega = 0.0, 0.0, {}
    for n in range(NUM_CLIENTS):
      if n in ids:
        dw, db = local_delta(w, b, *client_xy(images, labels, n))
        if aggregation == 'adaptive':
          omega = np.mean(intervals[n]) if intervals[n] else 1.0
        elif aggregation == 'known_prob':
          omega = 1.0 / PROBS[n]
        else:
          omega = 1.0
        round_omega[n] = omega
        sum_w, sum_b = sum_w + omega * dw, sum_b + omega * db
        intervals[n].append(counters[n] + 1)
        counters[n] = 0
      else:
        counters[n] += 1
        if cutoff is not None and counters[n] >= cutoff:
          intervals[n].append(counters[n])
          counters[n] = 0
    omegas.append(round_omega)
    if aggregation == 'average_participating':
      if not ids:
        continue
      divisor = len(ids)
    else:
      divisor = NUM_CLIENTS
    w, b = w + eta * sum_w / divisor, b + eta * sum_b / divisor
  return w, b, counters, intervals, omegas


@pytest.mark.parametrize('aggregation', fedau.AGGREGATIONS)
def test_fedau_aggregations_match_numpy(aggregation):
  eta, cutoff = 1.5, 2
  alg = algorithms.REGISTRY['fedau'](
    fx.linear(),
    server_optimizer=server(eta),
    aggregation=aggregation,
    cutoff=cutoff,
    run=RunFacts(participation_probabilities=PROBS),
  )
  variables, state, _, images, labels = run_rounds(alg, ROUNDS)
  w, b, counters, intervals, omegas = ref_fedau(
    images, labels, *kernel_bias(variables), aggregation, eta=eta, cutoff=cutoff
  )
  got = state.variables['params']['Dense_0']
  np.testing.assert_allclose(got['kernel'], w, atol=2e-5)
  np.testing.assert_allclose(got['bias'], b, atol=2e-5)
  extra = state.extra
  np.testing.assert_array_equal(extra['counter'], counters)
  np.testing.assert_array_equal(
    extra['interval_count'], [len(i) for i in intervals]
  )
  np.testing.assert_array_equal(
    extra['interval_sum'], [sum(i) for i in intervals]
  )
  if aggregation == 'adaptive':
    # The hand table of the weights that scaled the updates (K = 2), and the
    # public host helper over the same participation mask.
    assert omegas == [
      {0: 1.0, 2: 1.0},
      {1: 1.0},
      {},
      {0: 1.5, 1: 2.0, 2: 1.5},
      {2: 4 / 3},
      {0: 4 / 3},
    ]
    mask = np.zeros((len(ROUNDS), NUM_CLIENTS), bool)
    for t, ids in enumerate(ROUNDS):
      mask[t, ids] = True
    table = fedau_intervals.interval_weights(mask, cutoff=cutoff)
    for t, round_omega in enumerate(omegas):
      for n in range(NUM_CLIENTS):
        assert table[t, n] == pytest.approx(round_omega.get(n, 0.0))
    assert int(state.round) == len(ROUNDS)


def test_fedau_average_participating_is_uniform_fedavg():
  images, labels = fx.make_data(40)
  results = []
  for make in (
    lambda: algorithms.REGISTRY['fedau'](
      fx.linear(),
      server_optimizer=server(1.0),
      aggregation='average_participating',
    ),
    lambda: algorithms.REGISTRY['fedavg'](
      fx.linear(), server_optimizer=server(1.0), weighting='uniform'
    ),
  ):
    _, state, _, _, _ = run_rounds(
      make(), ROUNDS[:4], images=images, labels=labels
    )
    results.append(state.variables)
  assert fx.max_abs_diff(*results) < 1e-6


def test_fedau_validation():
  with pytest.raises(ValueError, match='aggregation'):
    fedau.SPEC(fx.linear(), server_optimizer=server(1.0), aggregation='mean')
  with pytest.raises(ValueError, match='participation probabilities'):
    fedau.SPEC(
      fx.linear(), server_optimizer=server(1.0), aggregation='known_prob'
    )
  with pytest.raises(ValueError, match=r'\(0, 1\]'):
    fedau.SPEC(
      fx.linear(),
      server_optimizer=server(1.0),
      aggregation='known_prob',
      run=RunFacts(participation_probabilities=[0.5, 0.0, 1.0]),
    )
  with pytest.raises(ValueError, match='cutoff'):
    fedau.SPEC(fx.linear(), server_optimizer=server(1.0), cutoff=0)


# ---------------------------------------------------------------------------
# MIFA and FedVarp: one stored update per client in the client table.
# ---------------------------------------------------------------------------


def ref_stored_updates(images, labels, w, b, method, *, eta):
  y = [(np.zeros_like(w), np.zeros_like(b)) for _ in range(NUM_CLIENTS)]
  ybar = (np.zeros_like(w), np.zeros_like(b))
  for ids in ROUNDS:
    deltas = {n: local_delta(w, b, *client_xy(images, labels, n)) for n in ids}
    if method == 'mifa':
      for n in ids:
        y[n] = deltas[n]
      # Every round, also one nobody joins: the mean over all N clients.
      w = w + eta * np.mean([u[0] for u in y], 0)
      b = b + eta * np.mean([u[1] for u in y], 0)
      continue
    if not ids:
      continue
    v_w = np.mean([deltas[n][0] - y[n][0] for n in ids], 0) + ybar[0]
    v_b = np.mean([deltas[n][1] - y[n][1] for n in ids], 0) + ybar[1]
    w, b = w + eta * v_w, b + eta * v_b
    for n in ids:
      y[n] = deltas[n]
    ybar = (np.mean([u[0] for u in y], 0), np.mean([u[1] for u in y], 0))
  return w, b, y, ybar


@pytest.mark.parametrize('method', ['mifa', 'fedvarp'])
def test_stored_update_methods_match_numpy(method):
  eta = 0.8
  alg = algorithms.REGISTRY[method](fx.linear(), server_optimizer=server(eta))
  variables, state, table, images, labels = run_rounds(alg, ROUNDS)
  w, b, y, ybar = ref_stored_updates(
    images, labels, *kernel_bias(variables), method, eta=eta
  )
  got = state.variables['params']['Dense_0']
  np.testing.assert_allclose(got['kernel'], w, atol=2e-5)
  np.testing.assert_allclose(got['bias'], b, atol=2e-5)
  for n in range(NUM_CLIENTS):
    np.testing.assert_allclose(
      table['params']['Dense_0']['kernel'][n], y[n][0], atol=2e-5
    )
  if method == 'fedvarp':
    np.testing.assert_allclose(
      state.extra['ybar']['params']['Dense_0']['bias'], ybar[1], atol=2e-5
    )


def test_client_table_sizes_and_memory_check():
  model = fx.linear()
  images, _ = fx.make_data(8)
  variables = fx.init_variables(model, images)
  model_bytes = memory.tree_bytes(variables)
  for name in ('mifa', 'fedvarp'):
    alg = algorithms.REGISTRY[name](model, server_optimizer=server(1.0))
    assert memory.client_table_bytes(alg, variables, 250) == 250 * model_bytes
  alg = algorithms.REGISTRY['pmfl'](
    model, server_optimizer=server(1.0), buffer_size=5
  )
  # Five buffered models, the previous local model, two int32 counters.
  assert memory.client_table_bytes(alg, variables, 250) == 250 * (
    6 * model_bytes + 8
  )
  with pytest.raises(memory.MemoryBudgetError, match='250 clients'):
    memory.check_client_table_fits(
      memory.client_table_bytes(alg, variables, 250), 250, model_bytes
    )


# ---------------------------------------------------------------------------
# PMFL: the server (Algorithm 2, Eqs. 9-11).
# ---------------------------------------------------------------------------

PMFL_ROUNDS = [[0], [0, 2], [], [1, 2], [0, 1, 2]]


def ref_pmfl_server(
  images, labels, w, b, *, eta, cutoff, num_rounds, history, divide
):
  """Algorithm 2 with explicit Q, R and Eq. 8's running mean; Eq. 10 with the
  + sign, past models averaged over those that exist (none in round 0)."""
  q, r, x = [0] * NUM_CLIENTS, [0] * NUM_CLIENTS, [0.0] * NUM_CLIENTS
  past = []  # Newest first.
  for t, ids in enumerate(PMFL_ROUNDS):
    for k in range(NUM_CLIENTS):
      q[k] += 1
      if k in ids or q[k] == cutoff:
        x[k] = q[k] if r[k] == 0 else (r[k] * x[k] + q[k]) / (r[k] + 1)
        r[k] += 1
        q[k] = 0
    if not ids:
      continue  # The model and the history stay as they are.
    sum_w, sum_b = 0.0, 0.0
    for k in ids:
      dw, db = local_delta(w, b, *client_xy(images, labels, k))
      sum_w, sum_b = sum_w + x[k] * dw, sum_b + x[k] * db
    divisor = NUM_CLIENTS if divide else 1.0
    new_w, new_b = w + eta * sum_w / divisor, b + eta * sum_b / divisor
    available = past[: history - 1]
    if available:
      psi = 0.5 - t / (2 * (num_rounds - 1))
      new_w = (1 - psi) * new_w + psi * np.mean([p[0] for p in available], 0)
      new_b = (1 - psi) * new_b + psi * np.mean([p[1] for p in available], 0)
    past.insert(0, (w, b))
    w, b = new_w, new_b
  return w, b, q, r, x, min(len(past), history - 1)


@pytest.mark.parametrize('normalize,eta', [('num_clients', 1.0), ('none', 0.3)])
def test_pmfl_server_matches_algorithm_2(normalize, eta):
  # The linear model's representation is its input, so l_con has no
  # gradient and local training is plain SGD: this isolates the server.
  cutoff, num_rounds, history = 2, 5, 3
  alg = algorithms.REGISTRY['pmfl'](
    fx.linear(),
    server_optimizer=server(eta),
    cutoff=cutoff,
    run=RunFacts(num_rounds=num_rounds),
    history_size=history,
    normalize=normalize,
  )
  variables, state, _, images, labels = run_rounds(alg, PMFL_ROUNDS)
  w, b, q, r, x, num_past = ref_pmfl_server(
    images,
    labels,
    *kernel_bias(variables),
    eta=eta,
    cutoff=cutoff,
    num_rounds=num_rounds,
    history=history,
    divide=normalize == 'num_clients',
  )
  got = state.variables['params']['Dense_0']
  np.testing.assert_allclose(got['kernel'], w, atol=2e-5)
  np.testing.assert_allclose(got['bias'], b, atol=2e-5)
  extra = state.extra
  np.testing.assert_array_equal(extra['interval'], q)
  np.testing.assert_array_equal(extra['count'], r)
  np.testing.assert_allclose(
    pmfl.adaptive_weight(
      pmfl.AdaptiveState(
        extra['interval'], extra['count'], extra['interval_sum']
      )
    ),
    x,
    rtol=1e-6,
  )
  assert int(extra['history_count']) == num_past == 2
  # The public host helper over the same mask ends with the same weights.
  mask = np.zeros((len(PMFL_ROUNDS), NUM_CLIENTS), bool)
  for t, ids in enumerate(PMFL_ROUNDS):
    mask[t, ids] = True
  np.testing.assert_allclose(
    pmfl.adaptive_weights(mask, cutoff=cutoff)[-1], x, rtol=1e-6
  )


def printed_pmfl_server_step(w_t, past, locals_, x, *, eta, psi):
  """Zhang et al., 2025, Eqs. 9-11 exactly as printed, in NumPy:
  W^{t+1} = (1 - psi) (W^t - eta_g sum_k x_k Delta_k)
            + psi / (H - 1) sum_{h=1}^{H-1} W^{t-h},
  no 1 / N, and Delta_k = w_k^{(t+1)E} - w_k^{tE}, the local model minus
  the global one (Algorithm 1, line 10)."""
  step = sum(xk * (wk - w_t) for xk, wk in zip(x, locals_))
  return (1 - psi) * (w_t - eta * step) + psi / len(past) * sum(past)


@pytest.mark.parametrize('compensate', [False, True])
def test_pmfl_server_step_against_the_printed_equations(compensate):
  """One server step with a full global buffer (H = 3: W^{t-1}, W^{t-2})
  against the printed Eqs. 9-11. The library's readings, each visible
  here: the sign of Eq. 9 is flipped (the printed minus with Delta = local
  - global moves the global model away from the local ones: the library is
  the printed step at -eta_g, not at eta_g); ``normalize='none'`` has no
  1 / N, as printed, and ``'num_clients'`` is the step at eta_g / N;
  ``mixing_compensation`` divides the step by `pmfl.mixing_step_factor`."""
  rng = np.random.default_rng(0)
  num_clients, t, num_rounds, eta = 4, 3, 9, 0.7
  model = fx.linear()
  images, _ = fx.make_data(8)
  variables = fx.init_variables(model, images)
  w_t = np.asarray(variables['params']['Dense_0']['kernel'], np.float64)
  shape = w_t.shape
  past = [rng.normal(size=shape) for _ in range(2)]  # W^{t-1}, W^{t-2}
  ids = [0, 2]
  locals_ = [w_t + 0.1 * rng.normal(size=shape) for _ in ids]
  x = [3.0, 1.5]
  psi = 0.5 - t / (2 * (num_rounds - 1))
  for normalize, divisor in (('none', 1.0), ('num_clients', num_clients)):
    alg = algorithms.REGISTRY['pmfl'](
      model,
      server_optimizer=server(eta),
      run=RunFacts(num_rounds=num_rounds),
      normalize=normalize,
      mixing_compensation=compensate,
    )
    state = alg.init_server(variables, num_clients, jax.random.key(0))

    def kernel_tree(k, like):
      return jax.tree.map(
        lambda v: v,
        {
          **like,
          'params': {
            'Dense_0': {
              **like['params']['Dense_0'],
              'kernel': jnp.asarray(k, jnp.float32),
            }
          },
        },
      )

    zero_bias = jax.tree.map(jnp.zeros_like, variables)
    history = jax.tree.map(
      lambda *h: jnp.stack(h),
      *[kernel_tree(p, zero_bias) for p in past],
    )
    # The bias leaves of the past models are zero; the check reads kernels.
    extra = {
      **state.extra,
      'history': history,
      'history_count': jnp.asarray(2, jnp.int32),
    }
    state = state._replace(extra=extra, round=jnp.asarray(t, jnp.int32))
    update = sum(xk * (wk - w_t) for xk, wk in zip(x, locals_))
    update_sum = kernel_tree(update, zero_bias)
    aggregate = engine.Aggregate(
      update_sum,
      jnp.asarray(sum(x), jnp.float32),
      jnp.asarray(len(ids), jnp.float32),
      jnp.asarray(ids + [num_clients, num_clients], jnp.int32),
      jnp.asarray([True, True, False, False]),
    )
    with jax.default_matmul_precision('highest'):
      new = alg.server_update(state, aggregate, ())
    factor = float(pmfl.mixing_step_factor(psi, 2)) if compensate else 1.0
    got = new.variables['params']['Dense_0']['kernel']
    step = eta / (divisor * factor)
    want = printed_pmfl_server_step(w_t, past, locals_, x, eta=-step, psi=psi)
    np.testing.assert_allclose(got, want, atol=2e-6)
    literal = printed_pmfl_server_step(w_t, past, locals_, x, eta=step, psi=psi)
    assert np.abs(np.asarray(got) - literal).max() > 1e-2  # the sign differs


def test_mixing_step_factor_is_the_steady_drift_of_eq_10():
  """Iterate Eq. 10 with a constant update u at a fixed psi (H = 3) until
  the drift is steady: the global model then moves by factor * u a round;
  with `mixing_compensation`'s 1 / factor it moves by u."""
  u = 1.0
  for psi in (0.5, 0.25, 0.1, 0.0):
    factor = float(pmfl.mixing_step_factor(psi, 2))
    for scale, want in ((1.0, factor), (1.0 / factor, 1.0)):
      w = [0.0, 0.0, 0.0]  # W^{t-2}, W^{t-1}, W^t
      for _ in range(400):
        w_next = (1 - psi) * (w[-1] + scale * u) + psi * (w[-2] + w[-3]) / 2
        w = w[1:] + [w_next]
      assert abs((w[-1] - w[-2]) - want) < 1e-6, (psi, scale)  # float32
  # The paper's schedule (Eq. 11) averages to 0.58 over a run.
  psis = 0.5 - np.arange(1000) / (2 * 999)
  mean = np.mean([float(pmfl.mixing_step_factor(p, 2)) for p in psis])
  assert abs(mean - 0.577) < 0.003
  assert float(pmfl.mixing_step_factor(0.3, 0)) == 1.0


def test_pmfl_update_moves_towards_the_local_model():
  """The working sign: W^1 = W^0 + eta_g x Delta. With one participant in
  round 0 (x = Q* = 1), no history yet, eta_g = 1 and the printed form
  (no 1 / N), the new global model IS the client's local model; the
  printed minus sign would give 2 W^0 - w_local."""
  alg = algorithms.REGISTRY['pmfl'](
    fx.linear(), server_optimizer=server(1.0), normalize='none'
  )
  variables, state, _, images, labels = run_rounds(alg, [[1]])
  w0, b0 = kernel_bias(variables)
  dw, db = local_delta(w0, b0, *client_xy(images, labels, 1))
  got = state.variables['params']['Dense_0']
  np.testing.assert_allclose(got['kernel'], w0 + dw, atol=2e-6)
  np.testing.assert_allclose(got['bias'], b0 + db, atol=2e-6)
  assert np.abs(dw).max() > 1e-3


def test_pmfl_participant_weight_equals_adaptive_step():
  rng = np.random.default_rng(1)
  extra = {
    'interval': jnp.asarray(rng.integers(0, 9, 6), jnp.int32),
    'count': jnp.asarray(rng.integers(0, 4, 6), jnp.int32),
  }
  extra['interval_sum'] = extra['count'] * 3 + jnp.asarray(
    rng.integers(0, 3, 6), jnp.int32
  )
  _, x = pmfl.adaptive_step(
    pmfl.AdaptiveState(
      extra['interval'], extra['count'], extra['interval_sum']
    ),
    np.ones(6, bool),
    cutoff=50,
  )
  got = jax.vmap(lambda k: pmfl.participant_weight(extra, k))(jnp.arange(6))
  np.testing.assert_allclose(got, x, rtol=1e-6)


# ---------------------------------------------------------------------------
# PMFL: the client (Algorithm 1, Eqs. 4-5) with its buffer.
# ---------------------------------------------------------------------------


class TinyProjection(nn.Module):
  """z = x A + a (the 'projection'), logits = z B + b."""

  @nn.compact
  def __call__(self, images, *, train, mask=None):
    del train, mask
    z = nn.Dense(4, name='proj')(images.reshape(images.shape[0], -1))
    return {
      'logits': nn.Dense(fx.NUM_CLASSES, name='head')(z),
      'embedding': z,
      'projection': z,
      'features': [],
    }


def np_params(variables):
  p = variables['params']
  names = {
    'A': ('proj', 'kernel'),
    'a': ('proj', 'bias'),
    'B': ('head', 'kernel'),
    'b': ('head', 'bias'),
  }
  return {k: np.asarray(p[m][n], np.float64) for k, (m, n) in names.items()}


def np_z(p, x):
  return x @ p['A'] + p['a']


def np_cos(u, v):
  return float(u @ v / max(np.linalg.norm(u) * np.linalg.norm(v), 1e-8))


def np_loss(p, x, y, z_global, z_buffer, positive, lam, tau):
  """CE + lam * mean_i l_con_i with FIXED sets (Eq. 4 as loops)."""
  z = np_z(p, x)
  logits = z @ p['B'] + p['b']
  m = logits.max(1, keepdims=True)
  ce = np.mean(
    np.log(np.exp(logits - m).sum(1)) + m[:, 0] - logits[np.arange(len(y)), y]
  )
  con = []
  for i in range(len(x)):
    pos = np.exp(np_cos(z[i], z_global[i]) / tau)
    neg = 0.0
    for j, zb in enumerate(z_buffer):
      term = np.exp(np_cos(z[i], zb[i]) / tau)
      if positive[i][j]:
        pos += term
      else:
        neg += term
    con.append(-np.log(pos / (pos + neg)))
  return ce + lam * np.mean(con)


def np_grad(f, p, h=1e-6):
  grad = {}
  for k, v in p.items():
    g = np.zeros_like(v)
    for idx in np.ndindex(v.shape):
      up = {**p, k: v.copy()}
      down = {**p, k: v.copy()}
      up[k][idx] += h
      down[k][idx] -= h
      g[idx] = (f(up) - f(down)) / (2 * h)
    grad[k] = g
  return grad


def ref_pmfl_client(
  p_global,
  previous,
  buffer,
  x,
  y,
  *,
  threshold,
  steps,
  lr,
  lam,
  tau,
  size,
  counts,
):
  """One node's round: Algorithm 1 with the buffer {w^{tE+e-N} ..
  w^{tE+e-1}} (the pre-step models, kept across rounds)."""
  p = dict(p_global)
  z_global = np_z(p_global, x)
  for _ in range(steps):
    z_now = np_z(p, x)
    z_buffer = [np_z(m, x) for m in buffer]
    if threshold == 'previous':
      z_start = np_z(previous if previous is not None else p_global, x)
    elif threshold == 'current':
      z_start = z_now
    else:
      z_start = z_global
    positive = []
    for i in range(len(x)):
      mu = np_cos(z_start[i], z_global[i])
      positive.append([np_cos(z_now[i], zb[i]) >= mu for zb in z_buffer])
      counts['positive'] += sum(positive[-1])
      counts['negative'] += len(z_buffer) - sum(positive[-1])
    grad = np_grad(
      lambda q: np_loss(q, x, y, z_global, z_buffer, positive, lam, tau), p
    )
    buffer = (buffer + [p])[-size:]
    p = {k: p[k] - lr * grad[k] for k in p}
  return p, buffer


@pytest.mark.parametrize('threshold', pmfl.THRESHOLDS)
def test_pmfl_client_rounds_match_finite_difference_reference(threshold):
  lam, tau, lr, steps, size, num_rounds = 0.5, 0.5, 0.5, 3, 2, 4
  images, labels = fx.make_data(20, seed=3)
  parts = [np.arange(0, 8), np.arange(8, 16)]
  rounds = [[0], [0, 1]]
  model = models.make_model_fns(TinyProjection(), fx.INPUT_SHAPE)
  alg = algorithms.REGISTRY['pmfl'](
    model,
    server_optimizer=server(1.0),
    contrastive_weight=lam,
    temperature=tau,
    buffer_size=size,
    threshold=threshold,
    run=RunFacts(num_rounds=num_rounds),
  )
  variables, state, table, _, _ = run_rounds(
    alg,
    rounds,
    lr=lr,
    steps=steps,
    model=model,
    parts=parts,
    images=images,
    labels=labels,
  )

  def xy(k):
    return (
      images[parts[k]].reshape(len(parts[k]), -1).astype(np.float64) / 255,
      labels[parts[k]],
    )

  counts = {'positive': 0, 'negative': 0}
  history, previous, buffers = [], [None, None], [[], []]
  w = np_params(variables)
  x_weights = [[1.0], [1.0, 2.0]]  # Algorithm 2: x_0 = 1, then 1 and Q* = 2.
  for t, ids in enumerate(rounds):
    total = dict.fromkeys(w, 0.0)
    for slot, k in enumerate(ids):
      end, buffers[k] = ref_pmfl_client(
        w,
        previous[k],
        buffers[k],
        *xy(k),
        threshold=threshold,
        steps=steps,
        lr=lr,
        lam=lam,
        tau=tau,
        size=size,
        counts=counts,
      )
      previous[k] = end
      total = {n: total[n] + x_weights[t][slot] * (end[n] - w[n]) for n in w}
    new = {n: w[n] + total[n] / len(parts) for n in w}
    if history:
      psi = 0.5 - t / (2 * (num_rounds - 1))
      new = {n: (1 - psi) * new[n] + psi * history[0][n] for n in w}
    history.insert(0, w)
    w = new

  got = np_params(state.variables)
  for n in w:
    np.testing.assert_allclose(got[n], w[n], atol=1e-4, err_msg=n)
  # Rows: each node's buffer holds its last `size` pre-step models.
  for k in range(2):
    assert int(table['fill'][k]) == size
    rows = [
      np_params(jax.tree.map(lambda leaf: leaf[k], slot))
      for slot in table['buffer']
    ]
    for ref in buffers[k]:
      assert (
        min(max(np.abs(r[n] - ref[n]).max() for n in ref) for r in rows) < 1e-4
      )
  if threshold != 'start':
    assert counts['positive'] > 0 and counts['negative'] > 0, counts
  else:
    assert counts['positive'] == 0  # mu = 1: every buffered model negative.
  if threshold == 'previous':  # The term is active: lambda = 0 differs.
    plain = algorithms.REGISTRY['pmfl'](
      model,
      server_optimizer=server(1.0),
      contrastive_weight=0.0,
      buffer_size=size,
      run=RunFacts(num_rounds=num_rounds),
    )
    _, plain_state, _, _, _ = run_rounds(
      plain,
      rounds,
      lr=lr,
      steps=steps,
      model=model,
      parts=parts,
      images=images,
      labels=labels,
    )
    assert fx.max_abs_diff(plain_state.variables, state.variables) > 1e-3


def test_pmfl_loss_gradient_finite_with_empty_buffer_and_zero_model():
  model = models.make_model_fns(TinyProjection(), fx.INPUT_SHAPE)
  alg = algorithms.REGISTRY['pmfl'](model, server_optimizer=server(1.0))
  images, labels = fx.make_data(8)
  variables = jax.tree.map(jnp.zeros_like, fx.init_variables(model, images))
  state, table = engine.init_state(alg, variables, 1)
  row = jax.tree.map(lambda t: t[0], table)
  batch = engine.Batch(
    jnp.asarray(images, jnp.float32) / 255,
    jnp.asarray(labels),
    jnp.ones(8, bool),
    jnp.asarray(images),
  )
  ctx = fx.client_context(
    state, client_row=row, local_state=None, num_examples=8
  )
  _, local = alg.client_begin(ctx)
  ctx = ctx._replace(local_state=local)
  params, model_state = models.split_variables(variables)

  @jax.jit
  def grads(params, fill):
    ctx_fill = ctx._replace(local_state=dict(local, fill=fill))
    return jax.grad(
      lambda q: alg.client_loss(q, model_state, batch, ctx_fill)[0]
    )(params)

  for fill in (0, 3):  # Empty buffer; zero models in three slots.
    leaves = jax.tree.leaves(grads(params, jnp.int32(fill)))
    assert all(np.all(np.isfinite(g)) for g in leaves)


@pytest.mark.parametrize(
  'name,value',
  [
    ('threshold', 'mean'),
    ('normalize', 'sum'),
    ('buffer_size', 0),
    ('history_size', 0),
    ('cutoff', 0),
    ('temperature', 0.0),
    ('contrastive_weight', -1.0),
  ],
)
def test_pmfl_validation(name, value):
  with pytest.raises(ValueError, match=name):
    pmfl.SPEC(fx.linear(), server_optimizer=server(1.0), **{name: value})


def test_pmfl_refuses_a_run_of_no_rounds():
  with pytest.raises(ValueError, match='num_rounds'):
    pmfl.SPEC(
      fx.linear(), server_optimizer=server(1.0), run=RunFacts(num_rounds=0)
    )
