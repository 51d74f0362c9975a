"""Global test accuracy and loss, and representation metrics from one pass.

The test set lives on the device, padded to a whole number of fixed-size
batches; one jitted forward per batch sums the statistics on the device
(`forward.make_forward_pass`), so the host reads a few scalars per evaluation
and, when representation metrics are asked for, the features of a fixed
subset from the same forward pass.
"""

import jax
import numpy as np

from fedjax_metric.evaluation import forward as forward_lib
from fedjax_metric.evaluation import representation


def make_evaluate_fn(
  model,
  preprocess,
  images: np.ndarray,
  labels: np.ndarray,
  *,
  batch_size: int = 1000,
  representation_examples: int = 0,
  num_classes: int = 0,
):
  """Returns ``variables -> {'test_accuracy', 'test_loss', ...}`` (floats).

  Args:
    model: `ModelFns`.
    preprocess: ``(uint8 images, key) -> float images`` without augmentation.
    images: uint8 [N, H, W, C]; labels: int [N].
    batch_size: examples per jitted forward.
    representation_examples: > 0 adds ``test_<name>`` for every metric of
      `representation.representation_metrics` on the embeddings of the first
      this-many test examples (a fixed subset, comparable across rounds).
    num_classes: needed with ``representation_examples``.
  """
  if representation_examples and num_classes < 1:
    raise ValueError('representation_examples needs num_classes >= 1.')
  forward = forward_lib.make_forward_pass(
    model,
    preprocess,
    images,
    labels,
    batch_size=batch_size,
    feature_examples=representation_examples,
  )
  subset_labels = np.asarray(labels[:representation_examples])
  # One program for all five metrics (op by op, each evaluation compiled
  # ~100 small programs on its first call).
  metrics_fn = jax.jit(
    representation.representation_metrics, static_argnames='num_classes'
  )

  def evaluate(variables):
    result = forward(variables)
    metrics = {
      'test_accuracy': result.correct / result.count,
      'test_loss': result.loss_sum / result.count,
    }
    if result.features is not None:
      values = metrics_fn(
        result.features, subset_labels, num_classes=num_classes
      )
      metrics.update({f'test_{k}': float(v) for k, v in values.items()})
    return metrics

  return evaluate
