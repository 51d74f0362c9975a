"""Downstream evaluation: kNN, linear probe, stratified subsets, fine-tuning.

References are independent: a float64 NumPy loop for the weighted kNN, a
hand-written float64 NumPy Adam / SGD step with hand-derived softmax
cross-entropy gradients for the probe and the fine-tuning optimiser, the
released code's own sklearn call for the stratified subset.
"""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from sklearn.model_selection import train_test_split

from fedjax_metric import evaluation
from fedjax_metric.models import make_model_fns
from fedjax_metric.models.layers import make_norm

HIGHEST = 'highest'


# ---------------------------------------------------------------------------
# kNN.
# ---------------------------------------------------------------------------


def ref_knn_accuracy(train, train_y, test, test_y, num_classes, k, t):
  """InstDisc weighted kNN, loop by loop; ties as documented (lower index
  first among equal similarities, lowest class among equal scores)."""

  def unit(v):
    v = np.asarray(v, np.float64)
    return v / max(np.linalg.norm(v), 1e-12)

  bank = [unit(v) for v in train]
  k = min(k, len(bank))
  correct = 0
  for q, y in zip(test, test_y):
    q = unit(q)
    sims = np.array([float(np.dot(q, b)) for b in bank])
    order = sorted(range(len(bank)), key=lambda j: (-sims[j], j))[:k]
    scores = [0.0] * num_classes
    for j in order:
      scores[train_y[j]] += np.exp(sims[j] / t)
    best = max(range(num_classes), key=lambda c: (scores[c], -c))
    correct += int(best == y)
  return correct / len(test)


def clustered(seed, n, num_classes, dim, spread=1.0):
  rng = np.random.default_rng(seed)
  centers = rng.normal(size=(num_classes, dim)) * 3
  labels = rng.integers(0, num_classes, size=n)
  x = centers[labels] + spread * rng.normal(size=(n, dim))
  return x.astype(np.float32), labels.astype(np.int32)


@pytest.mark.parametrize('k', [1, 7, 200])
def test_knn_matches_loop_reference(k):
  train, train_y = clustered(0, 60, 5, 8, spread=2.5)
  rng = np.random.default_rng(1)
  test = train[:25] + rng.normal(size=(25, 8)).astype(np.float32)
  test_y = train_y[:25].copy()
  test_y[::4] = (test_y[::4] + 1) % 5  # some wrong labels
  with jax.default_matmul_precision(HIGHEST):
    got = evaluation.knn_accuracy(
      train,
      train_y,
      test,
      test_y,
      num_classes=5,
      k=k,
      temperature=0.1,
      batch_size=8,
    )
  want = ref_knn_accuracy(train, train_y, test, test_y, 5, k, 0.1)
  assert got == pytest.approx(want, abs=1e-12)
  assert 0.3 < got < 1.0  # the data exercise both outcomes


def test_knn_ties_and_clamped_k():
  v = np.array([1.0, 0.0, 0.0], np.float32)
  w = np.array([0.0, 1.0, 0.0], np.float32)
  bank = np.stack([v, v, w, w])
  labels = np.array([2, 1, 0, 0], np.int32)
  query = 3.0 * v[None]  # normalised inside
  knn = lambda k, y: evaluation.knn_accuracy(
    bank, labels, query, np.array([y]), num_classes=3, k=k
  )
  # Two equally similar neighbours: k = 1 takes the lower index (label 2).
  assert knn(1, 2) == 1.0 and knn(1, 1) == 0.0
  # k = 2: labels 2 and 1 score equally, the lower class id (1) wins.
  assert knn(2, 1) == 1.0 and knn(2, 2) == 0.0
  # k > N is clamped to N = 4: the v-neighbours outweigh the w ones.
  assert knn(50, 1) == 1.0
  assert ref_knn_accuracy(bank, labels, query, [1], 3, 50, 0.1) == 1.0
  assert ref_knn_accuracy(bank, labels, query, [2], 3, 1, 0.1) == 1.0


# ---------------------------------------------------------------------------
# Linear probe.
# ---------------------------------------------------------------------------


