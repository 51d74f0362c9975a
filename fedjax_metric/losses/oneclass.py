"""One-class-per-client losses: FedMetric, Deep SVDD, FedAwS, FedUV.

In this setting every client holds the data of exactly one class and may not
see the embeddings of other classes, so each client loss pulls its examples
towards (or aligns them with) one class representative, and something shared
-- proxy hyperspheres (FedMetric), a server-side regulariser (FedAwS) or fixed
codewords (FedUV) -- keeps the classes apart.

Like the other losses of this package, every client loss returns per-example
values [B], 0 on masked (padding) rows, and the caller reduces with
`masked_mean`. Euclidean distances use the safe square root of
`metric._distance`, so gradients stay finite when an embedding sits exactly
on a center.
"""

import jax
import jax.numpy as jnp

from fedjax_metric.losses.metric import (
  _apply_mask,
  _cosine,
  _distance,
  _l2_normalize,
)

FEDAWS_FORMS = ('cosine', 'euclidean')
SPREADOUT_DISTANCES = ('euclidean', 'cosine')
REDUCTIONS = ('sum', 'mean')


def _check_choice(name, value, choices):
  if value not in choices:
    raise ValueError(f'{name} must be one of {choices}, got {value!r}')


def fedmetric_loss(
  embeddings,
  center,
  proxy_centers,
  proxy_margins,
  *,
  proxy_mask=None,
  lam=1.0,
  squared_hinge=True,
  mask=None,
):
  """FedMetric client loss, l_pos + lam * l_neg, per example.

  Park, Hosseini and Yun, 'Federated Learning with Metric Loss', FL-ICML
  workshop 2021, Eq. 4-6 (and Algorithm 1)::

    l_i = d(e_i, C) + lam * sum_j mask_j * max(0, M_j - d(e_i, A_j))^p

  with d the Euclidean distance (not squared; Eq. 5 and 6), C the client's
  local center, A_j / M_j = R_j + D_j the proxy centers and margins shared by
  the other clients, and p = 2 (Eq. 6, ``squared_hinge=True``, the default)
  or p = 1 (Algorithm 1 prints the hinge without the square). The paper sums
  over the batch; per-example values reduced with `masked_mean` give the
  batch mean instead, which only rescales the learning rate.

  The center is used as given: Algorithm 1 computes it once per round before
  local training, so the caller passes a constant (stop_gradient it if it
  was computed from the model being trained). The caller also masks out the
  client's own entry (j != k) with ``proxy_mask``.

  Args:
    embeddings: [B, D] embeddings g(x_i), not normalised.
    center: [D] local center C^k.
    proxy_centers: [K, D] proxy centers A^j.
    proxy_margins: [K] margins M^j.
    proxy_mask: optional [K] bool; False entries are left out of l_neg.
      All False gives the positive loss alone.
    lam: lambda, the weight of l_neg (Eq. 4).
    squared_hinge: square the hinge (Eq. 6) if True, else plain hinge.
    mask: optional [B] bool; masked outputs are 0.

  Returns:
    [B] per-example loss.
  """
  embeddings = jnp.asarray(embeddings)
  positive = _distance(embeddings, jnp.asarray(center)[None], squared=False)
  to_proxies = _distance(
    embeddings[:, None, :], jnp.asarray(proxy_centers)[None], squared=False
  )
  hinge = jax.nn.relu(jnp.asarray(proxy_margins)[None] - to_proxies)
  if squared_hinge:
    hinge = jnp.square(hinge)
  if proxy_mask is not None:
    hinge = jnp.where(jnp.asarray(proxy_mask, bool)[None], hinge, 0.0)
  return _apply_mask(positive + lam * jnp.sum(hinge, axis=-1), mask)


def deepsvdd_loss(embeddings, center, *, mask=None):
  """One-class Deep SVDD loss, the squared distance to a fixed center.

  Ruff et al., 'Deep One-Class Classification', ICML 2018, the One-Class
  Deep SVDD objective without its weight-decay term (which belongs to the
  optimiser); the same form is
  the DeepSVDD baseline of Park, Hosseini and Yun, 'Federated Learning with
  Metric Loss', FL-ICML workshop 2021, Eq. 1::

    l_i = ||e_i - c||^2

  Args:
    embeddings: [B, D].
    center: [D] hypersphere center c (see `deepsvdd_center`).
    mask: optional [B] bool; masked outputs are 0.

  Returns:
    [B] per-example loss.
  """
  return _apply_mask(
    _distance(jnp.asarray(embeddings), jnp.asarray(center)[None], squared=True),
    mask,
  )


def deepsvdd_center(embeddings, mask=None, *, eps=0.1):
  """Deep SVDD center: mean embedding, near-zero coordinates pushed to +-eps.

  Ruff et al., 'Deep One-Class Classification', ICML 2018, as in
  the authors' released code (github.com/lukasruff/Deep-SVDD-PyTorch,
  src/optim/deepSVDD_trainer.py, init_center_c): c is the mean of an initial
  forward pass; coordinates with 0 < |c_i| < eps become sign(c_i) * eps,
  because a zero coordinate can be matched trivially by zero weights.
  Coordinates exactly 0 stay 0, as in that code. ``eps=0`` gives the plain
  mean.

  Args:
    embeddings: [N, D].
    mask: optional [N] bool; only True rows are averaged.
    eps: the threshold.

  Returns:
    [D] center (zeros when every row is masked).
  """
  embeddings = jnp.asarray(embeddings)
  weights = (
    jnp.ones(embeddings.shape[:1])
    if mask is None
    else (jnp.asarray(mask).astype(embeddings.dtype))
  )
  # An elementwise sum, not a matmul, so TF32 on GPUs cannot round it.
  center = jnp.sum(weights[:, None] * embeddings, axis=0) / jnp.maximum(
    jnp.sum(weights), 1.0
  )
  small = (jnp.abs(center) < eps) & (center != 0)
  return jnp.where(small, jnp.sign(center) * eps, center)


