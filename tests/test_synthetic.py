"""Synthetic(alpha, beta) against its definition, and its determinism.

Li et al., 'Federated Optimization in Heterogeneous Networks' (FedProx),
MLSys 2020, Sec. 5.1, as in the authors' released generator. Every
statistical check's tolerance is a number of standard errors computed from
its sample size (Z = 5: a correct generator fails one check in ~10^6); each
test says which bug it catches, and some check that explicitly.
"""

import os
import subprocess
import sys

import numpy as np
import pytest
from scipy import stats

from fedjax_metric.data import synthetic

Z = 5.0
SPEC = synthetic.SyntheticSpec()
# alpha != beta, and alpha^2 != alpha: a swap of the two, or alpha read as a
# variance, moves the moments by many standard errors.
SKEWED = synthetic.SyntheticSpec(alpha=0.5, beta=1.5)
D = SPEC.num_features
SIGMA = np.arange(1, D + 1, dtype=np.float64) ** -1.2


def assert_mean(values, mean, std, what):
  """The sample mean of iid ``values`` is ``mean`` within Z standard errors."""
  values = np.asarray(values, np.float64).reshape(-1)
  error = std / np.sqrt(values.size)
  assert abs(values.mean() - mean) < Z * error, (what, values.mean(), mean)


def assert_variance(values, variance, what):
  """The sample variance of iid normals is ``variance`` within Z standard
  errors: sd of a normal sample's variance = variance * sqrt(2 / (n - 1))."""
  values = np.asarray(values, np.float64).reshape(-1)
  error = variance * np.sqrt(2 / (values.size - 1))
  got = values.var(ddof=1)
  assert abs(got - variance) < Z * error, (what, got, variance)
  return got, error


def differ(a, b):
  """Other draws: equal floats by chance only (a float32 normal takes one
  value with probability ~2^-24)."""
  return np.mean(a == b) < 1e-3


# ---- sizes -------------------------------------------------------------


def size_tail_z(sizes, mean, sigma, offset):
  """Largest |z| of the tail frequencies P(n - offset >= t) against
  P(floor(X) >= t) = P(X >= t) = sf((ln t - mean) / sigma), X log-normal."""
  worst = 0.0
  for t in (1, 20, 55, 150, 1000, 20000):
    p = stats.norm.sf((np.log(t) - mean) / sigma)
    got = np.mean(sizes - offset >= t)
    worst = max(worst, abs(got - p) / np.sqrt(p * (1 - p) / sizes.size))
  return worst


def test_sizes_follow_the_log_normal_plus_offset_and_the_cap():
  n = 200_000
  ids = np.arange(n)
  uncapped = synthetic.client_sizes(SPEC._replace(max_examples=None), 0, ids)
  assert uncapped.dtype == np.int64 and uncapped.shape == (n,)
  assert uncapped.min() >= 50
  assert size_tail_z(uncapped, 4.0, 2.0, 50) < Z
  # The check can fail: a wrong sigma or a missing offset is rejected.
  assert size_tail_z(uncapped, 4.0, 1.8, 50) > 4 * Z
  assert size_tail_z(uncapped, 4.0, 2.0, 0) > 4 * Z
  # The cap clips the same draws and nothing else.
  capped = synthetic.client_sizes(SPEC, 0, ids)
  np.testing.assert_array_equal(capped, np.minimum(uncapped, 1000))
  p = stats.norm.sf((np.log(950) - 4.0) / 2.0)  # floor(X) + 50 >= 1000
  assert_mean(capped == 1000, p, np.sqrt(p * (1 - p)), 'share at the cap')


def test_sizes_are_a_pure_function_of_seed_population_and_id():
  ids = np.array([0, 5, 10**6, 10**7 - 1, 2**32 - 1])
  sizes = synthetic.client_sizes(SPEC, 3, ids)
  np.testing.assert_array_equal(
    synthetic.client_sizes(SPEC, 3, ids[::-1]), sizes[::-1]
  )
  np.testing.assert_array_equal(
    synthetic.client_sizes(SPEC, 3, ids[2:3]), sizes[2:3]
  )
  many = np.arange(1000)
  train = synthetic.client_sizes(SPEC, 3, many)
  assert np.mean(train == synthetic.client_sizes(SPEC, 4, many)) < 0.2
  held = synthetic.client_sizes(SPEC, 3, many, held_out=True)
  assert np.mean(train == held) < 0.2
  with pytest.raises(ValueError):
    synthetic.client_sizes(SPEC, 3, [-1])
  with pytest.raises(ValueError):
    synthetic.client_sizes(SPEC, 2**32, [0])
  with pytest.raises(TypeError):
    synthetic.client_sizes(SPEC, 0, [0.5])


