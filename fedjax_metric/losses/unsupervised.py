"""Losses of federated unsupervised learning: SSD and its baselines.

SSD (Fang et al., 'Soft Separation and Distillation: Toward Global Uniformity
in Federated Unsupervised Learning', ICCV 2025) trains each client on

  L^k = L_align + beta L_uniform + gamma L_DSR + delta L_distill   (Eq. 10)

with `alignment_loss`, `uniformity_loss`, `dsr_loss` and
`projector_distillation_loss`. Its baselines add `nt_xent_loss` and
`fedu2_uniform_regularizer` (FedU2), `decorrelation_loss` (FedDecorr) and
`relational_loss` (FedX).

Conventions are those of `fedjax_metric.losses.metric`: losses that are a sum
over examples return per-example values [B] with masked rows set to 0 (reduce
with `masked_mean`); losses that are not (uniformity, DSR, decorrelation, the
FedU2 regulariser) return the batch scalar computed over the unmasked rows
only. Padding never enters a pair set, a mean or a normaliser, and gradients
stay finite (no NaN even internally) for zero rows, coincident rows and
all-masked batches.

Where a paper and the authors' released code differ, the code is the default
and the paper's form sits behind a ``form=`` switch.
"""

import math

import jax
import jax.numpy as jnp

from fedjax_metric.losses.metric import (
  _apply_mask,
  _as_mask,
  _l2_normalize,
  _masked_logsumexp,
)

# Larger than any projected tangent vector (|<log_x(y), w>| <= pi ||w||): a
# masked row gets this value so that it sorts after every real one.
_SORT_SENTINEL = 1e30
# geoopt's Sphere.logmap returns the plain projection below this angle.
_LOGMAP_MIN_ANGLE = 1e-6


def _safe_sqrt(x):
  """sqrt with a zero (not NaN) gradient at 0."""
  positive = x > 0
  return jnp.where(positive, jnp.sqrt(jnp.where(positive, x, 1.0)), 0.0)


def _num_real(mask, size, dtype):
  return jnp.sum(_as_mask(mask, size).astype(dtype))


def alignment_loss(p1, p2, *, mask=None):
  """Alignment of positive pairs (Wang & Isola, ICML 2020; SSD Eq. 3).

  ``l_i = ||n(p1_i) - n(p2_i)||^2`` with n the L2 normalisation (alpha = 2),
  as ``align_loss`` in the SSD authors' released code
  (github.com/hc-fang/ssd, methods/loss.py), which averages it over the batch.

  Args:
    p1, p2: [B, D] projector outputs of the two views, not normalised.
    mask: optional [B] bool; masked outputs are 0.

  Returns:
    [B] per-example loss in [0, 4].
  """
  diff = _l2_normalize(p1) - _l2_normalize(p2)
  return _apply_mask(jnp.sum(jnp.square(diff), axis=-1), mask)


def uniformity_loss(p, *, t=2.0, mask=None):
  """Uniformity L_uniform (Wang & Isola, ICML 2020; SSD Eq. 4).

    U = log( 1/|P| sum_{(i, j) in P} exp(-t ||n(p_i) - n(p_j)||^2) ),

  P = pairs of distinct unmasked rows; the sum is symmetric, so this is the
  mean over unordered pairs i < j that ``uniform_loss`` (torch.pdist) computes
  in the SSD authors' released code (github.com/hc-fang/ssd,
  methods/loss.py). Minimising U spreads the rows over the sphere. SSD applies
  it to each view separately and averages: (U(z1) + U(z2)) / 2. SSD's Eq. 4
  prints a leading minus sign (minimising that would collapse the rows);
  its tables report '-L_uniform' ~ 3.7 > 0, i.e. use U as here and as the
  code does.

  Squared distances need no sqrt, so coincident rows have finite gradients;
  the log-mean-exp is a logsumexp minus log |P|. This is the training loss;
  `fedjax_metric.evaluation.uniformity` is the same quantity as a metric
  (NaN when there is no pair).

  Args:
    p: [B, D] features, L2-normalised inside.
    t: temperature (2 in SSD and Wang & Isola).
    mask: optional [B] bool; masked rows are in no pair.

  Returns:
    Scalar in [-4t, 0]; 0 when fewer than two rows are unmasked.
  """
  size = p.shape[0]
  z = _l2_normalize(p)
  sq = jnp.sum(jnp.square(z), axis=-1)
  # Rounding can push the expansion slightly below 0.
  d2 = jnp.maximum(sq[:, None] + sq[None, :] - 2.0 * (z @ z.T), 0.0)
  real = _as_mask(mask, size)
  pairs = real[:, None] & real[None, :] & ~jnp.eye(size, dtype=bool)
  lse = _masked_logsumexp((-t * d2).reshape(1, -1), pairs.reshape(1, -1))[0]
  num_pairs = jnp.sum(pairs.astype(z.dtype))
  return jnp.where(
    num_pairs > 0, lse - jnp.log(jnp.maximum(num_pairs, 1.0)), 0.0
  )


