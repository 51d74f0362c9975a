"""Semi-supervised fine-tuning of a learned representation (SSL evaluation).

The encoder and a new linear head are trained end to end on a
`stratified_subset` (1% or 10%) of the labelled training set, as in the SSD
authors' released code (github.com/hc-fang/ssd, semi_eval.py); Fang et al.,
'Soft Separation and Distillation: Toward Global Uniformity in Federated
Unsupervised Learning', ICCV 2025, Sec. 4. One jitted ``lax.scan`` over each
epoch's batches. kNN and the linear probe are downstream.py.
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import optax

from fedjax_metric.evaluation.downstream import (
  epoch_batches,
  linear_head,
  pad_rows,
  torch_linear_init,
)
from fedjax_metric.losses import masked_mean, softmax_cross_entropy
from fedjax_metric.models import merge_variables, split_variables

# ---------------------------------------------------------------------------
# Semi-supervised fine-tuning.
# ---------------------------------------------------------------------------


def stratified_subset(labels, fraction, *, seed=17):
  """Indices of a stratified ``fraction`` of the examples (1% or 10%).

  The labelled subset of semi-supervised fine-tuning, drawn as
  ``semi_eval.py`` of the SSD authors' released code does
  (github.com/hc-fang/ssd): sklearn's ``train_test_split(range(N),
  train_size=fraction, stratify=labels)`` with NumPy's global generator
  seeded by ``set_seed(17)``. Here the generator is
  ``np.random.RandomState(seed)``, the same stream, so ``seed=17`` gives the
  released subset as long as nothing else drew from NumPy's global generator
  before the split there. sklearn gives the classes shares of floor(fraction
  * N) examples proportional to their sizes, rounded so that the total is
  kept.

  Every class present in ``labels`` gets at least one example: a class that
  sklearn's rounding leaves empty gets one random example appended; where
  sklearn refuses (a class with a single example, or fewer examples on either
  side of the split than classes), each class c instead gets max(1,
  round(fraction * n_c)) random examples.

  Args:
    labels: [N] int class labels.
    fraction: in (0, 1).
    seed: NumPy seed (17 in the released code).

  Returns:
    int64 indices into ``labels``: sklearn's (shuffled) order, then any
    appended examples; or, in the fallback, class by class.
  """
  # Lazy: sklearn is slow to import and only needed here.
  from sklearn.model_selection import train_test_split

  labels = np.asarray(labels)
  if not 0.0 < fraction < 1.0:
    raise ValueError(f'fraction must be in (0, 1), got {fraction}')
  classes = np.unique(labels)
  rng = np.random.RandomState(seed)
  try:
    chosen, _ = train_test_split(
      np.arange(len(labels)),
      train_size=fraction,
      stratify=labels,
      random_state=rng,
    )
  except ValueError:
    per_class = []
    for c in classes:
      members = np.flatnonzero(labels == c)
      take = max(1, int(round(fraction * len(members))))
      per_class.append(rng.choice(members, size=take, replace=False))
    return np.concatenate(per_class).astype(np.int64)
  missing = np.setdiff1d(classes, labels[chosen])
  extra = [rng.choice(np.flatnonzero(labels == c)) for c in missing]
  return np.concatenate([chosen, np.asarray(extra, np.int64)]).astype(np.int64)


def _to_unit_float(images, key):
  """The test-time transform of the released code: ToTensor only."""
  del key
  return jnp.asarray(images).astype(jnp.float32) / 255.0


def fine_tune(
  model_apply,
  variables,
  images,
  labels,
  test_images,
  test_labels,
  *,
  num_classes,
  augment,
  preprocess=None,
  epochs=200,
  batch_size=128,
  encoder_lr=1e-3,
  head_lr=0.3,
  momentum=0.9,
  num_evals=4,
  seed=17,
  eval_batch_size=500,
  embedding_key='embedding',
  head_init=None,
):
  """Semi-supervised fine-tuning (SSD, Sec. 4; FedU2's protocol).

  As ``semi_eval.py`` of the SSD authors' released code
  (github.com/hc-fang/ssd): the pre-trained encoder and a new Linear(D, C)
  head (torch's default init) are trained end to end on the labelled subset
  (`stratified_subset`, 1% or 10%) with softmax cross-entropy, SGD momentum
  0.9 and no weight decay, lr 1e-3 for the encoder and 0.3 for the head,
  batch 128 (shuffled, last batch partial), 200 epochs, the encoder in
  training mode (BatchNorm uses and updates batch statistics). The test set
  is evaluated ``num_evals`` = 4 times, after epochs 50, 100, 150, 200, in
  eval mode and without augmentation; the BEST of those is reported.
  Training augmentation there is RandomResizedCrop(32, scale (0.64, 1),
  ratio (1, 1)) + horizontal flip on [0, 1] images, no normalisation: pass
  it as ``augment``.

  Args:
    model_apply: ``apply(params, model_state, images, *, train, mask=None) ->
      (outputs, new_model_state)`` (`fedjax_metric.models.ModelFns.apply`);
      ``outputs[embedding_key]`` is the [B, D] encoder representation.
    variables: the pre-trained ``{'params': ..., 'batch_stats': ...}``.
    images: uint8 [N, H, W, C] labelled subset; labels: [N] int.
    test_images: uint8 [M, H, W, C]; test_labels: [M] int.
    num_classes: C.
    augment: ``(uint8 images [B, H, W, C], key) -> float images``.
    preprocess: test-time ``(uint8 images, key) -> float images``; default
      images / 255 (ToTensor).
    epochs, batch_size, encoder_lr, head_lr, momentum: as above.
    num_evals: evaluations, evenly spaced, the last after the final epoch.
    seed: seeds the head init, shuffling and augmentation.
    eval_batch_size: test images per forward.
    embedding_key: which model output is the representation.
    head_init: optional {'kernel': [D, C], 'bias': [C]} instead of the random
      head init.

  Returns:
    {'accuracy': best test accuracy over the evaluations (float),
     'accuracies': the test accuracy of each evaluation (list),
     'eval_epochs': the 1-based epochs evaluated (list),
     'variables': the fine-tuned encoder variables,
     'head': the trained head {'kernel', 'bias'}}.
  """
  preprocess = _to_unit_float if preprocess is None else preprocess
  images = jnp.asarray(images)
  labels = jnp.asarray(labels, jnp.int32)
  n = images.shape[0]
  if n == 0 or epochs < 1 or num_evals < 1:
    raise ValueError('fine_tune needs examples, epochs >= 1, num_evals >= 1')
  params, model_state = split_variables(variables)
  key_head, key_train = jax.random.split(jax.random.key(seed))
  if head_init is None:
    dim = _embedding_dim(
      model_apply, params, model_state, preprocess, images[:1], embedding_key
    )
    head = torch_linear_init(key_head, dim, num_classes)
  else:
    head = jax.tree.map(lambda a: jnp.asarray(a, jnp.float32), dict(head_init))
  trainable = {'encoder': params, 'head': head}
  tx = _encoder_and_head_sgd(encoder_lr, head_lr, momentum)
  train_epoch = _make_train_epoch(
    model_apply, tx, augment, min(batch_size, n), embedding_key
  )
  test_correct = _make_test_correct(model_apply, preprocess, embedding_key)
  test_batches = _test_batches(test_images, test_labels, eval_batch_size)
  eval_epochs = _eval_epochs(epochs, num_evals)
  opt_state = tx.init(trainable)
  accuracies = []
  for epoch in range(1, epochs + 1):
    key_train, key_epoch = jax.random.split(key_train)
    trainable, opt_state, model_state = train_epoch(
      trainable, opt_state, model_state, key_epoch, images, labels
    )
    if epoch in eval_epochs:
      correct = test_correct(trainable, model_state, test_batches)
      accuracies.append(float(correct) / len(test_labels))
  return {
    'accuracy': max(accuracies),
    'accuracies': accuracies,
    'eval_epochs': eval_epochs,
    'variables': merge_variables(trainable['encoder'], model_state),
    'head': jax.tree.map(np.asarray, trainable['head']),
  }


def _embedding_dim(model_apply, params, model_state, preprocess, x, key):
  """D of the [B, D] representation ``outputs[key]``, from shapes only
  (nothing is computed)."""

  def embed(params, model_state, x):
    x = preprocess(x, jax.random.key(0))
    return model_apply(params, model_state, x, train=False)[0][key]

  return jax.eval_shape(embed, params, model_state, x).shape[-1]


def _encoder_and_head_sgd(encoder_lr, head_lr, momentum):
  """SGD with momentum at one rate for the encoder and another for the head
  (the released code's two parameter groups), over {'encoder', 'head'}."""
  return optax.multi_transform(
    {
      'encoder': optax.sgd(encoder_lr, momentum=momentum),
      'head': optax.sgd(head_lr, momentum=momentum),
    },
    lambda tree: {
      part: jax.tree.map(lambda _, part=part: part, sub)
      for part, sub in tree.items()
    },
  )


def _make_train_epoch(model_apply, tx, augment, batch_size, embedding_key):
  """A jitted epoch of end-to-end fine-tuning: one ``lax.scan`` over shuffled
  batches (the last partial, masked), each augmented, cross-entropy of the
  head on the representation, the encoder in training mode.

  ``train_epoch(trainable, opt_state, model_state, key, images [N, H, W, C],
  labels [N]) -> (trainable, opt_state, model_state)``.
  """

  def loss_fn(trainable, state, x, y, mask):
    outputs, new_state = model_apply(
      trainable['encoder'], state, x, train=True, mask=mask
    )
    logits = linear_head(trainable['head'], outputs[embedding_key])
    return masked_mean(softmax_cross_entropy(logits, y), mask), new_state

  def step(carry, batch, images, labels):
    trainable, opt_state, state = carry
    idx, valid, key = batch
    x = augment(images[idx], key)
    grads, state = jax.grad(loss_fn, has_aux=True)(
      trainable, state, x, labels[idx], valid
    )
    updates, opt_state = tx.update(grads, opt_state, trainable)
    return (optax.apply_updates(trainable, updates), opt_state, state), None

  @jax.jit
  def train_epoch(trainable, opt_state, state, key, images, labels):
    key_order, key_aug = jax.random.split(key)
    idx, valid = epoch_batches(key_order, images.shape[0], batch_size)
    aug_keys = jax.random.split(key_aug, idx.shape[0])
    carry, _ = jax.lax.scan(
      functools.partial(step, images=images, labels=labels),
      (trainable, opt_state, state),
      (idx, valid, aug_keys),
    )
    return carry

  return train_epoch


def _test_batches(test_images, test_labels, eval_batch_size):
  """The test set on the device as ([T, b, H, W, C] images, [T, b] labels,
  [T, b] valid mask), zero-padded to whole batches of b."""
  m = len(test_labels)
  b = min(eval_batch_size, m)
  rows = (
    np.asarray(test_images),
    np.asarray(test_labels, np.int32),
    np.ones(m, bool),
  )
  return jax.device_put(
    tuple(pad_rows(a, b)[0].reshape((-1, b) + a.shape[1:]) for a in rows)
  )


def _make_test_correct(model_apply, preprocess, embedding_key):
  """A jitted count of correct test predictions (eval mode, no
  augmentation): ``test_correct(trainable, model_state, batches) -> int``."""

  def count(trainable, state, batch):
    x, y, valid = batch
    outputs, _ = model_apply(
      trainable['encoder'], state, preprocess(x, jax.random.key(0)), train=False
    )
    logits = linear_head(trainable['head'], outputs[embedding_key])
    return jnp.sum((jnp.argmax(logits, axis=-1) == y) & valid)

  @jax.jit
  def test_correct(trainable, state, batches):
    return jnp.sum(
      jax.lax.map(functools.partial(count, trainable, state), batches)
    )

  return test_correct


def _eval_epochs(epochs, num_evals):
  """The 1-based epochs after which the test set is evaluated: num_evals
  evenly spaced, the last the final epoch (50, 100, 150, 200 of 200)."""
  return sorted(
    {max(1, round(epochs * (i + 1) / num_evals)) for i in range(num_evals)}
  )
