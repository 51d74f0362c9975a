"""FedMetric: one class per client, proxy hyperspheres.

Park, Hosseini and Yun, 'Federated Learning with Metric Loss', FL-ICML
workshop 2021, Algorithm 1 with the loss of Eq. 4-6. Each client k holds one
class. Per round, client k:

  1. C^k = mean_i g(x_i) over its data with the received model
     (``center='round_start'``, Algorithm 1, computed by a pass over the
     round's batches: in epoch mode every local example once), or the mean
     of the current batch's embeddings at every step (``center='batch'``,
     Sec. 3.1: "the local center is iteratively updated using the mean of
     instance embeddings in the local batch");
  2. local steps on l = l_pos + lam l_neg (Eq. 4), with
     l_pos = sum_i d(g(x_i), C^k) (Eq. 5) and
     l_neg = sum_i sum_{j != k} max(0, M^j - d(g(x_i), A^j))^p (Eq. 6,
     p = 2; Algorithm 1 prints p = 1: ``squared_hinge=False``);
  3. R^k = max_i d(g(x_i), C^k) with the trained model (a second pass; in
     'batch' mode C^k is first recomputed with the trained model),
     A^k = C^k + X with X uniform on the sphere of radius D^k = s R^k,
     M^k = R^k + D^k (`fedmetric_proxies.proxy_center`), written to the
     client's row of the client table.

The proxy hypersphere contains the true one, so sharing it reveals less than
C^k (Sec. 3.2). The server averages the models (uniformly by default,
theta = 1/M sum_k theta_k in Algorithm 1) and copies every client's latest
(A^j, M^j) from the table into its state, which every client receives next
round. Clients that have not reported yet, the client itself and (with
``exclude_same_class``) clients holding the same class are masked out of
l_neg. The paper has one client per class; with several clients per class
their hyperspheres describe the same class, and pushing away from them would
split it, hence the default. The class a client holds is read from its
labels.

Slots replaced relative to FedAvg: ``init_server`` (the shared table in the
server extra), ``init_client`` (an empty row), ``client_begin`` (C^k with a
frozen pass), ``client_loss`` (Eq. 4-6), ``client_final`` (R^k with a second
pass; the new row), ``server_update`` (FedAvg, then the cohort's rows copied
into the extra). Where the paper's text, equations and Algorithm 1 differ
(squared or plain hinge, sum or mean over the batch, a center per round or
per batch) each form is an option; `Options` says which is the default and
why.
"""

import dataclasses
import functools
from typing import Literal, Optional

import jax
import jax.numpy as jnp

from fedjax_metric.algorithms import fedavg
from fedjax_metric.algorithms import fedmetric_proxies as proxies
from fedjax_metric.algorithms import oneclass_common as common
from fedjax_metric.algorithms.fedmetric_proxies import (  # noqa: F401
  DEFAULT_PROXY_SCALE,
  local_center,
  proxy_center,
  resolve_scale,
  shared_mean_radius,
)
from fedjax_metric.algorithms.spec import AlgorithmSpec
from fedjax_metric.losses.oneclass import fedmetric_loss

NEGATIVES = ('none', 'proxy', 'true')
CENTERS = ('round_start', 'batch')


@dataclasses.dataclass(frozen=True)
class Options:
  """FedMetric's options.

  Attributes:
    negatives: 'none' (Table 2's pos: l_pos only, nothing shared), 'proxy'
      (pos+neg(proxy), the method) or 'true' (pos+neg(true): A = C, M = R,
      i.e. s = 0).
    lam: lambda >= 0 of Eq. 4, the weight of l_neg.
    scale: s >= 0, D^k = s R^k (Sec. 4.2, Fig. 3); None picks
      `DEFAULT_PROXY_SCALE` for 'proxy' (the paper asks for s > 1, so that
      A^k lies outside the client's own hypersphere), 0 otherwise.
    squared_hinge: p = 2 in Eq. 6 (True) or Algorithm 1's plain hinge p = 1.
    center: 'round_start' or 'batch' (step 1).
    reduction: 'mean' (a masked mean over the batch, the default) or 'sum'
      (Eq. 5-6), whose gradient is B times larger at batch size B: with the
      paper's learning rate 0.1 and batch 16 the sum diverged (with proxy
      negatives: NaN within 100 one-step rounds on Fashion-MNIST with
      LeNet).
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
  """

  negatives: Literal['none', 'proxy', 'true'] = 'proxy'
  lam: float = 1.0
  scale: Optional[float] = None
  squared_hinge: bool = True
  center: Literal['round_start', 'batch'] = 'round_start'
  reduction: Literal['sum', 'mean'] = 'mean'
  exclude_same_class: bool = True
  rescale: bool = False

  def __post_init__(self):
    common.check_choice('negatives', self.negatives, NEGATIVES)
    common.check_choice('center', self.center, CENTERS)
    common.check_choice('reduction', self.reduction, common.REDUCTIONS)
    if not self.lam >= 0:
      raise ValueError(
        f'lam must be >= 0, got {self.lam} (--config.algorithm_kwargs.lam).'
      )
    resolve_scale(self.negatives, self.scale)  # Raises on a bad s.
    if self.rescale and not self.shares:
      raise ValueError(
        'rescale=True measures distances in units of the shared radii; '
        "negatives='none' shares none. Use negatives='proxy' or 'true'."
      )

  @property
  def shares(self) -> bool:
    """Whether clients share a hypersphere (negatives 'proxy' or 'true')."""
    return self.negatives != 'none'

  @property
  def proxy_scale(self) -> float:
    """s as the run uses it (`resolve_scale`)."""
    return resolve_scale(self.negatives, self.scale)


