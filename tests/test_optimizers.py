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
