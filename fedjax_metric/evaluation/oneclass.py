"""One-class (one-vs-rest) evaluation: per-class scores and AUROC.

For class c the positives are the test examples of class c and the negatives
all other test examples; a score s_c(x) says how strongly x belongs to c
(higher = more likely). AUROC_c is scikit-learn's ``roc_auc_score`` (the
Mann-Whitney statistic, ties counted 1/2); the
one-class papers (Park, Hosseini and Yun, 'Federated Learning with Metric
Loss', FL-ICML workshop 2021, Table 2) report its mean over classes.

Scores: `center_scores` (minus the Euclidean distance to a class center: a
mean training embedding from `class_centers`, or a FedMetric / Deep SVDD
center) and `cosine_scores` (cosine to a class embedding, FedAwS, or to a
codeword, FedUV). AUROC is invariant to monotone transforms of one class's
scores, so -d and -d^2 give the same AUROC.
"""

import jax
import jax.numpy as jnp
import numpy as np

from fedjax_metric.data import partition
from fedjax_metric.losses.metric import _cosine, _distance


def auroc(scores, is_positive):
  """Area under the ROC curve: ``sklearn.metrics.roc_auc_score``.

  The probability that a random positive scores above a random negative,
  ties counted 1/2 (the Mann-Whitney U statistic; Hanley and McNeil,
  Radiology 1982); tests/test_oneclass_eval.py checks it against that pair
  count on heavily tied scores. This wrapper adds the one-line errors.

  Args:
    scores: [N] float, higher = more likely positive.
    is_positive: [N] bool.

  Returns:
    float in [0, 1].

  Raises:
    ValueError: shapes differ, a score is NaN, or there are no positives or
      no negatives.
  """
  scores = np.asarray(scores, np.float64).reshape(-1)
  is_positive = np.asarray(is_positive, bool).reshape(-1)
  if scores.shape != is_positive.shape:
    raise ValueError(
      f'scores and is_positive must have the same length, '
      f'got {scores.shape} and {is_positive.shape}.'
    )
  if np.isnan(scores).any():
    raise ValueError('auroc: scores contain NaN.')
  num_pos = int(is_positive.sum())
  num_neg = is_positive.size - num_pos
  if num_pos == 0 or num_neg == 0:
    raise ValueError(
      f'auroc needs positives and negatives, got {num_pos} '
      f'positives and {num_neg} negatives.'
    )
  # Lazy: sklearn takes ~1 s to import, which every run would pay.
  from sklearn.metrics import roc_auc_score

  return float(roc_auc_score(is_positive, scores))


def one_class_auroc(scores, labels):
  """Per-class one-vs-rest AUROC: class c ranks scores[:, c], positives y = c.

  The protocol of the one-class evaluations of Park, Hosseini and Yun,
  'Federated Learning with Metric Loss', FL-ICML workshop 2021, Table 2 (the
  mean over classes of this vector).

  Args:
    scores: [N, C] float, column c the class-c score.
    labels: [N] int in [0, C).

  Returns:
    [C] np.float64.

  Raises:
    ValueError: a class has no test example, or every example is of it.
  """
  scores = np.asarray(scores)
  labels = np.asarray(labels).reshape(-1)
  if scores.ndim != 2 or scores.shape[0] != labels.size:
    raise ValueError(
      f'scores must be [N, C] with N = len(labels); got '
      f'{scores.shape} and {labels.size} labels.'
    )
  return np.array(
    [auroc(scores[:, c], labels == c) for c in range(scores.shape[1])],
    np.float64,
  )


def center_scores(embeddings, centers, *, squared=False):
  """Class scores -||e - c_k|| (or -||e - c_k||^2), [N, D] x [C, D] -> [N, C].

  The Euclidean score for center-based one-class models (Ruff et al., 'Deep
  One-Class Classification', ICML 2018, use ||e - c||^2 as the anomaly
  score; Park, Hosseini and Yun, 'Federated Learning with Metric
  Loss', FL-ICML workshop 2021, measure everything with d). Computed from
  explicit differences, not the |a|^2 + |b|^2 - 2ab expansion, so it is
  exact for nearby points and needs no matmul precision.

  Args:
    embeddings: [N, D].
    centers: [C, D].
    squared: negate the squared distance instead.

  Returns:
    [N, C].
  """
  embeddings = jnp.asarray(embeddings)
  centers = jnp.asarray(centers)
  return -_distance(embeddings[:, None, :], centers[None], squared=squared)


