"""FedAlignUniform: alignment + uniformity in FedAvg, and the pieces every
federated unsupervised method of this library shares.

The local objective is Wang & Isola's ('Understanding Contrastive
Representation Learning through Alignment and Uniformity on the
Hypersphere', ICML 2020) on the projections of two augmented views,

  L = L_align + beta (U(z1) + U(z2)) / 2,

as used by Fang et al., 'Soft Separation and Distillation: Toward Global
Uniformity in Federated Unsupervised Learning', ICCV 2025 (SSD; Eq. 3, 4 and
Eq. 10 without its last two terms), where it is the base that SSD extends.
Defaults follow the SSD authors' released code (github.com/hc-fang/ssd,
methods/fedalignuniform/client.py and server.py): t = 2, beta = 1, per-view
uniformity averaged, BatchNorm statistics of each view computed in its own
forward pass, a batch of a single example skipped, and the server averaging
encoder, projector and BatchNorm statistics with weights = the number of
local batches.

Shared pieces (used by `ssd`, `feddecorr`, `fedu2`, `fedx`, `l_dawa`):
  * `two_view_forward`: two SimCLR views of ``batch.raw_images`` drawn with
    ctx.key (on device) and one training forward pass per view.
  * `ssl_batch_schedules`: the batch schedule (drop_last, skipping
    batches of one example, FedX's extra random batch, FedU2's 'even'
    local epochs).
  * `make_client_final`: update = local - global, weight = local batches.
  * `make_algorithm`: FedAvg with those slots replaced.

Slots replaced relative to FedAvg: ``client_loss`` (the two-view loss),
``client_final`` (weights by ctx.num_steps, the client's real local steps),
``client_batches`` and ``cohort_batches`` (the schedule above, per client
and for the whole cohort).
"""

from typing import Optional

import jax
import jax.numpy as jnp
import numpy as np

from fedjax_metric import engine, losses
from fedjax_metric.algorithms import fedavg
from fedjax_metric.contract import NO_RUN_FACTS, RunFacts
from fedjax_metric.data import cohort as cohort_lib
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


