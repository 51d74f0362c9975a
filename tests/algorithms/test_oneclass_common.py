"""What the one-class algorithms share (oneclass_common): the radius pass
over a client's round, vs a NumPy loop."""

from types import SimpleNamespace

import jax.numpy as jnp
import numpy as np
import pytest

from .oneclass_helpers import np_dist


class _Identity:
  """A 'model' whose embedding is the flattened input (for scan_radius)."""

  @staticmethod
  def apply(params, model_state, images, train):
    del params, train
    return {'embedding': images.reshape(images.shape[0], -1)}, model_state


def _scan_over(batches):
  """A context's ``scan_batches`` over a fixed list of batches."""

  def scan_batches(body, init):
    carry = init
    for batch in batches:
      carry = body(carry, batch)
    return carry

  return scan_batches


def test_scan_radius_is_the_largest_real_distance_over_the_round():
  """R^k = max_i ||g(x_i) - C^k|| over every real example of the client's
  round (Park et al. 2021, Algorithm 1), as training computes it: batch by
  batch, padded examples (a far outlier here) left out; 0 with none."""
  from fedjax_metric import engine  # pylint: disable=g-import-not-at-top
  from fedjax_metric.algorithms import oneclass_common

  rng = np.random.default_rng(3)
  x = rng.normal(size=(3, 4, 2, 1)).astype(np.float32)  # 3 batches of 4
  mask = np.array([[1, 1, 0, 1], [1, 0, 0, 0], [1, 1, 1, 1]], bool)
  x[0, 2] = 50.0  # padding: must not count
  batches = [
    engine.Batch(jnp.asarray(x[b]), None, jnp.asarray(mask[b]), None)
    for b in range(3)
  ]
  center = np.array([0.3, -0.2], np.float32)
  ctx = SimpleNamespace(scan_batches=_scan_over(batches))
  radius = oneclass_common.scan_radius(
    ctx, _Identity, {'params': {}}, jnp.asarray(center)
  )
  want = max(
    np_dist(x[b, i].reshape(-1), center)
    for b in range(3)
    for i in range(4)
    if mask[b, i]
  )
  assert float(radius) == pytest.approx(want, rel=1e-5)
  empty = [b._replace(mask=jnp.zeros(4, bool)) for b in batches]
  ctx = SimpleNamespace(scan_batches=_scan_over(empty))
  assert (
    float(oneclass_common.scan_radius(ctx, _Identity, {'params': {}}, center))
    == 0.0
  )