def client_begin(options, model, dim, ctx):
  """client_begin: from the global model; local_state holds C^k ([D],
  zeros in 'batch' mode, where each step computes its own) and the class."""
  variables = ctx.server_state.variables
  if options.center == 'round_start':
    round_center, _ = common.scan_center(ctx, model, variables, dim)
  else:
    round_center = jnp.zeros((dim,), jnp.float32)
  return variables, {'center': round_center, 'class': common.client_class(ctx)}


def negatives_mask(options, ctx):
  """[N] bool: the hyperspheres in l_neg (reported, not the client's own,
  not its class's with ``exclude_same_class``; none without sharing)."""
  extra = ctx.server_state.extra
  num_clients = extra['reported'].shape[0]
  keep = (extra['reported'] > 0) & (jnp.arange(num_clients) != ctx.client_id)
  if options.exclude_same_class:
    keep = keep & (extra['classes'] != ctx.local_state['class'])
  return keep & options.shares


def client_loss(options, model, params, model_state, batch, ctx):
  """Eq. 4-6: l_pos + lam l_neg per example, reduced over the batch (and
  divided by rho with ``rescale``)."""
  outputs, model_state = model.apply(
    params, model_state, batch.images, train=True, mask=batch.mask
  )
  embeddings = outputs['embedding']
  if options.center == 'batch':
    batch_center = jax.lax.stop_gradient(local_center(embeddings, batch.mask))
  else:
    batch_center = ctx.local_state['center']
  extra = ctx.server_state.extra
  per_example = fedmetric_loss(
    embeddings,
    batch_center,
    extra['proxy_centers'],
    extra['proxy_margins'],
    proxy_mask=negatives_mask(options, ctx),
    lam=options.lam,
    squared_hinge=options.squared_hinge,
    mask=batch.mask,
  )
  loss = common.reduce_batch(per_example, batch.mask, options.reduction)
  if options.rescale:
    loss = loss / shared_mean_radius(extra, options.proxy_scale)
  return loss, (model_state, {})


def client_final(options, model, dim, weighting, end_variables, ctx):
  """FedAvg's update and weight; the row becomes (A^k, M^k) of step 3 (kept
  unchanged without sharing, or for a client without data)."""
  delta, weight, _ = fedavg.delta_final(weighting, end_variables, ctx)
  if not options.shares:
    return delta, weight, ctx.client_row
  if options.center == 'round_start':
    end_center = ctx.local_state['center']
  else:
    end_center, _ = common.scan_center(ctx, model, end_variables, dim)
  radius = common.scan_radius(ctx, model, end_variables, end_center)
  scale = options.proxy_scale
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


def server_update(server_optimizer, server_state, aggregate, cohort_rows):
  """FedAvg's step, then the cohort's rows copied into the shared table."""
  state = fedavg.server_update(
    server_optimizer, server_state, aggregate, cohort_rows
  )
  return state._replace(
    extra=proxies.copy_cohort_rows(server_state.extra, aggregate, cohort_rows)
  )


def build(model, options, *, server_optimizer, weighting='uniform'):
  """FedMetric as an `engine.Algorithm`.

  Args:
    model: `ModelFns` with an 'embedding' output (no classifier needed).
    options: `Options`.
    server_optimizer: optax transformation of the pseudo-gradient; sgd(1.0)
      is plain averaging.
    weighting: 'uniform' (Algorithm 1) or 'num_examples'.
  """
  dim = common.embedding_dim(model)
  base = fedavg.build(
    model, server_optimizer=server_optimizer, weighting=weighting
  )
  return base._replace(
    init_server=fedavg.make_init_server(
      server_optimizer, functools.partial(proxies.init_extra, dim)
    ),
    init_client=functools.partial(proxies.init_client, dim),
    client_begin=functools.partial(client_begin, options, model, dim),
    client_loss=functools.partial(client_loss, options, model),
    client_final=functools.partial(
      client_final, options, model, dim, weighting
    ),
    server_update=functools.partial(server_update, server_optimizer),
  )


SPEC = AlgorithmSpec(
  'fedmetric',
  build,
  Options,
  description='FedMetric (Park et al., 2021): one class per client, proxy '
  'hyperspheres.',
)
SPECS = (SPEC,)
