"""Metric-learning and contrastive losses: triplet, quadruplet, FedQuad, SupCon, FedRCL, MOON.

Every loss returns per-example values [B] and sets masked (padding) examples to 0; the
caller reduces with `masked_mean`. Padding is also excluded from every pair set (positives,
negatives, denominators), so the values on real rows do not depend on padding. Masking
never lets an inf meet a zero cotangent in the backward pass, so gradients stay finite for
all-masked batches, single-class batches and coincident embeddings.
"""

import jax
import jax.numpy as jnp

_NORM_EPS = 1e-12  # torch.nn.functional.normalize default (FedRCL).
_COS_EPS = 1e-8  # torch.nn.CosineSimilarity default (MOON).


def _as_mask(mask, size):
  return (
    jnp.ones((size,), bool) if mask is None else jnp.asarray(mask).astype(bool)
  )


def _apply_mask(values, mask):
  return (
    values
    if mask is None
    else jnp.where(_as_mask(mask, values.shape[0]), values, 0.0)
  )


def _distance(x, y, squared):
  """Squared (or plain) Euclidean distance between matching rows, [B, D] -> [B]."""
  d2 = jnp.sum(jnp.square(x - y), axis=-1)
  if squared:
    return d2
  # sqrt'(0) is infinite (coincident embeddings): evaluate sqrt at a harmless 1 there and
  # select 0, so the value stays exact and the gradient is 0 instead of NaN.
  nonzero = d2 > 0
  return jnp.where(nonzero, jnp.sqrt(jnp.where(nonzero, d2, 1.0)), 0.0)


def _l2_normalize(x):
  """``x / max(||x||, 1e-12)`` row-wise (torch ``F.normalize``), [B, D] -> [B, D].

  Written as rsqrt of the clamped squared norm: same value, but a zero (padding) row has a
  finite gradient, where ``||x||`` itself would give 0 * inf.
  """
  sq = jnp.sum(jnp.square(x), axis=-1, keepdims=True)
  return x * jax.lax.rsqrt(jnp.maximum(sq, _NORM_EPS**2))


def _cosine(x, y):
  """``x.y / max(||x|| ||y||, 1e-8)`` over the last axis (torch CosineSimilarity)."""
  dot = jnp.sum(x * y, axis=-1)
  sq = jnp.sum(jnp.square(x), axis=-1) * jnp.sum(jnp.square(y), axis=-1)
  return dot * jax.lax.rsqrt(jnp.maximum(sq, _COS_EPS**2))


def _masked_logsumexp(x, valid):
  """Row-wise ``log sum_{j valid} exp(x_ij)``, [B, N] -> [B]; 0 for a row with no valid j.

  The empty-row placeholder is finite (not -inf) and invalid entries go through exp(-inf)
  = 0, so neither the forward nor the backward pass ever forms 0 * inf.
  """
  has_any = jnp.any(valid, axis=-1)
  row_max = jnp.max(jnp.where(valid, x, -jnp.inf), axis=-1)
  # LSE is shift-invariant, so the shift needs no gradient.
  row_max = jax.lax.stop_gradient(jnp.where(has_any, row_max, 0.0))
  total = jnp.sum(
    jnp.exp(jnp.where(valid, x - row_max[:, None], -jnp.inf)), axis=-1
  )
  return jnp.log(jnp.where(has_any, total, 1.0)) + row_max


def _pair_masks(labels, mask):
  """Masks over pairs (i, j) of a batch: (both real, i != j) and (that, same label)."""
  size = labels.shape[0]
  real = _as_mask(mask, size)
  valid = real[:, None] & real[None, :] & ~jnp.eye(size, dtype=bool)
  same = valid & (labels[:, None] == labels[None, :])
  return real, valid, same


