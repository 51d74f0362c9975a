"""FedMetric building blocks: local center, local radius and proxy centers.

Park, Hosseini and Yun, 'Federated Learning with Metric Loss', FL-ICML
workshop 2021, Algorithm 1. Each client k holds one class. In a round it
computes its local center C^k (mean embedding under the received model),
trains on `fedjax_metric.losses.fedmetric_loss` against the proxy
hyperspheres (A^j, M^j) of the other clients, then measures its radius
R^k = max_i d(g(x_i), C^k) and shares a proxy center A^k = C^k + X, with X
uniform on the sphere of radius D^k = s R^k around 0, and the margin
M^k = R^k + D^k. The proxy hypersphere contains the true one, so sharing it
reveals less than C^k (Sec. 3.2).
"""

import numbers

import jax
import jax.numpy as jnp

from fedjax_metric.losses.metric import _distance
from fedjax_metric.losses.metric import _l2_normalize


def _weights(embeddings, mask):
  if mask is None:
    return jnp.ones(embeddings.shape[:1], embeddings.dtype)
  return jnp.asarray(mask).astype(embeddings.dtype)


def local_center(embeddings, mask=None):
  """Local center C^k: the mean embedding of the client's real examples.

  Park, Hosseini and Yun, 'Federated Learning with Metric Loss', FL-ICML
  workshop 2021, Algorithm 1 ("calculate local center C^k by averaging the
  instance embeddings based on the theta")::

    C^k = sum_i mask_i e_i / sum_i mask_i

  Args:
    embeddings: [N, D] embeddings of the client's data.
    mask: optional [N] bool; False rows (padding) are left out.

  Returns:
    [D] center; zeros when every row is masked.
  """
  embeddings = jnp.asarray(embeddings)
  weights = _weights(embeddings, mask)
  # An elementwise sum, not a matmul, so TF32 on GPUs cannot round it.
  total = jnp.sum(weights[:, None] * embeddings, axis=0)
  return total / jnp.maximum(jnp.sum(weights), 1.0)


def local_radius(embeddings, center, mask=None):
  """Local radius R^k: the largest distance of a real example to C^k.

  Park, Hosseini and Yun, 'Federated Learning with Metric Loss', FL-ICML
  workshop 2021, Algorithm 1::

    R^k = max_{i : mask_i} ||e_i - C^k||

  Args:
    embeddings: [N, D].
    center: [D] local center.
    mask: optional [N] bool; False rows are left out.

  Returns:
    scalar; 0 when every row is masked.
  """
  embeddings = jnp.asarray(embeddings)
  d = _distance(embeddings, jnp.asarray(center)[None], squared=False)
  # Distances are >= 0, so 0 is a neutral fill for the max.
  return jnp.max(jnp.where(_weights(embeddings, mask) > 0, d, 0.0),
                 initial=0.0)


def _check_non_negative(name, value):
  if isinstance(value, numbers.Real) and value < 0:
    raise ValueError(f'{name} must be >= 0, got {value}.')


def proxy_center(center, radius, scale, key):
  """Proxy center and margin a client shares instead of its true center.

  Park, Hosseini and Yun, 'Federated Learning with Metric Loss', FL-ICML
  workshop 2021, Algorithm 1 and Sec. 4.2 (Fig. 3)::

    D = scale * R,  A = C + D * u,  M = R + D = R (1 + scale)

  with u uniform on the unit sphere (a normalised standard Gaussian draw),
  so ||A - C|| = D exactly and the proxy hypersphere (A, M) contains the
  true one (C, R). ``scale=0`` gives A = C, M = R: the 'true centers'
  variant of Table 2. The paper recommends scale > 1, so that A lies
  outside the client's own hypersphere.

  Args:
    center: [D] local center C.
    radius: scalar local radius R (>= 0).
    scale: s >= 0; a Python number is checked.
    key: PRNG key for the direction u.

  Returns:
    (A [D], M scalar).

  Raises:
    ValueError: scale or radius is a negative Python number.
  """
  _check_non_negative('scale', scale)
  _check_non_negative('radius', radius)
  center = jnp.asarray(center)
  direction = _l2_normalize(
      jax.random.normal(key, center.shape, center.dtype))
  offset = scale * radius
  return center + offset * direction, radius + offset
