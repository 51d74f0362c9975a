"""FedMetric: local center, local radius, proxy centers and the algorithm.

Park, Hosseini and Yun, 'Federated Learning with Metric Loss', FL-ICML
workshop 2021, Algorithm 1. Each client k holds one class. In a round it
computes its local center C^k (mean embedding under the received model),
trains on `fedjax_metric.losses.fedmetric_loss` against the proxy
hyperspheres (A^j, M^j) of the other clients, then measures its radius
R^k = max_i d(g(x_i), C^k) and shares a proxy center A^k = C^k + X, with X
uniform on the sphere of radius D^k = s R^k around 0, and the margin
M^k = R^k + D^k. The proxy hypersphere contains the true one, so sharing it
reveals less than C^k (Sec. 3.2).

`make` maps Algorithm 1 onto the engine's slots: ``client_begin`` computes
C^k with a frozen pass over the round's batches; ``client_loss`` is
Eq. 4-6; ``client_final`` computes R^k with a second pass and writes
(A^k, M^k) to the client's row; ``server_update`` averages the models and
copies every row into the server extra, which all clients read next round.
Where the paper's text, equations and Algorithm 1 differ (squared or plain
hinge, sum or mean over the batch, a center per round or per batch) each
form is a keyword of `make`, whose docstring says which is the default and
why.
"""

import numbers

import jax
import jax.numpy as jnp

from fedjax_metric.algorithms import fedavg
from fedjax_metric.algorithms import oneclass_common as common
from fedjax_metric.contract import NO_RUN_FACTS, RunFacts
from fedjax_metric.losses.metric import _l2_normalize
from fedjax_metric.losses.oneclass import fedmetric_loss


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


# ---------------------------------------------------------------------------
# The algorithm.
# ---------------------------------------------------------------------------


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


NEGATIVES = ('none', 'proxy', 'true')
CENTERS = ('round_start', 'batch')
DEFAULT_PROXY_SCALE = 1.5


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


