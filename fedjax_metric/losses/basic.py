"""Cross-entropy and the masked reduction every loss uses."""

import jax
import jax.numpy as jnp
import optax


def softmax_cross_entropy(logits, labels):
  """Per-example softmax cross-entropy.

  Args:
    logits: [B, K] float.
    labels: [B] int class indices.

  Returns:
    [B] float, ``-log softmax(logits)[labels]``.
  """
  return optax.softmax_cross_entropy_with_integer_labels(logits, labels)


def masked_mean(values, mask):
  """Mean of ``values`` [B] over ``mask`` [B]; 0 when nothing is unmasked.

  Padded examples contribute neither to the sum nor to the count, and an
  all-padding batch gives 0 with a zero gradient (not NaN).
  """
  mask = mask.astype(values.dtype)
  return jnp.sum(values * mask) / jnp.maximum(jnp.sum(mask), 1.0)


def calibrated_cross_entropy(logits, labels, class_counts, tau):
  """FedLC's logit-calibrated cross-entropy, per example.

  Zhang, Li, Li, Zhang, Wang and Wu, 'Federated Learning with Label
  Distribution Skew via Logits Calibration', ICML 2022: every logit is
  lowered by a margin that grows as its class gets rarer on the client,

    z~_k = z_k - tau n_k^(-1/4),    loss = -log softmax(z~)[y],

  with n_k the client's number of examples of class k. A class the client
  does not hold (n_k = 0) has an infinite margin: it leaves the softmax, as
  in the authors' framework (0^(-1/4) = inf; github.com/geehokim/FedACG,
  utils/loss.py). The true class stays in the denominator there too
  (docs/methods.md, FedLC, on the paper's text, which leaves it out).

  Args:
    logits: [B, K].
    labels: [B] int in [0, K).
    class_counts: [K] the client's examples per class (float).
    tau: the calibration strength (> 0).

  Returns:
    [B]. Rows whose label the client does not hold (padding) are large and
    finite, so that a mask zeroes them without a NaN.
  """
  held = class_counts > 0
  margin = tau * jnp.where(held, class_counts, 1.0) ** -0.25
  # A large finite stand-in for -inf: exp() underflows to 0 in the softmax.
  calibrated = jnp.where(held, logits - margin, -1e30)
  return softmax_cross_entropy(calibrated, labels)


def not_true_logits(logits, labels):
  """Each row's logits without its true class, in class order.

  Args:
    logits: [B, K].
    labels: [B] int in [0, K).

  Returns:
    [B, K - 1]: row b holds the logits of classes 0..K-1 except labels[b].
  """
  num_classes = logits.shape[-1]
  others = jnp.arange(num_classes - 1)[None, :]
  # Class j for j < y, j + 1 from y on: every class but y, in order.
  index = others + (others >= labels[:, None])
  return jnp.take_along_axis(logits, index, axis=-1)


def not_true_distillation(local_logits, global_logits, labels, temperature):
  """FedNTD's not-true distillation, per example.

  Lee, Jeong, Shin, Bae and Yun, 'Preservation of the Global Knowledge by
  Not-True Distillation in Federated Learning', NeurIPS 2022, the loss
  L_NTD of its method section: with q~ the softmax at temperature tau over
  the not-true classes only (the true class's logit left out),

    L_NTD = sum_{c != y} q~_g(c) log(q~_g(c) / q~_l(c)),

  the KL divergence from the global model's not-true distribution to the
  local one's (the authors' code: KLDivLoss of log_softmax(l / tau) against
  softmax(g / tau) after removing the true class; their NTD_Loss then
  multiplies it by tau^2, which `fedntd.ntd_term` does). The global logits
  are a constant: no gradient flows into them.

  Args:
    local_logits, global_logits: [B, K].
    labels: [B] int.
    temperature: tau > 0.

  Returns:
    [B] float.
  """
  local = not_true_logits(local_logits, labels) / temperature
  teacher = not_true_logits(global_logits, labels) / temperature
  teacher = jax.lax.stop_gradient(teacher)
  log_q_local = jax.nn.log_softmax(local, axis=-1)
  log_q_global = jax.nn.log_softmax(teacher, axis=-1)
  return jnp.sum(jnp.exp(log_q_global) * (log_q_global - log_q_local), -1)


def branch_distillation(main_logits, hybrid_logits, temperature=1.0):
  """FedMLB's distillation between a hybrid pathway and the main one.

  Kim, Kim and Han, 'Multi-Level Branched Regularization for Federated
  Learning', ICML 2022, Eq. 4's KL term for one branch: with p = softmax at
  temperature tau,

    L_KL = KL(p_hybrid || p_main) = sum_c p_h(c) log(p_h(c) / p_main(c)),

  the hybrid pathway's distribution the target (the authors' code:
  KLDivLoss of log_softmax(main / tau) against softmax(hybrid / tau),
  'batchmean', no tau^2 factor, neither side detached). Gradients flow into
  both sides: through the main pathway to every local block and through the
  hybrid one to the local blocks below its branch point.

  Args:
    main_logits, hybrid_logits: [B, K].
    temperature: tau > 0.

  Returns:
    [B] float.
  """
  log_p_main = jax.nn.log_softmax(main_logits / temperature, axis=-1)
  log_p_hybrid = jax.nn.log_softmax(hybrid_logits / temperature, axis=-1)
  return jnp.sum(jnp.exp(log_p_hybrid) * (log_p_hybrid - log_p_main), -1)