def triplet_loss(
  anchor, positive, negative, *, margin=1.0, squared=False, mask=None
):
  """Margin triplet loss (the TripletFL baseline of FedQuad, Tables I-IV).

  ``l_i = [d(a_i, p_i) - d(a_i, n_i) + margin]_+``: the hinge form of
  Schroff, Kalenichenko and Philbin, 'FaceNet', CVPR 2015 (PyTorch's
  TripletMarginLoss). FedQuad cites Hoffer & Ailon, 'Deep Metric Learning
  Using Triplet Network', SIMBAD 2015, whose loss is a softmax over the two
  distances instead (docs/methods.md, FedQuad's baselines).

  Args:
    anchor, positive, negative: [B, D] embeddings, not normalised.
    margin: hinge margin.
    squared: d is the squared Euclidean distance if True, else (default) the Euclidean
      distance.
    mask: optional [B] bool; masked outputs are 0.

  Returns:
    [B] per-example loss.
  """
  d_ap = _distance(anchor, positive, squared)
  d_an = _distance(anchor, negative, squared)
  return _apply_mask(jax.nn.relu(d_ap - d_an + margin), mask)


def quadruplet_loss(
  anchor,
  positive,
  negative_1,
  negative_2,
  *,
  margin_1=1.0,
  margin_2=0.5,
  squared=False,
  mask=None,
  distinct_negatives=None,
):
  """Classic quadruplet loss (Chen et al., CVPR 2017, Eq. 5; the QuadrupletFL baseline).

  Chen, Chen, Zhang and Huang, 'Beyond Triplet Loss: A Deep Quadruplet Network for
  Person Re-identification', CVPR 2017.

  ``l_i = [d(a, p) - d(a, n1) + m1]_+ + [d(a, p) - d(n1, n2) + m2]_+``: the second term
  compares the positive pair with the NEGATIVE pair (n1, n2), two examples of
  two classes other than the anchor's. Not FedQuad; see `fedquad_loss`.

  Args:
    anchor, positive, negative_1, negative_2: [B, D] embeddings, not normalised.
    margin_1, margin_2: margins of the two hinge terms.
    squared: squared Euclidean distance if True, else (default) Euclidean.
    mask: optional [B] bool; masked outputs are 0.
    distinct_negatives: optional [B] bool, whether n1 and n2 are of
      different classes; where False the second term is 0 (the triplet term
      alone). A client with one class besides the anchor's draws both
      negatives from it, and the term would push two examples of one class
      apart, which Chen et al.'s loss never does.

  Returns:
    [B] per-example loss.
  """
  d_ap = _distance(anchor, positive, squared)
  term_1 = jax.nn.relu(d_ap - _distance(anchor, negative_1, squared) + margin_1)
  term_2 = jax.nn.relu(
    d_ap - _distance(negative_1, negative_2, squared) + margin_2
  )
  if distinct_negatives is not None:
    term_2 = jnp.where(distinct_negatives, term_2, 0.0)
  return _apply_mask(term_1 + term_2, mask)


def fedquad_loss(
  anchor,
  positive,
  negative_1,
  negative_2,
  *,
  margin_1=1.0,
  margin_2=0.5,
  squared=False,
  mask=None,
):
  """FedQuad's reformulated quadruplet loss l_quad* (Eq. 5 / Algorithm 1).

  Goksu & Pugeault, 'FedQuad: Federated Stochastic Quadruplet Learning to Mitigate
  Data Heterogeneity', arXiv:2509.04107, 2025.

  ``l_i = [d(a, p) - d(a, n1) + m1]_+ + [d(a, p) - d(a, n2) + m2]_+``: BOTH terms push
  the anchor from a negative (n1, n2 from two distinct classes != y_a). Eq. 5 writes the
  L2 norm ``d = ||f(x) - f(x')||_2``, the loss line of Algorithm 1 squares it. The
  default, ``squared=False``, is Eq. 5 (its value and gradient are exact and finite at
  d = 0); ``squared=True`` is Algorithm 1's reading. With un-normalised embeddings the
  squared form's gradient grows with the embedding scale (docs/methods.md, FedQuad,
  compares the two).

  Args:
    anchor, positive, negative_1, negative_2: [B, D] encoder embeddings, not normalised.
    margin_1, margin_2: m1 = 1.0, m2 = 0.5 (the paper's best, Table V).
    squared: squared Euclidean distance (Algorithm 1) if True, else (default) the
      Euclidean distance (Eq. 5).
    mask: optional [B] bool; masked outputs are 0.

  Returns:
    [B] per-example loss.
  """
  d_ap = _distance(anchor, positive, squared)
  term_1 = jax.nn.relu(d_ap - _distance(anchor, negative_1, squared) + margin_1)
  term_2 = jax.nn.relu(d_ap - _distance(anchor, negative_2, squared) + margin_2)
  return _apply_mask(term_1 + term_2, mask)