def dsr_loss(p, scaling, *, form='code', mask=None):
  """SSD dimension-scaled regularisation L_DSR (Fang et al., ICCV 2025, Eq. 7).

  With z = n(p) (L2-normalised rows) and the client's scaling matrix S
  (`fedjax_metric.algorithms.ssd_scaling.scaling_matrices`, S S^T = Q D_k Q^T):

  form='code' (default; ``subspace_loss`` with detach=True, norm=True in the
  authors' released code, github.com/hc-fang/ssd, methods/loss.py):

    target = n(stopgrad(z S S^T)),   L = ||Z - target||_F / n,

  the Frobenius norm of the whole [n, D] difference matrix over the n
  unmasked rows, divided by n -- not a mean squared distance. The target is
  normalised after scaling, on the detached value.

  form='paper' (Eq. 7 as printed): ``L = 1/n sum_i ||z_i -
  stopgrad(z_i S S^T)||^2``, the mean squared distance to the unnormalised
  scaled embedding (Eq. 7's z (.) d_k for S = diag(sqrt(d_k))).

  In both forms the gradient flows only through z: the target is a constant.
  Where Z equals its target exactly the Frobenius norm has a zero (not NaN)
  gradient. Like any norm it is not smooth there: a client whose scaled
  direction set is empty has S S^T = Q Q^T = I only up to rounding, so its
  loss is ~1e-7 while its gradient still has size ~1/n (as in the released
  code, which computes the same float32 quantity).

  Args:
    p: [B, D] projector outputs of one view, not normalised.
    scaling: [D, D] the client's scaling matrix S.
    form: 'code' or 'paper'.
    mask: optional [B] bool; masked rows are excluded from the norm and from n.

  Returns:
    Scalar; 0 when no row is unmasked.
  """
  if form not in ('code', 'paper'):
    raise ValueError(f"form must be 'code' or 'paper', got {form!r}")
  z = _l2_normalize(p)
  target = jax.lax.stop_gradient((z @ scaling) @ scaling.T)
  real = _as_mask(mask, z.shape[0])
  n = _num_real(mask, z.shape[0], z.dtype)
  if form == 'code':
    diff = jnp.where(real[:, None], z - _l2_normalize(target), 0.0)
    return _safe_sqrt(jnp.sum(jnp.square(diff))) / jnp.maximum(n, 1.0)
  per_row = jnp.sum(jnp.square(z - target), axis=-1)
  return jnp.sum(jnp.where(real, per_row, 0.0)) / jnp.maximum(n, 1.0)