def fedaws_positive_loss(
  embeddings, class_embedding, *, margin=0.9, form='cosine', mask=None
):
  """FedAwS positive-only client loss, per example.

  Yu, Rawat, Menon and Kumar, 'Federated Learning with Only Positive
  Labels', ICML 2020: a client that holds class y only sees w_y, so only the
  positive term of the contrastive loss (Eq. 2 of Park, Hosseini and Yun,
  'Federated Learning with Metric Loss', FL-ICML workshop 2021, which
  restates it) is trained locally:

    form='cosine':    l_i = max(0, margin - cos(e_i, w_y))^2
    form='euclidean': l_i = ||e_i / ||e_i|| - w_y / ||w_y|| ||^2

  The negative term is replaced by `spreadout_regularizer` at the server.

  Args:
    embeddings: [B, D].
    class_embedding: [D] the client's class embedding w_y.
    margin: cosine margin (0.9); unused by the Euclidean form.
    form: 'cosine' or 'euclidean'.
    mask: optional [B] bool; masked outputs are 0.

  Returns:
    [B] per-example loss.
  """
  _check_choice('form', form, FEDAWS_FORMS)
  embeddings = jnp.asarray(embeddings)
  w = jnp.asarray(class_embedding)[None]
  if form == 'cosine':
    loss = jnp.square(jax.nn.relu(margin - _cosine(embeddings, w)))
  else:
    loss = _distance(_l2_normalize(embeddings), _l2_normalize(w), squared=True)
  return _apply_mask(loss, mask)


def feduv_loss(embeddings, codeword, *, squared=False, mask=None):
  """FedUV positive-only loss against the client's secret codeword.

  Hosseini, Park, Yun, Louizos, Soriaga and Welling, 'Federated Learning of
  User Verification Models Without Sharing Embeddings', ICML 2021. With
  c = D the codeword length, the embedding is rescaled to the codeword's
  norm, f(x) = sqrt(c) x / ||x||, and::

    l_i = max(0, 1 - v^T f(x_i) / c)^p

  For a +-1 codeword v^T f(x) / c = cos(x, v). p = 1 (default) is the
  unofficial reproduction github.com/eggry/FedUV (feduv/trainer.py, the only
  public code); p = 2 (``squared=True``) is the form printed as Eq. 3 of
  Park, Hosseini and Yun, 'Federated Learning with Metric Loss', FL-ICML
  workshop 2021.

  Args:
    embeddings: [B, c] outputs of the linear layer W (the model's embedding).
    codeword: [c] the client's codeword v (+-1 entries; see
      `fedjax_metric.algorithms.feduv.codewords`).
    squared: square the hinge if True.
    mask: optional [B] bool; masked outputs are 0.

  Returns:
    [B] per-example loss.
  """
  embeddings = jnp.asarray(embeddings)
  c = embeddings.shape[-1]
  f = jnp.sqrt(float(c)) * _l2_normalize(embeddings)
  score = jnp.sum(f * jnp.asarray(codeword, f.dtype), axis=-1) / c
  hinge = jax.nn.relu(1.0 - score)
  return _apply_mask(jnp.square(hinge) if squared else hinge, mask)


def spreadout_regularizer(
  class_embeddings, *, margin, distance='euclidean', reduction='sum'
):
  """FedAwS spreadout regulariser on the class-embedding matrix (server side).

  Yu, Rawat, Menon and Kumar, 'Federated Learning with Only Positive
  Labels', ICML 2020, the spreadout term (restated in Park, Hosseini and Yun,
  'Federated Learning with Metric Loss', FL-ICML workshop 2021, Sec. 2.3)::

    reg_sp(W) = sum_c sum_{c' != c} max(0, margin - d(w_c, w_c'))^2

  on L2-normalised rows, with d the Euclidean distance (``'euclidean'``,
  range [0, 2]) or d = 1 - cos (``'cosine'``, range [0, 2]). Each unordered
  pair is counted twice, as in the double sum. ``reduction='mean'`` divides
  by the C (C - 1) ordered pairs instead (the third-party implementations
  average); a single class gives 0.

  Two rows that coincide exactly have a zero (not NaN) gradient in the
  Euclidean form (the safe square root), so rows should not be initialised
  identically.

  Args:
    class_embeddings: [C, D] class embeddings w_c.
    margin: nu, the margin on d.
    distance: 'euclidean' or 'cosine'.
    reduction: 'sum' (the paper's form) or 'mean'.

  Returns:
    scalar.
  """
  _check_choice('distance', distance, SPREADOUT_DISTANCES)
  _check_choice('reduction', reduction, REDUCTIONS)
  w = _l2_normalize(jnp.asarray(class_embeddings))
  num_classes = w.shape[0]
  if distance == 'euclidean':
    d = _distance(w[:, None, :], w[None, :, :], squared=False)
  else:
    d = 1.0 - _cosine(w[:, None, :], w[None, :, :])
  off_diagonal = ~jnp.eye(num_classes, dtype=bool)
  penalty = jnp.where(off_diagonal, jnp.square(jax.nn.relu(margin - d)), 0.0)
  total = jnp.sum(penalty)
  if reduction == 'mean':
    return total / max(num_classes * (num_classes - 1), 1)
  return total