def supcon_loss(
  features, labels, *, temperature=0.07, reduction='mean', mask=None
):
  """Supervised contrastive loss over one view's batch (Khosla et al.; FedRCL Eq. 2).

  With s_ij the cosine similarity, P(i) = {p != i : y_p = y_i} and A(i) = {a != i}::

    l_i = -w_i sum_{p in P(i)} log( exp(s_ip / t) / sum_{a in A(i)} exp(s_ia / t) )

  ``reduction='mean'`` (default): w_i = 1/|P(i)|, L_out of Khosla et al., 'Supervised
  Contrastive Learning', NeurIPS 2020, Eq. 2 (single view). ``reduction='sum'``:
  w_i = 1, the SUM over positives that Seo, Kim, Kim and Han, 'Relaxed Contrastive
  Learning for Federated Learning', CVPR 2024, print as their Eq. 2 (the same sum is
  the first term of their Eq. 5, `relaxed_supcon_loss` form='paper').

  Anchors with no positive give 0. Masked samples are not anchors, positives or members
  of A(i), and give 0.

  Args:
    features: [B, D], L2-normalised inside.
    labels: [B] int.
    temperature: t.
    reduction: 'mean' or 'sum' over the positives of an anchor.
    mask: optional [B] bool.

  Returns:
    [B] per-example loss.
  """
  if reduction not in ('mean', 'sum'):
    raise ValueError(f"reduction must be 'mean' or 'sum', got {reduction!r}")
  z = _l2_normalize(features)
  logits = (z @ z.T) / temperature
  real, valid, pos = _pair_masks(labels, mask)
  lse = _masked_logsumexp(logits, valid)
  num_pos = jnp.sum(pos, axis=-1)
  log_prob = jnp.sum(jnp.where(pos, logits - lse[:, None], 0.0), axis=-1)
  if reduction == 'mean':
    log_prob = log_prob / jnp.maximum(num_pos, 1)
  return jnp.where(real & (num_pos > 0), -log_prob, 0.0)


