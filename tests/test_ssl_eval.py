"""The 'ssl' evaluation protocol and the standalone ``launch.evaluate``.

The evaluator's features are checked against a float64 NumPy forward pass of
a linear encoder on images scaled to [0, 1] (no mean / std normalisation);
uniformity and effective rank against NumPy re-derivations of their
equations; the kNN, probe and fine-tuning numerics are tested in
tests/test_downstream_eval.py, so here they are checked for their inputs
(which examples, which labels) and ranges. The end-to-end tests train one
round, save a checkpoint, re-evaluate it with launch.evaluate and load the
exported model back outside the simulator: its outputs must reproduce the
metrics experiment.run computed itself (test accuracy from NumPy argmax of the
exported logits; kNN accuracy of the exported encoder's features).
"""

import json
import math
import os

from absl import flags
import flax.linen as nn
import jax
import numpy as np
import pytest

from configs import fedavg as fedavg_config
from fedjax_metric import (
  assemble,
  config_io,
  engine,
  paper_settings,
  validation,
)
from fedjax_metric import experiment as experiment_lib
from fedjax_metric import settings as common
from fedjax_metric.data import sources
from fedjax_metric.evaluation import downstream, protocols, semi_supervised
from fedjax_metric.evaluation import ssl as ssl_eval
from fedjax_metric.models import make_model_fns
from launch import evaluate as evaluate_lib
from launch import main as launch_main  # noqa: F401  (both in one process)
from launch import report


class Encoder(nn.Module):
  @nn.compact
  def __call__(self, images, *, train, mask=None):
    del train, mask
    h = nn.Dense(5, name='enc')(images.reshape(images.shape[0], -1))
    return {'embedding': h, 'projection': h, 'features': []}


def setup(**overrides):
  rng = np.random.default_rng(0)
  train = sources.ArrayDataset(
    rng.integers(0, 256, (40, 6, 6, 1)).astype(np.uint8),
    rng.integers(0, 3, 40).astype(np.int32),
    3,
  )
  test = sources.ArrayDataset(
    rng.integers(0, 256, (20, 6, 6, 1)).astype(np.uint8),
    rng.integers(0, 3, 20).astype(np.int32),
    3,
  )
  # The clients hold 22 of the 40 training examples.
  clients = [np.arange(0, 12), np.arange(30, 40)]
  model = make_model_fns(Encoder(), (1, 6, 6, 1))
  variables = model.init(jax.random.key(0))
  config = common.base_config().ssl_eval
  config.update(overrides)
  return model, variables, train, test, clients, config


def np_features(variables, images):
  p = variables['params']['enc']
  x = images.reshape(len(images), -1).astype(np.float64) / 255.0
  return x @ np.asarray(p['kernel'], np.float64) + np.asarray(p['bias'])


def test_knn_monitor_sees_unit_scaled_encoder_features_of_client_data(
  monkeypatch,
):
  model, variables, train, test, clients, config = setup()
  seen = {}

  def fake_knn(bank, bank_labels, queries, query_labels, **kwargs):
    seen.update(
      bank=bank,
      bank_labels=bank_labels,
      queries=queries,
      query_labels=query_labels,
      **kwargs,
    )
    return 0.5

  monkeypatch.setattr(downstream, 'knn_accuracy', fake_knn)
  every, _ = ssl_eval.make_ssl_evaluator(
    model, train, test, clients, config, batch_size=7
  )
  with jax.default_matmul_precision('highest'):
    assert every(variables) == {'knn_accuracy': 0.5}
  pool = np.concatenate(clients)
  np.testing.assert_allclose(
    seen['bank'], np_features(variables, train.images[pool]), atol=1e-5
  )
  np.testing.assert_array_equal(seen['bank_labels'], train.labels[pool])
  np.testing.assert_allclose(
    seen['queries'], np_features(variables, test.images), atol=1e-5
  )
  assert seen['k'] == 200 and seen['temperature'] == 0.1
  # Subsets of the bank and of the queries.
  model, variables, train, test, clients, config = setup(
    knn_bank_examples=5, knn_test_examples=8
  )
  every, _ = ssl_eval.make_ssl_evaluator(model, train, test, clients, config)
  every(variables)
  assert seen['bank'].shape == (5, 5) and seen['queries'].shape == (8, 5)
  assert set(seen['bank_labels']) <= set(train.labels[pool])


