"""Deep SVDD's center, objective and training, run by the authors' own code.

Runs, UNCHANGED, github.com/lukasruff/Deep-SVDD-PyTorch (Ruff et al., 'Deep
One-Class Classification', ICML 2018):

  * src/deepSVDD.py DeepSVDD.train / DeepSVDD.test, which build
    src/optim/deepSVDD_trainer.py DeepSVDDTrainer and call its
    init_center_c (the mean of an initial forward pass, coordinates with
    |c_i| < eps = 0.1 moved to +-eps), train (the One-Class objective
    mean ||phi(x) - c||^2, Adam with weight decay) and test (per-example
    scores ||phi(x) - c||^2, roc_auc_score);

as the library's per-client Deep SVDD runs it: one DeepSVDD per client
(client k holds class k), ``train`` called once per round with one epoch,
so the center is fixed by the first call and every round starts a fresh
Adam (the library re-creates the client optimizer every round; DeepSVDD
keeps ``c`` between calls). It writes an .npz fixture
(tests/test_golden_misc.py reads it): the data, the initial weights, each
client's batches, center, weights after every round and test scores.

  /path/to/torch-env/bin/python benchmarks/crosscheck/deepsvdd.py \\
      --repo=/path/to/Deep-SVDD-PyTorch --out=tests/golden/deepsvdd.npz

Stubs (no logic of the method is replaced):
  * model: a BaseNet (src/base/base_net.py) with rep_dim 4: two bias-free
    Linear layers with a leaky ReLU between (the authors' MNIST LeNet is
    bias-free too, with BatchNorm layers the library's LeNet replaces by
    GroupNorm). Fixed weights from a seeded NumPy generator; the last
    layer's rows are scaled so that two center coordinates fall inside
    (-eps, eps) and one row is zero, so that coordinate is exactly 0.
  * data: a BaseADDataset whose loaders() yield (inputs, labels, idx)
    batches of fixed Gaussian features: the training loader in a fixed
    shuffled order (the code's DataLoader shuffles with torch's RNG), the
    test loader every test example with label 0 (the client's class) or 1.

Settings that differ from the authors' defaults (src/main.py) and why:
  * float64 (``torch.set_default_dtype``); device cpu.
  * lr 0.01, n_epochs 1 per call (3 calls), batch 4 (defaults: 0.001, 50
    epochs, 128): a tiny problem with visible steps. weight_decay is the
    default 1e-6, optimizer adam.
  * no autoencoder pre-training (--pretrain False; the library has none).
  * objective 'one-class' only: the library implements no soft-boundary
    Deep SVDD, so there is nothing of it to compare.

This script does not import fedjax_metric.
"""

import argparse
import os
import subprocess
import sys

import numpy as np

NUM_CLIENTS = 2
PER_CLIENT = 10
TEST_PER_CLASS = 4
DIM = 5
HIDDEN = 6
REP_DIM = 4
BATCH = 4
LR = 0.01
WEIGHT_DECAY = 1e-6
ROUNDS = 3
SEED = 0


def make_data():
  rng = np.random.default_rng(SEED)
  centres = rng.normal(size=(NUM_CLIENTS, DIM)) * 1.5
  features = np.repeat(centres, PER_CLIENT, axis=0) + rng.normal(
    size=(NUM_CLIENTS * PER_CLIENT, DIM)
  )
  labels = np.repeat(np.arange(NUM_CLIENTS), PER_CLIENT)
  test_features = np.repeat(centres, TEST_PER_CLASS, axis=0) + rng.normal(
    size=(NUM_CLIENTS * TEST_PER_CLASS, DIM)
  )
  test_labels = np.repeat(np.arange(NUM_CLIENTS), TEST_PER_CLASS)
  w1 = rng.normal(size=(HIDDEN, DIM)) * 0.6
  w2 = rng.normal(size=(REP_DIM, HIDDEN)) * 0.6
  w2[1] *= 0.02  # a coordinate inside (-eps, eps)
  w2[2] *= 0.01  # another
  w2[3] = 0.0  # a coordinate exactly 0 (stays 0)
  orders = [
    [rng.permutation(PER_CLIENT) + k * PER_CLIENT for _ in range(ROUNDS)]
    for k in range(NUM_CLIENTS)
  ]
  return features, labels, test_features, test_labels, w1, w2, orders