def relaxed_supcon_loss(
  features,
  labels,
  *,
  temperature=0.05,
  threshold=0.7,
  beta=1.0,
  form='code',
  mask=None,
):
  """FedRCL relaxed supervised contrastive loss for ONE feature level (Seo et al., CVPR 2024).

  Returns ``l_scl(i) + beta * l_pen(i)`` with s_ij the cosine similarity and t = temperature.

  Seo, Kim, Kim and Han, 'Relaxed Contrastive Learning for Federated Learning', CVPR
  2024, Eq. 5; longer notes in docs/methods.md, FedRCL.

  form='code' (default; the authors' released code, github.com/skynbe/FedRCL,
  ``utils/loss.py`` CLLoss with ``configs/client/fedrcl.yaml`` -- the released
  behaviour, hard-mined, NOT Eq. 5; the maintainers call the hard mining
  intentional in that repository's issue #3):
    * l_scl(i) = -log( e^{s_ip*/t} / (e^{s_ip*/t} + sum_{n in N2(i)} e^{s_in/t}) ) where
      p* = argmin_{j : y_j = y_i} s_ij over the class INCLUDING i (a lone anchor falls back
      to itself) and N2(i) = the 2 most similar other-class samples (fewer if fewer exist).
      0 when i has no other-class sample.
    * l_pen(i) = softplus((s - 1) / t): the CL form with the constant positive 1 and one
      negative s = s_ij* for j* = argmin_{j != i, y_j = y_i} s_ij if s_ij* >= threshold,
      else s = -1 (which contributes ~e^{-40}, as the code's -1 substitution does). So it
      fires only when the whole rest of the class is above the threshold (collapsed).

  form='paper' (Eq. 5 of the paper, read as follows):
    * l_scl(i) = -sum_{j != i, y_j = y_i} log( e^{s_ij/t} / sum_{k != i} e^{s_ik/t} ): the
      SUM over positives as Eq. 5 (and Eq. 2) print it, not Khosla's mean.
    * l_pen(i) = -log( e^{1/t} / (e^{1/t} + sum_{j in P(i)} e^{s_ij/t}) ), P(i) = {j != i :
      y_j = y_i, s_ij > threshold} (strict, as printed), 0 when P(i) is empty.
    Reading of the penalty: as printed, Eq. 5's second term is
    ``-beta * sum_{j in P(i)} log(exp(s_ij / t))`` = -beta * sum s_ij / t, whose sign REWARDS
    over-threshold similarity -- the opposite of the "divergence penalty" the text
    describes (pointed out in skynbe/FedRCL issue #1). The maintainer answered there that
    the penalty is built as a contrastive loss whose positive similarity is the constant 1;
    we therefore keep the paper's pair set (all over-threshold same-class pairs) and put
    it in that form's denominator, as the code form does. With one pair in P(i) this
    equals the code penalty.

  Masked samples are excluded from every pair set and give 0.

  Args:
    features: [B, D] features of one level, L2-normalised inside.
    labels: [B] int.
    temperature: t (0.05 in FedRCL).
    threshold: lambda (0.7).
    beta: penalty weight (1.0).
    form: 'code' or 'paper'.
    mask: optional [B] bool.

  Returns:
    [B] per-example loss.
  """
  z = _l2_normalize(features)
  sim = z @ z.T
  real, valid, same = _pair_masks(labels, mask)
  if form == 'code':
    eye = jnp.eye(sim.shape[0], dtype=bool)
    # (a) Hardest positive, self included: the min always sees the finite diagonal.
    s_pos = jnp.min(jnp.where(same | eye, sim, jnp.inf), axis=-1)
    other = valid & ~same
    k = min(2, sim.shape[0])  # top-2 negatives; -inf fills mean "missing".
    top_neg = jax.lax.top_k(jnp.where(other, sim, -jnp.inf), k)[0]
    logits = jnp.concatenate([s_pos[:, None], top_neg], axis=-1) / temperature
    l_scl = jax.nn.logsumexp(logits, axis=-1) - logits[:, 0]
    l_scl = jnp.where(jnp.any(other, axis=-1), l_scl, 0.0)
    # (b) Least-similar other same-class partner, used only at or above the threshold.
    s_partner = jnp.min(jnp.where(same, sim, jnp.inf), axis=-1)
    fires = jnp.any(same, axis=-1) & (s_partner >= threshold)
    l_pen = jax.nn.softplus(
      (jnp.where(fires, s_partner, -1.0) - 1.0) / temperature
    )
  elif form == 'paper':
    logits = sim / temperature
    lse = _masked_logsumexp(logits, valid)
    l_scl = jnp.sum(jnp.where(same, lse[:, None] - logits, 0.0), axis=-1)
    over = same & (sim > threshold)
    # log(1 + sum e^{(s-1)/t}): (s - 1)/t <= ~0, so exp never overflows.
    l_pen = jnp.log1p(
      jnp.sum(jnp.where(over, jnp.exp((sim - 1.0) / temperature), 0.0), axis=-1)
    )
  else:
    raise ValueError(f"form must be 'code' or 'paper', got {form!r}")
  return jnp.where(real, l_scl + beta * l_pen, 0.0)


def _check_levels(levels):
  if not levels:
    raise ValueError('levels must hold at least one [B, D_l] feature array')


def multilevel_relaxed_supcon_loss(
  levels,
  labels,
  *,
  temperature=0.05,
  threshold=0.7,
  beta=1.0,
  form='code',
  mask=None,
):
  """FedRCL multi-level loss (Seo et al., Sec. 4.4 / Alg. 1 line 8): mean over levels.

  ``L_RCL = 1/L sum_l L_RCL(x, y; phi_l)`` -- the MEAN, not the sum, as Sec. 4.4 writes
  it and the authors' released code (github.com/skynbe/FedRCL) computes it. Each level
  is normalised separately; the kwargs are `relaxed_supcon_loss`'s.

  Args:
    levels: list of L arrays [B, D_l] (dims may differ).
    labels: [B] int.
    temperature, threshold, beta, form, mask: as in `relaxed_supcon_loss`.

  Returns:
    [B] per-example loss.
  """
  _check_levels(levels)
  per_level = [
    relaxed_supcon_loss(
      f,
      labels,
      temperature=temperature,
      threshold=threshold,
      beta=beta,
      form=form,
      mask=mask,
    )
    for f in levels
  ]
  return sum(per_level) / len(per_level)