def make(
  model,
  *,
  server_optimizer,
  run: RunFacts = NO_RUN_FACTS,
  weighting='uniform',
  negatives='proxy',
  lam=1.0,
  scale=None,
  squared_hinge=True,
  center='round_start',
  reduction='mean',
  exclude_same_class=True,
  rescale=False,
):
  """FedMetric as an `engine.Algorithm`.

  Park, Hosseini and Yun, 'Federated Learning with Metric Loss', FL-ICML
  workshop 2021, Algorithm 1 with the loss of Eq. 4-6. Per round, client k:

    1. C^k = mean_i g(x_i) over its data with the received model
       (``center='round_start'``, Algorithm 1, computed by a pass over the
       round's batches: in epoch mode every local example once), or the
       mean of the current batch's embeddings at every step
       (``center='batch'``, Sec. 3.1: "the local center is iteratively
       updated using the mean of instance embeddings in the local batch");
    2. local steps on l = l_pos + lam l_neg (Eq. 4), with
       l_pos = sum_i d(g(x_i), C^k) (Eq. 5) and
       l_neg = sum_i sum_{j != k} max(0, M^j - d(g(x_i), A^j))^p (Eq. 6,
       p = 2; Algorithm 1 prints p = 1: ``squared_hinge=False``);
    3. R^k = max_i d(g(x_i), C^k) with the trained model (a second pass;
       in 'batch' mode C^k is first recomputed with the trained model),
       A^k = C^k + X with X uniform on the sphere of radius D^k = s R^k,
       M^k = R^k + D^k, written to the client's row of the client table.

  The server averages the models (uniformly by default, theta = 1/M sum_k
  theta_k in Algorithm 1) and copies every client's latest (A^j, M^j) from
  the table into its state, which every client receives next round.
  Clients that have not reported yet, the client itself and (with
  ``exclude_same_class``) clients holding the same class are masked out of
  l_neg. The paper has one client per class; with several clients per class
  their hyperspheres describe the same class, and pushing away from them
  would split it, hence the default. The class a client holds is read from
  its labels.

  Args:
    model: `ModelFns` with an 'embedding' output (no classifier needed).
    server_optimizer: optax transformation of the pseudo-gradient; sgd(1.0)
      is plain averaging.
    weighting: 'uniform' (Algorithm 1) or 'num_examples'.
    negatives: 'none' (Table 2's pos: l_pos only, nothing shared), 'proxy'
      (pos+neg(proxy), the method) or 'true' (pos+neg(true): A = C, M = R,
      i.e. s = 0).
    lam: lambda >= 0 of Eq. 4.
    scale: s >= 0, D^k = s R^k (Sec. 4.2, Fig. 3); None picks
      `DEFAULT_PROXY_SCALE` for 'proxy' (the paper asks for s > 1, so that
      A^k lies outside the client's own hypersphere).
    squared_hinge: Eq. 6 (True) or Algorithm 1's plain hinge (False).
    center: 'round_start' or 'batch' (step 1).
    reduction: 'mean' (a masked mean over the batch, the default) or
      'sum' (Eq. 5-6), whose gradient is B times larger at batch size B:
      with the paper's learning rate 0.1 and batch 16 the sum diverged
      (with proxy negatives: NaN within 100 one-step rounds on
      Fashion-MNIST with LeNet).
    exclude_same_class: leave clients holding the client's own class out of
      l_neg.
    rescale: not in the paper; a fix for the embedding scale running away
      (docs/methods.md, FedMetric): measure every distance of the loss in
      units of rho, the mean radius R^j of the hyperspheres shared in the
      previous round (`shared_mean_radius`). That is, each round rescales
      the shared hyperspheres (A^j, M^j), the local center and the
      embeddings by 1 / rho, so the loss (homogeneous of degree 1 in the
      embedding scale) is divided by rho: steps shrink as the embeddings
      grow. Needs shared hyperspheres (negatives 'proxy' or 'true').

  Raises:
    ValueError: an unknown choice, lam < 0 or a bad scale, or rescale
      without shared hyperspheres.
  """
  common.check_choice('negatives', negatives, NEGATIVES)
  common.check_choice('center', center, CENTERS)
  common.check_choice('reduction', reduction, common.REDUCTIONS)
  if not lam >= 0:
    raise ValueError(
      f'lam must be >= 0, got {lam} (--config.algorithm_kwargs.lam).'
    )
  scale = resolve_scale(negatives, scale)
  shares = negatives != 'none'
  if rescale and not shares:
    raise ValueError(
      'rescale=True measures distances in units of the shared radii; '
      "negatives='none' shares none. Use negatives='proxy' or 'true'."
    )
  dim = common.embedding_dim(model)
  base = fedavg.build(
    model, server_optimizer=server_optimizer, weighting=weighting
  )

  def empty_row():
    return {
      'proxy_center': jnp.zeros((dim,), jnp.float32),
      'proxy_margin': jnp.zeros((), jnp.float32),
      'reported': jnp.zeros((), jnp.int32),  # 1 once it has shared.
      'class': jnp.zeros((), jnp.int32),
    }

  def shared(rows):
    """The server's broadcast copy of the table's (A, M, reported, class)."""
    return {
      'proxy_centers': rows['proxy_center'],
      'proxy_margins': rows['proxy_margin'],
      'reported': rows['reported'],
      'classes': rows['class'],
    }

  def init_server(variables, num_clients, key):
    state = base.init_server(variables, num_clients, key)
    rows = jax.tree.map(
      lambda x: jnp.zeros((num_clients,) + x.shape, x.dtype), empty_row()
    )
    return state._replace(extra=shared(rows))

  def init_client(variables, key):
    del variables, key
    return empty_row()

  def client_begin(ctx):
    variables = ctx.server_state.variables
    if center == 'round_start':
      round_center, _ = common.scan_center(ctx, model, variables, dim)
    else:
      round_center = jnp.zeros((dim,), jnp.float32)
    return variables, {
      'center': round_center,
      'class': common.client_class(ctx),
    }

  def negatives_mask(ctx):
    extra = ctx.server_state.extra
    num_clients = extra['reported'].shape[0]
    keep = (extra['reported'] > 0) & (jnp.arange(num_clients) != ctx.client_id)
    if exclude_same_class:
      keep = keep & (extra['classes'] != ctx.local_state['class'])
    return keep & shares

  def client_loss(params, model_state, batch, ctx):
    outputs, model_state = model.apply(
      params, model_state, batch.images, train=True, mask=batch.mask
    )
    embeddings = outputs['embedding']
    if center == 'batch':
      batch_center = jax.lax.stop_gradient(local_center(embeddings, batch.mask))
    else:
      batch_center = ctx.local_state['center']
    extra = ctx.server_state.extra
    per_example = fedmetric_loss(
      embeddings,
      batch_center,
      extra['proxy_centers'],
      extra['proxy_margins'],
      proxy_mask=negatives_mask(ctx),
      lam=lam,
      squared_hinge=squared_hinge,
      mask=batch.mask,
    )
    loss = common.reduce_batch(per_example, batch.mask, reduction)
    if rescale:
      loss = loss / shared_mean_radius(extra, scale)
    return loss, (model_state, {})

  def client_final(end_variables, ctx):
    delta, weight, _ = base.client_final(end_variables, ctx)
    if not shares:
      return delta, weight, ctx.client_row
    if center == 'round_start':
      end_center = ctx.local_state['center']
    else:
      end_center, _ = common.scan_center(ctx, model, end_variables, dim)
    radius = common.scan_radius(ctx, model, end_variables, end_center)
    if scale == 0:
      proxy, margin = end_center, radius
    else:
      proxy, margin = proxy_center(end_center, radius, scale, ctx.key)
    row = {
      'proxy_center': proxy,
      'proxy_margin': margin,
      'reported': jnp.ones((), jnp.int32),
      'class': ctx.local_state['class'],
    }
    # A client without data has nothing to describe: it does not report.
    has_data = ctx.num_examples > 0
    row = jax.tree.map(
      lambda new, old: jnp.where(has_data, new, old), row, ctx.client_row
    )
    return delta, weight, row

  def server_update(server_state, aggregate, cohort_rows):
    state = base.server_update(server_state, aggregate, cohort_rows)
    # The extra mirrors the table: only the cohort's rows changed. Padding
    # slots' ids are out of range, so their writes are dropped.
    ids = jnp.where(
      aggregate.slot_mask, aggregate.client_ids, jnp.iinfo(jnp.int32).max
    )
    extra = jax.tree.map(
      lambda all_rows, new: all_rows.at[ids].set(new, mode='drop'),
      server_state.extra,
      shared(cohort_rows),
    )
    return state._replace(extra=extra)

  return base._replace(
    init_server=init_server,
    init_client=init_client,
    client_begin=client_begin,
    client_loss=client_loss,
    client_final=client_final,
    server_update=server_update,
  )
