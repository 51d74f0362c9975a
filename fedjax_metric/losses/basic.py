"""Cross-entropy and the masked reduction every loss uses."""

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
