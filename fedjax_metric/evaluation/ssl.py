"""The 'ssl' evaluation protocol: a label-free model judged by its encoder.

The protocol of the federated unsupervised papers (FedU2: Liao et al.,
'Rethinking the Representation in Federated Unsupervised Learning with
Non-IID Data', CVPR 2024; SSD: Fang et al., 'Soft Separation and
Distillation: Toward Global Uniformity in Federated Unsupervised Learning',
ICCV 2025, Sec. 4 'Evaluation Metrics' and App. A.2), as in the SSD
authors' released code (github.com/hc-fang/ssd: methods/fedalignuniform/
server.py, utils/evaluate.py, linear_eval.py, semi_eval.py):

  * every evaluation: the weighted kNN monitor (`downstream.knn_accuracy`,
    k = 200, temperature 0.1) of the test set's encoder features against
    the encoder features of all clients' un-augmented training data
    (``knn_accuracy``, the headline);
  * at the end of a run (or on a saved checkpoint, ``python -m
    launch.evaluate``): the linear probe (`downstream.linear_probe`, raw
    frozen encoder features of the same training data, Adam 3e-3, 200
    epochs), semi-supervised fine-tuning on stratified 1% and 10% of the
    labels (`semi_supervised.fine_tune`, best of four evaluations), and the
    uniformity (Eq. 4; `representation.uniformity`, t = 2, on L2-normalised
    features; lower is more uniform, the paper reports -L_uniform) and
    effective rank (App. A.2, Roy & Vetterli; `representation.
    effective_rank` of the raw feature matrix) of the global model's test
    features.

Features are the encoder output ``outputs['embedding']`` in eval mode on
images scaled to [0, 1] with no mean / std normalisation, as the models are
trained (the released code's ToTensor only). Epochs, subset sizes and
fractions come from `SslEvalSettings` (the config's ``ssl_eval`` block,
fedjax_metric/settings.py), so CPU runs can shorten them; a run states what
it used in its summary.
"""

import time
from typing import Dict, NamedTuple, Tuple

import jax
import jax.numpy as jnp
import numpy as np

from fedjax_metric.data import views
from fedjax_metric.evaluation import downstream, representation, semi_supervised
from fedjax_metric.evaluation import forward as forward_lib


def unit_preprocess(images, key):
  """uint8 images -> float32 on [0, 1] (ToTensor), no normalisation."""
  del key
  return jnp.asarray(images).astype(jnp.float32) / 255.0


def make_finetune_augment(*, scale=(0.64, 1.0), ratio=(1.0, 1.0), flip_p=0.5):
  """``(uint8 images [B, H, W, C], key) -> float [B, H, W, C]``: the
  released semi_eval.py training transform, RandomResizedCrop(H, scale
  (0.64, 1), ratio (1, 1)) then a horizontal flip, no normalisation."""

  def one(image, key):
    k_crop, k_flip = jax.random.split(key)
    x = views.random_resized_crop(image, k_crop, scale=scale, ratio=ratio)
    return views.horizontal_flip(x, k_flip, p=flip_p)

  def batch_augment(images, key):
    return jax.vmap(one)(images, jax.random.split(key, images.shape[0]))

  return batch_augment


def _subset(n, size, seed):
  """A fixed random subset of range(n) of ``size`` (0 or >= n: all), sorted."""
  if size <= 0 or size >= n:
    return np.arange(n)
  return np.sort(np.random.default_rng(seed).choice(n, size, replace=False))


