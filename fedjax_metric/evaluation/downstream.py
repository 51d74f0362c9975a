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
  * `fine_tune` (semi_supervised.py): encoder + new linear head trained end to
    end on a `stratified_subset` (1% or 10%) of the labelled training set.

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

_HIGHEST = jax.lax.Precision.HIGHEST


def pad_rows(x, multiple):
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
  queries, _ = pad_rows(test_features, batch_size)
  query_labels, _ = pad_rows(np.asarray(test_labels, np.int32), batch_size)
  valid, _ = pad_rows(np.ones(m, bool), batch_size)
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


def torch_linear_init(key, fan_in, fan_out, dtype=jnp.float32):
  """torch.nn.Linear's default init: W, b ~ U(-1/sqrt(fan_in), 1/sqrt(fan_in)).

  (kaiming_uniform with a = sqrt(5) gives exactly this bound for W.)
  """
  bound = 1.0 / math.sqrt(fan_in)
  k_w, k_b = jax.random.split(key)
  return {
    'kernel': jax.random.uniform(k_w, (fan_in, fan_out), dtype, -bound, bound),
    'bias': jax.random.uniform(k_b, (fan_out,), dtype, -bound, bound),
  }


def linear_head(params, x):
  """Logits [B, C] of a linear head {'kernel': [D, C], 'bias': [C]} on x [B, D]."""
  return x @ params['kernel'] + params['bias']


def epoch_batches(key, n, batch_size):
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
    return masked_mean(softmax_cross_entropy(linear_head(p, xb), yb), vb)

  def step(carry, batch):
    p, opt_state = carry
    idx, vb = batch
    grads = jax.grad(loss_fn)(p, x[idx], y[idx], vb)
    updates, opt_state = tx.update(grads, opt_state, p)
    return (optax.apply_updates(p, updates), opt_state), None

  def test_accuracy(p):
    pred = jnp.argmax(linear_head(p, x_test), axis=-1)
    return jnp.mean((pred == y_test).astype(jnp.float32))

  def epoch(carry, epoch_index):
    p, opt_state, key = carry
    key, sub = jax.random.split(key)
    (p, opt_state), _ = jax.lax.scan(
      step, (p, opt_state), epoch_batches(sub, x.shape[0], batch_size)
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
    torch_linear_init(key_init, x.shape[1], num_classes)
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
