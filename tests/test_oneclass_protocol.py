"""The 'one_class' evaluation protocol and the one-class configs end to end.

Per-class AUROC is checked against scikit-learn on embeddings and scores
re-derived in NumPy (Park, Hosseini and Yun, 'Federated Learning with Metric
Loss', FL-ICML workshop 2021, Table 2: one-vs-rest AUROC per class, mean
over classes); bad input must fail with a message that names the fix.
"""

import importlib

from algorithms.oneclass_helpers import DIM, SHAPE, LinearEmbedding
import fl_fixtures as fx
import jax
import ml_collections
import numpy as np
import pytest
from sklearn.metrics import roc_auc_score

from fedjax_metric import assemble, engine, experiment, models
from fedjax_metric.data import sources
from fedjax_metric.evaluation import oneclass, protocols

NUM_CLASSES = fx.NUM_CLASSES


def split(num_examples, seed):
  rng = np.random.default_rng(seed)
  images = rng.integers(0, 256, (num_examples,) + SHAPE[1:]).astype(np.uint8)
  labels = (np.arange(num_examples) % NUM_CLASSES).astype(np.int32)
  return sources.ArrayDataset(images, labels, NUM_CLASSES)


def setup(num_clients_per_class=1):
  train_set, test_set = split(24, 0), split(30, 1)
  clients = [
    np.flatnonzero(train_set.labels == c)[j::num_clients_per_class]
    for j in range(num_clients_per_class)
    for c in range(NUM_CLASSES)
  ]
  model = models.make_model_fns(LinearEmbedding(), SHAPE)
  return train_set, test_set, clients, model


def flat(images):
  return images.reshape(len(images), -1).astype(np.float64) / 255.0


def kernel_of(variables):
  return np.asarray(variables['params']['Dense_0']['kernel'], np.float64)


def sklearn_aurocs(scores, labels):
  return [
    roc_auc_score(labels == c, scores[:, c]) for c in range(scores.shape[1])
  ]


def check_metrics(metrics, expected):
  assert metrics['auroc_mean'] == pytest.approx(np.mean(expected), abs=1e-5)
  for c, value in enumerate(expected):
    assert metrics[f'auroc_class_{c}'] == pytest.approx(value, abs=1e-5)


def state_with(variables, extra=()):
  return engine.ServerState(variables, (), np.zeros((), np.int32), extra)


def test_center_score_matches_sklearn():
  train_set, test_set, clients, model = setup()
  variables = model.init(jax.random.key(0))
  evaluate = oneclass.make_one_class_evaluator(
    model,
    fx.identity_preprocess(),
    train_set,
    test_set,
    clients,
    score='center',
    batch_size=7,
  )  # Batches that do not divide N.
  with jax.default_matmul_precision('highest'):
    metrics = evaluate(state_with(variables), ())
  k = kernel_of(variables)
  e_train, e_test = flat(train_set.images) @ k, flat(test_set.images) @ k
  centers = [
    np.mean(
      [e_train[i] for i in range(len(e_train)) if train_set.labels[i] == c],
      axis=0,
    )
    for c in range(NUM_CLASSES)
  ]
  scores = np.array(
    [
      [-np.linalg.norm(e - centers[c]) for c in range(NUM_CLASSES)]
      for e in e_test
    ]
  )
  check_metrics(metrics, sklearn_aurocs(scores, test_set.labels))


def client_models_evaluation(model, train_set, test_set, clients):
  """(evaluate, per-client variables, client table) for the
  'client_models' score, each client with its own initialisation."""
  per_client = [model.init(jax.random.key(j)) for j in range(len(clients))]
  table = {'variables': jax.tree.map(lambda *x: np.stack(x), *per_client)}
  evaluate = oneclass.make_one_class_evaluator(
    model,
    fx.identity_preprocess(),
    train_set,
    test_set,
    clients,
    score='client_models',
  )
  return evaluate, per_client, table


def test_client_models_score_uses_each_clients_own_model_and_data():
  train_set, test_set, clients, model = setup(num_clients_per_class=2)
  evaluate, per_client, table = client_models_evaluation(
    model, train_set, test_set, clients
  )
  with jax.default_matmul_precision('highest'):
    metrics = evaluate(state_with(per_client[0]), table)
  expected = [[] for _ in range(NUM_CLASSES)]
  for j, idx in enumerate(clients):
    k = kernel_of(per_client[j])
    label = train_set.labels[idx[0]]
    center = np.mean(flat(train_set.images[idx]) @ k, axis=0)
    scores = -np.linalg.norm(flat(test_set.images) @ k - center, axis=1)
    expected[label].append(roc_auc_score(test_set.labels == label, scores))
  check_metrics(metrics, [np.mean(a) for a in expected])