def git_commit(repo):
  commit = subprocess.check_output(
    ['git', '-C', repo, 'rev-parse', 'HEAD'], text=True
  ).strip()
  assert len(commit) == 40, commit
  return commit


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument('--repo', required=True)
  parser.add_argument('--out', default='tests/golden/deepsvdd.npz')
  parser.add_argument(
    '--commit', default='', help="the checkout's commit, if not a git tree"
  )
  flags = parser.parse_args()

  import torch
  import torch.nn.functional as F

  torch.set_default_dtype(torch.float64)
  torch.set_num_threads(1)
  sys.path.insert(0, os.path.join(flags.repo, 'src'))
  from base.base_dataset import BaseADDataset
  from base.base_net import BaseNet
  from deepSVDD import DeepSVDD

  features, labels, test_x, test_y, w1, w2, orders = make_data()

  class Net(BaseNet):
    def __init__(self):
      super().__init__()
      self.rep_dim = REP_DIM
      self.fc1 = torch.nn.Linear(DIM, HIDDEN, bias=False)
      self.fc2 = torch.nn.Linear(HIDDEN, REP_DIM, bias=False)
      with torch.no_grad():
        self.fc1.weight.copy_(torch.as_tensor(w1))
        self.fc2.weight.copy_(torch.as_tensor(w2))

    def forward(self, x):
      return self.fc2(F.leaky_relu(self.fc1(x)))

  class Data(BaseADDataset):
    def __init__(self, client):
      super().__init__(root='')
      self.client = client
      self.calls = 0

    def loaders(
      self, batch_size, shuffle_train=True, shuffle_test=False, num_workers=0
    ):
      # train() and test() each ask for both loaders; only train() reads
      # the training one, once per call (after init_center_c in round 0).
      order = orders[self.client][min(self.calls, ROUNDS - 1)]
      train = [
        (
          torch.as_tensor(features[b]),
          torch.zeros(len(b)),
          torch.as_tensor(b),
        )
        for b in (
          order[i : i + batch_size] for i in range(0, len(order), batch_size)
        )
      ]
      test = [
        (
          torch.as_tensor(test_x),
          torch.as_tensor((test_y != self.client).astype(np.int64)),
          torch.arange(len(test_y)),
        )
      ]
      return train, test

  steps = int(np.ceil(PER_CLIENT / BATCH))
  out_weights = np.zeros((NUM_CLIENTS, ROUNDS, REP_DIM * HIDDEN + HIDDEN * DIM))
  centers = np.zeros((NUM_CLIENTS, REP_DIM))
  scores = np.zeros((NUM_CLIENTS, len(test_y)))
  aucs = np.zeros(NUM_CLIENTS)
  batches = -np.ones((ROUNDS, NUM_CLIENTS, steps, BATCH), np.int64)
  for k in range(NUM_CLIENTS):
    svdd = DeepSVDD(objective='one-class', nu=0.1)
    svdd.net = Net()
    data = Data(k)
    for r in range(ROUNDS):
      data.calls = r
      order = orders[k][r]
      for s in range(steps):
        chunk = order[s * BATCH : (s + 1) * BATCH]
        batches[r, k, s, : len(chunk)] = chunk
      svdd.train(
        data,
        optimizer_name='adam',
        lr=LR,
        n_epochs=1,
        lr_milestones=(),
        batch_size=BATCH,
        weight_decay=WEIGHT_DECAY,
        device='cpu',
      )
      out_weights[k, r] = np.concatenate(
        [
          svdd.net.fc1.weight.detach().numpy().ravel(),
          svdd.net.fc2.weight.detach().numpy().ravel(),
        ]
      )
    centers[k] = np.asarray(svdd.c)
    svdd.test(data, device='cpu')
    idx, _, score = zip(*svdd.trainer.test_scores)
    scores[k, np.asarray(idx)] = score
    aucs[k] = svdd.trainer.test_auc
  out = {
    'repository': np.asarray('lukasruff/Deep-SVDD-PyTorch'),
    'commit': np.asarray(flags.commit or git_commit(flags.repo)),
    'function': np.asarray(
      'src/deepSVDD.py:DeepSVDD.train,DeepSVDD.test; '
      'src/optim/deepSVDD_trainer.py:DeepSVDDTrainer.init_center_c,'
      'DeepSVDDTrainer.train,DeepSVDDTrainer.test'
    ),
    'features': features,
    'labels': labels,
    'test_features': test_x,
    'test_labels': test_y,
    'initial_fc1': w1,
    'initial_fc2': w2,
    'batches': batches,
    'weights': out_weights,  # per client and round: fc1 then fc2, flat
    'centers': centers,
    'test_scores': scores,
    'test_auc': aucs,
    'lr': np.float64(LR),
    'weight_decay': np.float64(WEIGHT_DECAY),
    'eps': np.float64(0.1),
    'objective': np.asarray('one-class'),
    'num_clients': np.int64(NUM_CLIENTS),
  }
  os.makedirs(os.path.dirname(os.path.abspath(flags.out)), exist_ok=True)
  np.savez_compressed(flags.out, **out)
  print(f'wrote {flags.out} ({os.path.getsize(flags.out)} bytes)')
  print('centers', centers)
  print('auc', aucs)


if __name__ == '__main__':
  main()
