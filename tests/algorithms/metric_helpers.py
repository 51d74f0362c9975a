"""What the supervised metric-learning algorithms' tests share.

An algorithm built with a plain SGD server; one client step's loss on the
softmax-regression fixture, whose embedding is its flattened input, so each
client loss can be re-derived in NumPy from the images alone; FedRCL's Eq. 2
and the released supervised-contrastive pair as loops (also used by
tests/test_metric_faithful.py); and a config loaded from configs/.
"""

import importlib.util
import math
import os

import fl_fixtures as fx
import jax
import jax.numpy as jnp
import numpy as np

from fedjax_metric import algorithms, engine, optimizers
from fedjax_metric.models import split_variables

SERVER = optimizers.make_server_optimizer('sgd')


def build(name, model, **kwargs):
  return algorithms.REGISTRY[name](model, server_optimizer=SERVER, **kwargs)


def one_step_loss(
  alg, variables, images, labels, idx, mask, round_idx=0, client_row=()
):
  """One client step's loss at full matmul precision (the FedQuad and MOON
  tests' helper and the FedSCL and FedQuad-without-CE tests' one, which
  differed only by the precision scope and by fixing round 0 with no client
  row: the defaults here)."""
  params, model_state = split_variables(variables)
  preprocess = fx.identity_preprocess()
  batch = engine.Batch(
    preprocess(jnp.asarray(images[idx]), None),
    jnp.asarray(labels[idx]),
    jnp.asarray(mask),
    jnp.asarray(images[idx]),
  )
  state = engine.ServerState(variables, (), jnp.asarray(round_idx), ())
  ctx = fx.client_context(state, client_row=client_row, num_examples=len(idx))
  with jax.default_matmul_precision('highest'):
    loss, _ = alg.client_loss(params, model_state, batch, ctx)
  return float(loss)


def numpy_ce(variables, x, y):
  w = np.asarray(variables['params']['Dense_0']['kernel'], np.float64)
  b = np.asarray(variables['params']['Dense_0']['bias'], np.float64)
  z = x @ w + b
  z = z - z.max(1, keepdims=True)
  return np.mean(np.log(np.exp(z).sum(1)) - z[np.arange(len(y)), y])


# This file is tests/algorithms/metric_helpers.py.
REPO = os.path.dirname(
  os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
)


def load_config(name, arg):
  path = os.path.join(REPO, 'configs', f'{name}.py')
  spec = importlib.util.spec_from_file_location(f'cfg_{name}', path)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module.get_config(arg)


def np_cos(f):
  f = np.asarray(f, np.float64)
  z = f / np.maximum(np.linalg.norm(f, axis=1, keepdims=True), 1e-12)
  return z @ z.T


def ref_eq2(f, y, t, reduction, mask=None):
  """FedRCL Eq. 2 (sum over positives) or Khosla's L_out (mean), loops."""
  s, b = np_cos(f), len(f)
  real = [True] * b if mask is None else list(mask)
  out = np.zeros(b)
  for i in range(b):
    if not real[i]:
      continue
    denom = sum(math.exp(s[i, k] / t) for k in range(b) if k != i and real[k])
    positives = [j for j in range(b) if j != i and real[j] and y[j] == y[i]]
    terms = [-math.log(math.exp(s[i, j] / t) / denom) for j in positives]
    if terms:
      out[i] = sum(terms) / (len(terms) if reduction == 'mean' else 1)
  return out


def ref_code_scl(f, y, t, mask=None):
  """The released CLLoss supervised pair: the least similar same-class
  sample (self included) against the two most similar other-class ones."""
  s, b = np_cos(f), len(f)
  real = [True] * b if mask is None else list(mask)
  out = np.zeros(b)
  for i in range(b):
    if not real[i]:
      continue
    same = [s[i, j] for j in range(b) if real[j] and y[j] == y[i]]
    others = sorted(
      (s[i, j] for j in range(b) if real[j] and y[j] != y[i]), reverse=True
    )[:2]
    if not others:
      continue
    pos = math.exp(min(same) / t)
    out[i] = -math.log(pos / (pos + sum(math.exp(o / t) for o in others)))
  return out