def cosine_scores(embeddings, class_vectors):
  """Class scores cos(e, w_k), [N, D] x [C, D] -> [N, C].

  The score of normalised-embedding one-class models: FedAwS's cosine to
  the class embedding (Yu et al., 'Federated Learning with Only Positive
  Labels', ICML 2020) and FedUV's v^T f(x) / c, which equals the cosine for
  +-1 codewords (Hosseini et al., 'Federated Learning of User Verification
  Models Without Sharing Embeddings', ICML 2021).

  Args:
    embeddings: [N, D].
    class_vectors: [C, D].

  Returns:
    [N, C] in [-1, 1]; 0 for a zero row.
  """
  embeddings = jnp.asarray(embeddings)
  class_vectors = jnp.asarray(class_vectors)
  return _cosine(embeddings[:, None, :], class_vectors[None])


def class_centers(embeddings, labels, num_classes, mask=None):
  """Mean embedding per class: c_k = mean_{i : y_i = k} e_i, -> [C, D].

  The class representative for models that keep no class embedding (the
  mean training embedding of class k), as a center for `center_scores`.

  Args:
    embeddings: [N, D].
    labels: [N] int in [0, num_classes).
    num_classes: C.
    mask: optional [N] bool; False rows are left out.

  Returns:
    [C, D]; zeros for a class with no (real) example.
  """
  embeddings = jnp.asarray(embeddings)
  labels = jnp.asarray(labels)
  weights = (
    jnp.ones(labels.shape, embeddings.dtype)
    if mask is None
    else (jnp.asarray(mask).astype(embeddings.dtype))
  )
  # segment_sum adds rows exactly (no matmul, no TF32 rounding).
  sums = jax.ops.segment_sum(
    weights[:, None] * embeddings, labels, num_segments=num_classes
  )
  counts = jax.ops.segment_sum(weights, labels, num_segments=num_classes)
  return sums / jnp.maximum(counts, 1.0)[:, None]


# ---------------------------------------------------------------------------
# The 'one_class' evaluation protocol.
# ---------------------------------------------------------------------------

# How each one-class method scores class c (higher = more likely c):
#   center:           -||g(x) - C_c||, C_c the mean training embedding of
#                     class c under the global model (FedMetric);
#   client_models:    the same with the model of the client holding c and
#                     that client's training data (Deep SVDD);
#   class_embeddings: cos(g(x), w_c), W in server_state.extra (FedAwS);
#   codewords:        cos(g(x), v_c), V in server_state.extra (FedUV).
SCORES = ('center', 'client_models', 'class_embeddings', 'codewords')


def _embedding_pass(model, preprocess, batch_size):
  """``(variables, device batches, n) -> [n, D]`` np.float32 embeddings."""

  @jax.jit
  def embed(variables, images):
    params = variables['params']
    model_state = {k: v for k, v in variables.items() if k != 'params'}
    outputs, _ = model.apply(
      params, model_state, preprocess(images, jax.random.key(0)), train=False
    )
    return outputs['embedding']

  def run(variables, batches, n):
    out = [embed(variables, b) for b in batches]
    return np.concatenate([np.asarray(o, np.float32) for o in out])[:n]

  def put(images, size=None):
    """Pads ``images`` to whole batches and puts them on the device once.

    ``size``: the batch size (default ``min(batch_size, n)``). Sets of
    images given one size share one compiled forward pass.
    """
    n = len(images)
    size = size or min(batch_size, max(n, 1))
    pad = -n % size
    padded = np.concatenate(
      [images, np.zeros((pad,) + images.shape[1:], images.dtype)]
    )
    return jax.device_put(
      [padded[i : i + size] for i in range(0, n + pad, size)]
    ), n

  return run, put


def _per_class_metrics(aurocs):
  """{'auroc_mean', 'auroc_class_<c>'} from a [C] vector (NaN: no client)."""
  aurocs = np.asarray(aurocs, np.float64)
  metrics = {'auroc_mean': float(np.nanmean(aurocs))}
  metrics.update(
    {
      f'auroc_class_{c}': float(v)
      for c, v in enumerate(aurocs)
      if np.isfinite(v)
    }
  )
  return metrics


def _center_subset(held, labels, per_class, seed=0):
  """At most ``per_class`` indices of each class from ``held`` (0 = all),
  a fixed random draw so that every evaluation uses the same examples."""
  if not per_class:
    return held
  rng = np.random.default_rng(seed)
  keep = [
    rng.permutation(held[labels[held] == c])[:per_class]
    for c in np.unique(labels[held])
  ]
  return np.sort(np.concatenate(keep))