def to_image_shape(dataset, shape):
  """``dataset`` with its images resized to ``shape`` (H, W, C) for an
  encoder trained on another dataset (out-of-distribution evaluation).

  Bilinear resizing (antialiased when shrinking) on the 0..255 scale,
  rounded back to uint8; one channel becomes C copies and C channels become
  their mean when the encoder takes one. A dataset already of that shape is
  returned unchanged.
  """
  images = np.asarray(dataset.images)
  if images.shape[1:] == tuple(shape):
    return dataset
  height, width, channels = shape
  if images.shape[-1] != channels:
    if images.shape[-1] == 1:
      images = np.repeat(images, channels, axis=-1)
    elif channels == 1:
      images = images.mean(axis=-1, keepdims=True)
    else:
      raise ValueError(
        f'Cannot map {images.shape[-1]}-channel images onto a '
        f'{channels}-channel encoder.'
      )
  resized = jax.image.resize(
    jnp.asarray(images, jnp.float32),
    (images.shape[0], height, width, channels),
    method='bilinear',
  )
  pixels = np.clip(np.rint(np.asarray(resized)), 0, 255).astype(np.uint8)
  return dataset._replace(images=pixels)


class SslEvalSettings(NamedTuple):
  """The 'ssl' protocol's settings; the defaults are the SSD authors'.

  Attributes:
    knn_k, knn_temperature: the weighted kNN monitor's k and temperature.
    knn_bank_examples, knn_test_examples: kNN bank / query subset sizes
      (0: every example).
    linear_epochs, linear_learning_rate, linear_batch_size: the linear
      probe (Adam).
    finetune_fractions: labelled fractions of the semi-supervised
      fine-tuning (stratified subsets).
    finetune_epochs, finetune_batch_size, finetune_encoder_lr,
    finetune_head_lr, finetune_evals, finetune_seed: its training.
    quality_examples: test examples behind uniformity and effective rank
      (0: all).
    erank_matrix: 'features' (SSD App. A.2) or 'covariance'.
    target_dataset, target_data_dir: out-of-distribution evaluation on
      another dataset's splits ('': the run's own dataset).
  """

  knn_k: int = 200
  knn_temperature: float = 0.1
  knn_bank_examples: int = 0
  knn_test_examples: int = 0
  linear_epochs: int = 200
  linear_learning_rate: float = 3e-3
  linear_batch_size: int = 512
  finetune_fractions: Tuple[float, ...] = (0.01, 0.1)
  finetune_epochs: int = 200
  finetune_batch_size: int = 128
  finetune_encoder_lr: float = 1e-3
  finetune_head_lr: float = 0.3
  finetune_evals: int = 4
  finetune_seed: int = 17
  quality_examples: int = 0
  erank_matrix: str = 'features'
  target_dataset: str = ''
  target_data_dir: str = ''


def fraction_name(fraction):
  """0.01 -> '1pct', 0.1 -> '10pct', 0.005 -> '0.5pct'."""
  pct = 100.0 * fraction
  text = f'{pct:.0f}' if abs(pct - round(pct)) < 1e-9 else f'{pct:g}'
  return f'{text}pct'


