"""What the federated unsupervised algorithms' tests share.

A two-layer linear encoder + projector (no normalisation, so a NumPy
re-derivation is a few lines), its client contexts and batches, the two
views drawn with the same key by `make_two_view_augment` (tested in
tests/test_ssl_augment.py) and passed to the references as data, float64
NumPy references written with explicit loops, and central finite
differences for gradients (stop-gradient targets held fixed, as the
equations detach them).
"""

import math

import fl_fixtures as fx
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from fedjax_metric import engine, optimizers
from fedjax_metric.data import views
from fedjax_metric.models import make_model_fns

SERVER = optimizers.make_server_optimizer('sgd')
HIGHEST = 'highest'
D_IN, DIM = 36, 4  # 6x6x1 images; encoder and projector widths


class TwoLinear(nn.Module):
  """h = x W1 + b1 (encoder), p = h W2 + b2 (projector): no normalisation,
  so a NumPy re-derivation is a few lines."""

  @nn.compact
  def __call__(self, images, *, train, mask=None):
    del train, mask
    x = images.reshape(images.shape[0], -1)
    h = nn.Dense(DIM, name='enc')(x)
    return {
      'embedding': h,
      'projection': nn.Dense(DIM, name='proj')(h),
      'features': [],
    }


def two_linear():
  return make_model_fns(TwoLinear(), (1, 6, 6, 1))


def init(model, seed=0):
  return model.init(jax.random.key(seed))


def raw_batch(size=8, seed=0, padded=2):
  rng = np.random.default_rng(seed)
  raw = rng.integers(0, 256, (size, 6, 6, 1)).astype(np.uint8)
  mask = np.arange(size) < size - padded
  return raw, mask


def make_ctx(
  server_state,
  *,
  client_id=0,
  slot=0,
  key=None,
  num_steps=3.0,
  num_examples=20.0,
  client_row=(),
):
  return fx.client_context(
    server_state,
    client_row=client_row,
    key=jax.random.key(7) if key is None else key,
    client_id=client_id,
    slot=slot,
    num_steps=num_steps,
    num_examples=num_examples,
  )


def batch_of(raw, mask):
  return engine.Batch(
    jnp.zeros(raw.shape, jnp.float32),
    jnp.zeros(len(raw), jnp.int32),
    jnp.asarray(mask),
    jnp.asarray(raw),
  )


def np_params(variables):
  p = variables['params']
  return {
    k: {n: np.asarray(v, np.float64) for n, v in p[k].items()}
    for k in ('enc', 'proj')
  }


def np_forward(theta, x):
  h = x.reshape(len(x), -1) @ theta['enc']['kernel'] + theta['enc']['bias']
  return h, h @ theta['proj']['kernel'] + theta['proj']['bias']


def unit(v):
  return v / max(np.linalg.norm(v), 1e-12)


def np_align(p1, p2, real):
  return np.mean([np.sum((unit(p1[i]) - unit(p2[i])) ** 2) for i in real])


def np_uniform(p, real, t=2.0):
  vals = [
    np.exp(-t * np.sum((unit(p[i]) - unit(p[j])) ** 2))
    for i in real
    for j in real
    if i != j
  ]
  return math.log(np.mean(vals))


def np_softmax(v):
  e = np.exp(v - v.max())
  return e / e.sum()


def np_nt_xent(z1, z2, real, t, self_in_denominator):
  u = [unit(v) for v in list(z1) + list(z2)]
  b = len(z1)
  rows = list(real) + [i + b for i in real]
  per = {}
  for a in rows:
    partner = a + b if a < b else a - b
    terms = []
    for c in rows:
      if c == a:
        if self_in_denominator:
          terms.append(1.0)  # the zeroed diagonal: exp(0)
        continue
      terms.append(math.exp(np.dot(u[a], u[c]) / t))
    per[a] = -(np.dot(u[a], u[partner]) / t) + math.log(sum(terms))
  return np.mean([(per[i] + per[i + b]) / 2 for i in real])


def flatten(theta):
  return np.concatenate(
    [theta[k][n].ravel() for k in sorted(theta) for n in sorted(theta[k])]
  )


def unflatten(vec, like):
  out, at = {}, 0
  for k in sorted(like):
    out[k] = {}
    for n in sorted(like[k]):
      size = like[k][n].size
      out[k][n] = vec[at : at + size].reshape(like[k][n].shape)
      at += size
  return out


def sampled_coordinates(size, count=40, seed=0):
  """A fixed random choice of ``count`` of ``size`` flat coordinates (all of
  them when there are fewer): finite differences of a NumPy loss cost two
  evaluations a coordinate, and a sample catches a wrong gradient as surely
  as the full sweep unless the error sits in a few entries only."""
  if size <= count:
    return np.arange(size)
  return np.sort(np.random.default_rng(seed).choice(size, count, replace=False))


def fd_grad(fn, theta, eps=1e-6):
  """Central differences of fn(theta) (float64) at `sampled_coordinates`
  of the flattened parameters; NaN at the others."""
  flat = flatten(theta)
  grad = np.full_like(flat, np.nan)
  for i in sampled_coordinates(flat.size):
    up, down = flat.copy(), flat.copy()
    up[i] += eps
    down[i] -= eps
    grad[i] = (fn(unflatten(up, theta)) - fn(unflatten(down, theta))) / (
      2 * eps
    )
  return unflatten(grad, theta)


def jax_value_and_grad(alg, variables, batch, ctx):
  params = variables['params']
  with jax.default_matmul_precision(HIGHEST):
    (loss, _), grads = fx.jit_client_loss_and_grad(alg, params, {}, batch, ctx)
  return float(loss), {
    k: {n: np.asarray(v, np.float64) for n, v in grads[k].items()}
    for k in ('enc', 'proj')
  }


def assert_grads_close(got, want, atol=2e-4):
  """``got`` matches ``want`` wherever ``want`` was computed (not NaN)."""
  checked = 0
  for k in want:
    for n in want[k]:
      known = np.isfinite(want[k][n])
      checked += known.sum()
      np.testing.assert_allclose(
        np.asarray(got[k][n])[known],
        want[k][n][known],
        atol=atol,
        err_msg=f'{k}/{n}',
      )
  assert checked > 0


def views_np(raw, key, order='ssd'):
  with jax.default_matmul_precision(HIGHEST):
    v1, v2 = views.make_two_view_augment(order=order)(jnp.asarray(raw), key)
  return np.asarray(v1, np.float64), np.asarray(v2, np.float64)
