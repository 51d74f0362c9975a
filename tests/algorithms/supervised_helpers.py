"""What the supervised baselines' tests share: the linear model's client loss
and logits, and float64 NumPy references of the cross-entropy, FedNTD's
not-true distillation and FedLC's calibrated cross-entropy (the last two
also used by tests/test_supervised_baselines.py)."""

import fl_fixtures as fx
import jax
import jax.numpy as jnp
import numpy as np

from fedjax_metric import engine
from fedjax_metric.models import split_variables


def linear_client_loss(alg, local_vars, global_vars, x, images, labels, mask):
  """(loss, aux) of ``alg``'s client loss for the linear model ``local_vars``
  on the flat inputs x [B, 36] (reshaped as ``images``), the server holding
  ``global_vars``, at full matmul precision."""
  params, state = split_variables(local_vars)
  batch = engine.Batch(
    jnp.asarray(x.reshape(images.shape), jnp.float32),
    jnp.asarray(labels),
    jnp.asarray(mask),
    jnp.asarray(images),
  )
  ctx = fx.client_context(engine.ServerState(global_vars, (), jnp.int32(0)))
  with jax.default_matmul_precision('highest'):
    loss, (_, aux) = alg.client_loss(params, state, batch, ctx)
  return loss, aux


def linear_logits(variables, x):
  """The linear model's logits in float64."""
  dense = variables['params']['Dense_0']
  return x @ np.asarray(dense['kernel']) + np.asarray(dense['bias'])


def ref_cross_entropy(logits, labels, mask):
  """Mean softmax cross-entropy over the real (mask) rows, float64."""
  shifted = logits - logits.max(1, keepdims=True)
  log_p = shifted - np.log(np.exp(shifted).sum(1, keepdims=True))
  return -log_p[np.arange(len(labels)), labels][mask].mean()


def ref_ntd(local, teacher, labels, tau):
  """Per example, by a loop: drop the true class, softmax at tau, KL."""
  out = []
  for l_row, g_row, y in zip(local, teacher, labels):
    keep = [c for c in range(len(l_row)) if c != y]
    ql = np.exp(l_row[keep] / tau - np.max(l_row[keep] / tau))
    qg = np.exp(g_row[keep] / tau - np.max(g_row[keep] / tau))
    ql, qg = ql / ql.sum(), qg / qg.sum()
    out.append(np.sum(qg * (np.log(qg) - np.log(ql))))
  return np.array(out)


def ref_calibrated_ce(logits, labels, counts, tau):
  """Per example, by a loop over the classes the client holds: the margin
  tau n^(-1/4) subtracted, then -log softmax at the label."""
  out = []
  for row, y in zip(logits, labels):
    held = [k for k in range(len(row)) if counts[k] > 0]
    z = {k: row[k] - tau * counts[k] ** -0.25 for k in held}
    top = max(z.values())
    log_norm = top + np.log(sum(np.exp(v - top) for v in z.values()))
    out.append(log_norm - z[y])
  return np.array(out)