def _lowerings_of_first_evaluation(clients):
  """How many programs the first 'client_models' evaluation lowers (JAX
  records one event per lowering, whether or not a compilation cache then
  supplies the executable)."""
  train_set, test_set, _, model = setup()
  evaluate, per_client, table = client_models_evaluation(
    model, train_set, test_set, clients
  )
  events = []

  def count(event, duration, **kwargs):
    del duration, kwargs
    if event == '/jax/core/compile/jaxpr_to_mlir_module_duration':
      events.append(event)

  jax.monitoring.register_event_duration_secs_listener(count)
  try:
    evaluate(state_with(per_client[0]), table)
  finally:
    jax.monitoring.unregister_event_duration_listener(count)
  return len(events)


def test_clients_of_different_sizes_share_one_compiled_forward_pass():
  labels = split(24, 0).labels
  one_each = [np.flatnonzero(labels == c)[:1] for c in range(NUM_CLASSES)]
  # Sizes 1, 2, 3 (classes 0-3 have 3 training examples here, 4-9 have 2).
  mixed = [np.flatnonzero(labels == c)[: 1 + c % 3] for c in range(NUM_CLASSES)]
  assert len({len(c) for c in mixed}) == 3
  # Each evaluator has its own jitted forward pass; the scoring's eager ops
  # are cached by shape across evaluators (jax 0.8.1 reports their first
  # lowering too), so one unmeasured evaluation first makes the two counts
  # the forward passes' alone.
  _lowerings_of_first_evaluation(one_each)
  assert _lowerings_of_first_evaluation(mixed) == (
    _lowerings_of_first_evaluation(one_each)
  )


@pytest.mark.parametrize(
  'score,key',
  [('class_embeddings', 'class_embeddings'), ('codewords', 'codewords')],
)
def test_cosine_scores_read_the_server_extra(score, key):
  train_set, test_set, clients, model = setup()
  variables = model.init(jax.random.key(0))
  vectors = np.random.default_rng(2).normal(size=(NUM_CLASSES, DIM))
  evaluate = oneclass.make_one_class_evaluator(
    model, fx.identity_preprocess(), train_set, test_set, clients, score=score
  )
  with jax.default_matmul_precision('highest'):
    metrics = evaluate(state_with(variables, {key: vectors}), ())
  e = flat(test_set.images) @ kernel_of(variables)
  scores = np.array(
    [
      [x @ v / (np.linalg.norm(x) * np.linalg.norm(v)) for v in vectors]
      for x in e
    ]
  )
  check_metrics(metrics, sklearn_aurocs(scores, test_set.labels))


def one_class_settings(algorithm):
  return protocols.EvalSettings(
    protocol='one_class',
    algorithm=algorithm,
    model_name='linear',
    batch_size=7,
  )


def test_shared_center_score_and_validation_metrics():
  """FedAwS is scored by cosine to its class embeddings (auroc_mean) and
  also by the shared rule, the distance to the class's mean training
  embedding (auroc_center_mean, what the 'center' evaluator gives); with a
  validation split every metric is also computed on it as val_*."""
  train_set, test_set, clients, model = setup()
  validation = split(20, 3)
  variables = model.init(jax.random.key(0))
  vectors = np.random.default_rng(2).normal(size=(NUM_CLASSES, DIM))
  state = state_with(variables, {'class_embeddings': vectors})
  common = dict(
    model=model,
    preprocess=fx.identity_preprocess(),
    train=train_set,
    clients=clients,
  )
  evaluator = protocols.make_evaluator(
    one_class_settings('fedaws'),
    test=test_set,
    validation=validation,
    **common,
  )
  with jax.default_matmul_precision('highest'):
    metrics = evaluator.every(state, ())

    def direct(test, score):
      return oneclass.make_one_class_evaluator(
        model,
        fx.identity_preprocess(),
        train_set,
        test,
        clients,
        score=score,
      )(state, ())['auroc_mean']

    for test, prefix in ((test_set, ''), (validation, 'val_')):
      assert metrics[prefix + 'auroc_mean'] == pytest.approx(
        direct(test, 'class_embeddings'), abs=1e-6
      )
      assert metrics[prefix + 'auroc_center_mean'] == pytest.approx(
        direct(test, 'center'), abs=1e-6
      )
  assert metrics['auroc_mean'] != metrics['auroc_center_mean']
  # FedMetric's own score is the shared one.
  fedmetric = protocols.make_evaluator(
    one_class_settings('fedmetric'),
    test=test_set,
    **common,
  ).every(state, ())
  assert fedmetric['auroc_center_mean'] == fedmetric['auroc_mean']
  assert not any(name.startswith('val_') for name in fedmetric)


