"""L-DAWA's aggregation against a NumPy loop over layers."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fedjax_metric import engine
from fedjax_metric.algorithms import l_dawa

from .ssl_helpers import HIGHEST, SERVER, init, make_ctx, two_linear


@pytest.mark.parametrize('scope', ['layer', 'model'])
@pytest.mark.parametrize('round_idx', [0, 3])
def test_l_dawa_aggregation_matches_numpy(scope, round_idx):
  model = two_linear()
  variables = init(model)
  # Every leaf non-zero (flax initialises biases to 0, whose cosine is
  # undefined; that case is tested below).
  variables = jax.tree.map(lambda v: v + 0.1, variables)
  variables = {**variables, 'batch_stats': {'bn': {'var': jnp.ones(3)}}}
  alg = l_dawa.SPEC(
    model, server_optimizer=SERVER, scope=scope, warmup_rounds=3
  )
  state, table = engine.init_state(alg, variables, 3)
  state = state._replace(round=jnp.int32(round_idx))
  rng = np.random.default_rng(1)
  ends, updates, weights = [], [], []
  steps = [2.0, 5.0, 3.0]
  for k in range(3):
    end = jax.tree.map(
      lambda v: v + jnp.asarray(0.3 * rng.normal(size=v.shape), jnp.float32),
      variables,
    )
    ends.append(end)
    with jax.default_matmul_precision(HIGHEST):
      u, w, _ = alg.client_final(end, make_ctx(state, num_steps=steps[k]))
    updates.append(u)
    weights.append(float(w))
  update_sum = jax.tree.map(
    lambda *x: sum(w * v for w, v in zip(weights, x)), *updates
  )
  aggregate = engine.Aggregate(
    update_sum,
    jnp.float32(sum(weights)),
    jnp.float32(3),
    jnp.arange(3),
    jnp.ones(3, bool),
  )
  rows = engine.gather_rows(table, jnp.arange(3))  # the cohort's rows
  with jax.default_matmul_precision(HIGHEST):
    new = alg.server_update(state, aggregate, rows)
  glob = jax.tree.map(lambda v: np.asarray(v, np.float64), variables)
  locs = [jax.tree.map(lambda v: np.asarray(v, np.float64), e) for e in ends]
  leaves_g = jax.tree.leaves(glob)
  leaves_k = [jax.tree.leaves(l) for l in locs]
  got = jax.tree.leaves(new.variables)
  if scope == 'model':
    whole = []
    for lk in leaves_k:
      a = np.concatenate([x.ravel() for x in lk])
      b = np.concatenate([x.ravel() for x in leaves_g])
      whole.append(min(a @ b / (np.linalg.norm(a) * np.linalg.norm(b)), 1.0))
  for i, g in enumerate(leaves_g):
    if round_idx < 3:  # warm-up: FedAvg weighted by local batches
      want = sum(s * lk[i] for s, lk in zip(steps, leaves_k)) / sum(steps)
    else:
      total = np.zeros_like(g)
      for k, lk in enumerate(leaves_k):
        if scope == 'layer':
          cos = np.sum(lk[i] * g) / (np.linalg.norm(lk[i]) * np.linalg.norm(g))
          delta = min(cos, 1.0)
        else:
          delta = whole[k]
        total += delta * lk[i]
      want = total / 3
    np.testing.assert_allclose(got[i], want, atol=1e-5)


def test_l_dawa_zero_global_layer_keeps_weight_one():
  local = {
    'a': jnp.asarray([1.0, 2.0]),
    'b': jnp.asarray([0.0, 0.0]),
    's': jnp.asarray(3.0),
  }
  glob = {
    'a': jnp.asarray([2.0, 4.0]),
    'b': jnp.asarray([0.0, 0.0]),
    's': jnp.asarray(1.0),
  }
  got = l_dawa.divergence_weights(local, glob)
  assert float(got['a']) == pytest.approx(1.0)  # clipped at 1
  assert float(got['b']) == 1.0 and float(got['s']) == 1.0
  glob['a'] = jnp.asarray([2.0, -1.0])
  got = l_dawa.divergence_weights(local, glob)
  assert float(got['a']) == pytest.approx(0.0)