def test_images_are_resized_to_the_encoders_shape():
  """Out-of-distribution evaluation meets images of another shape: a
  constant image stays constant at any size, one channel is repeated, three
  become their mean, and a dataset of the right shape is left alone."""
  images = np.full((2, 8, 8, 1), 77, np.uint8)
  images[1] = np.arange(64, dtype=np.uint8).reshape(8, 8, 1) * 4
  ds = sources.ArrayDataset(images, np.array([0, 1], np.int32), 2)
  up = ssl_eval.to_image_shape(ds, (28, 28, 3))
  assert up.images.shape == (2, 28, 28, 3) and up.images.dtype == np.uint8
  assert (up.images[0] == 77).all()
  assert (up.images[1, ..., 0] == up.images[1, ..., 2]).all()
  # A left-to-right ramp stays monotone along its rows.
  assert (np.diff(up.images[1, 10, :, 0].astype(int)) >= 0).all()
  color = sources.ArrayDataset(
    np.stack([np.full((4, 4), v, np.uint8) for v in (30, 60, 90)], -1)[None],
    np.array([0], np.int32),
    1,
  )
  gray = ssl_eval.to_image_shape(color, (4, 4, 1))
  assert (gray.images == 60).all()
  assert ssl_eval.to_image_shape(ds, (8, 8, 1)) is ds
  with pytest.raises(ValueError, match='3-channel images onto a 2-channel'):
    ssl_eval.to_image_shape(color, (4, 4, 2))


def test_a_target_dataset_moves_every_ssl_metric_to_its_splits(monkeypatch):
  """``ssl_eval.target_dataset='digits'`` on an encoder of 6x6 images: the
  kNN bank is the encoder's features of all of digits' training split
  resized to 6x6, with digits' labels, and the queries its test split."""
  model, variables, train, test, clients, _ = setup()
  config = common.base_config()
  with config.unlocked():
    config.eval_protocol = 'ssl'
    config.ssl_eval.target_dataset = 'digits'
  seen = {}

  def fake_knn(bank, bank_labels, queries, query_labels, **kwargs):
    seen.update(bank=bank, bank_labels=bank_labels, query_labels=query_labels)
    return 0.5

  monkeypatch.setattr(downstream, 'knn_accuracy', fake_knn)
  evaluator = protocols.make_evaluator(
    assemble.eval_settings(config),
    model=model,
    preprocess=None,
    train=train,
    test=test,
    clients=clients,
  )
  server_state = engine.ServerState(variables, (), 0)
  with jax.default_matmul_precision('highest'):
    evaluator.every(server_state, ())
  target = sources.load('digits', 'train')
  resized = ssl_eval.to_image_shape(target, (6, 6, 1))
  np.testing.assert_array_equal(seen['bank_labels'], target.labels)
  np.testing.assert_allclose(
    seen['bank'], np_features(variables, resized.images), atol=1e-5
  )
  np.testing.assert_array_equal(
    seen['query_labels'], sources.load('digits', 'test').labels
  )
  with config.unlocked():
    config.eval_protocol = 'classification'
  with pytest.raises(validation.ConfigError, match='target_dataset'):
    validation.validate(config)
  # A validation split beside a target: its val_* would be the target's test.
  with config.unlocked():
    config.eval_protocol = 'ssl'
    config.dataset.validation_fraction = 0.1
  with pytest.raises(validation.ConfigError, match='would be test metrics'):
    validation.validate(config)
  with config.unlocked():
    config.dataset.validation_fraction = 0.0
    config.ssl_eval.target_dataset = 'synthetic'
  with pytest.raises(validation.ConfigError, match='no stored splits'):
    validation.validate(config)
  with pytest.raises(ValueError, match='no stored splits to load'):
    sources.load('synthetic', 'test')