def projector_distillation_loss(
  encoder_out, projector_out, *, temperature=0.5, form='code', mask=None
):
  """SSD projector distillation L_distill (Fang et al., ICCV 2025, Eq. 9).

  With h the raw encoder output and p the raw projector output (neither
  normalised), softmax over the D feature dimensions:

  form='code' (default; ``distillation_loss`` in the authors' released code,
  github.com/hc-fang/ssd, methods/loss.py: ``kl_div(log_softmax(h/T),
  softmax(p/T), reduction='batchmean')``)::

    l_i = KL( softmax(p_i / T) || softmax(h_i / T) )
        = sum_d q_id (log q_id - log r_id),
    q = softmax(p / T),  r = softmax(h / T);

  the projector's distribution is the target, the encoder's the student, and
  T = 0.5.

  form='paper' (Eq. 9 as printed, D_KL(sigma(h) || sigma(z))): the reverse
  direction, ``KL(softmax(h_i / T) || softmax(p_i / T))``; Eq. 9 prints no
  temperature, i.e. temperature=1.

  No stop-gradient on either side in either form: the gradient reaches both
  the encoder and the projector. `masked_mean` of the output is the code's
  'batchmean'. Needs equal encoder and projector widths (512 in SSD).

  Args:
    encoder_out: [B, D] encoder representations h.
    projector_out: [B, D] projector embeddings p.
    temperature: T.
    form: 'code' or 'paper'.
    mask: optional [B] bool; masked outputs are 0.

  Returns:
    [B] per-example KL divergence (>= 0).
  """
  if form not in ('code', 'paper'):
    raise ValueError(f"form must be 'code' or 'paper', got {form!r}")
  log_q = jax.nn.log_softmax(projector_out / temperature, axis=-1)
  log_r = jax.nn.log_softmax(encoder_out / temperature, axis=-1)
  if form == 'paper':
    log_q, log_r = log_r, log_q
  kl = jnp.sum(jnp.exp(log_q) * (log_q - log_r), axis=-1)
  return _apply_mask(kl, mask)


def nt_xent_loss(
  z1, z2, *, temperature=0.07, self_in_denominator=True, mask=None
):
  """NT-Xent (Chen et al., 'A Simple Framework for Contrastive Learning of
  Visual Representations', ICML 2020), as FedU2 computes it.

  The 2B rows u = [n(z1); n(z2)] are anchors; anchor a's positive is the other
  view of the same example, and with s_ab = <u_a, u_b> / T::

    l_a = -log( e^{s_a,pos} / sum_{b in A(a)} e^{s_ab} ).

  self_in_denominator=True (default; FedU2's released code,
  github.com/XeniaLLL/FedU2, src/my/algo/fedU2/functional.py ``nt_xent_loss``,
  T = 0.07): the diagonal of the similarity matrix is multiplied by 0, so
  A(a) holds every row including a itself, whose term is e^0 = 1.
  self_in_denominator=False: the standard SimCLR form, A(a) = all rows but a
  (a -inf diagonal); with temperature=0.1 this is FedX's ``nt_xent``
  (github.com/Sungwon-Han/FEDX, losses.py).

  Rows are L2-normalised inside (FedU2 feeds already-normalised features, so
  this changes nothing there). Masked examples are neither anchors nor in any
  denominator.

  Args:
    z1, z2: [B, D] features of the two views.
    temperature: T.
    self_in_denominator: see above.
    mask: optional [B] bool over examples (both views).

  Returns:
    [B] per-example loss (l_i + l_{i+B}) / 2, so that `masked_mean` of it is
    the mean over the 2B anchors, i.e. the released cross-entropy.
  """
  size = z1.shape[0]
  u = jnp.concatenate([_l2_normalize(z1), _l2_normalize(z2)], axis=0)
  logits = (u @ u.T) / temperature
  eye = jnp.eye(2 * size, dtype=bool)
  real = jnp.tile(_as_mask(mask, size), 2)
  valid = real[:, None] & real[None, :]
  if self_in_denominator:
    logits = jnp.where(eye, 0.0, logits)
  else:
    valid = valid & ~eye
  lse = _masked_logsumexp(logits, valid)
  partner = (jnp.arange(2 * size) + size) % (2 * size)
  per_anchor = lse - logits[jnp.arange(2 * size), partner]
  return _apply_mask((per_anchor[:size] + per_anchor[size:]) / 2.0, mask)


