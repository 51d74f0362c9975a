"""Which evaluation a run performs: one `Evaluator` per protocol.

  * 'classification': test accuracy and loss of the global model's logits
    (and training accuracy with ``eval_train_examples > 0``)
    (and representation metrics of its embeddings when asked for).
  * 'one_class': per-class one-vs-rest AUROC of embedding models trained
    with one class per client (FedMetric, DeepSVDD, FedAwS, FedUV).
  * 'ssl': label-free training judged by downstream use of its encoder: a
    kNN monitor at every evaluation and, at the end of a run, a linear probe,
    semi-supervised fine-tuning, uniformity and effective rank.
  * 'embedding_knn': a supervised model judged by its embeddings (kNN at
    every evaluation, a linear probe at the end; evaluation/embedding_knn.py)
    beside its logits' accuracy: FedQuad's "without l_ce" ablation.

An evaluator sees the whole state, ``(server_state, client_table)``, since
some methods keep what is evaluated outside the global model (DeepSVDD's
per-client models, FedAwS's class embeddings).
"""

from typing import Any, Callable, Dict, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from fedjax_metric.data import sources
from fedjax_metric.evaluation import (
  classification,
  embedding_knn,
  federated,
  oneclass,
)
from fedjax_metric.evaluation import ssl as ssl_eval

PROTOCOLS = ('classification', 'one_class', 'ssl', 'embedding_knn')


class EvalSettings(NamedTuple):
  """What decides a run's evaluation (built from the config by
  `assemble.eval_settings`; this module never reads the config).

  Attributes:
    protocol: one of `PROTOCOLS`.
    algorithm: the algorithm's registered name (the one-class algorithms
      are scored their own way, `ONE_CLASS_SCORES`).
    model_name, dataset_name: named in error messages.
    batch_size: examples per jitted forward pass.
    seed: seeds the subsets drawn for evaluation.
    train_examples: n > 0 also evaluates the global model on n training
      examples (training accuracy, as FedAU and PMFL report).
    representation_examples: test examples whose embeddings give the
      representation statistics (0: none).
    one_class_center_examples: training examples per class behind a class
      center of the 'one_class' protocol (0: all).
    federated_clients, federated_every: the federated evaluation's clients
      per evaluation and its interval in evaluations (0 clients: off).
    ssl: the 'ssl' protocol's settings (`ssl.SslEvalSettings`).
  """

  protocol: str
  algorithm: str = ''
  model_name: str = '?'
  dataset_name: str = '?'
  batch_size: int = 1000
  seed: int = 0
  train_examples: int = 0
  representation_examples: int = 0
  one_class_center_examples: int = 0
  federated_clients: int = 0
  federated_every: int = 0
  ssl: Any = None


class Evaluator(NamedTuple):
  """Attributes:
  every: ``(server_state, client_table) -> {name: float}``, at every
    evaluation of a run.
  final: ``(server_state, client_table) -> {name: float}``, once at the end
    of a run (slow downstream evaluations); may return ``{}``.
  headline: the metric the progress bar shows.
  reads_client_table: whether ``every`` / ``final`` read the client table
    (Deep SVDD's per-client models); where the table lives off the device
    (client_table.py) the others are given ``()`` and it is not read.
  """

  every: Callable[..., Dict[str, float]]
  final: Callable[..., Dict[str, float]]
  headline: str
  reads_client_table: bool = False


def _nothing(server_state, client_table) -> Dict[str, Any]:
  del server_state, client_table
  return {}


# The one-class algorithms (one class per client) and how the 'one_class'
# protocol scores each (evaluation/oneclass.py, SCORES). Any other algorithm
# evaluated under 'one_class' is scored by class centers of its embeddings.
ONE_CLASS_SCORES = {
  'fedmetric': 'center',
  'deepsvdd': 'client_models',
  'fedaws': 'class_embeddings',
  'feduv': 'codewords',
}


