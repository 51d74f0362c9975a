"""One jitted forward pass over a held-out split: statistics and features.

The split is put on the device once, padded to whole fixed-size batches so a
single compiled forward serves every batch. Each batch yields the sufficient
statistics of accuracy and loss (summed on the device) and, for the first
``feature_examples`` examples, the model's features, so evaluation and
representation metrics come from the same pass.
"""

from typing import NamedTuple, Optional

import jax
import jax.numpy as jnp
import numpy as np

from fedjax_metric.losses import softmax_cross_entropy
from fedjax_metric.models import split_variables


class PassResult(NamedTuple):
  """What one pass over the split gives.

  Attributes:
    correct: examples whose argmax logit is the label (0 without logits).
    loss_sum: summed cross-entropy (0 without logits).
    count: examples in the split.
    features: [feature_examples, D] float32 ``outputs[feature_key]`` of the
      first examples, or None.
  """

  correct: float
  loss_sum: float
  count: int
  features: Optional[np.ndarray]


def make_forward_pass(
  model,
  preprocess,
  images: np.ndarray,
  labels: np.ndarray,
  *,
  batch_size: int = 1000,
  feature_examples: int = 0,
  classify: bool = True,
  feature_key: str = 'embedding',
):
  """Returns ``variables -> PassResult`` for ``model`` in eval mode.

  Args:
    model: `ModelFns`.
    preprocess: ``(uint8 images, key) -> float images`` without augmentation.
    images: uint8 [N, H, W, C]; labels: int [N].
    batch_size: examples per jitted forward.
    feature_examples: return features of the first this-many examples.
    classify: compute accuracy and loss from ``outputs['logits']``.
    feature_key: which model output the features are.
  """
  n = len(labels)
  if n == 0:
    raise ValueError('The evaluation split is empty.')
  feature_examples = min(feature_examples, n)
  batch_size = min(batch_size, n)
  num_batches = -(-n // batch_size)
  pad = num_batches * batch_size - n
  mask = np.concatenate([np.ones(n, bool), np.zeros(pad, bool)])
  padded_images = np.concatenate(
    [images, np.zeros((pad,) + images.shape[1:], images.dtype)]
  )
  padded_labels = np.concatenate([labels, np.zeros(pad, labels.dtype)])
  batches = jax.device_put(
    [
      (
        padded_images[i : i + batch_size],
        padded_labels[i : i + batch_size],
        mask[i : i + batch_size],
      )
      for i in range(0, n + pad, batch_size)
    ]
  )
  # Only the batches holding wanted features send them to the host.
  feature_batches = -(-feature_examples // batch_size)

  @jax.jit
  def one_batch(variables, images, labels, mask):
    params, model_state = split_variables(variables)
    x = preprocess(images, jax.random.key(0))
    outputs, _ = model.apply(params, model_state, x, train=False)
    stats = jnp.zeros((2,), jnp.float32)
    if classify:
      logits = outputs['logits']
      correct = (jnp.argmax(logits, -1) == labels) & mask
      loss = jnp.where(mask, softmax_cross_entropy(logits, labels), 0.0)
      stats = jnp.stack([jnp.sum(correct.astype(jnp.float32)), jnp.sum(loss)])
    features = outputs[feature_key] if feature_examples else None
    return stats, features

  def forward(variables):
    totals = jnp.zeros((2,), jnp.float32)
    features = []
    for b, batch in enumerate(batches):
      stats, batch_features = one_batch(variables, *batch)
      totals = totals + stats
      if b < feature_batches:
        features.append(batch_features)
    correct, loss_sum = np.asarray(totals)
    feats = None
    if feature_examples:
      feats = np.concatenate([np.asarray(f) for f in features])
      feats = feats[:feature_examples].astype(np.float32)
    return PassResult(float(correct), float(loss_sum), n, feats)

  return forward
