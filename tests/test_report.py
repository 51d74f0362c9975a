"""launch/report.py on a real (tiny) run: curves, PCA / t-SNE embeddings, errors."""

import json
import os
import shutil

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import configs.fedavg
import fedjax_metric as fm
from fedjax_metric import assemble, evaluation, experiment
from fedjax_metric import restore as restore_lib
from fedjax_metric.data import augment, sources
from launch import report

PNG_MAGIC = b'\x89PNG\r\n\x1a\n'


@pytest.fixture(scope='module')
def workdir(tmp_path_factory):
  config = configs.fedavg.get_config('runlocal')
  config.unlock()
  config.progress = False
  path = str(tmp_path_factory.mktemp('runs') / 'fedavg_tiny')
  experiment.run(config, path)
  return path


def assert_png(path):
  assert os.path.exists(path), path
  with open(path, 'rb') as f:
    head = f.read(8)
  assert head == PNG_MAGIC and os.path.getsize(path) > 1000, path


def test_read_curve_and_label(workdir):
  rounds, accuracies = report.read_curve(workdir)
  np.testing.assert_array_equal(rounds, [1, 2])
  assert np.all((accuracies >= 0) & (accuracies <= 1))
  assert report.run_label(workdir + '/') == 'fedavg fedavg_tiny'


def test_plot_curves_two_runs(workdir, tmp_path):
  other = str(tmp_path / 'copy')
  shutil.copytree(workdir, other, ignore=shutil.ignore_patterns('checkpoints'))
  out = str(tmp_path / 'plots' / 'curves.png')  # The folder is created.
  assert report.plot_curves([workdir, other], out) == out
  assert_png(out)


def test_plot_curves_without_metrics_is_a_clear_error(workdir, tmp_path):
  empty = tmp_path / 'not_a_run'
  empty.mkdir()
  with pytest.raises(FileNotFoundError, match='metrics.jsonl'):
    report.plot_curves([workdir, str(empty)], str(tmp_path / 'x.png'))
  assert not os.path.exists(tmp_path / 'x.png')
  with pytest.raises(ValueError, match='No workdirs'):
    report.plot_curves([], str(tmp_path / 'x.png'))


def test_plot_curves_skips_lines_without_accuracy(tmp_path):
  run = tmp_path / 'partial'
  run.mkdir()
  (run / 'config.json').write_text(json.dumps({'algorithm': 'fedprox'}))
  (run / 'metrics.jsonl').write_text(
    '{"round": 2, "test_accuracy": 0.5}\n{"round": 1, "train_loss": 1.0}\n'
    '\n{"round": 1, "test_accuracy": 0.25}\n'
  )
  rounds, accuracies = report.read_curve(str(run))
  np.testing.assert_array_equal(rounds, [1, 2])
  np.testing.assert_allclose(accuracies, [0.25, 0.5])
  assert report.run_label(str(run)) == 'fedprox partial'


def test_compute_embeddings_restores_the_final_global_model(workdir):
  emb = report.compute_embeddings(workdir, max_examples=50)
  assert emb['round'] == 2
  assert emb['features'].shape == (50, 16)  # runlocal: embedding_dim = 16.
  assert emb['labels'].shape == (50,)
  assert np.all(np.isfinite(emb['features']))
  # The features are the final global model's: the run's final variables as
  # the Python API reads them give the same features, the initial model's
  # do not.
  config = emb['config']
  train = sources.load(config.dataset.name, 'train')
  test = sources.load(config.dataset.name, 'test')
  mean, std = restore_lib.input_scaling(config, train.images)
  preprocess = augment.make_preprocess(mean, std, 'none')
  model = assemble.build_model(config.model, train.num_classes)
  features_of = evaluation.make_feature_fn(
    model, preprocess, test.images, test.labels, batch_size=32, max_examples=50
  )
  final, _ = features_of(fm.load_run(workdir).variables)
  np.testing.assert_allclose(emb['features'], final, rtol=1e-5, atol=1e-5)
  initial = model.init(
    jax.random.key(config.seed), preprocess(jnp.asarray(train.images[:1]), None)
  )
  start, _ = features_of(initial)
  assert np.abs(np.asarray(start) - np.asarray(emb['features'])).max() > 1e-2


def test_plot_embedding_pca(workdir, tmp_path):
  out = str(tmp_path / 'emb_pca.png')
  assert report.plot_embedding(workdir, out, 'pca') == out
  assert_png(out)


def test_plot_embedding_tsne_few_points(workdir, tmp_path):
  out = str(tmp_path / 'emb_tsne.png')
  report.plot_embedding(workdir, out, 'tsne', max_examples=40)
  assert_png(out)


def test_plot_embedding_errors(workdir, tmp_path):
  with pytest.raises(ValueError, match='method'):
    report.plot_embedding(workdir, str(tmp_path / 'e.png'), 'umap')
  with pytest.raises(FileNotFoundError, match='config.json'):
    report.plot_embedding(str(tmp_path), str(tmp_path / 'e.png'))


def test_pca_2d_is_the_top_principal_plane():
  rng = np.random.default_rng(0)
  # Variance 9 and 4 along axes 2 and 0, tiny elsewhere.
  x = rng.normal(size=(500, 5)) * np.array([2.0, 0.01, 3.0, 0.01, 0.01])
  projected = report.pca_2d(x)
  np.testing.assert_allclose(np.var(projected, axis=0), [9.0, 4.0], rtol=0.2)
  assert report.pca_2d(x[:, :1]).shape == (500, 2)
