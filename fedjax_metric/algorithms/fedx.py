"""FedX: unsupervised federated learning with cross knowledge distillation.

Han et al., 'FedX: Unsupervised Federated Learning with Cross Knowledge
Distillation', ECCV 2022, as in the authors' released code
(github.com/Sungwon-Han/FEDX, main.py and losses.py) and its copy in FedU2's
repository (github.com/XeniaLLL/FedU2, src/my/algo/fedx/client.py,
src/mains/train_fedx.py), which the SSD paper's baselines build on.

The model gains a prediction head q (Linear(P, P) -> ReLU -> Linear(P, P)
on the projection, ``ModelFedX.predictionMLP``); it is federated like the
rest, and lives in the parameters under the key ``'fedx_predictor'`` (the
encoder and projector ignore it). Each step sees the two views x1, x2 of a
batch and one view x_r of an independent random batch of the client's data
(`ssl_schedules.ssl_batch_schedules` with random_batch=True); one
forward pass of the local model over [x1; x2; x_r] (BatchNorm statistics
over all 3B) gives projections z and predictions q(z), and the frozen
global model in eval mode gives z^g. The loss is

  NT-Xent(z_1, z_2) + NT-Xent(q_1, z^g_2)                  (local, global)
  + JS(z_1, z_2; anchors z_r) + JS(q_1, q_2; anchors z^g_r)  (relational)

with NT-Xent at tau = 0.1 (self-similarity excluded, `losses.nt_xent_loss`
with self_in_denominator=False) and JS the relational loss
(`losses.relational_loss`, form 'code', t = t2 = 0.1). Aggregation: the
average weighted by local batches (the released ``client_weights =
len(train_loader)``).

Slots replaced relative to FedAvg: ``init_server`` (adds the prediction
head), ``client_loss``, ``client_final`` (weight = local batches),
``client_batches`` / ``cohort_batches`` ([batch | random batch] per step,
width 2B).
"""

import dataclasses
import functools
import math
from typing import Literal

import jax
import jax.numpy as jnp

from fedjax_metric import losses
from fedjax_metric.algorithms import fedavg, ssl_common, ssl_schedules
from fedjax_metric.algorithms.spec import AlgorithmSpec
from fedjax_metric.models import split_variables

PREDICTOR = 'fedx_predictor'


def _torch_linear(key, fan_in, fan_out):
  """torch.nn.Linear's default init: U(-1/sqrt(fan_in), 1/sqrt(fan_in))."""
  bound = 1.0 / math.sqrt(fan_in)
  k_w, k_b = jax.random.split(key)
  return {
    'kernel': jax.random.uniform(
      k_w, (fan_in, fan_out), jnp.float32, -bound, bound
    ),
    'bias': jax.random.uniform(k_b, (fan_out,), jnp.float32, -bound, bound),
  }


def init_predictor(key, dim):
  """The prediction head's parameters, {'fc1', 'fc2'}, each P x P."""
  k1, k2 = jax.random.split(key)
  return {
    'fc1': _torch_linear(k1, dim, dim),
    'fc2': _torch_linear(k2, dim, dim),
  }


def apply_predictor(params, z):
  """q(z) = fc2(ReLU(fc1(z))), [B, P] -> [B, P]."""
  h = jax.nn.relu(z @ params['fc1']['kernel'] + params['fc1']['bias'])
  return h @ params['fc2']['kernel'] + params['fc2']['bias']


@dataclasses.dataclass(frozen=True)
class Options:
  """FedX's options (the released main.py's defaults).

  Attributes:
    temperature: tau of NT-Xent and of the relational student
      distributions (> 0; main.py --temperature).
    local_target_temperature: t2 of the local relational target (> 0;
      main.py --ts).
    global_target_temperature: t2 of the global relational target (> 0;
      main.py --tt).
    relational_form: 'code' or 'js' (`losses.relational_loss`).
    view_order: augmentation order ('fedu2', the FedU2 copy's transforms).
    drop_last: drop partial batches.
  """

  temperature: float = 0.1
  local_target_temperature: float = 0.1
  global_target_temperature: float = 0.1
  relational_form: Literal['code', 'js'] = 'code'
  view_order: Literal['ssd', 'fedu2'] = 'fedu2'
  drop_last: bool = False

  def __post_init__(self):
    for name in (
      'temperature',
      'local_target_temperature',
      'global_target_temperature',
    ):
      ssl_common.check_positive(name, getattr(self, name), allow_zero=False)


