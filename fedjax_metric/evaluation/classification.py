"""Global test accuracy and loss, as sufficient statistics (sum, count).

The test set lives on the device, padded to a whole number of fixed-size
batches; a Python loop runs one jitted forward per batch and sums on the
device, so the host reads three scalars per evaluation.
"""

import jax
import jax.numpy as jnp
import numpy as np

from fedjax_metric.losses import softmax_cross_entropy
from fedjax_metric.models import split_variables


def make_evaluate_fn(model, preprocess, images: np.ndarray, labels: np.ndarray,
                     *, batch_size: int = 1000):
  """Returns ``variables -> {'test_accuracy', 'test_loss'}`` (floats).

  Args:
    model: `ModelFns`.
    preprocess: ``(uint8 images, key) -> float images`` without augmentation.
    images: uint8 [N, H, W, C]; labels: int [N].
    batch_size: examples per jitted forward.
  """
  n = len(labels)
  if n == 0:
    raise ValueError('The evaluation split is empty.')
  batch_size = min(batch_size, n)
  num_batches = -(-n // batch_size)
  pad = num_batches * batch_size - n
  mask = np.concatenate([np.ones(n, bool), np.zeros(pad, bool)])
  padded_images = np.concatenate([images, np.zeros((pad,) + images.shape[1:],
                                                   images.dtype)])
  padded_labels = np.concatenate([labels, np.zeros(pad, labels.dtype)])
  batches = jax.device_put([
      (padded_images[i:i + batch_size], padded_labels[i:i + batch_size],
       mask[i:i + batch_size]) for i in range(0, n + pad, batch_size)])

  @jax.jit
  def batch_sums(variables, images, labels, mask):
    params, model_state = split_variables(variables)
    x = preprocess(images, jax.random.key(0))
    outputs, _ = model.apply(params, model_state, x, train=False)
    logits = outputs['logits']
    correct = (jnp.argmax(logits, -1) == labels) & mask
    loss = jnp.where(mask, softmax_cross_entropy(logits, labels), 0.0)
    return jnp.stack([jnp.sum(correct.astype(jnp.float32)), jnp.sum(loss)])

  def evaluate(variables):
    totals = sum(batch_sums(variables, *batch) for batch in batches)
    correct, loss = np.asarray(totals)
    return {'test_accuracy': float(correct / n), 'test_loss': float(loss / n)}

  return evaluate