def decorrelation_loss(z, *, form='code', eps=1e-8, mask=None):
  """FedDecorr regulariser (Shi et al., 'Towards Understanding and Mitigating
  Dimensional Collapse in Heterogeneous Federated Learning', ICLR 2023).

  Over the n unmasked rows, each feature is standardised over the batch,
  ``x_hat = (x - mean) / sqrt(eps + var)`` with the unbiased variance
  (torch's ``var`` default), and C = x_hat^T x_hat [D, D].

  form='code' (default; ``FedDecorrLoss`` in the authors' released code,
  github.com/bytedance/FedDecorr, loss.py, identical in FedU2's copy):

    L = (1 / (D (D - 1))) sum_{i != j} C_ij^2 / n,

  the mean of the squared OFF-diagonal entries of the unnormalised C, divided
  by n once (so it grows like n times the squared correlations).

  form='paper': the paper's L = ||K||_F^2 / D^2 of the correlation matrix K
  (Sec. 4), taken as K = C / n with the code's standardisation (the exact
  normalisation of K is our reading, not checked against the paper's text),
  diagonal included; K_ii = (n - 1) / n up to eps, so the diagonal only
  shifts the value. Both forms have the same minimisers (up to eps); their
  scales differ by n D / (D - 1), which the weight (0.1 in the code) absorbs.

  Args:
    z: [B, D] representations (FedDecorr: the encoder output).
    form: 'code' or 'paper'.
    eps: added to the variance inside the sqrt (1e-8 in the code).
    mask: optional [B] bool; masked rows are excluded from every statistic.

  Returns:
    Scalar; 0 when fewer than two rows are unmasked (the code returns 0 for a
    batch of one), and 0 for D = 1 in the code form (no off-diagonal entry).
  """
  if form not in ('code', 'paper'):
    raise ValueError(f"form must be 'code' or 'paper', got {form!r}")
  size, dim = z.shape
  w = _as_mask(mask, size).astype(z.dtype)[:, None]
  n = jnp.sum(w)
  mean = jnp.sum(w * z, axis=0) / jnp.maximum(n, 1.0)
  centred = (z - mean) * w
  var = jnp.sum(jnp.square(centred), axis=0) / jnp.maximum(n - 1.0, 1.0)
  x_hat = centred / jnp.sqrt(eps + var)
  corr = x_hat.T @ x_hat
  if form == 'code':
    if dim < 2:
      return jnp.zeros((), z.dtype)
    off = jnp.where(jnp.eye(dim, dtype=bool), 0.0, jnp.square(corr))
    loss = jnp.sum(off) / (dim * (dim - 1)) / jnp.maximum(n, 1.0)
  else:
    loss = jnp.sum(jnp.square(corr / jnp.maximum(n, 1.0))) / dim**2
  return jnp.where(n > 1, loss, 0.0)


def _masked_log_softmax(logits, valid):
  """Row-wise log-softmax over the valid columns; 0 (finite) elsewhere."""
  lse = _masked_logsumexp(logits, valid)
  return jnp.where(valid, logits - lse[:, None], 0.0)