def make_one_class_evaluator(
  model,
  preprocess,
  train,
  test,
  clients,
  *,
  score,
  batch_size=1000,
  center_examples=0,
):
  """The 'one_class' protocol: per-class one-vs-rest AUROC on the test set.

  Park, Hosseini and Yun, 'Federated Learning with Metric Loss', FL-ICML
  workshop 2021, Table 2: for class c the positives are the test examples
  of class c, the negatives every other test example, and the score
  s_c(x) is, by ``score``:

    'center'           -d(g(x), C_c), C_c the mean embedding of the class-c
                       training examples (those held by clients) under the
                       evaluated global model;
    'client_models'    -d(g_j(x), C_j) with client j's own model g_j and
                       the mean C_j of its training embeddings under g_j,
                       for every client j holding class c; the class's
                       AUROC is the mean over those clients (one client per
                       class in the paper);
    'class_embeddings' cos(g(x), w_c), W = server_state.extra[
                       'class_embeddings'];
    'codewords'        cos(g(x), v_c), V = server_state.extra['codewords'].

  Args:
    model: `ModelFns` with an 'embedding' output.
    preprocess: ``(uint8 images, key) -> float images``, no augmentation.
    train, test: `sources.ArrayDataset` splits.
    clients: the partition, per-client index arrays into ``train``.
    score: one of `SCORES`.
    batch_size: examples per jitted forward pass.
    center_examples: for 'center', use at most this many training examples
      per class (a fixed random subset) for C_c; 0 = all. The mean of a few
      thousand embeddings is already precise, and the pass over the whole
      training set dominates the evaluation's cost.

  Returns:
    ``(server_state, client_table) -> {'auroc_mean': float,
    'auroc_class_<c>': float, ...}``, AUROC in [0, 1]; a class held by no
    client (for 'client_models') is left out.

  Raises:
    ValueError: an unknown score, a client with no data, or (for
      'client_models') a client holding more than one class.
  """
  if score not in SCORES:
    raise ValueError(f'score must be one of {SCORES}, got {score!r}.')
  for j, idx in enumerate(clients):
    if len(idx) == 0:
      raise ValueError(
        f'Client {j} has no training data; the one-class '
        'protocol needs every client to hold its class.'
      )
  embed, put = _embedding_pass(model, preprocess, batch_size)
  test_batches = put(test.images)
  test_labels = np.asarray(test.labels)
  if score == 'center':
    return _center_evaluator(
      embed, put, train, clients, test_batches, test_labels, center_examples
    )
  if score == 'client_models':
    return _client_models_evaluator(
      embed, put, train, clients, test_batches, test_labels, batch_size
    )
  key = 'class_embeddings' if score == 'class_embeddings' else 'codewords'
  return _server_vectors_evaluator(embed, key, test_batches, test_labels)


def _center_evaluator(
  embed, put, train, clients, test_batches, test_labels, center_examples
):
  """score 'center': -d(g(x), C_c), C_c the class-c mean embedding of the
  held training examples (at most ``center_examples`` a class) under the
  evaluated global model."""
  num_classes = int(train.num_classes)
  held = np.unique(np.concatenate([np.asarray(c, np.int64) for c in clients]))
  held = _center_subset(held, np.asarray(train.labels), center_examples)
  train_batches = put(train.images[held])
  held_labels = np.asarray(train.labels)[held]

  def evaluate(server_state, client_table):
    del client_table
    variables = server_state.variables
    centers = class_centers(
      embed(variables, *train_batches), held_labels, num_classes
    )
    scores = center_scores(embed(variables, *test_batches), centers)
    return _per_class_metrics(one_class_auroc(scores, test_labels))

  return evaluate


def _client_models_evaluator(
  embed, put, train, clients, test_batches, test_labels, batch_size
):
  """score 'client_models': -d(g_j(x), C_j) for every client j, with its own
  model (row j of ``client_table['variables']``) and its own center; a
  class's AUROC is the mean over the clients holding it."""
  num_classes = int(train.num_classes)
  client_labels = partition.one_class_labels(clients, train.labels)
  # One batch shape for every client (the largest client's, capped), so
  # the forward pass compiles once rather than once per client size.
  size = min(batch_size, max(len(idx) for idx in clients))
  client_batches = [
    put(train.images[np.asarray(idx, np.int64)], size) for idx in clients
  ]

  def evaluate(server_state, client_table):
    del server_state
    per_class = [[] for _ in range(num_classes)]
    for j, label in enumerate(client_labels):
      variables = jax.tree.map(lambda x, j=j: x[j], client_table['variables'])
      center = np.mean(embed(variables, *client_batches[j]), axis=0)
      scores = center_scores(embed(variables, *test_batches), center[None])
      per_class[int(label)].append(
        auroc(np.asarray(scores)[:, 0], test_labels == label)
      )
    return _per_class_metrics([np.mean(a) if a else np.nan for a in per_class])

  return evaluate


def _server_vectors_evaluator(embed, key, test_batches, test_labels):
  """scores 'class_embeddings' / 'codewords': cos(g(x), v_c) with the class
  vectors [C, D] the server keeps in ``server_state.extra[key]``."""

  def evaluate(server_state, client_table):
    del client_table
    vectors = server_state.extra[key]
    scores = cosine_scores(
      embed(server_state.variables, *test_batches), vectors
    )
    return _per_class_metrics(one_class_auroc(scores, test_labels))

  return evaluate