def make_views(order='ssd'):
  """``(uint8 images [B, H, W, C], key) -> (view1, view2)``, float 0..1.

  SimCLR's two views (`fedjax_metric.data.views.make_two_view_augment`)
  in SSD's order (crop -> flip -> jitter -> grayscale, crop scale (0.08, 1))
  or FedU2's ('fedu2': crop scale (0.2, 1), flip last).
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
    views: ``(images, key) -> (view1, view2)`` (`make_views`).

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


def align_uniform_loss(p1, p2, mask, *, uniform_weight=1.0, t=2.0):
  """``L_align + beta (U(p1) + U(p2)) / 2`` and its two parts.

  Wang & Isola, ICML 2020; SSD Eq. 3-4 (Fang et al., ICCV 2025), with the
  per-view uniformity average of the SSD authors' released code
  (github.com/hc-fang/ssd, methods/fedalignuniform/client.py).

  Args:
    p1, p2: [B, D] projections of the two views (normalised inside).
    mask: bool [B].
    uniform_weight: beta.
    t: the uniformity temperature.

  Returns:
    ``(loss, alignment, uniformity)`` scalars.
  """
  align = losses.masked_mean(losses.alignment_loss(p1, p2, mask=mask), mask)
  uniform = (
    losses.uniformity_loss(p1, t=t, mask=mask)
    + losses.uniformity_loss(p2, t=t, mask=mask)
  ) / 2.0
  return align + uniform_weight * uniform, align, uniform


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


# ---------------------------------------------------------------------------
# Batch schedule and aggregation weight.
# ---------------------------------------------------------------------------


def ssl_batch_schedules(
  *,
  drop_last=False,
  min_batch_examples=2,
  random_batch=False,
  even_epochs_cap=0,
):
  """The batch schedule for two-view training, as both `engine.Algorithm`
  slots: ``client_batches`` (per client) and ``cohort_batches`` (vectorized).

  Starts from `cohort.client_batches` (a fresh permutation per local epoch,
  the last batch partial) and then:

  * ``drop_last``: drops every partial batch (torch DataLoader
    drop_last=True; the SSD released code sets it when K <= 10);
  * drops batches with fewer than ``min_batch_examples`` real examples (the
    released SSD, FedU2 and FedX clients skip batches of one example);
  * ``random_batch``: each step is [batch | random batch], width 2B: the
    second half comes from an independent permutation of the client's data,
    FedX's ``random_loader`` zipped with its train loader (Han et al.,
    'FedX: Unsupervised Federated Learning with Cross Knowledge
    Distillation', ECCV 2022; github.com/Sungwon-Han/FEDX, main.py);
  * ``even_epochs_cap > 0``: FedU2's 'even' schedule (Liao et al.,
    'Rethinking the Representation in Federated Unsupervised Learning with
    Non-IID Data', CVPR 2024; github.com/XeniaLLL/FedU2,
    src/my/algo/fedU2/fedsimclr_client.py): a client with ceil(n_k / B)
    batches per epoch runs E_k = min(S // ceil(n_k / B), cap) epochs, S the
    run's steps per round, so small clients take about as many steps as
    the largest (the code's S is (max n // B + 1) x epochs; here S is
    `cohort.num_local_steps`, epochs x ceil(max n / B)).

  Steps that are dropped keep their slot in the [S, B] layout with an
  all-False mask, so they are no-ops and do not count in ctx.num_steps.

  Returns:
    ``dict(client_batches=(indices, labels, rng, *, num_steps, batch_size,
    local_epochs, local_steps) -> (idx [S, B or 2B], mask [S, B or 2B]),
    cohort_batches=(clients, labels, *, seed, round_idx, **shape) -> (idx
    [R, S, B or 2B], mask))``; the vectorized form draws the random batch
    from its own stream of permutations.
  """
  if min_batch_examples < 0 or even_epochs_cap < 0:
    raise ValueError(
      'min_batch_examples and even_epochs_cap must be >= 0 '
      f'(got {min_batch_examples}, {even_epochs_cap}).'
    )

  def epochs_of(sizes, *, num_steps, batch_size, local_epochs, local_steps):
    """Local epochs of clients with ``sizes`` examples (int array)."""
    sizes = np.asarray(sizes)
    if not (even_epochs_cap and local_steps == 0):
      return np.full(sizes.shape, local_epochs)
    per_epoch = np.maximum(-(-sizes // batch_size), 1)
    return np.clip(num_steps // per_epoch, 1, even_epochs_cap)

  def kept_steps(mask, batch_size):
    """[..., S] which steps train: enough real examples (and full)."""
    counts = mask.sum(axis=-1)
    keep = counts >= max(min_batch_examples, 1)
    if drop_last:
      keep &= counts == batch_size
    return keep[..., None]

  def client_batches(indices, labels, rng, **shape):
    del labels
    shape['local_epochs'] = int(epochs_of(len(indices), **shape))
    idx, mask = cohort_lib.client_batches(indices, rng, **shape)
    keep = kept_steps(mask, shape['batch_size'])
    mask = mask & keep
    if random_batch:
      idx_r, mask_r = cohort_lib.client_batches(indices, rng, **shape)
      idx = np.concatenate([idx, idx_r], axis=1)
      mask = np.concatenate([mask, mask_r & keep], axis=1)
    return idx, mask

  def cohort_batches(clients, labels, *, seed, round_idx, **shape):
    del labels
    epochs = epochs_of(clients.sizes, **shape)
    draws = dict(seed=seed, round_idx=round_idx, epochs=epochs, **shape)
    pos, mask = cohort_lib.vectorized_schedule(clients, **draws)
    keep = kept_steps(mask, shape['batch_size'])
    mask = mask & keep
    if random_batch:  # the second loader: an independent stream
      pos_r, mask_r = cohort_lib.vectorized_schedule(clients, stream=1, **draws)
      pos = np.concatenate([pos, pos_r], axis=2)
      mask = np.concatenate([mask, mask_r & keep], axis=2)
    return cohort_lib.take(clients, pos, mask), mask

  return dict(client_batches=client_batches, cohort_batches=cohort_batches)


def batches_per_epoch(ctx):
  """The client's batches in one local epoch, counted on its schedule.

  Walks ctx.scan_batches and counts the leading steps whose examples still
  fit in n_k: in epoch mode those are the first epoch's batches. A batch
  that the schedule dropped (one example, or partial with drop_last) is not
  counted, which differs from len(loader) of the reference code by at most
  one batch.

  Returns:
    float32 scalar.
  """

  def count(carry, batch):
    seen, steps = carry
    real = jnp.sum(batch.mask.astype(jnp.float32))
    take = (real > 0) & (seen + real <= ctx.num_examples)
    return seen + jnp.where(take, real, 0.0), steps + take.astype(jnp.float32)

  zero = jnp.zeros((), jnp.float32)
  return ctx.scan_batches(count, (zero, zero))[1]


def aggregation_weight(ctx, weighting):
  """The weight of one client's update: ctx.num_steps ('num_batches', the
  SSD released code's len(loader) times the local epochs, the same for every
  client), ctx.num_examples, or 1 ('uniform')."""
  if weighting == 'num_batches':
    return ctx.num_steps
  if weighting == 'num_examples':
    return ctx.num_examples
  return jnp.ones_like(ctx.num_examples)


def check_weighting(weighting):
  if weighting not in WEIGHTINGS:
    raise ValueError(
      f'Unknown weighting {weighting!r}; use one of '
      f'{WEIGHTINGS} (--config.server.weighting).'
    )


def make_client_final(weighting='num_batches'):
  """client_final: update = local - global variables (BatchNorm statistics
  included), weight by `aggregation_weight`."""
  check_weighting(weighting)

  def client_final(end_variables, ctx):
    delta = jax.tree.map(
      jnp.subtract, end_variables, ctx.server_state.variables
    )
    return delta, aggregation_weight(ctx, weighting), ctx.client_row

  return client_final


def make_algorithm(
  model,
  client_loss,
  *,
  server_optimizer,
  weighting='num_batches',
  schedules: Optional[dict] = None,
  init_extra=None,
):
  """FedAvg with an unsupervised ``client_loss``, `make_client_final` and an
  ssl batch schedule (``schedules``, both slots; default
  `ssl_batch_schedules()`)."""
  del model
  base = fedavg.build(
    None, server_optimizer=server_optimizer, weighting='num_examples'
  )
  return base._replace(
    init_server=fedavg.make_init_server(server_optimizer, init_extra),
    client_loss=client_loss,
    client_final=make_client_final(weighting),
    **(schedules or ssl_batch_schedules()),
  )


def make(
  model,
  *,
  server_optimizer,
  run: RunFacts = NO_RUN_FACTS,
  weighting='num_batches',
  uniform_weight=1.0,
  uniformity_t=2.0,
  view_order='ssd',
  drop_last=False,
) -> engine.Algorithm:
  """FedAlignUniform.

  Args:
    model: `ModelFns` with outputs 'embedding' (encoder) and 'projection'.
    server_optimizer: optax transformation of the pseudo-gradient (sgd(1.0)
      is plain averaging, as the released code).
    weighting: 'num_batches' (released code), 'num_examples' (the paper's
      n_k / n, Sec. 3.1) or 'uniform'.
    uniform_weight: beta (1.0).
    uniformity_t: t of the uniformity loss (2).
    view_order: 'ssd' or 'fedu2' augmentation order.
    drop_last: drop partial batches (the released code does when K <= 10).
  """
  check_positive('uniform_weight', uniform_weight)
  check_positive('uniformity_t', uniformity_t, allow_zero=False)
  views = make_views(view_order)

  def client_loss(params, model_state, batch, ctx):
    out1, out2, model_state = two_view_forward(
      model, params, model_state, batch.raw_images, batch.mask, ctx.key, views
    )
    loss, align, uniform = align_uniform_loss(
      out1['projection'],
      out2['projection'],
      batch.mask,
      uniform_weight=uniform_weight,
      t=uniformity_t,
    )
    return loss, (model_state, {'alignment': align, 'uniformity': uniform})

  return make_algorithm(
    model,
    client_loss,
    server_optimizer=server_optimizer,
    weighting=weighting,
    schedules=ssl_batch_schedules(drop_last=drop_last),
  )
