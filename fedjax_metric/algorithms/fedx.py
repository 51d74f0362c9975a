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
(`fedalignuniform.ssl_batch_schedules` with random_batch=True); one
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

import math

import jax
import jax.numpy as jnp

from fedjax_metric import losses
from fedjax_metric.algorithms import fedalignuniform as fau
from fedjax_metric.algorithms import fedavg
from fedjax_metric.contract import NO_RUN_FACTS, RunFacts
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


def make(
  model,
  *,
  server_optimizer,
  run: RunFacts = NO_RUN_FACTS,
  weighting='num_batches',
  temperature=0.1,
  local_target_temperature=0.1,
  global_target_temperature=0.1,
  relational_form='code',
  view_order='fedu2',
  drop_last=False,
):
  """FedX.

  Args:
    model: `ModelFns` with a 'projection' output.
    server_optimizer: optax transformation of the pseudo-gradient.
    weighting: 'num_batches' (released code), 'num_examples', 'uniform'.
    temperature: tau of NT-Xent and of the relational student
      distributions (0.1, main.py --temperature).
    local_target_temperature: t2 of the local relational target (0.1,
      main.py --ts).
    global_target_temperature: t2 of the global relational target (0.1,
      main.py --tt).
    relational_form: 'code' or 'js' (`losses.relational_loss`).
    view_order: augmentation order ('fedu2', the FedU2 copy's transforms).
    drop_last: drop partial batches.
  """
  for name, value in (
    ('temperature', temperature),
    ('local_target_temperature', local_target_temperature),
    ('global_target_temperature', global_target_temperature),
  ):
    fau.check_positive(name, value, allow_zero=False)
  views = fau.make_views(view_order)
  init_server_base = fedavg.make_init_server(server_optimizer)

  def init_server(variables, num_clients, key):
    dim = fau.output_width(model, variables, 'projection')
    params = dict(variables['params'])
    params[PREDICTOR] = init_predictor(key, dim)
    return init_server_base({**variables, 'params': params}, num_clients, key)

  def nt_xent(a, b, mask):
    return losses.masked_mean(
      losses.nt_xent_loss(
        a, b, temperature=temperature, self_in_denominator=False, mask=mask
      ),
      mask,
    )

  def relational(a, b, anchors, target_temperature, mask, anchor_mask):
    return losses.masked_mean(
      losses.relational_loss(
        a,
        b,
        anchors,
        temperature=temperature,
        target_temperature=target_temperature,
        form=relational_form,
        mask=mask,
        anchor_mask=anchor_mask,
      ),
      mask,
    )

  def client_loss(params, model_state, batch, ctx):
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
    nt_local = nt_xent(z1, z2, mask)
    nt_global = nt_xent(q1, g2, mask)
    js_local = relational(
      z1, z2, z_random, local_target_temperature, mask, mask_random
    )
    js_global = relational(
      q1, q2, g_random, global_target_temperature, mask, mask_random
    )
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

  algorithm = fau.make_algorithm(
    model,
    client_loss,
    server_optimizer=server_optimizer,
    weighting=weighting,
    schedules=fau.ssl_batch_schedules(drop_last=drop_last, random_batch=True),
  )
  return algorithm._replace(init_server=init_server)
