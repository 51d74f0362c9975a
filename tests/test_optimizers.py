"""fedjax_metric/optimizers.py: the client and server optimizers against
the formulas they implement (torch.optim.SGD, Reddi et al.'s FedAdam,
FedAvgM, FedHyper-G's global rate), and the round schedules."""

from algorithms.test_fedhyper import numpy_fedhyper
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from fedjax_metric import optimizers


def test_client_sgd_weight_decay_momentum_and_clipping_match_torch_formula():
  """torch.optim.SGD: g += wd * w; b = mu * b + g; w -= lr * b, after
  clip_grad_norm_(max_norm): g *= min(1, max_norm / ||g||)."""
  lr, mu, wd, clip = 0.1, 0.9, 0.01, 0.5
  tx = optimizers.make_client_optimizer(
    'sgd', momentum=mu, weight_decay=wd, grad_clip_norm=clip
  )(lr)
  w = np.array([1.0, -2.0, 0.5])
  grads = [np.array([3.0, 0.0, 4.0]), np.array([0.1, 0.2, -0.1])]
  params = jnp.asarray(w, jnp.float32)
  state = tx.init(params)
  buf = np.zeros(3)
  for g in grads:
    updates, state = tx.update(jnp.asarray(g, jnp.float32), state, params)
    params = optax.apply_updates(params, updates)
    g = g * min(1.0, clip / np.linalg.norm(g))
    g = g + wd * w
    buf = mu * buf + g
    w = w - lr * buf
  np.testing.assert_allclose(params, w, rtol=1e-5)


def test_round_schedules():
  exp = optimizers.make_round_schedule(
    0.1, kind='exponential', decay_rate=0.998
  )
  np.testing.assert_allclose(exp(10), 0.1 * 0.998**10, rtol=1e-6)
  cos = optimizers.make_round_schedule(0.1, kind='cosine', num_rounds=10)
  np.testing.assert_allclose(cos(5), 0.05, rtol=1e-5)
  with pytest.raises(ValueError, match='schedule'):
    optimizers.make_round_schedule(0.1, kind='linear')


def test_fedadam_first_step_matches_reddi_formula():
  """Reddi et al. Alg. 2 with bias correction, first round from zero state:
  m = g, v = g^2 -> x -= lr * g / (|g| + tau)."""
  tx = optimizers.make_server_optimizer('adam', learning_rate=0.01, eps=1e-3)
  x = jnp.array([1.0, 2.0])
  g = np.array([0.5, -0.02])
  updates, _ = tx.update(jnp.asarray(g, jnp.float32), tx.init(x), x)
  np.testing.assert_allclose(updates, -0.01 * g / (np.abs(g) + 1e-3), rtol=1e-5)


def test_fedavgm_momentum_accumulates():
  tx = optimizers.make_server_optimizer('sgd', learning_rate=1.0, momentum=0.9)
  x = jnp.zeros(2)
  state = tx.init(x)
  g = jnp.array([1.0, -1.0])
  u1, state = tx.update(g, state, x)
  u2, state = tx.update(g, state, x)
  np.testing.assert_allclose(u1, -g)
  np.testing.assert_allclose(u2, -1.9 * g, rtol=1e-6)
  with pytest.raises(ValueError, match='FedYogi'):
    optimizers.make_server_optimizer('lamb')


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


@pytest.mark.parametrize('name', ['adam', 'yogi'])
def test_the_default_form_is_optax_itself(name):
  """form='optax' (the default) is optax.adam / optax.yogi, bit for bit."""
  rng = np.random.default_rng(0)
  grads = [jnp.asarray(rng.normal(size=(4, 3)), jnp.float32) for _ in range(5)]
  for kw in (dict(), dict(learning_rate=0.1, b1=0.8, b2=0.999, eps=1e-2)):
    ours = optimizers.make_server_optimizer(name, **kw)
    theirs = getattr(optax, name)(
      kw.get('learning_rate', 1.0),
      b1=kw.get('b1', 0.9),
      b2=kw.get('b2', 0.99),
      eps=kw.get('eps', 1e-3),
    )
    x = jnp.ones((4, 3))
    s_ours, s_theirs = ours.init(x), theirs.init(x)
    for g in grads:
      u_ours, s_ours = ours.update(g, s_ours, x)
      u_theirs, s_theirs = theirs.update(g, s_theirs, x)
      np.testing.assert_array_equal(u_ours, u_theirs)