# ---- the clients' latent variables --------------------------------------


def test_client_prior_alpha_and_beta_are_standard_deviations():
  n = 4000
  params = synthetic.client_parameters(SKEWED, 0, np.arange(n))
  assert params.w.shape == (n, D, 10) and params.b.shape == (n, 10)
  assert params.v.shape == (n, D) and params.u.shape == (n,)
  # u_k ~ N(0, alpha^2), B_k ~ N(0, beta^2): the code's np.random.normal(0,
  # alpha) takes a standard deviation.
  assert_mean(params.u, 0.0, SKEWED.alpha, 'mean u')
  assert_mean(params.big_b, 0.0, SKEWED.beta, 'mean B')
  var_u, error = assert_variance(params.u, SKEWED.alpha**2, 'var u')
  assert_variance(params.big_b, SKEWED.beta**2, 'var B')
  # The check can fail: alpha read as a variance (0.5 instead of 0.25), or
  # alpha and beta swapped (2.25), is many standard errors away.
  assert abs(var_u - SKEWED.alpha) > 4 * Z * error
  assert abs(var_u - SKEWED.beta**2) > 4 * Z * error
  assert abs(np.corrcoef(params.u, params.big_b)[0, 1]) < Z / np.sqrt(n)
  # W_k, b_k entries ~ N(u_k, 1) (mean_b = mean_W: with b's mean 0, b - u
  # would have variance 1 + alpha^2); v_k entries ~ N(B_k, 1).
  w_noise = params.w - params.u[:, None, None]
  assert_mean(w_noise, 0.0, 1.0, 'W - u')
  assert_variance(w_noise, 1.0, 'W - u')
  b_noise = params.b - params.u[:, None]
  assert_mean(b_noise, 0.0, 1.0, 'b - u')
  assert_variance(b_noise, 1.0, 'b - u')
  v_noise = params.v - params.big_b[:, None]
  assert_mean(v_noise, 0.0, 1.0, 'v - B')
  assert_variance(v_noise, 1.0, 'v - B')
  # Held-out clients are other draws: held-out client k is not client k.
  held = synthetic.client_parameters(SKEWED, 0, np.arange(n), held_out=True)
  assert abs(np.corrcoef(held.w.ravel(), params.w.ravel())[0, 1]) < Z / np.sqrt(
    params.w.size
  )
  assert_variance(held.u, SKEWED.alpha**2, 'held-out var u')


# ---- examples ----------------------------------------------------------


def client_block(spec, clients, per_client, seed=0):
  """Examples 0 .. per_client - 1 of each client: (x [c, p, d], y [c, p])."""
  ids = np.repeat(clients, per_client)
  positions = np.tile(np.arange(per_client), len(clients))
  x, y = synthetic.client_examples(spec, seed, ids, positions)
  shape = (len(clients), per_client)
  return np.asarray(x).reshape(shape + (-1,)), np.asarray(y).reshape(shape)


def log_variance_slope(x):
  """(slope, standard error) of log Var(x_j) against log j, the variance
  within each client pooled over clients. A normal sample variance of n
  values has log-sd ~ sqrt(2 / (n - 1)); a least-squares slope's sd is that
  over sqrt(sum (log j - mean)^2)."""
  clients, per_client, d = x.shape
  variance = x.var(axis=1, ddof=1).mean(axis=0)
  log_j = np.log(np.arange(1, d + 1))
  slope = np.polyfit(log_j, np.log(variance), 1)[0]
  sd = np.sqrt(2 / (clients * (per_client - 1)))
  return slope, sd / np.sqrt(np.sum((log_j - log_j.mean()) ** 2))