def test_final_metrics_and_their_inputs(monkeypatch):
  model, variables, train, test, clients, config = setup(
    linear_epochs=3,
    finetune_epochs=1,
    finetune_evals=1,
    finetune_fractions=(0.5,),
    finetune_batch_size=4,
    quality_examples=15,
  )
  tuned = []
  real_fine_tune = semi_supervised.fine_tune

  def spy(model_apply, variables, images, labels, *args, **kwargs):
    tuned.append((np.asarray(images), np.asarray(labels)))
    return real_fine_tune(
      model_apply, variables, images, labels, *args, **kwargs
    )

  monkeypatch.setattr(semi_supervised, 'fine_tune', spy)
  _, final = ssl_eval.make_ssl_evaluator(model, train, test, clients, config)
  with jax.default_matmul_precision('highest'):
    metrics = final(variables)
  for name in ('linear_probe_accuracy', 'finetune_50pct_accuracy'):
    assert 0.0 <= metrics[name] <= 1.0, name
  pool = np.concatenate(clients)
  pool_images = {bytes(im) for im in train.images[pool]}
  assert len(tuned) == 1
  for (images, labels), fraction in zip(tuned, (0.5,)):
    assert len(labels) == pytest.approx(fraction * len(pool), abs=2)
    assert all(bytes(im) in pool_images for im in images)
    assert set(labels) == set(train.labels[pool])  # every class labelled
  # Uniformity (Wang & Isola) and effective rank (Roy & Vetterli) of the
  # first 15 test features, re-derived in float64.
  f = np_features(variables, test.images)[:15]
  u = f / np.linalg.norm(f, axis=1, keepdims=True)
  pairs = [
    math.exp(-2 * np.sum((u[i] - u[j]) ** 2))
    for i in range(15)
    for j in range(15)
    if i != j
  ]
  assert metrics['test_uniformity'] == pytest.approx(
    math.log(np.mean(pairs)), abs=1e-4
  )
  s = np.linalg.svd(f, compute_uv=False)
  p = s / s.sum()
  assert metrics['test_effective_rank'] == pytest.approx(
    math.exp(-np.sum(p * np.log(p))), rel=1e-4
  )


def test_fraction_names():
  assert ssl_eval.fraction_name(0.01) == '1pct'
  assert ssl_eval.fraction_name(0.1) == '10pct'
  assert ssl_eval.fraction_name(0.005) == '0.5pct'


def test_importing_launch_evaluate_defines_no_flags():
  # launch.main defines --workdir at import; launch.evaluate must not (both
  # are imported above, which would raise DuplicateFlagError otherwise).
  by_module = flags.FLAGS.flags_by_module_dict()
  assert not by_module.get('launch.evaluate')
  assert 'round' not in flags.FLAGS