def init_server(model, server_optimizer, variables, num_clients, key):
  """FedAvg's init_server on the model's variables plus the prediction head
  (``params[PREDICTOR]``, width P of the projection)."""
  dim = ssl_common.output_width(model, variables, 'projection')
  params = dict(variables['params'])
  params[PREDICTOR] = init_predictor(key, dim)
  return fedavg.init_server(
    server_optimizer, None, {**variables, 'params': params}, num_clients, key
  )


def nt_xent(options, a, b, mask):
  """Masked mean NT-Xent at tau, self-similarity excluded."""
  return losses.masked_mean(
    losses.nt_xent_loss(
      a,
      b,
      temperature=options.temperature,
      self_in_denominator=False,
      mask=mask,
    ),
    mask,
  )


def relational(options, a, b, anchors, target_temperature, mask, anchor_mask):
  """Masked mean relational (JS) loss of a against b over ``anchors``."""
  return losses.masked_mean(
    losses.relational_loss(
      a,
      b,
      anchors,
      temperature=options.temperature,
      target_temperature=target_temperature,
      form=options.relational_form,
      mask=mask,
      anchor_mask=anchor_mask,
    ),
    mask,
  )


def client_loss(options, model, views, params, model_state, batch, ctx):
  """Local + global NT-Xent and relational losses on a batch laid out as
  [batch | random batch] (width 2B): one training forward over [x1; x2;
  x_r], the frozen global model in eval mode for the targets z^g."""
  size = batch.raw_images.shape[0] // 2
  raw, raw_random = batch.raw_images[:size], batch.raw_images[size:]
  mask, mask_random = batch.mask[:size], batch.mask[size:]
  k_views, k_random = jax.random.split(ctx.key)
  x1, x2 = views(raw, k_views)
  x_random = views(raw_random, k_random)[0]
  x = jnp.concatenate([x1, x2, x_random])
  all_mask = jnp.concatenate([mask, mask, mask_random])
  out, model_state = model.apply(
    params, model_state, x, train=True, mask=all_mask
  )
  z = out['projection']
  q = apply_predictor(params[PREDICTOR], z)
  g_params, g_state = split_variables(ctx.server_state.variables)
  g_out, _ = model.apply(g_params, g_state, x, train=False)
  g = jax.lax.stop_gradient(g_out['projection'])
  z1, z2, z_random = z[:size], z[size : 2 * size], z[2 * size :]
  q1, q2 = q[:size], q[size : 2 * size]
  g2, g_random = g[size : 2 * size], g[2 * size :]
  nt_local = nt_xent(options, z1, z2, mask)
  nt_global = nt_xent(options, q1, g2, mask)
  t_local = options.local_target_temperature
  t_global = options.global_target_temperature
  js_local = relational(options, z1, z2, z_random, t_local, mask, mask_random)
  js_global = relational(options, q1, q2, g_random, t_global, mask, mask_random)
  loss = nt_local + nt_global + js_local + js_global
  return loss, (
    model_state,
    {
      'nt_local': nt_local,
      'nt_global': nt_global,
      'js_local': js_local,
      'js_global': js_global,
    },
  )


def build(model, options, *, server_optimizer, weighting='num_batches'):
  """FedX.

  Args:
    model: `ModelFns` with a 'projection' output.
    options: `Options`.
    server_optimizer: optax transformation of the pseudo-gradient.
    weighting: 'num_batches' (released code), 'num_examples', 'uniform'.
  """
  views = ssl_common.two_views(options.view_order)
  algorithm = ssl_common.build_algorithm(
    functools.partial(client_loss, options, model, views),
    server_optimizer=server_optimizer,
    weighting=weighting,
    schedules=ssl_schedules.ssl_batch_schedules(
      drop_last=options.drop_last, random_batch=True
    ),
  )
  return algorithm._replace(
    init_server=functools.partial(init_server, model, server_optimizer)
  )


SPEC = AlgorithmSpec(
  'fedx',
  build,
  Options,
  description='FedX (Han et al., 2022): local and global relational '
  'distillation.',
)
SPECS = (SPEC,)
