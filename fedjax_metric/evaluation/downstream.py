"""Downstream evaluation of a learned representation: kNN, linear probe,
semi-supervised fine-tuning.

The protocol of the federated unsupervised papers (FedU2: Liao et al.,
'Rethinking the Representation in Federated Unsupervised Learning with
Non-IID Data', CVPR 2024; SSD: Fang et al., 'Soft Separation and
Distillation: Toward Global Uniformity in Federated Unsupervised Learning',
ICCV 2025, Sec. 4 'Evaluation Metrics'), as in the SSD authors' released code
(github.com/hc-fang/ssd: utils/evaluate.py, linear_eval.py, semi_eval.py):

  * `knn_accuracy`: weighted kNN monitor on L2-normalised encoder features.
  * `linear_probe`: a linear classifier on frozen, raw encoder features.
  * `fine_tune`: encoder + new linear head trained end to end on a
    `stratified_subset` (1% or 10%) of the labelled training set.

Representation-quality metrics (uniformity, effective rank) are in
`fedjax_metric.evaluation.representation`.

Everything runs in JAX with the data on the device: kNN is one jitted
``lax.map`` over test batches, the linear probe one jitted ``lax.scan`` over
epochs, fine-tuning one jitted ``lax.scan`` over each epoch's batches.
"""

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
import optax

from fedjax_metric.losses import masked_mean, softmax_cross_entropy
from fedjax_metric.losses.metric import _l2_normalize
from fedjax_metric.models import merge_variables, split_variables

_HIGHEST = jax.lax.Precision.HIGHEST


def _pad_rows(x, multiple):
  """Pads axis 0 with zeros to a multiple of ``multiple``; returns (x, n)."""
  n = x.shape[0]
  pad = -n % multiple
  return np.concatenate([x, np.zeros((pad,) + x.shape[1:], x.dtype)]), n


# ---------------------------------------------------------------------------
# kNN.
# ---------------------------------------------------------------------------


@functools.partial(
  jax.jit, static_argnames=('num_classes', 'k', 'temperature', 'batch_size')
)
def _knn_correct(
  bank,
  bank_labels,
  queries,
  query_labels,
  valid,
  *,
  num_classes,
  k,
  temperature,
  batch_size,
):
  bank = _l2_normalize(bank)

  def predict(batch):
    q, y, v = batch
    sim = jnp.einsum('bd,nd->bn', _l2_normalize(q), bank, precision=_HIGHEST)
    top_sim, top_idx = jax.lax.top_k(sim, k)
    weights = jnp.exp(top_sim / temperature)
    votes = jax.nn.one_hot(
      bank_labels[top_idx], num_classes, dtype=weights.dtype
    )
    scores = jnp.sum(votes * weights[..., None], axis=1)
    return jnp.sum((jnp.argmax(scores, axis=-1) == y) & v)

  shape = lambda a: a.reshape((-1, batch_size) + a.shape[1:])
  return jnp.sum(
    jax.lax.map(predict, (shape(queries), shape(query_labels), shape(valid)))
  )


def knn_accuracy(
  train_features,
  train_labels,
  test_features,
  test_labels,
  *,
  num_classes,
  k=200,
  temperature=0.1,
  batch_size=256,
):
  """Weighted kNN accuracy (Wu et al., 'Unsupervised Feature Learning via
  Non-Parametric Instance Discrimination', CVPR 2018).

  Train and test features are L2-normalised; for each test point the k most
  cosine-similar training points vote for their labels with weight
  exp(sim / temperature), and the class with the largest total wins. This is
  ``knn_predict`` of the SSD authors' released code (github.com/hc-fang/ssd,
  utils/evaluate.py; k = 200, temperature = 0.1), where the bank is the
  encoder features of all clients' un-augmented training data.

  Ties: k is clamped to the number of training points; among equally similar
  neighbours the lower training index is taken first (``lax.top_k``) and among
  equal class scores the lowest class id wins (torch's ``topk`` / ``argsort``
  leave both unspecified).

  Args:
    train_features: [N, D] the bank; test_features: [M, D].
    train_labels: [N] int in [0, num_classes); test_labels: [M] int.
    num_classes: C.
    k: number of neighbours.
    temperature: vote temperature.
    batch_size: test points per step (bounds the [batch, N] similarities).

  Returns:
    Accuracy in [0, 1] as a Python float.
  """
  train_features = np.asarray(train_features, np.float32)
  test_features = np.asarray(test_features, np.float32)
  m = len(test_features)
  if m == 0 or len(train_features) == 0:
    raise ValueError('knn_accuracy needs a non-empty bank and test set')
  batch_size = min(batch_size, m)
  queries, _ = _pad_rows(test_features, batch_size)
  query_labels, _ = _pad_rows(np.asarray(test_labels, np.int32), batch_size)
  valid, _ = _pad_rows(np.ones(m, bool), batch_size)
  correct = _knn_correct(
    train_features,
    np.asarray(train_labels, np.int32),
    queries,
    query_labels,
    valid,
    num_classes=num_classes,
    k=min(k, len(train_features)),
    temperature=float(temperature),
    batch_size=batch_size,
  )
  return float(correct) / m


