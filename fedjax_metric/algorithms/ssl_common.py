"""What every federated unsupervised method of this library shares.

Used by `fedalignuniform`, `ssd`, `feddecorr`, `fedu2`, `fedx`, `l_dawa`:

  * `two_views` / `two_view_forward`: two SimCLR views of
    ``batch.raw_images`` drawn with ctx.key (on device) and one training
    forward pass per view;
  * `client_final`: update = local - global, weight = `aggregation_weight`
    (by default the local batches, as the released SSD, FedU2 and FedX
    code);
  * `build_algorithm`: FedAvg with an unsupervised ``client_loss``, that
    ``client_final`` and a batch schedule of `ssl_schedules`.
"""

import functools

import jax
import jax.numpy as jnp

from fedjax_metric.algorithms import fedavg, ssl_schedules
from fedjax_metric.data import views

WEIGHTINGS = ('num_batches', 'num_examples', 'uniform')


def check_positive(name, value, *, allow_zero=True):
  """Raises a ValueError naming the knob unless value >= 0 (or > 0)."""
  bad = value < 0 if allow_zero else value <= 0
  if bad:
    bound = '>= 0' if allow_zero else '> 0'
    raise ValueError(
      f'{name} must be {bound} (got {value}); set '
      f'--config.algorithm_kwargs.{name} to a value {bound}.'
    )


def check_weighting(weighting):
  if weighting not in WEIGHTINGS:
    raise ValueError(
      f'Unknown weighting {weighting!r}; use one of '
      f'{WEIGHTINGS} (--config.server.weighting).'
    )


def two_views(order='ssd'):
  """``(uint8 images [B, H, W, C], key) -> (view1, view2)``, float 0..1.

  SimCLR's two views (`fedjax_metric.data.views.make_two_view_augment`)
  in SSD's order (crop -> flip -> jitter -> grayscale, crop scale (0.08, 1))
  or FedU2's ('fedu2': crop scale (0.2, 1), flip last). Each ``build``
  calls it once and binds the result into its client loss.
  """
  return views.make_two_view_augment(order=order)


def two_view_forward(model, params, model_state, raw_images, mask, key, views):
  """Draws two views of ``raw_images`` and runs a training forward on each.

  As ``encoder(x1), encoder(x2)`` in the SSD and FedU2 released code
  (github.com/hc-fang/ssd, methods/fedalignuniform/client.py): one forward
  pass per view, so BatchNorm normalises each view with its own batch
  statistics, and the running statistics are updated twice per step.

  Args:
    model: `ModelFns`.
    params, model_state: the variables being trained.
    raw_images: uint8 [B, H, W, C].
    mask: bool [B]; padded examples are kept out of BatchNorm statistics.
    key: PRNG key of the views.
    views: ``(images, key) -> (view1, view2)`` (`two_views`).

  Returns:
    ``(outputs_1, outputs_2, new_model_state)``.
  """
  x1, x2 = views(raw_images, key)
  out1, model_state = model.apply(
    params, model_state, x1, train=True, mask=mask
  )
  out2, model_state = model.apply(
    params, model_state, x2, train=True, mask=mask
  )
  return out1, out2, model_state


def output_width(model, variables, name='projection'):
  """Width of ``outputs[name]`` of ``model`` (abstract evaluation).

  Needs ``model.input_shape`` (set by `models.build` from the dataset).
  """
  if model.input_shape is None:
    raise ValueError(
      'The model has no input_shape; build it with '
      'fedjax_metric.models.build(..., input_shape).'
    )
  params, model_state = (
    variables['params'],
    {k: v for k, v in variables.items() if k != 'params'},
  )
  out = jax.eval_shape(
    lambda p, s: model.apply(p, s, jnp.zeros(model.input_shape), train=False)[
      0
    ][name],
    params,
    model_state,
  )
  return out.shape[-1]


def aggregation_weight(ctx, weighting):
  """The weight of one client's update: ctx.num_steps ('num_batches', the
  SSD released code's len(loader) times the local epochs, the same for every
  client), ctx.num_examples, or 1 ('uniform')."""
  if weighting == 'num_batches':
    return ctx.num_steps
  if weighting == 'num_examples':
    return ctx.num_examples
  return jnp.ones_like(ctx.num_examples)


def client_final(weighting, end_variables, ctx):
  """client_final: update = local - global variables (BatchNorm statistics
  included), weight by `aggregation_weight`."""
  delta = jax.tree.map(jnp.subtract, end_variables, ctx.server_state.variables)
  return delta, aggregation_weight(ctx, weighting), ctx.client_row


def build_algorithm(
  client_loss,
  *,
  server_optimizer,
  weighting='num_batches',
  schedules=None,
  init_extra=None,
):
  """FedAvg with an unsupervised ``client_loss``, `client_final` and a
  batch schedule (``schedules``: both slots, default
  `ssl_schedules.ssl_batch_schedules()`); ``init_extra`` as in
  `fedavg.init_server`."""
  check_weighting(weighting)
  base = fedavg.build(
    None, server_optimizer=server_optimizer, weighting='num_examples'
  )
  return base._replace(
    init_server=fedavg.make_init_server(server_optimizer, init_extra),
    client_loss=client_loss,
    client_final=functools.partial(client_final, weighting),
    **(schedules or ssl_schedules.ssl_batch_schedules()),
  )
