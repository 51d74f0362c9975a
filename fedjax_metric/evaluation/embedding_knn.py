"""Judging a supervised model by its embeddings: kNN and a linear probe.

For models trained without a cross-entropy term, whose classifier never
learns: the "without l_ce" rows of FedQuad's ablation (Goksu & Pugeault,
'FedQuad: Federated Stochastic Quadruplet Learning to Mitigate Data
Heterogeneity', arXiv:2509.04107, 2025, Table V). The paper reports an
accuracy for those rows without saying how it was measured; this module
measures it the way metric-learning embeddings are usually judged:

  * every evaluation: weighted kNN accuracy (k = 200, temperature 0.1;
    `downstream.knn_accuracy`) of the test embeddings against the
    embeddings of all clients' training examples (no augmentation);
  * at the end of a run: a linear probe (`downstream.linear_probe`, Adam, 200
    epochs) on the frozen training embeddings, tested on the test set.

The logits' test accuracy and loss (and representation metrics, if asked
for) are reported beside them, so a CE-free model shows its untrained
classifier at chance level next to its kNN accuracy.
"""

from typing import Dict

import numpy as np

from fedjax_metric.evaluation import classification, downstream
from fedjax_metric.evaluation import forward as forward_lib

KNN_K = 200
KNN_TEMPERATURE = 0.1


def make_embedding_fns(
  model,
  preprocess,
  train,
  test,
  clients,
  *,
  batch_size: int = 1000,
  representation_examples: int = 0,
):
  """``(every, final)``: ``variables -> {name: float}`` for this protocol.

  Args:
    model: `ModelFns` with an 'embedding' output (and 'logits').
    preprocess: ``(uint8 images, key) -> float images``, no augmentation.
    train, test: `sources.ArrayDataset` splits.
    clients: per-client index arrays into ``train``; their union is the kNN
      bank and the probe's training set.
    batch_size: examples per jitted forward.
    representation_examples: as in `classification.make_evaluate_fn`.

  Returns:
    ``every(variables)`` gives 'test_accuracy', 'test_loss' (of the logits)
    and 'test_knn_accuracy'; ``final(variables)`` gives
    'test_linear_probe_accuracy'.
  """
  num_classes = test.num_classes
  bank_idx = np.sort(np.concatenate([np.asarray(c, np.int64) for c in clients]))
  bank_labels = np.asarray(train.labels[bank_idx])
  test_labels = np.asarray(test.labels)
  classify = classification.make_evaluate_fn(
    model,
    preprocess,
    test.images,
    test.labels,
    batch_size=batch_size,
    representation_examples=representation_examples,
    num_classes=num_classes,
  )
  train_pass = forward_lib.make_forward_pass(
    model,
    preprocess,
    np.asarray(train.images[bank_idx]),
    bank_labels,
    batch_size=batch_size,
    feature_examples=len(bank_idx),
    classify=False,
  )
  test_pass = forward_lib.make_forward_pass(
    model,
    preprocess,
    np.asarray(test.images),
    test_labels,
    batch_size=batch_size,
    feature_examples=len(test_labels),
    classify=False,
  )

  def every(variables) -> Dict[str, float]:
    metrics = classify(variables)
    metrics['test_knn_accuracy'] = downstream.knn_accuracy(
      train_pass(variables).features,
      bank_labels,
      test_pass(variables).features,
      test_labels,
      num_classes=num_classes,
      k=KNN_K,
      temperature=KNN_TEMPERATURE,
    )
    return metrics

  def final(variables) -> Dict[str, float]:
    probe = downstream.linear_probe(
      train_pass(variables).features,
      bank_labels,
      test_pass(variables).features,
      test_labels,
      num_classes=num_classes,
    )
    return {'test_linear_probe_accuracy': probe['accuracy']}

  return every, final
