"""FedMetric's hyperspheres: local center, proxy centers and their tables.

Park, Hosseini and Yun, 'Federated Learning with Metric Loss', FL-ICML
workshop 2021, Algorithm 1 and Sec. 3.2. A client k describes its class by
the hypersphere (C^k, R^k) of its embeddings and shares instead a proxy
hypersphere (A^k, M^k) that contains it: A^k = C^k + X, X uniform on the
sphere of radius D^k = s R^k, M^k = R^k + D^k. This module holds those
formulas and the bookkeeping around them: the client's row of the client
table and the server's copy of every client's latest row, which each client
reads next round (algorithms/fedmetric.py uses them).
"""

import numbers

import jax
import jax.numpy as jnp

from fedjax_metric.losses.metric import _l2_normalize

DEFAULT_PROXY_SCALE = 1.5


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
  direction = _l2_normalize(jax.random.normal(key, center.shape, center.dtype))
  offset = scale * radius
  return center + offset * direction, radius + offset


def resolve_scale(negatives, scale):
  """The proxy distance factor s a ``negatives`` mode runs with.

  'proxy' defaults to `DEFAULT_PROXY_SCALE`; 'true' shares the true
  hypersphere (Table 2's pos+neg(true), s = 0) and 'none' shares nothing, so
  both run with s = 0.

  Raises:
    ValueError: s < 0, or s != 0 with negatives='true'.
  """
  if scale is not None and scale < 0:
    raise ValueError(
      f'scale (s, the proxy center distance D = s R) must be '
      f'>= 0, got {scale} (--config.algorithm_kwargs.scale).'
    )
  if negatives == 'proxy':
    return DEFAULT_PROXY_SCALE if scale is None else float(scale)
  if negatives == 'true' and scale not in (None, 0):
    raise ValueError(
      f"negatives='true' shares the true centers (s = 0); got "
      f"scale={scale}. Use negatives='proxy' for s > 0."
    )
  return 0.0


def shared_mean_radius(extra, scale):
  """rho, the mean radius R^j = M^j / (1 + s) of the hyperspheres the
  clients have shared; 1 before any has (or if all radii are 0).

  Args:
    extra: the server extra ('proxy_margins' [N], 'reported' [N]).
    scale: s, so that M^j = (1 + s) R^j.
  """
  reported = extra['reported'] > 0
  radii = extra['proxy_margins'] / (1.0 + scale)
  total = jnp.sum(jnp.where(reported, radii, 0.0))
  mean = total / jnp.maximum(jnp.sum(reported), 1)
  return jax.lax.stop_gradient(jnp.where(mean > 0, mean, 1.0))


# ---------------------------------------------------------------------------
# The client table's rows and the server's copy of them.
# ---------------------------------------------------------------------------


def empty_row(dim):
  """A client's row before it has shared: (A [D], M, reported, class)."""
  return {
    'proxy_center': jnp.zeros((dim,), jnp.float32),
    'proxy_margin': jnp.zeros((), jnp.float32),
    'reported': jnp.zeros((), jnp.int32),  # 1 once it has shared.
    'class': jnp.zeros((), jnp.int32),
  }


def init_client(dim, variables, key):
  """init_client: the empty row."""
  del variables, key
  return empty_row(dim)


def shared(rows):
  """The server's broadcast copy of the table's (A, M, reported, class):
  'proxy_centers' [N, D], 'proxy_margins' [N], 'reported' [N], 'classes'
  [N] (or [C, ...] for the cohort's rows)."""
  return {
    'proxy_centers': rows['proxy_center'],
    'proxy_margins': rows['proxy_margin'],
    'reported': rows['reported'],
    'classes': rows['class'],
  }


def init_extra(dim, variables, num_clients, key):
  """The server extra of round 0: N empty rows, nobody has reported."""
  del variables, key
  rows = jax.tree.map(
    lambda x: jnp.zeros((num_clients,) + x.shape, x.dtype), empty_row(dim)
  )
  return shared(rows)


def copy_cohort_rows(extra, aggregate, cohort_rows):
  """The server extra with the cohort's new rows written in.

  The extra mirrors the client table, of which only the cohort's rows
  changed this round (the whole table may not be on the device). Padding
  slots' ids are sent out of range, so their writes are dropped.
  """
  ids = jnp.where(
    aggregate.slot_mask, aggregate.client_ids, jnp.iinfo(jnp.int32).max
  )
  return jax.tree.map(
    lambda all_rows, new: all_rows.at[ids].set(new, mode='drop'),
    extra,
    shared(cohort_rows),
  )