# ---------------------------------------------------------------------------
# Linear probe.
# ---------------------------------------------------------------------------


def _torch_linear_init(key, fan_in, fan_out, dtype=jnp.float32):
  """torch.nn.Linear's default init: W, b ~ U(-1/sqrt(fan_in), 1/sqrt(fan_in)).

  (kaiming_uniform with a = sqrt(5) gives exactly this bound for W.)
  """
  bound = 1.0 / math.sqrt(fan_in)
  k_w, k_b = jax.random.split(key)
  return {
    'kernel': jax.random.uniform(k_w, (fan_in, fan_out), dtype, -bound, bound),
    'bias': jax.random.uniform(k_b, (fan_out,), dtype, -bound, bound),
  }


def _linear(params, x):
  return x @ params['kernel'] + params['bias']


def _epoch_batches(key, n, batch_size):
  """A shuffled epoch as [num_batches, batch_size] indices and a valid mask.

  The last batch is partial (torch DataLoader with drop_last=False); its
  padding repeats index 0 and is masked out.
  """
  num_batches = -(-n // batch_size)
  perm = jax.random.permutation(key, n)
  idx = jnp.zeros(num_batches * batch_size, perm.dtype).at[:n].set(perm)
  valid = jnp.arange(num_batches * batch_size) < n
  return (
    idx.reshape(num_batches, batch_size),
    valid.reshape(num_batches, batch_size),
  )


@functools.partial(
  jax.jit,
  static_argnames=('epochs', 'learning_rate', 'batch_size', 'eval_every'),
)
def _train_linear(
  params,
  key,
  x,
  y,
  x_test,
  y_test,
  *,
  epochs,
  learning_rate,
  batch_size,
  eval_every,
):
  tx = optax.adam(learning_rate)  # torch Adam defaults: b=(.9,.999), eps=1e-8

  def loss_fn(p, xb, yb, vb):
    return masked_mean(softmax_cross_entropy(_linear(p, xb), yb), vb)

  def step(carry, batch):
    p, opt_state = carry
    idx, vb = batch
    grads = jax.grad(loss_fn)(p, x[idx], y[idx], vb)
    updates, opt_state = tx.update(grads, opt_state, p)
    return (optax.apply_updates(p, updates), opt_state), None

  def test_accuracy(p):
    pred = jnp.argmax(_linear(p, x_test), axis=-1)
    return jnp.mean((pred == y_test).astype(jnp.float32))

  def epoch(carry, epoch_index):
    p, opt_state, key = carry
    key, sub = jax.random.split(key)
    (p, opt_state), _ = jax.lax.scan(
      step, (p, opt_state), _epoch_batches(sub, x.shape[0], batch_size)
    )
    evaluate = ((epoch_index + 1) % eval_every == 0) | (
      epoch_index == epochs - 1
    )
    acc = jax.lax.cond(
      evaluate, test_accuracy, lambda _: jnp.array(-1.0, jnp.float32), p
    )
    return (p, opt_state, key), acc

  (params, _, _), accs = jax.lax.scan(
    epoch, (params, tx.init(params), key), jnp.arange(epochs)
  )
  return params, accs


def linear_probe(
  train_features,
  train_labels,
  test_features,
  test_labels,
  *,
  num_classes,
  epochs=200,
  learning_rate=3e-3,
  batch_size=512,
  seed=1,
  eval_every=20,
  init=None,
):
  """Linear evaluation on frozen features (SSD, Sec. 4 'Evaluation Metrics').

  As ``linear_eval.py`` of the SSD authors' released code
  (github.com/hc-fang/ssd): a Linear(D, C) layer (torch's default init) on
  the raw, un-normalised encoder features, trained with Adam (lr 3e-3, no
  weight decay) and softmax cross-entropy on shuffled minibatches of 512
  (last batch partial) for 200 epochs; test accuracy every 20 epochs, the
  last one is reported. When the training set has at most ``batch_size``
  examples every step is full-batch. The whole run is one jitted scan with
  the features on the device.

  Args:
    train_features: [N, D]; train_labels: [N] int.
    test_features: [M, D]; test_labels: [M] int.
    num_classes: C.
    epochs, learning_rate, batch_size: as above.
    seed: seeds the init and the shuffling (the code's set_seed(1)).
    eval_every: test accuracy every this many epochs (and after the last).
    init: optional {'kernel': [D, C], 'bias': [C]} instead of the random init.

  Returns:
    {'accuracy': final test accuracy (float),
     'accuracy_history': test accuracies at 'eval_epochs' (list of floats),
     'eval_epochs': the 1-based epochs evaluated (list of ints),
     'params': the trained {'kernel', 'bias'} as NumPy arrays}.
  """
  x = jnp.asarray(train_features, jnp.float32)
  if x.shape[0] == 0 or epochs < 1:
    raise ValueError('linear_probe needs training data and epochs >= 1')
  key_init, key_train = jax.random.split(jax.random.key(seed))
  params = (
    _torch_linear_init(key_init, x.shape[1], num_classes)
    if init is None
    else jax.tree.map(lambda a: jnp.asarray(a, jnp.float32), dict(init))
  )
  params, accs = _train_linear(
    params,
    key_train,
    x,
    jnp.asarray(train_labels, jnp.int32),
    jnp.asarray(test_features, jnp.float32),
    jnp.asarray(test_labels, jnp.int32),
    epochs=epochs,
    learning_rate=float(learning_rate),
    batch_size=min(batch_size, x.shape[0]),
    eval_every=eval_every,
  )
  accs = np.asarray(accs)
  eval_epochs = [e + 1 for e in range(epochs) if accs[e] >= 0]
  history = [float(accs[e - 1]) for e in eval_epochs]
  return {
    'accuracy': history[-1],
    'accuracy_history': history,
    'eval_epochs': eval_epochs,
    'params': jax.tree.map(np.asarray, params),
  }


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
    dim = jax.eval_shape(
      lambda p, s, x: model_apply(
        p, s, preprocess(x, jax.random.key(0)), train=False
      )[0][embedding_key],
      params,
      model_state,
      images[:1],
    ).shape[-1]
    head = _torch_linear_init(key_head, dim, num_classes)
  else:
    head = jax.tree.map(lambda a: jnp.asarray(a, jnp.float32), dict(head_init))
  trainable = {'encoder': params, 'head': head}
  tx = optax.multi_transform(
    {
      'encoder': optax.sgd(encoder_lr, momentum=momentum),
      'head': optax.sgd(head_lr, momentum=momentum),
    },
    lambda tree: {
      part: jax.tree.map(lambda _, part=part: part, sub)
      for part, sub in tree.items()
    },
  )
  batch_size = min(batch_size, n)

  def loss_fn(tp, state, x, y, mask):
    outputs, new_state = model_apply(
      tp['encoder'], state, x, train=True, mask=mask
    )
    logits = _linear(tp['head'], outputs[embedding_key])
    return masked_mean(softmax_cross_entropy(logits, y), mask), new_state

  @jax.jit
  def train_epoch(tp, opt_state, state, key, images, labels):
    key_order, key_aug = jax.random.split(key)
    idx, valid = _epoch_batches(key_order, images.shape[0], batch_size)
    aug_keys = jax.random.split(key_aug, idx.shape[0])

    def step(carry, batch):
      tp, opt_state, state = carry
      b_idx, b_valid, b_key = batch
      x = augment(images[b_idx], b_key)
      grads, state = jax.grad(loss_fn, has_aux=True)(
        tp, state, x, labels[b_idx], b_valid
      )
      updates, opt_state = tx.update(grads, opt_state, tp)
      return (optax.apply_updates(tp, updates), opt_state, state), None

    (tp, opt_state, state), _ = jax.lax.scan(
      step, (tp, opt_state, state), (idx, valid, aug_keys)
    )
    return tp, opt_state, state

  m = len(test_labels)
  eval_batch_size = min(eval_batch_size, m)
  test_x, _ = _pad_rows(np.asarray(test_images), eval_batch_size)
  test_y, _ = _pad_rows(np.asarray(test_labels, np.int32), eval_batch_size)
  test_valid, _ = _pad_rows(np.ones(m, bool), eval_batch_size)
  test_batches = jax.device_put(
    tuple(
      a.reshape((-1, eval_batch_size) + a.shape[1:])
      for a in (test_x, test_y, test_valid)
    )
  )

  @jax.jit
  def test_correct(tp, state, batches):
    def count(batch):
      x, y, v = batch
      outputs, _ = model_apply(
        tp['encoder'], state, preprocess(x, jax.random.key(0)), train=False
      )
      pred = jnp.argmax(_linear(tp['head'], outputs[embedding_key]), axis=-1)
      return jnp.sum((pred == y) & v)

    return jnp.sum(jax.lax.map(count, batches))

  eval_epochs = sorted(
    {max(1, round(epochs * (i + 1) / num_evals)) for i in range(num_evals)}
  )
  opt_state = tx.init(trainable)
  accuracies = []
  for epoch in range(1, epochs + 1):
    key_train, key_epoch = jax.random.split(key_train)
    trainable, opt_state, model_state = train_epoch(
      trainable, opt_state, model_state, key_epoch, images, labels
    )
    if epoch in eval_epochs:
      accuracies.append(
        float(test_correct(trainable, model_state, test_batches)) / m
      )
  return {
    'accuracy': max(accuracies),
    'accuracies': accuracies,
    'eval_epochs': eval_epochs,
    'variables': merge_variables(trainable['encoder'], model_state),
    'head': jax.tree.map(np.asarray, trainable['head']),
  }
