"""FedProx golden fixture from the official code (litian96/FedProx).

Runs the authors' TensorFlow 1 training loop unchanged under TensorFlow
2's ``tf.compat.v1`` (graph mode, v1 variables), in float64 on CPU: the
trainer ``flearn/trainers/fedprox.py: Server.train`` (client selection,
``PerturbedGradientDescent.set_params`` loading the global model as w^t,
every selected client's ``solve_inner``, ``BaseFedarated.aggregate``), the
optimizer ``flearn/optimizer/pgd.py: PerturbedGradientDescent`` (its
``_apply_dense``: ``w -= lr (g + mu (w - w^t))``), the client
``flearn/models/client.py: Client`` and the model's training loop
``flearn/models/synthetic/mclr.py: Model.solve_inner`` with
``flearn/utils/model_utils.py: batch_data`` (which reshuffles a client's
data in place with np.random.seed(100) every epoch). Writes
tests/golden/fedprox_official.npz for tests/test_golden_moon_niid.py:

  PYTHONPATH=/path/to/tensorflow-and-tqdm /path/to/torch-env/bin/python \\
    benchmarks/crosscheck/fedprox.py --repo=/path/to/FedProx \\
    [--out=tests/golden/fedprox_official.npz] [--commit=SHA]

(--commit names the checkout's commit where --repo is no git work tree,
e.g. a ``git archive`` of d2a4501f319f1594b732d88315c5ca1a72855f50; the
repository's data/ folder is not needed. Needs ``tensorflow`` (2.21 was
used: ``pip install --target DIR tensorflow-cpu tqdm``) and ``tqdm``.)

TensorFlow 1 itself does not install on this Python; the shim is the
least that runs their code on TensorFlow 2: ``tf.compat.v1`` with v2
behaviour disabled, bound as the name ``tf`` in their modules (they call
``tf.trainable_variables``, ``tf.Session``, ``tf.reset_default_graph`` ...,
which TF2 keeps only under ``tf.compat.v1``). Their optimizer subclasses
``tensorflow.python.training.optimizer.Optimizer``, which TF2 still ships.

Stubs: the model: ``mclr.Model`` subclassed, replacing only
``create_model`` (theirs builds ``tf.layers.dense`` with a
``tf.contrib`` L2 regulariser: neither exists in TF2; the regulariser's
loss is never added to their objective anyway) by the same multinomial
logistic regression in float64 (placeholders, ``logits = x W + b``,
``tf.losses.sparse_softmax_cross_entropy``, the optimizer's
``compute_gradients`` / ``apply_gradients``) with fixed initial weights;
the data: 3 clients of 5-feature, 3-class random float64 examples, sizes
(6, 6, 10). Recorded (wrappers that only read): every batch
``batch_data`` yields (its rows matched back to example indices), every
client's solution and the aggregated model of every round.

Settings that differ from the authors' defaults and why: the data and
model (tiny, so the test runs in seconds); 3 clients, 2 a round
(``clients_per_round=2``: their ``select_clients`` draws {2, 1}, {0, 2},
{2, 1} with np.random.seed(round); the sizes make every round's two
clients hold 16 examples, so that the weights n_k / 16 are exact in
binary: our engine normalises them in float32), 3 rounds, 2 local epochs,
batch 4; ``drop_percent=0`` (default 0.1 makes stragglers train a random
number of epochs, which our FedProx does not model); learning rate 0.01
(the paper's for the synthetic sets) and mu in (1, 0.01) (1: the paper's
mu for its synthetic sets; 0.01: our default), passed as float64 so that
their ``convert_to_tensor`` keeps them exact in the float64 graph.
"""

import argparse
import importlib
import os
import subprocess
import sys

import numpy as np

NUM_FEATURES = 5
NUM_CLASSES = 3
CLIENT_SIZES = (6, 6, 10)
CLIENTS_PER_ROUND = 2
ROUNDS = 3
EPOCHS = 2
BATCH = 4
LR = 0.01
MUS = (1.0, 0.01)


