"""SSD: Soft Separation and Distillation.

Fang et al., 'Soft Separation and Distillation: Toward Global Uniformity in
Federated Unsupervised Learning', ICCV 2025. The server gives every client k a
scaling matrix S_k once, before training (Algorithm 1, line 4); each client
minimises (Eq. 10)

  L^k = L_align + beta L_uniform + gamma L_DSR + delta L_distill,

FedAlignUniform's loss (`fedjax_metric.algorithms.fedalignuniform`) plus the
dimension-scaled regulariser (`fedjax_metric.losses.dsr_loss`, Eq. 7), which
pulls the client's normalised embeddings towards n(z S_k S_k^T) and so leans
them towards the client's own directions, and the projector distillation
(`fedjax_metric.losses.projector_distillation_loss`, Eq. 9). The server
averages as FedAlignUniform does.

Slots replaced relative to FedAvg: ``init_server`` (the K scaling matrices
in the server extra, [K, D, D]), ``client_loss`` (two views drawn from
``batch.raw_images`` with ctx.key; S_k picked by ctx.client_id, or by
ctx.slot as the released code does), ``client_final`` (weight = local
batches), ``client_batches`` / ``cohort_batches`` (drop_last / skip
one-example batches).
"""

import jax
import jax.numpy as jnp
import numpy as np

from fedjax_metric import losses
from fedjax_metric.algorithms import fedalignuniform as fau
from fedjax_metric.contract import NO_RUN_FACTS, RunFacts

COHORT_ASSIGNMENTS = ('position', 'client_id')


def _random_orthogonal(rng, dim):
  """Haar-random orthogonal [dim, dim]: QR of a Gaussian, R's signs removed.

  Without the sign fix the columns' signs follow LAPACK's convention and Q is
  not exactly Haar; either way S S^T is unchanged by column signs.
  """
  q, r = np.linalg.qr(rng.standard_normal((dim, dim)))
  signs = np.sign(np.diag(r))
  return q * np.where(signs == 0, 1.0, signs)


def scaling_matrices(
  num_clients,
  dim,
  *,
  scale=10.0,
  seed=0,
  directions_per_client=None,
  random_basis=True,
):
  """The K clients' DSR scaling matrices S_k (SSD Eq. 6; Algorithm 1, line 4).

  As ``FedAlignUniformServer.fit`` with ``subspace_mode='fixed'`` in the
  authors' released code (github.com/hc-fang/ssd,
  methods/fedalignuniform/server.py): one random orthonormal basis Q shared
  by all clients, one random permutation ``perm`` of the D basis directions,
  and client k's direction set ``perm[k m : (k + 1) m]``. S_k is Q with those
  columns multiplied by sqrt(scale), so

    S_k S_k^T = Q D_k Q^T,   D_k = diag(scale on k's m directions, 1 else):

  eigenvalue ``scale`` on an m-dimensional subspace, 1 on its complement, and
  the scaled subspaces of different clients are mutually orthogonal. The
  paper speaks of scaling 'dimensions' (Eq. 6: d_i,k = alpha on S_k);
  ``random_basis=False`` gives that reading, Q = I (canonical axes).

  m = ``directions_per_client``, by default floor(D / K) as the paper states
  (the released script hard-codes m = 10). When K m > D the later clients get
  a partial or an empty set, as the released code's slicing does; a client
  with none has S_k S_k^T = I, so its DSR target is z itself and its loss 0.
  The released code draws scale ~ U[low, high] per client with low = high =
  10; a fixed ``scale`` is that case.

  Args:
    num_clients: K >= 1.
    dim: D, the embedding width (512 in SSD).
    scale: the factor alpha on the chosen directions (10 in SSD).
    seed: NumPy seed; the same seed gives the same matrices.
    directions_per_client: m; None means floor(D / K).
    random_basis: random rotation Q (released code) or canonical axes.

  Returns:
    float32 [K, D, D]; S_k = result[k].
  """
  if num_clients < 1 or dim < 1:
    raise ValueError(
      f'need num_clients >= 1 and dim >= 1, got {num_clients}, {dim}'
    )
  m = (
    dim // num_clients
    if directions_per_client is None
    else int(directions_per_client)
  )
  if m < 0:
    raise ValueError(f'directions_per_client must be >= 0, got {m}')
  rng = np.random.default_rng(seed)
  basis = _random_orthogonal(rng, dim) if random_basis else np.eye(dim)
  perm = rng.permutation(dim)
  out = np.repeat(basis[None], num_clients, axis=0)
  for k in range(num_clients):
    chosen = perm[k * m : (k + 1) * m]
    out[k][:, chosen] *= np.sqrt(scale)
  return out.astype(np.float32)