def test_launch_evaluate_reproduces_the_run_from_its_checkpoint(tmp_path):
  config = paper_settings.ssl_config('runlocal', 'ssd')
  config.num_rounds = 1
  config.num_clients = 2
  config.clients_per_round = 2
  config.local.steps = 1
  config.progress = False
  config.plot_partition = False
  # Fine-tuning is tested above; here it would only add compile time.
  config.ssl_eval.finetune_fractions = ()
  workdir = str(tmp_path / 'run')
  summary = experiment_lib.run(config, workdir)
  metrics = evaluate_lib.evaluate(
    workdir, overrides=['ssl_eval.linear_epochs=1']
  )
  assert metrics['round'] == 1
  assert metrics['knn_accuracy'] == pytest.approx(summary['knn_accuracy'])
  assert 0.0 <= metrics['linear_probe_accuracy'] <= 1.0
  # An evaluation under overrides is saved beside eval.json, not over it.
  name = evaluate_lib.eval_file_name(None, ['ssl_eval.linear_epochs=1'])
  assert name.startswith('eval_set-') and name.endswith('.json')
  assert not os.path.exists(os.path.join(workdir, 'eval.json'))
  with open(os.path.join(workdir, name)) as f:
    saved = json.load(f)
  assert saved['knn_accuracy'] == metrics['knn_accuracy']
  assert saved['overrides'][0] == 'ssl_eval.linear_epochs=1'
  with pytest.raises(ValueError, match='no field'):
    config_io.load_config(
      overrides=['ssl_eval.no_such_knob=1'], workdir=workdir
    )
  with pytest.raises(FileNotFoundError, match='saved rounds'):
    evaluate_lib.evaluate(workdir, round_=7)

  # The exported encoder, outside the simulator: the kNN monitor on its
  # features (0..1 input scale, bank = the clients' data) is the run's.
  export_dir = metrics['export_dir']
  assert export_dir == os.path.join(workdir, 'export', 'round_1')
  model, variables, preprocess, description = evaluate_lib.load_export(
    export_dir
  )
  assert description['round'] == 1 and description['algorithm'] == 'ssd'
  assert description['input_mean'] == [0.0] and description['input_std'] == [
    1.0
  ]
  assert 'batch_stats' in variables  # The ResNet-style encoder's BN.
  train_split = sources.load('digits', 'train')
  test_split = sources.load('digits', 'test')
  clients = assemble.make_partition(config, train_split.labels)
  pool = np.concatenate(clients)

  def embed(images):
    params = variables['params']
    state = {k: v for k, v in variables.items() if k != 'params'}
    with jax.default_matmul_precision('highest'):
      out, _ = model.apply(params, state, preprocess(images, None), train=False)
    return np.asarray(out['embedding'])

  np.testing.assert_allclose(
    preprocess(test_split.images[:2], None),
    test_split.images[:2] / 255.0,
    atol=1e-7,
  )
  knn = downstream.knn_accuracy(
    embed(train_split.images[pool]),
    train_split.labels[pool],
    embed(test_split.images),
    test_split.labels,
    num_classes=test_split.num_classes,
  )
  assert knn == pytest.approx(summary['knn_accuracy'], abs=2e-3)
  # launch/report.py embeds the run's test images on the same 0..1 scale.
  with jax.default_matmul_precision('highest'):
    reported = report.compute_embeddings(workdir, max_examples=50)
  np.testing.assert_allclose(
    reported['features'], embed(test_split.images[:50]), atol=1e-4
  )


def test_export_of_a_classifier_gives_the_runs_test_accuracy(tmp_path):
  config = fedavg_config.get_config('runlocal')
  with config.unlocked():
    config.num_rounds = 1
    config.progress = False
    config.plot_partition = False
  workdir = str(tmp_path / 'run')
  summary = experiment_lib.run(config, workdir)
  metrics = evaluate_lib.evaluate(workdir, round_=1, run_evaluation=False)
  assert not os.path.exists(os.path.join(workdir, 'eval_1.json'))
  test_split = sources.load('digits', 'test')
  results = []
  for npz in (False, True):
    model, variables, preprocess, description = evaluate_lib.load_export(
      metrics['export_dir'], npz=npz
    )
    assert description['model']['name'] == config.model.name
    assert description['num_classes'] == 10
    assert description['input_shape'] == list(test_split.images.shape[1:])
    # The run's evaluation scaling: the training set's channel statistics.
    x = sources.load('digits', 'train').images.astype(np.float64) / 255.0
    np.testing.assert_allclose(description['input_mean'], [x.mean()], rtol=1e-5)
    np.testing.assert_allclose(description['input_std'], [x.std()], rtol=1e-5)
    params = variables['params']
    state = {k: v for k, v in variables.items() if k != 'params'}
    with jax.default_matmul_precision('highest'):
      out, _ = model.apply(
        params, state, preprocess(test_split.images, None), train=False
      )
    logits = np.asarray(out['logits'], np.float64)
    results.append(logits)
    accuracy = np.mean(np.argmax(logits, axis=1) == test_split.labels)
    assert accuracy == pytest.approx(summary['test_accuracy'], abs=1e-6)
  np.testing.assert_array_equal(results[0], results[1])  # msgpack == npz