def test_hold_out_is_a_stratified_fixed_split():
  data = split(200, 0)
  train_part, held = sources.hold_out(data, 0.2)
  assert np.bincount(held.labels).tolist() == [
    round(0.2 * n) for n in np.bincount(data.labels)
  ]
  assert len(train_part.labels) + len(held.labels) == len(data.labels)
  # Disjoint, and together every example once (images are unique rows).
  rows = lambda d: {bytes(x) for x in d.images}
  assert not rows(train_part) & rows(held)
  assert rows(train_part) | rows(held) == rows(data)
  again = sources.hold_out(data, 0.2)[1]
  np.testing.assert_array_equal(again.images, held.images)  # fixed draw
  assert sources.hold_out(data, 0.0) == (data, None)
  with pytest.raises(ValueError, match='validation_fraction'):
    sources.hold_out(data, 1.0)
  with pytest.raises(ValueError, match='without training or validation'):
    sources.hold_out(split(10, 0), 0.01)


def test_center_subset_keeps_at_most_k_per_class_from_held_examples():
  labels = np.repeat(np.arange(3), 10)
  held = np.arange(2, 30)
  got = oneclass._center_subset(held, labels, 4)
  assert set(got) <= set(held)
  assert np.bincount(labels[got]).tolist() == [4, 4, 4]
  np.testing.assert_array_equal(oneclass._center_subset(held, labels, 0), held)
  np.testing.assert_array_equal(got, oneclass._center_subset(held, labels, 4))


def test_evaluator_errors():
  train_set, test_set, clients, model = setup()
  with pytest.raises(ValueError, match='score'):
    oneclass.make_one_class_evaluator(
      model,
      fx.identity_preprocess(),
      train_set,
      test_set,
      clients,
      score='logits',
    )
  clients[1] = clients[1][:0]
  with pytest.raises(ValueError, match='Client 1 has no training data'):
    oneclass.make_one_class_evaluator(
      model,
      fx.identity_preprocess(),
      train_set,
      test_set,
      clients,
      score='center',
    )


# ---------------------------------------------------------------------------
# Configs, model checks and partitions.
# ---------------------------------------------------------------------------


def load_config(name, arg='runlocal'):
  config = importlib.import_module(f'configs.{name}').get_config(arg)
  config.unlock()
  config.progress = False
  return config


def lenet():
  return models.build('lenet', 10, (28, 28, 1))


def test_embedding_model_with_classification_is_a_clear_error():
  config = load_config('fedavg')
  config.model = ml_collections.ConfigDict(dict(name='lenet'))
  with pytest.raises(ValueError, match="no 'logits'.*one-class config"):
    protocols.check_model_outputs(assemble.eval_settings(config), lenet())
  config.eval_protocol = 'one_class'
  with pytest.raises(ValueError, match="'fedavg' trains on the cross-entropy"):
    protocols.check_model_outputs(assemble.eval_settings(config), lenet())
  # A model with logits is fine for fedavg under either protocol.
  protocols.check_model_outputs(
    assemble.eval_settings(config), fx.all_outputs()
  )


def test_one_class_algorithm_needs_the_one_class_protocol():
  config = load_config('fedmetric')
  protocols.check_model_outputs(
    assemble.eval_settings(config), lenet()
  )  # The config is right.
  config.eval_protocol = 'classification'
  with pytest.raises(ValueError, match='eval_protocol=one_class'):
    protocols.check_model_outputs(assemble.eval_settings(config), lenet())


def test_one_class_partition_errors(tmp_path):
  config = load_config('fedmetric')
  labels = np.repeat(np.arange(10), 5)
  config.num_clients = 25
  with pytest.raises(ValueError, match='Set --config.num_clients=10'):
    assemble.one_class_partition(config, labels)
  # Class 0 has 3 examples, too few for 4 clients.
  uneven = np.concatenate([labels[labels != 0], [0, 0, 0]])
  config.partition.clients_per_class = 4
  config.num_clients = 40
  with pytest.raises(ValueError, match='no data'):
    assemble.one_class_partition(config, uneven)
  config.partition.clients_per_class = 2
  config.num_clients = 20
  parts = assemble.one_class_partition(config, labels)
  assert [len(p) for p in parts] == [3] * 10 + [2] * 10
  # Through experiment.run: the error comes before any training.
  config.num_clients = 11
  with pytest.raises(ValueError, match='clients_per_class'):
    experiment.run(config, str(tmp_path))


def test_negative_scale_in_a_config_is_a_clear_error():
  config = load_config('fedmetric', 'runlocal,scale=-2.0')
  with pytest.raises(ValueError, match='scale.*>= 0'):
    assemble.build_algorithm(config, lenet())
