"""What the partial-participation algorithms' tests share.

A three-client federation run round by round under the vmap executor (the
cohort sizes differ, one compile), local training re-derived by hand
(softmax regression with full-batch SGD), and participation masks: a
hand-derived one and random ones.
"""

import fl_fixtures as fx
import jax
import jax.numpy as jnp
import numpy as np

from fedjax_metric import engine, executors, optimizers

from .helpers import softmax_regression_grad

PARTS = [np.arange(0, 6), np.arange(6, 16), np.arange(16, 24)]
NUM_CLIENTS = len(PARTS)
# Round 2 has nobody; client 0 is closed by the cutoff K = 2 in round 2.
ROUNDS = [[0, 2], [1], [], [0, 1, 2], [2], [0]]
STEPS, LR = 2, 0.4


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


# Two clients, nine rounds (1 = participates). Client 0 hits the cutoff
# K = C = 3 after round 4; client 1 hits it before it ever participates.
HAND_MASK = np.array(
  [[1, 0, 0, 1, 1, 0, 0, 0, 1], [0, 0, 0, 0, 1, 0, 1, 1, 1]], bool
).T  # [T=9, N=2]


def random_masks():
  rng = np.random.default_rng(0)
  p = np.array([0.02, 0.05, 0.1, 0.3, 0.6, 0.9, 1.0, 0.15])
  return [
    rng.random((300, p.size)) < p,
    np.zeros((40, 3), bool),
    np.ones((40, 3), bool),
  ]