def _model_outputs(model):
  """The names of the model's outputs (abstract evaluation, no compute)."""
  if model.input_shape is None:
    return None

  def forward(key):
    variables = model.init(key)
    params = variables['params']
    model_state = {k: v for k, v in variables.items() if k != 'params'}
    outputs, _ = model.apply(
      params,
      model_state,
      jnp.zeros(model.input_shape, jnp.float32),
      train=False,
    )
    return outputs

  return set(jax.eval_shape(forward, jax.random.key(0)))


def check_model_outputs(settings: EvalSettings, model):
  """Clear errors for a model / algorithm / protocol mismatch, before training.

  An embedding network without a classifier ('lenet', 'resnet32': no
  'logits' output) cannot be trained by a cross-entropy algorithm nor
  evaluated by 'classification'; a one-class algorithm is only scored by
  'one_class'.

  Raises:
    ValueError: naming the config fields to change.
  """
  algorithm, protocol = settings.algorithm, settings.protocol
  one_class = algorithm in ONE_CLASS_SCORES
  if one_class and protocol != 'one_class':
    raise ValueError(
      f'{algorithm} trains one class per client and is scored by '
      f'per-class AUROC: set --config.eval_protocol=one_class (got '
      f'{protocol!r}); configs/{algorithm}.py does.'
    )
  outputs = _model_outputs(model)
  if outputs is None or 'logits' in outputs:
    return
  name = settings.model_name
  if protocol == 'classification':
    raise ValueError(
      f'Model {name!r} is an embedding network without a classifier (its '
      f"outputs are {sorted(outputs)}, no 'logits'), but "
      "eval_protocol='classification' scores logits. Use a one-class "
      f'config (configs/fedmetric.py, deepsvdd.py, fedaws.py, feduv.py) '
      'or a model with a classifier (--config.model.name=small_cnn).'
    )
  if protocol == 'one_class' and not one_class:
    raise ValueError(
      f"Model {name!r} has no 'logits' output, but algorithm "
      f'{algorithm!r} trains on the cross-entropy of logits. Use '
      f'one of the one-class algorithms {sorted(ONE_CLASS_SCORES)} or a '
      'model with a classifier.'
    )


def _one_class_evaluator(settings, model, preprocess, train, test, clients):
  """Per-class one-vs-rest AUROC (evaluation/oneclass.py), every evaluation.

  ``auroc_mean`` scores each method its own way (`ONE_CLASS_SCORES`);
  ``auroc_center_mean`` scores every method that has a global model by one
  shared rule, minus the distance to the class's mean training embedding
  (the 'center' score), so that methods can also be compared with scoring
  held fixed. Deep SVDD has no global model: its own rule is the shared one
  applied to each client's model.
  """
  score = ONE_CLASS_SCORES.get(settings.algorithm, 'center')

  def make(score):
    return oneclass.make_one_class_evaluator(
      model,
      preprocess,
      train,
      test,
      clients,
      score=score,
      batch_size=settings.batch_size,
      center_examples=settings.one_class_center_examples,
    )

  own = make(score)
  shared = make('center') if score not in ('center', 'client_models') else None

  def evaluate(server_state, client_table):
    metrics = own(server_state, client_table)
    center = shared(server_state, client_table) if shared else metrics
    metrics['auroc_center_mean'] = center['auroc_mean']
    return metrics

  def final(server_state, client_table):
    del client_table
    extra = server_state.extra
    if isinstance(extra, dict) and 'min_distance' in extra:
      return {'codeword_min_distance': int(extra['min_distance'])}
    return {}

  return Evaluator(
    evaluate,
    final,
    'auroc_mean',
    reads_client_table=score == 'client_models',
  )