def numpy_fedopt(grads, *, lr, b1, b2, eps, yogi, v0):
  """The authors' released FedAdam / FedYogi server (Keras' Adam, their
  Yogi) in NumPy float64: count 1 before the first round (their
  zero-gradient initialisation), eps added to sqrt(v) before the bias
  correction, m from 0 and v from v0."""
  m, v, t, steps = 0.0, v0, 1, []
  for g in grads:
    t += 1
    m = b1 * m + (1 - b1) * g
    if yogi:
      v = v - (1 - b2) * np.sign(v - g * g) * g * g
    else:
      v = b2 * v + (1 - b2) * g * g
    steps.append(
      -lr * np.sqrt(1 - b2**t) / (1 - b1**t) * m / (np.sqrt(v) + eps)
    )
  return steps


@pytest.mark.parametrize(
  'name, v0', [('adam', 0.0), ('yogi', 0.0), ('yogi', 0.5)]
)
def test_fedopt_form_follows_the_authors_equations(name, v0):
  rng = np.random.default_rng(1)
  grads = [rng.normal(size=(3, 2)) * 0.1 for _ in range(6)]
  hyper = dict(learning_rate=0.1, b1=0.9, b2=0.999, eps=1e-3)
  tx = optimizers.make_server_optimizer(
    name, form='fedopt', initial_accumulator=v0, **hyper
  )
  want = numpy_fedopt(
    grads,
    lr=0.1,
    b1=0.9,
    b2=0.999,
    eps=1e-3,
    yogi=name == 'yogi',
    v0=v0,
  )
  x = jnp.zeros((3, 2))
  state = tx.init(x)
  assert int(state[0].count) == 1  # their zero-gradient initialisation
  for g, step in zip(grads, want, strict=True):
    update, state = tx.update(jnp.asarray(g, jnp.float32), state, x)
    np.testing.assert_allclose(update, step, rtol=1e-4, atol=1e-8)


def test_fedopt_form_tau_is_optax_epsilon_hat():
  """First round (their step 2): Keras' eps placement is optax's with
  eps / sqrt(1 - b2^2); it differs from optax's own form by far more."""
  g = jnp.array([0.5, -0.02, 1e-4])
  b1, b2, tau = 0.9, 0.999, 1e-3
  fedopt = optimizers.make_server_optimizer(
    'adam', learning_rate=0.1, b1=b1, b2=b2, eps=tau, form='fedopt'
  )
  got, _ = fedopt.update(g, fedopt.init(g), g)
  m_hat = (1 - b1) * g / (1 - b1**2)
  v_hat = (1 - b2) * g * g / (1 - b2**2)
  eps_hat = tau / np.sqrt(1 - b2**2)
  # float32: 1 - b2^2 keeps ~4 of its digits
  np.testing.assert_allclose(
    got, -0.1 * m_hat / (np.sqrt(v_hat) + eps_hat), rtol=1e-4
  )
  optax_form = optimizers.make_server_optimizer(
    'adam', learning_rate=0.1, b1=b1, b2=b2, eps=tau
  )
  default, _ = optax_form.update(g, optax_form.init(g), g)
  assert abs(float(default[2] / got[2])) > 5  # the small coordinate


@pytest.mark.parametrize(
  'kw, match',
  [
    (dict(name='adam', form='keras'), "Unknown server.form 'keras'"),
    (dict(name='sgd', form='fedopt'), 'server.optimizer=adam or yogi'),
    (dict(name='fedagm', form='fedopt'), 'server.optimizer=adam or yogi'),
    (dict(name='fedhyper', form='fedopt'), 'server.optimizer=adam or yogi'),
    (dict(name='adam', form='fedopt', initial_accumulator=1.0), 'FedYogi'),
    (dict(name='yogi', initial_accumulator=1.0), 'server.form=fedopt'),
    (dict(name='sgd', initial_accumulator=1.0), 'initial_accumulator=0'),
    (
      dict(name='yogi', form='fedopt', initial_accumulator=-1.0),
      'a number >= 0',
    ),
  ],
)
def test_options_the_optimizer_does_not_read_are_refused(kw, match):
  name = kw.pop('name')
  with pytest.raises(ValueError, match=match) as error:
    optimizers.make_server_optimizer(name, **kw)
  assert len(str(error.value).splitlines()) == 1