def softmax_ce_grads(w, b, x, y, num_classes):
  """Mean softmax cross-entropy and its gradients, by hand, float64."""
  logits = x @ w + b
  logits = logits - logits.max(1, keepdims=True)
  p = np.exp(logits)
  p /= p.sum(1, keepdims=True)
  onehot = np.eye(num_classes)[y]
  dlogits = (p - onehot) / len(x)
  return x.T @ dlogits, dlogits.sum(0), dlogits


def test_linear_probe_adam_steps_match_numpy_adam():
  """Full-batch mode: each epoch is one Adam step (torch defaults)."""
  rng = np.random.default_rng(3)
  x = rng.normal(size=(12, 4)).astype(np.float32)
  y = rng.integers(0, 3, size=12).astype(np.int32)
  init = {
    'kernel': rng.normal(size=(4, 3)).astype(np.float32) * 0.3,
    'bias': rng.normal(size=3).astype(np.float32) * 0.1,
  }
  with jax.default_matmul_precision(HIGHEST):
    out = evaluation.linear_probe(
      x, y, x, y, num_classes=3, epochs=3, batch_size=512, init=init
    )
  w, b = init['kernel'].astype(np.float64), init['bias'].astype(np.float64)
  lr, b1, b2, eps = 3e-3, 0.9, 0.999, 1e-8
  state = {
    name: (np.zeros_like(p), np.zeros_like(p))
    for name, p in (('w', w), ('b', b))
  }
  params = {'w': w, 'b': b}
  for step in range(1, 4):
    gw, gb, _ = softmax_ce_grads(
      params['w'], params['b'], x.astype(np.float64), y, 3
    )
    for name, g in (('w', gw), ('b', gb)):
      m, v = state[name]
      m = b1 * m + (1 - b1) * g
      v = b2 * v + (1 - b2) * g * g
      state[name] = (m, v)
      m_hat, v_hat = m / (1 - b1**step), v / (1 - b2**step)
      params[name] = params[name] - lr * m_hat / (np.sqrt(v_hat) + eps)
  np.testing.assert_allclose(
    out['params']['kernel'], params['w'], atol=1e-5, rtol=0
  )
  np.testing.assert_allclose(
    out['params']['bias'], params['b'], atol=1e-5, rtol=0
  )
  # The steps moved the parameters by much more than the tolerance.
  assert np.abs(params['w'] - w).max() > 5e-3


def test_linear_probe_separable_data_and_eval_schedule():
  train, train_y = clustered(4, 150, 3, 6, spread=0.3)
  test, test_y = clustered(4, 210, 3, 6, spread=0.3)
  test, test_y = test[150:], test_y[150:]  # same centres, fresh points
  out = evaluation.linear_probe(
    train,
    train_y,
    test,
    test_y,
    num_classes=3,
    epochs=45,
    batch_size=64,
    eval_every=20,
  )
  assert out['eval_epochs'] == [20, 40, 45]
  assert len(out['accuracy_history']) == 3
  assert out['accuracy_history'][0] < 0.9  # it had to learn
  assert out['accuracy'] == out['accuracy_history'][-1] == 1.0


# ---------------------------------------------------------------------------
# Stratified subsets.
# ---------------------------------------------------------------------------


def test_stratified_subset_balanced_classes_are_exact():
  labels = np.repeat(np.arange(10), 100)
  np.random.default_rng(0).shuffle(labels)
  for fraction, per_class in ((0.01, 1), (0.1, 10)):
    idx = evaluation.stratified_subset(labels, fraction, seed=3)
    assert len(np.unique(idx)) == len(idx) == 10 * per_class
    np.testing.assert_array_equal(
      np.bincount(labels[idx], minlength=10), per_class
    )


def test_stratified_subset_proportions_and_determinism():
  sizes = [500, 300, 150, 40, 10]
  labels = np.repeat(np.arange(5), sizes)
  idx = evaluation.stratified_subset(labels, 0.1, seed=5)
  counts = np.bincount(labels[idx], minlength=5)
  assert counts.sum() == 100
  assert np.all(np.abs(counts - 0.1 * np.array(sizes)) <= 1)
  np.testing.assert_array_equal(
    idx, evaluation.stratified_subset(labels, 0.1, seed=5)
  )
  assert not np.array_equal(
    np.sort(idx), np.sort(evaluation.stratified_subset(labels, 0.1, seed=6))
  )