SCL_FORMS = ('code', 'paper', 'khosla')


def multilevel_supcon_loss(
  levels, labels, *, temperature=0.05, form='code', mask=None
):
  """FedSCL's term (Seo et al., CVPR 2024, Table 3): mean over levels of an SCL loss.

  FedSCL is FedRCL without its divergence penalty, so ``form`` names the same readings
  as `relaxed_supcon_loss` and each equals FedRCL's loss with beta = 0:

    * 'code' (default): the supervised pair of the authors' released CLLoss
      (github.com/skynbe/FedRCL, utils/loss.py, configs/client/fedrcl.yaml without the
      penalty pair): one hardest positive, the two most similar negatives.
    * 'paper': Eq. 2 of Seo et al. as printed, the SUM over positives
      (`supcon_loss` with reduction='sum').
    * 'khosla': Khosla et al.'s L_out, the MEAN over positives (`supcon_loss` with
      reduction='mean'); what this function computed before the two forms above.

  The released code has no FedSCL config, so which reading produced the paper's FedSCL
  numbers is not known; 'code' matches FedRCL's own default form, so FedRCL vs FedSCL
  isolates the penalty.

  Args:
    levels: list of L arrays [B, D_l].
    labels: [B] int.
    temperature: t (FedRCL's 0.05).
    form: 'code', 'paper' or 'khosla'.
    mask: optional [B] bool.

  Returns:
    [B] per-example loss.
  """
  _check_levels(levels)
  if form not in SCL_FORMS:
    raise ValueError(f'form must be one of {SCL_FORMS}, got {form!r}')
  if form == 'code':
    level_loss = lambda f: relaxed_supcon_loss(
      f, labels, temperature=temperature, beta=0.0, form='code', mask=mask
    )
  else:
    reduction = 'sum' if form == 'paper' else 'mean'
    level_loss = lambda f: supcon_loss(
      f, labels, temperature=temperature, reduction=reduction, mask=mask
    )
  per_level = [level_loss(f) for f in levels]
  return sum(per_level) / len(per_level)


def moon_contrastive_loss(
  z, z_global, z_previous, *, temperature=0.5, mask=None
):
  """MOON model-contrastive loss (Li et al., CVPR 2021, Eq. 3; QinbinLi/MOON main.py).

  Li, He and Song, 'Model-Contrastive Federated Learning', CVPR 2021; the authors'
  released code is github.com/QinbinLi/MOON, main.py ``train_net_fedcon``.

  ``l_i = -log( e^{sim(z, z_glob)/t} / (e^{sim(z, z_glob)/t} + sum_k e^{sim(z, z_prev_k)/t}) )``,
  i.e. cross-entropy with target 0 over logits [sim(z, z_glob), sim(z, z_prev_1), ...] / t,
  with sim = x.y / max(||x|| ||y||, 1e-8). With no previous model (P = 0, MOON round 0) it
  is a one-logit cross-entropy: exactly 0.

  Args:
    z: [B, D] projections of the model being trained.
    z_global: [B, D] projections of the (frozen) global model.
    z_previous: [B, D] or [P, B, D] projections of the P previous local models.
    temperature: t.
    mask: optional [B] bool; masked outputs are 0.

  Returns:
    [B] per-example loss.
  """
  if z_previous.ndim == z.ndim:
    z_previous = z_previous[None]
  positive = _cosine(z, z_global)[None]  # [1, B]
  negatives = _cosine(z[None], z_previous)  # [P, B]
  logits = jnp.concatenate([positive, negatives], axis=0) / temperature
  return _apply_mask(jax.nn.logsumexp(logits, axis=0) - logits[0], mask)
