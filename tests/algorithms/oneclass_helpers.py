"""What the one-class algorithms' tests share.

A bias-free linear embedding e = x K (a Dense layer without bias on the
flattened image), whose gradient is x^T dl/de, so that each round can be
re-derived in float64 NumPy; a one-class federation; rounds run with every
client; and the NumPy pieces the references share (local SGD, unit vectors,
cosine gradients, distances). tests/test_oneclass_losses.py and
tests/test_oneclass_protocol.py use some of them too.
"""

import fl_fixtures as fx
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from fedjax_metric import engine, executors, models, optimizers
from fedjax_metric.data import partition as partition_lib

SERVER = optimizers.make_server_optimizer('sgd')
DIM = 3
SHAPE = (1, 3, 3, 1)  # 9 input features: small enough for float32 to agree.


class LinearEmbedding(nn.Module):
  """e = flatten(x) K, no bias: the gradient is x^T dl/de."""

  num_classes: int = fx.NUM_CLASSES

  @nn.compact
  def __call__(self, images, *, train, mask=None):
    del train, mask
    x = images.reshape(images.shape[0], -1)
    return {'embedding': nn.Dense(DIM, use_bias=False)(x), 'features': []}


def linear_model():
  return models.make_model_fns(LinearEmbedding(), SHAPE)


def federation(clients_per_class=1, num_examples=30, seed=0):
  rng = np.random.default_rng(seed)
  images = rng.integers(0, 256, (num_examples,) + SHAPE[1:]).astype(np.uint8)
  labels = (np.arange(num_examples) % fx.NUM_CLASSES).astype(np.int32)
  parts = partition_lib.one_class(
    labels, clients_per_class=clients_per_class, seed=seed
  )
  data = engine.DeviceData(jnp.asarray(images), jnp.asarray(labels))
  x = images.reshape(num_examples, -1).astype(np.float64) / 255.0
  return x, labels, parts, data


def run_rounds(
  alg, model, parts, data, *, rounds, lr, batch_size=4, steps=0, executor='vmap'
):
  """Runs ``rounds`` rounds with every client; returns states and cohorts."""
  variables = model.init(jax.random.key(1))
  state, table = engine.init_state(alg, variables, len(parts))
  # Host copies: the round donates (deletes) its input buffers.
  copy = lambda tree: jax.tree.map(np.array, tree)
  states = [copy((state, table))]
  round_fn = executors.make_round_fn(
    fx.make_spec(alg, lr=lr), data, executor=executor
  )
  cohorts = []
  for r in range(rounds):
    c = fx.cohort(
      parts,
      list(range(len(parts))),
      num_slots=len(parts),
      batch_size=batch_size,
      steps=steps,
      round_idx=r,
    )
    cohorts.append(jax.tree.map(np.asarray, c))
    state, table, _ = round_fn(state, table, c)
    states.append(copy((state, table)))
  return states, cohorts


def kernel(state):
  return np.asarray(state.variables['params']['Dense_0']['kernel'], np.float64)


def client_batches(cohort, slot):
  """[(example indices, mask)] of the slot's real steps."""
  return [
    (idx, m)
    for idx, m in zip(cohort.example_idx[slot], cohort.example_mask[slot])
    if m.any()
  ]


def local_sgd(k, x, batches, grad_e, lr, reduction='mean'):
  """Plain SGD on the linear embedding, one step per batch (NumPy loops).

  grad_e(e, i) is dl_i/de for example i at embedding e (float64 [D]).
  """
  k = k.copy()
  for idx, m in batches:
    g = np.zeros_like(k)
    for i, real in zip(idx, m):
      if real:
        e = x[i] @ k
        g += np.outer(x[i], grad_e(e, i))
    k -= lr * g / (1.0 if reduction == 'sum' else m.sum())
  return k


def unit(v):
  """v / |v|; 0 for v = 0 (the subgradient the safe square root picks: a
  one-example batch sits exactly on its own batch center)."""
  n = np.linalg.norm(v)
  return v / n if n > 0 else 0 * v


def cosine_grads(e, w):
  """cos(e, w) and its gradients with respect to e and w."""
  ne, nw = np.linalg.norm(e), np.linalg.norm(w)
  cos = e @ w / (ne * nw)
  return cos, w / (ne * nw) - cos * e / ne**2, e / (ne * nw) - cos * w / nw**2


TOL = dict(rtol=1e-5, atol=1e-5)


def np_norm(x):
  return float(np.sqrt(sum(float(v) ** 2 for v in x)))


def np_dist(x, y):
  return np_norm(np.asarray(x, np.float64) - np.asarray(y, np.float64))