def test_stratified_subset_at_least_one_per_class():
  # sklearn's rounding would leave the 3-example class empty at 1%.
  labels = np.repeat(np.arange(3), [200, 200, 3])
  idx = evaluation.stratified_subset(labels, 0.01, seed=0)
  assert np.all(np.bincount(labels[idx], minlength=3) >= 1)
  # A singleton class makes sklearn refuse: per-class fallback.
  labels = np.repeat(np.arange(4), [50, 30, 20, 1])
  idx = evaluation.stratified_subset(labels, 0.1, seed=0)
  counts = np.bincount(labels[idx], minlength=4)
  np.testing.assert_array_equal(counts, [5, 3, 2, 1])
  assert len(np.unique(idx)) == len(idx)


def test_stratified_subset_reproduces_the_released_call():
  """semi_eval.py: set_seed(17), then train_test_split(range(N), ...)."""
  labels = np.random.default_rng(2).integers(0, 10, size=2000)
  saved = np.random.get_state()
  try:
    np.random.seed(17)
    released, _ = train_test_split(
      list(range(len(labels))), train_size=0.1, stratify=labels
    )
  finally:
    np.random.set_state(saved)
  np.testing.assert_array_equal(
    evaluation.stratified_subset(labels, 0.1, seed=17), released
  )


# ---------------------------------------------------------------------------
# Fine-tuning.
# ---------------------------------------------------------------------------


class TinyEncoder(nn.Module):
  """Flatten -> Dense(width) [-> BatchNorm -> ReLU]; outputs 'embedding'."""

  width: int = 4
  norm: str = 'none'

  @nn.compact
  def __call__(self, images, *, train, mask=None):
    h = nn.Dense(self.width)(images.reshape((images.shape[0], -1)))
    if self.norm != 'none':
      h = nn.relu(make_norm(self.norm)(h, train, mask))
    return {'embedding': h}


def quadrant_images(seed, n, num_classes=4):
  """uint8 [n, 4, 4, 1]: class c lights up quadrant c."""
  rng = np.random.default_rng(seed)
  labels = rng.integers(0, num_classes, size=n)
  images = rng.integers(0, 40, size=(n, 4, 4, 1))
  for i, c in enumerate(labels):
    r, col = divmod(int(c), 2)
    images[i, 2 * r : 2 * r + 2, 2 * col : 2 * col + 2] += 180
  return images.astype(np.uint8), labels.astype(np.int32)


def unit_float(images, key):
  del key
  return images.astype(jnp.float32) / 255.0


def noisy(images, key):
  return unit_float(images, key) + 0.02 * jax.random.normal(key, images.shape)


def test_fine_tune_one_step_uses_two_learning_rates():
  """One full-batch step: encoder moves by -1e-3 g, head by -0.3 g.

  Gradients derived by hand for embedding = x W1 + b1, logits = h W2 + b2,
  mean softmax cross-entropy (the first momentum step is the plain gradient).
  """
  model = make_model_fns(TinyEncoder(width=4))
  images, labels = quadrant_images(0, 10)
  variables = model.init(jax.random.key(0), jnp.zeros((1, 4, 4, 1)))
  rng = np.random.default_rng(1)
  head = {
    'kernel': rng.normal(size=(4, 4)).astype(np.float32),
    'bias': rng.normal(size=4).astype(np.float32) * 0.1,
  }
  with jax.default_matmul_precision(HIGHEST):
    out = evaluation.fine_tune(
      model.apply,
      variables,
      images,
      labels,
      images,
      labels,
      num_classes=4,
      augment=unit_float,
      epochs=1,
      num_evals=1,
      head_init=head,
    )
  p = variables['params']['Dense_0']
  w1 = np.asarray(p['kernel'], np.float64)
  b1 = np.asarray(p['bias'], np.float64)
  w2, b2 = head['kernel'].astype(np.float64), head['bias'].astype(np.float64)
  x = images.reshape(10, -1).astype(np.float64) / 255.0
  h = x @ w1 + b1
  gw2, gb2, dlogits = softmax_ce_grads(w2, b2, h, labels, 4)
  dh = dlogits @ w2.T
  gw1, gb1 = x.T @ dh, dh.sum(0)
  new = out['variables']['params']['Dense_0']
  tol = dict(atol=1e-6, rtol=1e-5)
  np.testing.assert_allclose(new['kernel'], w1 - 1e-3 * gw1, **tol)
  np.testing.assert_allclose(new['bias'], b1 - 1e-3 * gb1, **tol)
  np.testing.assert_allclose(out['head']['kernel'], w2 - 0.3 * gw2, **tol)
  np.testing.assert_allclose(out['head']['bias'], b2 - 0.3 * gb2, **tol)
  # Both parts moved visibly (so swapped rates would fail the check).
  assert np.abs(0.3 * gw2).max() > 1e-3 and np.abs(1e-3 * gw1).max() > 1e-7