def make_data():
  rng = np.random.default_rng(3)
  n = sum(CLIENT_SIZES)
  x = rng.normal(size=(n, NUM_FEATURES))
  y = rng.integers(0, NUM_CLASSES, n).astype(np.int64)
  w0 = 0.3 * rng.normal(size=(NUM_FEATURES, NUM_CLASSES))
  b0 = 0.1 * rng.normal(size=NUM_CLASSES)
  parts = np.split(np.arange(n), np.cumsum(CLIENT_SIZES)[:-1])
  return x, y, parts, w0, b0


def shim_tensorflow():
  import tensorflow as tf

  v1 = tf.compat.v1
  v1.disable_v2_behavior()
  v1.logging.set_verbosity(v1.logging.ERROR)
  names = (
    'flearn.optimizer.pgd',
    'flearn.utils.tf_utils',
    'flearn.models.synthetic.mclr',
    'flearn.trainers.fedbase',
    'flearn.trainers.fedprox',
  )
  modules = {name: importlib.import_module(name) for name in names}
  for module in modules.values():
    module.tf = v1
  return v1, modules


def run(v1, modules, mu, x, y, parts, w0, b0):
  mclr = modules['flearn.models.synthetic.mclr']
  fedprox = modules['flearn.trainers.fedprox']
  batch_data = importlib.import_module('flearn.utils.model_utils').batch_data
  batches = []

  class StubModel(mclr.Model):
    """mclr.Model with a float64 create_model and fixed initial weights."""

    def create_model(self, optimizer):
      features = v1.placeholder(
        v1.float64, shape=[None, NUM_FEATURES], name='features'
      )
      labels = v1.placeholder(v1.int64, shape=[None], name='labels')
      kernel = v1.get_variable(
        'dense/kernel', initializer=v1.constant(w0, v1.float64)
      )
      bias = v1.get_variable(
        'dense/bias', initializer=v1.constant(b0, v1.float64)
      )
      logits = v1.matmul(features, kernel) + bias
      predictions = {'classes': v1.argmax(input=logits, axis=1)}
      loss = v1.losses.sparse_softmax_cross_entropy(
        labels=labels, logits=logits
      )
      grads_and_vars = optimizer.compute_gradients(loss)
      grads, _ = zip(*grads_and_vars)
      train_op = optimizer.apply_gradients(
        grads_and_vars, global_step=v1.train.get_global_step()
      )
      eval_metric_ops = v1.count_nonzero(
        v1.equal(labels, predictions['classes'])
      )
      return (
        features,
        labels,
        train_op,
        grads,
        eval_metric_ops,
        loss,
        predictions['classes'],
      )

  def recording_batch_data(data, batch_size):
    for bx, by in batch_data(data, batch_size):
      rows = [int(np.flatnonzero((x == r).all(1))[0]) for r in bx]
      np.testing.assert_array_equal(y[rows], by)
      batches.append(rows)
      yield bx, by

  mclr.batch_data = recording_batch_data
  users = [f'f_{k:05d}' for k in range(len(parts))]
  train = {
    u: {'x': x[p].tolist(), 'y': y[p].tolist()} for u, p in zip(users, parts)
  }
  test = {
    u: {'x': x[p[:2]].tolist(), 'y': y[p[:2]].tolist()}
    for u, p in zip(users, parts)
  }
  params = {
    'optimizer': 'fedprox',
    'dataset': 'stub',
    'model': 'mclr',
    'model_params': (NUM_CLASSES,),
    'num_rounds': ROUNDS,
    'eval_every': 1,
    'clients_per_round': CLIENTS_PER_ROUND,
    'batch_size': BATCH,
    'num_epochs': EPOCHS,
    'num_iters': 1,
    'learning_rate': np.float64(LR),
    'mu': np.float64(mu),
    'seed': 0,
    'drop_percent': 0.0,
  }
  server = fedprox.Server(params, StubModel, (users, [], train, test))
  aggregate = server.aggregate
  solutions, models = [], []

  def recording_aggregate(wsolns):
    solutions.extend(
      [np.asarray(s[0]), np.asarray(s[1][0]), np.asarray(s[1][1])]
      for s in wsolns
    )
    out = aggregate(wsolns)
    models.append([np.asarray(v) for v in out])
    return out

  server.aggregate = recording_aggregate
  server.train()
  return batches, solutions, models