def test_examples_follow_the_client_parameters():
  clients = np.array([7, 1000, 123456, 2**31])
  per_client = 2500
  x, y = client_block(SKEWED, clients, per_client)
  assert x.dtype == np.float32 and y.dtype == np.int32
  params = synthetic.client_parameters(SKEWED, 0, clients)
  # x ~ N(v_k, Sigma): standardised, every entry is N(0, 1), and each
  # client's per-feature mean is v_k within sqrt(Sigma_jj / n).
  noise = (x - params.v[:, None, :]) / np.sqrt(SIGMA)
  assert_mean(noise, 0.0, 1.0, 'x - v')
  assert_variance(noise, 1.0, '(x - v) / sqrt(Sigma)')
  mean_error = (x.mean(axis=1) - params.v) / np.sqrt(SIGMA / per_client)
  assert np.abs(mean_error).max() < Z
  # Sigma_jj = j^-1.2: the log-log slope of the within-client variances.
  slope, error = log_variance_slope(x)
  assert abs(slope + 1.2) < Z * error, (slope, error)
  # y = argmax(W_k^T x + b_k), recomputed in float64; a float32 label may
  # differ only where two logits tie to float32 precision.
  logits = np.einsum(
    'cpd,cdk->cpk', x.astype(np.float64), params.w.astype(np.float64)
  ) + params.b[:, None, :].astype(np.float64)
  expected = logits.argmax(-1)
  top2 = np.sort(logits, axis=-1)[..., -2:]
  differ = expected != y
  assert np.all(top2[..., 1][differ] - top2[..., 0][differ] < 1e-3)
  assert differ.mean() < 1e-3
  # One scalar u_k shifts every class's logit by u_k * (sum_j x_j + 1), so
  # it cannot move a label; a mean per entry of W_k (an alternative reading
  # of the paper) would: with independent u_kc ~ N(0, alpha^2) per class
  # many labels change, which the alpha test below would catch.
  shift = np.sum(x, axis=-1, keepdims=True) + 1.0
  assert np.array_equal(
    (logits + params.u[:, None, None] * shift).argmax(-1), expected
  )
  per_class = np.random.default_rng(0).normal(0, SKEWED.alpha, (4, 1, 10))
  assert np.mean((logits + per_class * shift).argmax(-1) != expected) > 0.05


def test_covariance_check_rejects_a_wrong_exponent():
  # The slope check of the test above, on data made with Sigma_jj = j^-1:
  # -1.2 is rejected by far.
  x, _ = client_block(SKEWED._replace(cov_exponent=1.0), np.arange(4), 2500)
  slope, error = log_variance_slope(x)
  assert abs(slope + 1.0) < Z * error
  assert abs(slope + 1.2) > 10 * Z * error


def test_labels_do_not_depend_on_alpha_and_skew_grows_with_beta():
  # u_k adds u_k * (sum_j x_j + 1) to every logit (W_k's and b_k's entries
  # share the scalar mean u_k), so the argmax, and thus every client's
  # label histogram, is the same at alpha = 0 and 1 up to float ties. (A
  # mean per class would break this: see the examples test.)
  clients = np.arange(2000)
  counts = {
    (a, b): synthetic.client_label_counts(
      SPEC._replace(alpha=a, beta=b), 0, clients, 32
    )
    for a, b in ((0.0, 0.0), (1.0, 0.0), (0.0, 2.0))
  }
  same = counts[0.0, 0.0] == counts[1.0, 0.0]
  assert same.all(axis=1).mean() > 0.99
  # Label skew grows with beta: |v_k| grows, W_k^T v_k dominates the
  # within-client noise W_k^T (x - v_k). The majority class's share, paired
  # per client (same W_k noise), rises by more than Z standard errors.
  share = {k: c.max(axis=1) / c.sum(axis=1) for k, c in counts.items()}
  rise = share[0.0, 2.0] - share[0.0, 0.0]
  assert rise.mean() > Z * rise.std() / np.sqrt(rise.size), rise.mean()
  # Already skewed at beta = 0 (the paper's Synthetic(0, 0)): on average
  # one class holds over 70% of a client's labels (measured: 82%).
  assert share[0.0, 0.0].mean() > 0.7