def cohort_scaling(scalings, client_ids, *, assign='position'):
  """The scaling matrices of one round's cohort, [C, D, D].

  assign='position' (the authors' released code,
  github.com/hc-fang/ssd, methods/fedalignuniform/server.py): the i-th
  sampled client gets slot i, whatever its id. With full participation the
  order is fixed and slot = client id; with partial participation only slots
  0..C-1 are ever used and a client's directions change from round to round.
  assign='client_id' (the paper's description, Algorithm 1): client k always
  gets S_k.

  Args:
    scalings: [K, D, D] from `scaling_matrices`.
    client_ids: [C] int ids of the round's cohort (C <= K); jittable.
    assign: 'position' or 'client_id'.

  Returns:
    [C, D, D].
  """
  client_ids = jnp.asarray(client_ids)
  if assign == 'position':
    if client_ids.shape[0] > scalings.shape[0]:
      raise ValueError(
        f'cohort of {client_ids.shape[0]} exceeds the {scalings.shape[0]} slots'
      )
    return jnp.asarray(scalings)[: client_ids.shape[0]]
  if assign == 'client_id':
    return jnp.take(jnp.asarray(scalings), client_ids, axis=0)
  raise ValueError(
    f'assign must be one of {COHORT_ASSIGNMENTS}, got {assign!r}'
  )


def pick_scaling(scalings, ctx, assign):
  """The client's [D, D] scaling matrix: row ctx.client_id ('client_id', the
  paper's Algorithm 1) or ctx.slot ('position', the released code; see
  `cohort_scaling`). Padding slots (ids >= K) read a clipped row; they
  train on no example."""
  index = ctx.client_id if assign == 'client_id' else ctx.slot
  return jnp.take(scalings, index, axis=0, mode='clip')