def git_commit(repo, commit):
  if commit:
    return commit
  return subprocess.check_output(
    ['git', '-C', repo, 'rev-parse', 'HEAD'], text=True
  ).strip()


def selected_clients():
  """Their select_clients: np.random.seed(round), choice without
  replacement (BaseFedarated.select_clients), replayed."""
  out = []
  for r in range(ROUNDS):
    np.random.seed(r)
    out.append(
      np.random.choice(
        range(len(CLIENT_SIZES)), CLIENTS_PER_ROUND, replace=False
      )
    )
  return np.asarray(out)


def main():
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  parser.add_argument('--repo', required=True)
  parser.add_argument('--out', default='tests/golden/fedprox_official.npz')
  parser.add_argument('--commit', default='')
  args = parser.parse_args()
  repo = os.path.abspath(args.repo)
  out_path = os.path.abspath(args.out)
  commit = git_commit(repo, args.commit)
  sys.path.insert(0, repo)
  v1, modules = shim_tensorflow()
  x, y, parts, w0, b0 = make_data()
  rounds = selected_clients()
  fixture = {
    'repository': np.asarray('litian96/FedProx'),
    'commit': np.asarray(commit),
    'function': np.asarray(
      'flearn/trainers/fedprox.py:Server.train with '
      'flearn/optimizer/pgd.py:PerturbedGradientDescent'
    ),
    'tensorflow': np.asarray(importlib.import_module('tensorflow').__version__),
    'images': x,
    'labels': y,
    'client_sizes': np.asarray(CLIENT_SIZES),
    'party_rounds': rounds,
    'init_kernel': w0,
    'init_bias': b0,
    'lr': np.asarray(LR),
    'mus': np.asarray(MUS),
    'batch_size': np.asarray(BATCH),
    'epochs': np.asarray(EPOCHS),
    'rounds': np.asarray(ROUNDS),
  }
  for i, mu in enumerate(MUS):
    batches, solutions, models = run(v1, modules, mu, x, y, parts, w0, b0)
    steps_per_client = [
      EPOCHS * -(-CLIENT_SIZES[k] // BATCH) for r in rounds for k in r
    ]
    assert len(batches) == sum(steps_per_client)
    width = BATCH
    idx = np.zeros((len(batches), width), np.int64)
    mask = np.zeros((len(batches), width), bool)
    for s, rows in enumerate(batches):
      idx[s, : len(rows)] = rows
      mask[s, : len(rows)] = True
    fixture[f'run{i}__batch_idx'] = idx
    fixture[f'run{i}__batch_mask'] = mask
    fixture[f'run{i}__client_steps'] = np.asarray(steps_per_client)
    fixture[f'run{i}__solution_weight'] = np.asarray([s[0] for s in solutions])
    fixture[f'run{i}__solution_kernel'] = np.stack([s[1] for s in solutions])
    fixture[f'run{i}__solution_bias'] = np.stack([s[2] for s in solutions])
    fixture[f'run{i}__global_kernel'] = np.stack([m[0] for m in models])
    fixture[f'run{i}__global_bias'] = np.stack([m[1] for m in models])
  os.makedirs(os.path.dirname(out_path), exist_ok=True)
  np.savez_compressed(out_path, **fixture)
  print(f'wrote {out_path} ({os.path.getsize(out_path)} bytes)')


if __name__ == '__main__':
  main()