def _train_accuracy_fn(settings, model, preprocess, train, clients=None):
  """``variables -> {'train_accuracy', 'train_eval_loss'}``, or ``{}``.

  ``settings.train_examples`` = n > 0 evaluates the global model on n
  training examples (all of them when n >= the training set's size; else a
  fixed uniform subset drawn with the settings' seed), as FedAU and PMFL report
  training accuracy beside test accuracy. 'train_eval_loss' is the global
  model's loss there, unlike 'train_loss' (the clients' local losses).
  For clients made on demand (``train`` None) the n examples are drawn
  uniformly over all training examples, with replacement, and made.
  """
  n = settings.train_examples
  if n < 0:
    raise ValueError(f'eval_train_examples must be >= 0, got {n}.')
  if n == 0:
    return lambda variables: {}
  if train is None:
    images, labels = _generated_train_sample(clients, n, settings.seed)
  else:
    idx = np.arange(len(train.labels))
    if n < idx.size:
      idx = np.sort(
        np.random.default_rng(settings.seed).choice(idx, n, replace=False)
      )
    images, labels = train.images[idx], train.labels[idx]
  evaluate = classification.make_evaluate_fn(
    model,
    preprocess,
    images,
    labels,
    batch_size=settings.batch_size,
  )

  def evaluate_train(variables):
    metrics = evaluate(variables)
    return {
      'train_accuracy': metrics['test_accuracy'],
      'train_eval_loss': metrics['test_loss'],
    }

  return evaluate_train


def _generated_train_sample(clients, n: int, seed: int):
  """n training examples of a population made on demand, uniform over all
  its examples (client k with probability n_k / sum n), with replacement."""
  sizes = clients.sizes
  rng = np.random.default_rng([seed, 0x7A1])
  flat = np.sort(rng.integers(0, int(sizes.sum()), n))
  ends = np.cumsum(sizes)
  owner = np.searchsorted(ends, flat, side='right')
  position = flat - (ends[owner] - sizes[owner])
  x, y = clients.examples(owner, position)
  return np.asarray(x), np.asarray(y)


def validation_name(name: str) -> str:
  """A test metric's name on the validation split: test_x -> val_x, any
  other name (auroc_mean) -> val_auroc_mean."""
  return 'val_' + name.removeprefix('test_')


def make_evaluator(
  settings: EvalSettings,
  *,
  model,
  preprocess,
  train,
  test,
  clients,
  validation=None,
) -> Evaluator:
  """The `Evaluator` of ``settings.protocol``.

  Args:
    settings: `EvalSettings` (`assemble.eval_settings` makes them from a
      config).
    model: `ModelFns`.
    preprocess: ``(uint8 images, key) -> float images``, no augmentation.
    train, test: `sources.ArrayDataset` splits.
    clients: the partition, per-client index arrays into ``train``.
    validation: an `ArrayDataset` held out of ``train``
      (``dataset.validation_fraction``), or None. Every evaluation then also
      computes the test metrics on it, named by `validation_name`; the end
      of run evaluations stay on the test set.
  """
  evaluator = _make_test_evaluator(
    settings,
    model=model,
    preprocess=preprocess,
    train=train,
    test=test,
    clients=clients,
  )
  evaluator = _with_federated_eval(
    settings, evaluator, model, preprocess, test, clients
  )
  if validation is None:
    return evaluator
  # Training accuracy and representation statistics once, not twice.
  quiet = settings._replace(train_examples=0, representation_examples=0)
  on_validation = _make_test_evaluator(
    quiet,
    model=model,
    preprocess=preprocess,
    train=train,
    test=validation,
    clients=clients,
  )

  def every(state, table):
    metrics = evaluator.every(state, table)
    for name, value in on_validation.every(state, table).items():
      metrics[validation_name(name)] = value
    return metrics

  return evaluator._replace(every=every)