def make_ssl_evaluator(
  model, train, test, clients, eval_config, *, batch_size=1000, seed=0
):
  """``(every, final)`` of the 'ssl' protocol, each ``variables -> dict``.

  Args:
    model: `ModelFns` with an 'embedding' (encoder) output.
    train, test: `sources.ArrayDataset` splits.
    clients: per-client index arrays into ``train``; their union is the kNN
      bank, the linear probe's training set and the pool of the labelled
      fine-tuning subsets.
    eval_config: `SslEvalSettings` (or any object with its fields).
    batch_size: examples per jitted forward.
    seed: seeds the kNN subsets (when they are subsets).

  Returns:
    ``every(variables) -> {'knn_accuracy'}``; ``final(variables) ->
    {'linear_probe_accuracy', 'finetune_<p>pct_accuracy' per fraction,
    'test_uniformity', 'test_effective_rank', 'final_eval_seconds'}``.
  """
  e = eval_config
  num_classes = test.num_classes
  pool = np.sort(np.concatenate([np.asarray(c, np.int64) for c in clients]))
  pool_images = np.asarray(train.images[pool])
  pool_labels = np.asarray(train.labels[pool], np.int32)
  test_images = np.asarray(test.images)
  test_labels = np.asarray(test.labels, np.int32)

  def features_of(images, labels):
    return forward_lib.make_forward_pass(
      model,
      unit_preprocess,
      images,
      labels,
      batch_size=batch_size,
      feature_examples=len(labels),
      classify=False,
    )

  bank = _subset(len(pool), e.knn_bank_examples, seed)
  queries = _subset(len(test_labels), e.knn_test_examples, seed + 1)
  full_bank = len(bank) == len(pool)
  full_queries = len(queries) == len(test_labels)
  pool_pass = features_of(pool_images, pool_labels)
  test_pass = features_of(test_images, test_labels)
  bank_pass = (
    pool_pass
    if full_bank
    else features_of(pool_images[bank], pool_labels[bank])
  )
  query_pass = (
    test_pass
    if full_queries
    else features_of(test_images[queries], test_labels[queries])
  )

  def knn(bank_features, query_features):
    return downstream.knn_accuracy(
      bank_features,
      pool_labels[bank],
      query_features,
      test_labels[queries],
      num_classes=num_classes,
      k=e.knn_k,
      temperature=e.knn_temperature,
    )

  def every(variables) -> Dict[str, float]:
    return {
      'knn_accuracy': knn(
        bank_pass(variables).features, query_pass(variables).features
      )
    }

  finetune_augment = make_finetune_augment()

  def final(variables) -> Dict[str, float]:
    start = time.time()
    test_features = test_pass(variables).features
    metrics = {
      'linear_probe_accuracy': _linear_probe_accuracy(
        pool_pass(variables).features,
        pool_labels,
        test_features,
        test_labels,
        num_classes,
        e,
      )
    }
    for fraction in e.finetune_fractions:
      metrics[f'finetune_{fraction_name(fraction)}_accuracy'] = (
        _fine_tune_accuracy(
          model,
          variables,
          (pool_images, pool_labels),
          (test_images, test_labels),
          fraction,
          num_classes,
          e,
          augment=finetune_augment,
          eval_batch_size=batch_size,
        )
      )
    metrics.update(_representation_quality(test_features, e))
    metrics['final_eval_seconds'] = time.time() - start
    return metrics

  return every, final


def _linear_probe_accuracy(
  train_features, train_labels, test_features, test_labels, num_classes, e
):
  """Linear probe on frozen [N, D] features (`downstream.linear_probe`);
  its test accuracy after the last of ``e.linear_epochs`` epochs."""
  probe = downstream.linear_probe(
    train_features,
    train_labels,
    test_features,
    test_labels,
    num_classes=num_classes,
    epochs=e.linear_epochs,
    learning_rate=e.linear_learning_rate,
    batch_size=e.linear_batch_size,
    eval_every=max(1, e.linear_epochs // 10),
  )
  return probe['accuracy']


def _fine_tune_accuracy(
  model,
  variables,
  pool,
  test,
  fraction,
  num_classes,
  e,
  *,
  augment,
  eval_batch_size,
):
  """Fine-tuning on a stratified ``fraction`` of the pool's labels
  (`semi_supervised.fine_tune`); its best test accuracy.

  ``pool`` / ``test``: (uint8 images [N, H, W, C], int labels [N]).
  """
  pool_images, pool_labels = pool
  labelled = semi_supervised.stratified_subset(
    pool_labels, fraction, seed=e.finetune_seed
  )
  tuned = semi_supervised.fine_tune(
    model.apply,
    variables,
    pool_images[labelled],
    pool_labels[labelled],
    *test,
    num_classes=num_classes,
    augment=augment,
    preprocess=unit_preprocess,
    epochs=e.finetune_epochs,
    batch_size=e.finetune_batch_size,
    encoder_lr=e.finetune_encoder_lr,
    head_lr=e.finetune_head_lr,
    num_evals=e.finetune_evals,
    seed=e.finetune_seed,
    eval_batch_size=eval_batch_size,
  )
  return tuned['accuracy']


def _representation_quality(test_features, e):
  """Uniformity and effective rank of the first ``e.quality_examples`` test
  features [M, D] (all when 0)."""
  quality = test_features[: e.quality_examples or None]
  return {
    'test_uniformity': float(representation.uniformity(quality)),
    'test_effective_rank': float(
      representation.effective_rank(quality, matrix=e.erank_matrix)
    ),
  }