def test_fine_tune_accuracy_goes_up_with_batchnorm_and_partial_batches():
  model = make_model_fns(TinyEncoder(width=8, norm='batch'))
  images, labels = quadrant_images(2, 60)
  test_images, test_labels = quadrant_images(3, 40)
  variables = model.init(jax.random.key(1), jnp.zeros((1, 4, 4, 1)))
  rng = np.random.default_rng(4)
  head = {
    'kernel': rng.normal(size=(8, 4)).astype(np.float32) * 0.1,
    'bias': np.zeros(4, np.float32),
  }
  # Accuracy before fine-tuning: the initial encoder (eval mode) and head.
  outputs, _ = model.apply(
    variables['params'],
    {'batch_stats': variables['batch_stats']},
    unit_float(test_images, None),
    train=False,
  )
  before = np.mean(
    np.argmax(
      np.asarray(outputs['embedding']) @ head['kernel'] + head['bias'], -1
    )
    == test_labels
  )
  out = evaluation.fine_tune(
    model.apply,
    variables,
    images,
    labels,
    test_images,
    test_labels,
    num_classes=4,
    augment=noisy,
    epochs=12,
    batch_size=16,
    num_evals=4,
    head_init=head,
  )
  assert out['eval_epochs'] == [3, 6, 9, 12]
  assert len(out['accuracies']) == 4
  assert out['accuracy'] >= 0.95 > before + 0.3
  # BatchNorm ran in training mode: its running statistics moved.
  moved = jax.tree.map(
    lambda a, b: np.abs(np.asarray(a) - b).max(),
    out['variables']['batch_stats'],
    variables['batch_stats'],
  )
  assert max(jax.tree.leaves(moved)) > 1e-3


def test_fine_tune_reports_the_best_evaluation_not_the_last():
  """Training on labels the test set contradicts makes test accuracy fall,
  so the best evaluation is an early one."""
  model = make_model_fns(TinyEncoder(width=4))
  images, labels = quadrant_images(5, 32)
  variables = model.init(jax.random.key(2), jnp.zeros((1, 4, 4, 1)))
  # Encoder: embedding c = brightness of quadrant c; head: quadrant c ->
  # class (c + 1) % 4. The test labels follow the head, training does not.
  kernel = np.zeros((16, 4), np.float32)
  for c in range(4):
    r, col = divmod(c, 2)
    for i in range(2 * r, 2 * r + 2):
      for j in range(2 * col, 2 * col + 2):
        kernel[i * 4 + j, c] = 1.0
  variables = {
    'params': {'Dense_0': {'kernel': jnp.asarray(kernel), 'bias': jnp.zeros(4)}}
  }
  head = {
    'kernel': np.roll(np.eye(4, dtype=np.float32), 1, axis=1) * 2.0,
    'bias': np.zeros(4, np.float32),
  }
  out = evaluation.fine_tune(
    model.apply,
    variables,
    images,
    labels,
    images,
    (labels + 1) % 4,
    num_classes=4,
    augment=unit_float,
    epochs=8,
    batch_size=8,
    num_evals=4,
    head_lr=0.02,
    encoder_lr=1e-3,
    head_init=head,
  )
  accs = out['accuracies']
  assert accs[0] > accs[-1] + 0.2, accs  # the trajectory falls
  assert out['accuracy'] == max(accs) != accs[-1]