def test_iid_variant_shares_one_model_and_a_zero_input_mean():
  spec = SPEC._replace(iid=True, alpha=0.0, beta=0.0)
  params = synthetic.client_parameters(spec, 1, np.arange(50))
  held = synthetic.client_parameters(spec, 1, np.arange(50), held_out=True)
  for p in (params, held):
    np.testing.assert_array_equal(p.w, np.broadcast_to(params.w[0], p.w.shape))
    np.testing.assert_array_equal(p.b, np.broadcast_to(params.b[0], p.b.shape))
    np.testing.assert_array_equal(p.v, 0.0)
  assert_mean(params.w[0], 0.0, 1.0, 'shared W')
  x, y = client_block(spec, np.arange(10), 200, seed=1)
  assert_mean(x / np.sqrt(SIGMA), 0.0, 1.0, 'iid x')
  # One model for everyone: labels are far less skewed than non-iid ones.
  assert len(np.unique(y)) >= 5


# ---- determinism -------------------------------------------------------

CHILD = """
import sys
import numpy as np
from fedjax_metric.data import synthetic
spec = synthetic.SyntheticSpec(alpha=0.5, beta=1.5)
ids = np.array([3, 3, 10**6 + 7, 2**32 - 1, 0, 3])
positions = np.array([0, 999, 5, 2**31, 17, 4])
x, y = synthetic.client_examples(spec, 11, ids, positions)
np.savez(sys.argv[1], x=np.asarray(x), y=np.asarray(y),
         sizes=synthetic.client_sizes(spec, 11, ids))
"""


def test_same_examples_in_another_process(tmp_path):
  out = str(tmp_path / 'child.npz')
  env = dict(os.environ)
  root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  env['PYTHONPATH'] = root + os.pathsep + env.get('PYTHONPATH', '')
  subprocess.run([sys.executable, '-c', CHILD, out], check=True, env=env)
  child = np.load(out)
  ids = np.array([3, 3, 10**6 + 7, 2**32 - 1, 0, 3])
  positions = np.array([0, 999, 5, 2**31, 17, 4])
  # Here in another order and batch: ask for them reversed, with others.
  order = np.arange(6)[::-1]
  x, y = synthetic.client_examples(
    SKEWED,
    11,
    np.concatenate([ids[order], [42, 43]]),
    np.concatenate([positions[order], [1, 2]]),
  )
  x, y = np.asarray(x)[:6][::-1], np.asarray(y)[:6][::-1]
  assert child['x'].tobytes() == x.tobytes()  # bit for bit
  np.testing.assert_array_equal(child['y'], y)
  np.testing.assert_array_equal(
    child['sizes'], synthetic.client_sizes(SKEWED, 11, ids)
  )


def mixed_batch(client, positions, others, seed=0):
  """(ids, positions, rows): the client's positions shuffled among
  ``others`` examples of random clients; rows[i] is where position i went."""
  rng = np.random.default_rng(seed)
  ids = np.concatenate(
    [np.full(len(positions), client), rng.integers(0, 10**7, others)]
  )
  pos = np.concatenate([positions, rng.integers(0, 1000, others)])
  perm = rng.permutation(ids.size)
  return ids[perm], pos[perm], np.argsort(perm)[: len(positions)]


def test_a_clients_examples_do_not_depend_on_the_batch():
  client, positions = 31337, np.arange(64)
  alone_x, alone_y = synthetic.client_examples(SKEWED, 0, client, positions)
  alone_x, alone_y = np.asarray(alone_x), np.asarray(alone_y)
  # Shuffled among 300 other clients' examples (another compiled shape).
  ids, pos, rows = mixed_batch(client, positions, 300)
  x, y = synthetic.client_examples(SKEWED, 0, ids, pos)
  assert np.asarray(x)[rows].tobytes() == alone_x.tobytes()
  np.testing.assert_array_equal(np.asarray(y)[rows], alone_y)
  # In two halves.
  first, _ = synthetic.client_examples(SKEWED, 0, client, positions[:32])
  second, _ = synthetic.client_examples(SKEWED, 0, client, positions[32:])
  halves = np.concatenate([np.asarray(first), np.asarray(second)])
  assert halves.tobytes() == alone_x.tobytes()
  # In a batch of more than one block of the generator (its lax.map path):
  # bit for bit with XLA's default code generation (the subprocess test
  # below); this suite's older XLA CPU emitters may move it a few ulps.
  ids, pos, rows = mixed_batch(client, positions, synthetic._BLOCK + 600)
  x, y = synthetic.client_examples(SKEWED, 0, ids, pos)
  np.testing.assert_allclose(np.asarray(x)[rows], alone_x, rtol=1e-6, atol=1e-6)
  np.testing.assert_array_equal(np.asarray(y)[rows], alone_y)
  # Other positions, seeds and populations are other examples.
  other_seed, _ = synthetic.client_examples(SKEWED, 1, client, positions)
  held, _ = synthetic.client_examples(
    SKEWED, 0, client, positions, held_out=True
  )
  assert differ(np.asarray(other_seed), alone_x)
  assert differ(np.asarray(held), alone_x)
  assert differ(alone_x[1:], alone_x[:-1])