def federated_source(clients, test):
  """``(pool, client_examples)`` of the federated evaluation
  (evaluation/federated.py): the clients that can be drawn and their
  held-out examples; None where the data has no per-client held-out split.
  """
  test_examples = getattr(clients, 'test_examples', None)
  if test_examples is not None:  # Made on demand: every client has some.
    return np.arange(len(clients)), test_examples
  writers = getattr(test, 'client_ids', None)
  if writers is None:
    return None
  pool = np.unique(writers)

  def client_examples(ids):
    keep = np.isin(writers, ids)
    return test.images[keep], test.labels[keep], writers[keep]

  return pool, client_examples


def _with_federated_eval(settings, evaluator, model, preprocess, test, clients):
  """``evaluator`` with the federated evaluation's metrics added to every
  evaluation at its rounds (``settings.federated_clients``; 0: off)."""
  if not settings.federated_clients:
    return evaluator
  source = federated_source(clients, test)
  if source is None:
    raise ValueError(
      'federated_eval needs held-out data per client: '
      f'{settings.dataset_name!r} '
      'has no per-client test split (synthetic and the naturally partitioned '
      'datasets femnist, emnist_fedjax have). Set '
      '--config.federated_eval.clients=0.'
    )
  pool, client_examples = source
  evaluate = federated.make_federated_eval(
    model=model,
    preprocess=preprocess,
    pool=pool,
    client_examples=client_examples,
    num_clients=settings.federated_clients,
    every=settings.federated_every,
    seed=settings.seed,
    batch_size=settings.batch_size,
  )

  def every(state, table):
    return {**evaluator.every(state, table), **evaluate(state)}

  return evaluator._replace(every=every)


def _make_test_evaluator(
  settings, *, model, preprocess, train, test, clients
) -> Evaluator:
  """`make_evaluator` without a validation split."""
  protocol = settings.protocol
  check_model_outputs(settings, model)
  if protocol == 'classification':
    evaluate = classification.make_evaluate_fn(
      model,
      preprocess,
      test.images,
      test.labels,
      batch_size=settings.batch_size,
      representation_examples=settings.representation_examples,
      num_classes=test.num_classes,
    )
    evaluate_train = _train_accuracy_fn(
      settings, model, preprocess, train, clients
    )

    def every(state, table):
      del table
      return {**evaluate(state.variables), **evaluate_train(state.variables)}

    return Evaluator(every, _nothing, 'test_accuracy')
  if protocol == 'embedding_knn':
    every, final = embedding_knn.make_embedding_fns(
      model,
      preprocess,
      train,
      test,
      clients,
      batch_size=settings.batch_size,
      representation_examples=settings.representation_examples,
    )
    return Evaluator(
      lambda state, table: every(state.variables),
      lambda state, table: final(state.variables),
      'test_knn_accuracy',
    )
  if protocol == 'one_class':
    return _one_class_evaluator(
      settings, model, preprocess, train, test, clients
    )
  if protocol == 'ssl':
    # The unsupervised methods train on [0, 1] views without mean / std
    # normalisation, so their encoder is evaluated on [0, 1] images too
    # (evaluation/ssl.py), not with ``preprocess``.
    ssl_settings = settings.ssl or ssl_eval.SslEvalSettings()
    target = ssl_settings.target_dataset
    if target:
      # Out of distribution (SSD's Tables 2-5): every SSL metric on another
      # dataset's splits, its whole training split as the labelled pool.
      train, test = (
        ssl_eval.to_image_shape(
          sources.load(target, split, ssl_settings.target_data_dir or None),
          train.images.shape[1:],
        )
        for split in ('train', 'test')
      )
      clients = [np.arange(len(train.labels))]
    every, final = ssl_eval.make_ssl_evaluator(
      model,
      train,
      test,
      clients,
      ssl_settings,
      batch_size=settings.batch_size,
      seed=settings.seed,
    )
    return Evaluator(
      lambda state, table: every(state.variables),
      lambda state, table: final(state.variables),
      'knn_accuracy',
    )
  del train, clients
  raise ValueError(
    f'Unknown eval_protocol {protocol!r}; use one of '
    f'{PROTOCOLS} (--config.eval_protocol).'
  )