def relational_loss(
  z1,
  z2,
  anchors,
  *,
  temperature=0.1,
  target_temperature=0.1,
  form='code',
  mask=None,
  anchor_mask=None,
):
  """FedX relational loss (Han et al., 'FedX: Unsupervised Federated Learning
  with Cross Knowledge Distillation', ECCV 2022), one of its two uses.

  Each view's similarity distribution over a batch of anchors,
  ``r_v(i) = softmax_a( cos(z_v,i, anchor_a) / t )``, is distilled towards
  the views' average, so that the two views relate to the anchors alike.

  form='code' (default; ``js_loss`` in the authors' released code,
  github.com/Sungwon-Han/FEDX, losses.py, also in FedU2's copy):

    m_i = (softmax(s_1,i / t2) + softmax(s_2,i / t2)) / 2,
    l_i = (KL(m_i || r_1(i)) + KL(m_i || r_2(i))) / 2,

  with t = ``temperature``, t2 = ``target_temperature``. The target m is
  NOT detached: gradients flow through it as well.

  form='js': the textbook Jensen-Shannon divergence the code's name refers
  to, ``(KL(r_1 || m) + KL(r_2 || m)) / 2`` with m = (r_1 + r_2) / 2, all at
  ``temperature`` (target_temperature unused). We could not read the paper's
  equation itself; this form is offered as the definition, not as a verified
  transcription.

  FedX uses it twice per step (main.py): the local relational loss with z1,
  z2 = the local projections of the two views and anchors = the local
  projections of a random batch of the client's data; the global one with
  z1, z2 = the local predictor outputs and anchors = the GLOBAL model's
  projections of that random batch (the caller passes them through
  stop_gradient; here every input carries gradient). Defaults t = t2 = 0.1
  are main.py's (--temperature, --tt, --ts); ``js_loss``'s own t2 = 0.01
  default is always overridden there.

  Args:
    z1, z2: [B, D] embeddings of the two views (normalised inside).
    anchors: [A, D] anchor embeddings (normalised inside).
    temperature: t of the student distributions.
    target_temperature: t2 of the target (form='code').
    form: 'code' or 'js'.
    mask: optional [B] bool over rows of z1 / z2; masked outputs are 0.
    anchor_mask: optional [A] bool; masked anchors are in no distribution.

  Returns:
    [B] per-example loss (`masked_mean` of it is the code's 'batchmean').
  """
  if form not in ('code', 'js'):
    raise ValueError(f"form must be 'code' or 'js', got {form!r}")
  na = _l2_normalize(anchors)
  s1 = _l2_normalize(z1) @ na.T
  s2 = _l2_normalize(z2) @ na.T
  valid = jnp.broadcast_to(
    _as_mask(anchor_mask, anchors.shape[0])[None, :], s1.shape
  )
  log_r1 = _masked_log_softmax(s1 / temperature, valid)
  log_r2 = _masked_log_softmax(s2 / temperature, valid)

  def kl(log_p, log_q):  # sum_a p (log p - log q) over valid anchors
    return jnp.sum(
      jnp.where(valid, jnp.exp(log_p) * (log_p - log_q), 0.0), axis=-1
    )

  if form == 'code':
    log_m = jnp.logaddexp(
      _masked_log_softmax(s1 / target_temperature, valid),
      _masked_log_softmax(s2 / target_temperature, valid),
    ) - math.log(2.0)
    per_row = (kl(log_m, log_r1) + kl(log_m, log_r2)) / 2.0
  else:
    log_m = jnp.logaddexp(log_r1, log_r2) - math.log(2.0)
    per_row = (kl(log_r1, log_m) + kl(log_r2, log_m)) / 2.0
  return _apply_mask(per_row, mask)


def _sphere_logmap(base, points):
  """Riemannian log map of the unit sphere at ``base`` [D], for points [N, D].

  geoopt's ``Sphere.logmap``: u = proj_base(y - base) = (y - base) - <base,
  y - base> base, scaled to length dist(base, y), or u itself when the angle
  is <= 1e-6. For unit vectors ||u|| = sin(theta) and <base, y> =
  cos(theta), so the angle is taken as atan2(||u||, <base, y>): the value of
  geoopt's arccos with a finite gradient near theta = 0 (antipodal points,
  where geoopt divides by 0, give u ~ 0 instead of NaN). geoopt 0.5 (the
  release FedU2's unpinned install gets) also clamps <base, y> to +-(1 -
  1e-4) in float32, which changes the map only within 0.014 rad of the base
  point or its antipode -- for random tangent points in hundreds of
  dimensions an event of negligible probability; this is the exact map.
  """
  delta = points - base
  u = delta - (delta @ base)[:, None] * base
  sin_sq = jnp.sum(jnp.square(u), axis=-1)
  far = sin_sq > _LOGMAP_MIN_ANGLE**2
  sin = jnp.sqrt(jnp.where(far, sin_sq, 1.0))
  angle = jnp.arctan2(sin, points @ base)
  return u * jnp.where(far, angle / sin, 1.0)[:, None]