BATCHES_CHILD = """
import numpy as np
from fedjax_metric.data import synthetic
spec = synthetic.SyntheticSpec(alpha=0.5, beta=1.5)
client, positions = 31337, np.arange(64)
alone, _ = synthetic.client_examples(spec, 0, client, positions)
for others in (300, 2 * synthetic._BLOCK):
  rng = np.random.default_rng(others)
  ids = np.concatenate([np.full(64, client), rng.integers(0, 10**7, others)])
  pos = np.concatenate([positions, rng.integers(0, 1000, others)])
  perm = rng.permutation(ids.size)
  x, _ = synthetic.client_examples(spec, 0, ids[perm], pos[perm])
  rows = np.argsort(perm)[:64]
  assert np.asarray(x)[rows].tobytes() == np.asarray(alone).tobytes(), others
"""


def test_bit_identical_in_any_batch_with_default_xla_settings():
  # A process with JAX's and XLA's defaults (the suite's compile-speed
  # settings removed): the library's claim, for one and several blocks.
  env = dict(os.environ)
  for name in ('XLA_FLAGS', 'JAX_DISABLE_MOST_OPTIMIZATIONS'):
    env.pop(name, None)
  root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  env['PYTHONPATH'] = root + os.pathsep + env.get('PYTHONPATH', '')
  subprocess.run([sys.executable, '-c', BATCHES_CHILD], check=True, env=env)


def test_label_counts_count_the_first_examples():
  clients = np.arange(100, 150)
  m = 64  # ~25% of the clients have fewer than 64 examples (min 50)
  counts = synthetic.client_label_counts(
    SKEWED, 0, clients, m, chunk_clients=16
  )
  sizes = synthetic.client_sizes(SKEWED, 0, clients)
  take = np.minimum(sizes, m)
  assert 0 < np.sum(sizes < m) < len(clients)
  np.testing.assert_array_equal(counts.sum(axis=1), take)
  _, y = client_block(SKEWED, clients, m)
  expected = np.stack(
    [np.bincount(y[i, : take[i]], minlength=10) for i in range(len(clients))]
  )
  np.testing.assert_array_equal(counts, expected)


# ---- held-out clients ---------------------------------------------------


def test_held_out_data_and_test_set():
  data = synthetic.held_out_client_data(SKEWED, 5, [0, 1, 2])
  sizes = synthetic.client_sizes(SKEWED, 5, [0, 1, 2], held_out=True)
  np.testing.assert_array_equal(data.sizes, sizes)
  assert data.x.shape == (3, sizes.max(), D)
  np.testing.assert_array_equal(data.mask.sum(axis=1), sizes)
  assert not data.x[~data.mask].any()
  x, y = synthetic.test_set(SKEWED, 5, 3)
  assert x.shape == (sizes.sum(), D) and y.shape == (sizes.sum(),)
  np.testing.assert_array_equal(x, data.x[data.mask])
  np.testing.assert_array_equal(y, data.y[data.mask])
  # The same examples as client_examples(held_out=True) makes; not the
  # training clients'.
  one_x, one_y = synthetic.client_examples(
    SKEWED, 5, 1, np.arange(sizes[1]), held_out=True
  )
  np.testing.assert_array_equal(data.x[1, : sizes[1]], np.asarray(one_x))
  np.testing.assert_array_equal(data.y[1, : sizes[1]], np.asarray(one_y))
  train = synthetic.client_data(SKEWED, 5, [1])
  n = min(sizes[1], train.sizes[0])
  assert differ(train.x[0, :n], data.x[1, :n])