def make(
  model,
  *,
  server_optimizer,
  run: RunFacts = NO_RUN_FACTS,
  weighting='num_batches',
  uniform_weight=1.0,
  uniformity_t=2.0,
  dsr_weight=1.0,
  distill_weight=0.1,
  distill_temperature=0.5,
  distill_method='kl',
  distill_form='code',
  dsr_form='code',
  scale=10.0,
  directions_per_client=None,
  random_basis=True,
  assign='client_id',
  scaling_seed=None,
  view_order='ssd',
  drop_last=False,
  loss_on='projection',
):
  """SSD as an `engine.Algorithm`.

  Defaults are the paper's (Sec. 4 'Implementation Details', App. A.1) and
  the authors' released code's (github.com/hc-fang/ssd,
  scripts/run_FedAlignUniformSubspace.sh): beta = gamma = 1, delta = 0.1,
  alpha = 10, KL distillation at T = 0.5, m = floor(D / K) rotated
  directions per client.

  Args:
    model: `ModelFns` with 'embedding' (encoder, h) and 'projection' (z)
      outputs of equal width (projector distillation compares them).
    server_optimizer: optax transformation of the pseudo-gradient.
    weighting: 'num_batches' (released code), 'num_examples', 'uniform'.
    uniform_weight: beta. uniformity_t: t of L_uniform (2).
    dsr_weight: gamma. dsr_form: 'code' (Frobenius norm / n of the
      difference to the normalised target) or 'paper' (Eq. 7).
    distill_weight: delta. distill_temperature: T of the KL form.
    distill_method: 'kl' (default) or 'mse' (the released code's
      alternative, mean squared difference; SSD Table 5).
    distill_form: 'code' (KL(softmax(z/T) || softmax(h/T))) or 'paper'
      (Eq. 9's direction); see `losses.projector_distillation_loss`.
    scale: alpha, the factor on a client's directions.
    directions_per_client: m; None means floor(D / K).
    random_basis: directions of a random rotation (released code) or
      canonical axes (Eq. 6's literal 'dimensions').
    assign: 'client_id' (client k always gets S_k, the paper) or
      'position' (the i-th client of the round's cohort gets S_i, the
      released code; differs only under partial participation).
    scaling_seed: NumPy seed of the matrices; None derives it from the key
      `init_server` receives (the run's seed).
    view_order: 'ssd' or 'fedu2' augmentation order.
    drop_last: drop partial batches (the released code does when K <= 10).
    loss_on: the output the alignment, uniformity and DSR terms read:
      'projection' (the method) or 'embedding', the representation itself,
      Table 4's "without the projector" (the projector then gets no
      gradient and stays as initialised; projector distillation has nothing
      to distil, so it needs distill_weight=0).
  """
  for name, value in (
    ('uniform_weight', uniform_weight),
    ('dsr_weight', dsr_weight),
    ('distill_weight', distill_weight),
    ('scale', scale),
  ):
    fau.check_positive(name, value)
  fau.check_positive(
    'distill_temperature', distill_temperature, allow_zero=False
  )
  if assign not in COHORT_ASSIGNMENTS:
    raise ValueError(
      f'assign must be one of {COHORT_ASSIGNMENTS}, got '
      f'{assign!r} (--config.algorithm_kwargs.assign).'
    )
  if distill_method not in ('kl', 'mse'):
    raise ValueError(
      f"distill_method must be 'kl' or 'mse', got {distill_method!r}."
    )
  if loss_on not in ('projection', 'embedding'):
    raise ValueError(
      f"loss_on must be 'projection' or 'embedding', got {loss_on!r} "
      '(--config.algorithm_kwargs.loss_on).'
    )
  if loss_on == 'embedding' and distill_weight > 0:
    raise ValueError(
      "loss_on='embedding' trains without the projector, so projector "
      'distillation has nothing to distil; set '
      '--config.algorithm_kwargs.distill_weight=0.'
    )
  views = fau.make_views(view_order)

  def init_extra(variables, num_clients, key):
    dim = fau.output_width(model, variables, loss_on)
    if (
      distill_weight > 0
      and fau.output_width(model, variables, 'embedding') != dim
    ):
      raise ValueError(
        'Projector distillation needs equal encoder and '
        'projector widths; set the model so that '
        "'embedding' and 'projection' match, or "
        'distill_weight=0.'
      )
    seed = scaling_seed
    if seed is None:
      seed = int(jax.random.randint(key, (), 0, 2**31 - 1))
    return {
      'scaling': jnp.asarray(
        scaling_matrices(
          num_clients,
          dim,
          scale=scale,
          seed=seed,
          directions_per_client=directions_per_client,
          random_basis=random_basis,
        )
      )
    }

  def distillation(h, p, mask):
    if distill_method == 'mse':
      per_row = jnp.mean(jnp.square(h - p), axis=-1)
    else:
      per_row = losses.projector_distillation_loss(
        h, p, temperature=distill_temperature, form=distill_form, mask=mask
      )
    return losses.masked_mean(per_row, mask)

  def client_loss(params, model_state, batch, ctx):
    mask = batch.mask
    out1, out2, model_state = fau.two_view_forward(
      model, params, model_state, batch.raw_images, mask, ctx.key, views
    )
    p1, p2 = out1[loss_on], out2[loss_on]
    loss, align, uniform = fau.align_uniform_loss(
      p1, p2, mask, uniform_weight=uniform_weight, t=uniformity_t
    )
    scaling = pick_scaling(ctx.server_state.extra['scaling'], ctx, assign)
    dsr = (
      losses.dsr_loss(p1, scaling, form=dsr_form, mask=mask)
      + losses.dsr_loss(p2, scaling, form=dsr_form, mask=mask)
    ) / 2.0
    distill = (
      distillation(out1['embedding'], p1, mask)
      + distillation(out2['embedding'], p2, mask)
    ) / 2.0
    loss = loss + dsr_weight * dsr + distill_weight * distill
    return loss, (
      model_state,
      {
        'alignment': align,
        'uniformity': uniform,
        'dsr': dsr,
        'distillation': distill,
      },
    )

  return fau.make_algorithm(
    model,
    client_loss,
    server_optimizer=server_optimizer,
    weighting=weighting,
    init_extra=init_extra,
    schedules=fau.ssl_batch_schedules(drop_last=drop_last),
  )
