"""PMFL inside real rounds, vs float64 NumPy loops.

The server (Algorithm 2, Eqs. 9-11, with Eq. 8 as a float running mean) and
the printed equations; the client (Algorithm 1, Eqs. 4-5) with its buffer,
on a linear projection model whose gradient is taken by central finite
differences of a loop-based l_con (Eq. 4); and the options it refuses.
"""

import fl_fixtures as fx
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fedjax_metric import algorithms, engine, models
from fedjax_metric.algorithms import pmfl
from fedjax_metric.contract import RunFacts

from .participation_helpers import (
  NUM_CLIENTS,
  client_xy,
  kernel_bias,
  local_delta,
  run_rounds,
  server,
)

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