def _sliced_w2(x, y, projections, real):
  """Mean over projections and matched ranks of (sorted x.w - sorted y.w)^2.

  x, y: [N, D] with the same ``real`` rows [N]; projections: [K, D]. Masked
  rows are moved past the end of both sorts, so rank r < n pairs real rows
  only and the tail contributes exactly 0.
  """
  n = jnp.sum(real.astype(x.dtype))

  def sorted_projections(v):
    proj = v @ projections.T  # [N, K]
    return jnp.sort(jnp.where(real[:, None], proj, _SORT_SENTINEL), axis=0)

  diff = sorted_projections(x) - sorted_projections(y)
  return jnp.sum(jnp.square(diff)) / jnp.maximum(n * projections.shape[0], 1.0)


def tangent_sliced_wasserstein(
  z, tangent_points, reference, projections, *, num_tangent_space=6, mask=None
):
  """FedU2's flexible uniform regulariser for given random draws.

  Liao et al., 'Rethinking the Representation in Federated Unsupervised
  Learning with Non-IID Data', CVPR 2024 (FUR), as coded in
  ``RepresentationTagentCollapse`` (github.com/XeniaLLL/FedU2,
  src/my/loss/sw_loss.py). For each tangent point t_b, both the reference
  samples R (uniform on the sphere) and the features Z = n(z) are mapped to
  the tangent space at t_b by the sphere's log map, and their sliced
  Wasserstein-2 distance is taken with the projections W_b [K, D] (Gaussian,
  not normalised; sort-and-match, mean of squared differences)::

    FUR = (1 / num_tangent_space) sum_b SW2(log_{t_b}(R), log_{t_b}(Z); W_b).

  The sum runs over all tangent points (the code draws as many as rows) but
  is divided by ``num_tangent_space`` = 6, as the code does.

  Args:
    z: [B, D] features (L2-normalised inside; FedU2's SimCLR path feeds
      normalised projector outputs).
    tangent_points: [B, D] unit vectors.
    reference: [B, D] unit vectors, the uniform sample.
    projections: [B, K, D], the projections used at each tangent point.
    num_tangent_space: the divisor.
    mask: optional [B] bool, applied alike to the rows of z, of reference and
      to the tangent points, so n real rows meet n reference samples.

  Returns:
    Scalar >= 0; 0 when no row is unmasked.
  """
  real = _as_mask(mask, z.shape[0])
  features = _l2_normalize(z)

  def at_tangent_point(base, w):
    return _sliced_w2(
      _sphere_logmap(base, reference), _sphere_logmap(base, features), w, real
    )

  per_point = jax.vmap(at_tangent_point)(tangent_points, projections)
  return jnp.sum(jnp.where(real, per_point, 0.0)) / num_tangent_space


def fedu2_uniform_regularizer(
  z, key, *, num_projections=6, num_tangent_space=6, mask=None
):
  """FedU2's flexible uniform regulariser with fresh random draws.

  Draws, as ``RepresentationTagentCollapse.forward`` does on every call, B
  tangent points and B reference samples (normalised standard Gaussians,
  i.e. uniform on the sphere) and, per tangent point, ``num_projections``
  standard Gaussian projection directions, then returns
  `tangent_sliced_wasserstein`. FedU2 applies it to each view and weights
  the sum by 0.01 (Liao et al., CVPR 2024; github.com/XeniaLLL/FedU2,
  src/my/algo/fedU2/fedsimclr_client.py).

  Args:
    z: [B, D] features.
    key: PRNG key for the draws.
    num_projections: K (6 in the code).
    num_tangent_space: the divisor (6 in the code).
    mask: optional [B] bool.

  Returns:
    Scalar >= 0.
  """
  size, dim = z.shape
  k_tangent, k_reference, k_projection = jax.random.split(key, 3)
  tangent = _l2_normalize(jax.random.normal(k_tangent, (size, dim), z.dtype))
  reference = _l2_normalize(
    jax.random.normal(k_reference, (size, dim), z.dtype)
  )
  projections = jax.random.normal(
    k_projection, (size, num_projections, dim), z.dtype
  )
  return tangent_sliced_wasserstein(
    z,
    tangent,
    reference,
    projections,
    num_tangent_space=num_tangent_space,
    mask=mask,
  )
