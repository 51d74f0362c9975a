"""Losses of the heterogeneous-participation family (PMFL).

Per-example outputs [B] with explicit masks; the caller reduces with
`masked_mean`.
"""

import jax
import jax.numpy as jnp

# Shared private helpers: one cosine (torch eps semantics) and one stable
# masked logsumexp for every contrastive loss in the package.
from fedjax_metric.losses.metric import _cosine, _masked_logsumexp

# Cosines this close to mu count as ties (float32 rounding of two forward
# passes of the same model differs by ~1e-7 relative; 1e-6 leaves a margin).
TIE_TOLERANCE = 1e-6


def pmfl_contrastive_loss(
  z, z_global, z_buffer, buffer_mask, mu, *, temperature=0.5, mask=None
):
  """PMFL's model-contrastive term l_con with a buffer of historical models.

  Zhang et al., 'Towards Performance-Enhanced Model-Contrastive Federated
  Learning using Historical Information in Heterogeneous Scenarios', preprint,
  2025, Section IV-C2, Eq. 4 and the definitions of Z+, Z-, pos and neg after
  it. For sample i, with s(a, b) = a.b / max(||a|| ||b||, 1e-8) (torch
  CosineSimilarity), z = z_i the current local representation z_k^{tE+e},
  z_g = Z^t the global model's representation and z_j the representations of
  the buffered local models:

    Z+ = {z_j : s(z, z_j) >= mu_i},   Z- = {z_j : s(z, z_j) < mu_i}
    pos = exp(s(z, z_g) / tau) + sum_{z_j in Z+} exp(s(z, z_j) / tau)
    neg = sum_{z_j in Z-} exp(s(z, z_j) / tau)
    l_con = -log(pos / (pos + neg))                                (Eq. 4)

  computed as logsumexp over all valid logits minus logsumexp over the
  positive ones. Ties (s = mu) are positives, as in the paper's '>='; so are
  near-ties within float32 rounding (`TIE_TOLERANCE`), which a buffered
  copy of the global model produces. The
  paper defines mu = Sim(z_k^{tE}, Z^t), the similarity between the
  representation of the node's model at the start of the round's local
  training and the global representation, per sample and fixed for the
  round; it is an input here. Taken literally, Algorithm 1 line 4 sets
  w_k^{tE} = W^t, so z_k^{tE} = Z^t and mu = 1 for every non-zero
  representation: Z+ is then empty up to exact ties and l_con is MOON's loss
  with the buffered representations as negatives.

  The split into Z+ / Z- is a hard selection, so it carries no gradient: the
  comparison is made on stop_gradient values and mu receives no gradient.
  Gradients do flow into z, z_global and z_buffer; pass the frozen models'
  representations (or stop_gradient them), as the paper trains only the
  current model.

  An empty buffer slot (buffer_mask False) is in neither set; with the whole
  buffer empty pos + neg = pos and the loss is exactly 0.

  Args:
    z: [B, D] projections of the model being trained.
    z_global: [B, D] projections of the global model W^t.
    z_buffer: [N, B, D] projections of the N buffered local models.
    buffer_mask: bool [N], False for empty buffer slots.
    mu: [B] per-sample thresholds.
    temperature: tau (0.5, Section V-C).
    mask: optional bool [B]; masked (padding) outputs are 0.

  Returns:
    [B] per-example loss.
  """
  if z.ndim != 2 or z_global.shape != z.shape:
    raise ValueError(
      f'z and z_global must both be [B, D], got {z.shape} and {z_global.shape}.'
    )
  if z_buffer.ndim != 3 or z_buffer.shape[1:] != z.shape:
    raise ValueError(
      f'z_buffer must be [N, B, D] with [B, D] = {z.shape}, got '
      f'{z_buffer.shape}.'
    )
  if jnp.shape(buffer_mask) != z_buffer.shape[:1]:
    raise ValueError(
      f'buffer_mask must be [N] = {z_buffer.shape[:1]}, got '
      f'{jnp.shape(buffer_mask)}.'
    )
  if jnp.shape(mu) != z.shape[:1]:
    raise ValueError(f'mu must be [B] = {z.shape[:1]}, got {jnp.shape(mu)}.')
  sim_global = _cosine(z, z_global)  # [B]
  sim_buffer = _cosine(z[None], z_buffer).T  # [B, N]
  logits = (
    jnp.concatenate([sim_global[:, None], sim_buffer], axis=1) / temperature
  )  # [B, 1 + N]
  slot = jnp.broadcast_to(
    jnp.asarray(buffer_mask, bool)[None, :], sim_buffer.shape
  )
  # The sets are chosen by a comparison, not learned through it. Exact ties
  # are not rare: a node's first local step buffers the global model itself,
  # whose similarity equals mu under 'current'. Its representation comes from
  # another forward pass than Z^t's, so float32 rounding (and the platform)
  # would decide the tie; within TIE_TOLERANCE it is a tie, hence positive.
  positive = slot & (
    jax.lax.stop_gradient(sim_buffer)
    >= jax.lax.stop_gradient(mu)[:, None] - TIE_TOLERANCE
  )
  always = jnp.ones_like(sim_global, bool)[:, None]  # the global positive
  log_all = _masked_logsumexp(logits, jnp.concatenate([always, slot], axis=1))
  log_pos = _masked_logsumexp(
    logits, jnp.concatenate([always, positive], axis=1)
  )
  loss = log_all - log_pos
  return loss if mask is None else jnp.where(jnp.asarray(mask, bool), loss, 0.0)
