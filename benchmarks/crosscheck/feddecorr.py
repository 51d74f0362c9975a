"""FedDecorr golden fixture from the authors' code (bytedance/FedDecorr).

Runs, unchanged, the authors' decorrelation loss (``loss.py:
FedDecorrLoss.forward``) and their supervised FedAvg + FedDecorr loop
(``approach/fedavg.py: FedAvg.run_fed``, with ``_local_training`` and
``global_aggregation``) in float64 on CPU, and writes
tests/golden/feddecorr.npz for tests/test_golden_baselines.py:

  /path/to/torch-env/bin/python benchmarks/crosscheck/feddecorr.py \\
    --repo=/path/to/FedDecorr [--out=tests/golden/feddecorr.npz] \\
    [--commit=SHA]

(--commit names the checkout's commit where --repo is no git work tree,
e.g. a ``git archive`` of 973e4af2d416e8dacda1fb19a328e440f9e815af.)

Loss level: FedDecorrLoss on fixed representations [N, D] of shapes
(8, 5), (3, 4), (16, 2) and (6, 4) with a constant column (its variance 0:
the eps inside the sqrt decides), the loss and its gradient w.r.t. the
representations; and (1, 4), where the code returns 0.

Round level: 4 clients of a label-skewed 48-example set of 6x6x1 uint8
images (x = image / 255, flattened), a stub model (Linear 36 -> 8, ReLU:
the representation FedDecorr decorrelates; Linear 8 -> 3: the classifier,
``net(x, return_features=True) -> (logits, features)`` as their networks),
2 rounds with the cohorts [0, 1, 2] and [3, 1, 0] (``party_list_rounds``),
2 local epochs of batch 8. Stubs: the data loaders (lists of fixed batches,
one shuffled order per epoch, written to the fixture; ``.dataset`` for the
aggregation's sizes), ``compute_accuracy`` (evaluation only), ``.cuda()``
(the identity: CPU), the logger.

Settings that differ from the authors' defaults (main.py, approach/
fedavg.py) and why: the model and data (tiny, so the test runs in
seconds), 4 clients / 2 rounds / 2 local epochs / batch 8 (small),
partial cohorts (their default samples every client). Kept: --feddecorr
with feddecorr_coef 0.1, lr 0.1, momentum (rho) 0.9, weight decay 1e-5,
no learning-rate decay.
"""

import argparse
import os
import subprocess
import sys
import types

import numpy as np
import torch

LR = 0.1
MOMENTUM = 0.9
WEIGHT_DECAY = 1e-5
COEF = 0.1
BATCH = 8
LOCAL_EPOCHS = 2
NUM_CLIENTS = 4
NUM_CLASSES = 3
HIDDEN = 8
COHORTS = [[0, 1, 2], [3, 1, 0]]


def commit_of(repo, given):
  """--commit, else the checkout's HEAD (a git archive has none)."""
  if given:
    return given
  return subprocess.check_output(
    ['git', '-C', repo, 'rev-parse', 'HEAD'], text=True
  ).strip()


def cpu_device_stub():
  """Their loop calls .cuda() on models and tensors: the identity here."""
  torch.Tensor.cuda = lambda self, *a, **k: self
  torch.nn.Module.cuda = lambda self, *a, **k: self


def loss_level(loss_mod):
  rng = np.random.default_rng(0)
  constant = rng.normal(size=(6, 4)) + 1.0
  constant[:, 2] = 0.7
  cases = {
    'a': rng.normal(size=(8, 5)) * np.array([1.0, 2.0, 0.5, 3.0, 1.0]) + 0.3,
    'b': rng.normal(size=(3, 4)),
    'c': rng.normal(size=(16, 2)) @ np.array([[1.0, 0.6], [0.0, 0.8]]),
    'd': constant,
    'one': rng.normal(size=(1, 4)),
  }
  out = {}
  for name, x in cases.items():
    fn = loss_mod.FedDecorrLoss()
    z = torch.tensor(x, requires_grad=True)
    loss = fn(z)
    out[f'loss_{name}_x'] = x
    if isinstance(loss, torch.Tensor):
      (grad,) = torch.autograd.grad(loss, z)
      out[f'loss_{name}_value'] = np.float64(loss.item())
      out[f'loss_{name}_grad'] = grad.numpy()
    else:  # N == 1: a Python 0.0
      out[f'loss_{name}_value'] = np.float64(loss)
  out['loss_eps'] = np.float64(loss_mod.FedDecorrLoss().eps)
  return out


class Net(torch.nn.Module):
  """The stub model: representation relu(fc(x)), classifier on it."""

  def __init__(self, w1, b1, w2, b2):
    super().__init__()
    self.fc = torch.nn.Linear(w1.shape[1], w1.shape[0])
    self.classifier = torch.nn.Linear(w2.shape[1], w2.shape[0])
    with torch.no_grad():
      for p, v in zip(self.parameters(), (w1, b1, w2, b2)):
        p.copy_(torch.tensor(v))

  def forward(self, x, return_features=False):
    features = torch.relu(self.fc(x.flatten(1)))
    out = self.classifier(features)
    return (out, features) if return_features else out


class Dataset:
  def __init__(self, x, y, rows):
    self.rows = rows
    self.target = y[rows]

  def __len__(self):
    return len(self.rows)


class EpochLoader:
  """A client's loader stub: its k-th iteration (its k-th local epoch over
  the run; evaluation is stubbed) yields the fixed batches ``epochs[k]``."""

  def __init__(self, x, y, rows, epochs):
    self.x, self.y, self.epochs = x, y, epochs
    self.dataset = Dataset(x, y, rows)
    self.calls = 0

  def __len__(self):
    return len(self.epochs[0])

  def __iter__(self):
    batches = self.epochs[self.calls]
    self.calls += 1
    for rows in batches:
      yield torch.tensor(self.x[rows]), torch.tensor(self.y[rows])


def make_federation(rng):
  images = rng.integers(0, 256, (48, 6, 6, 1)).astype(np.uint8)
  labels = rng.integers(0, NUM_CLASSES, 48)
  parts = [[] for _ in range(NUM_CLIENTS)]
  for i, y in enumerate(labels):
    choices = [c for c in range(NUM_CLIENTS) if y in (c % 3, (c + 1) % 3)]
    parts[choices[i % len(choices)]].append(i)
  return images, labels, [np.array(p) for p in parts]


def schedule(rng, parts, cohorts):
  """Per round the cohort's batches: (loader epochs per client, the
  fixture's example_idx and example_mask [R, C, S, B])."""
  max_steps = LOCAL_EPOCHS * max(-(-len(p) // BATCH) for p in parts)
  epochs = {c: [] for c in range(len(parts))}
  idx = np.zeros((len(cohorts), len(cohorts[0]), max_steps, BATCH), np.int32)
  mask = np.zeros(idx.shape, bool)
  for r, cohort in enumerate(cohorts):
    for slot, c in enumerate(cohort):
      step = 0
      for _ in range(LOCAL_EPOCHS):
        order = rng.permutation(parts[c])
        batches = [order[i : i + BATCH] for i in range(0, len(order), BATCH)]
        epochs[c].append(batches)
        for rows in batches:
          idx[r, slot, step, : len(rows)] = rows
          mask[r, slot, step, : len(rows)] = True
          step += 1
  return epochs, idx, mask


def initial_weights(rng, dim):
  return (
    rng.normal(size=(HIDDEN, dim)) * 0.3,
    rng.normal(size=HIDDEN) * 0.3 + 0.2,
    rng.normal(size=(NUM_CLASSES, HIDDEN)) * 0.3,
    rng.normal(size=NUM_CLASSES) * 0.3,
  )


def round_level(approach_cls, approach_mod):
  rng = np.random.default_rng(1)
  images, labels, parts = make_federation(rng)
  x = images.reshape(len(images), -1).astype(np.float64) / 255.0
  init = initial_weights(rng, x.shape[1])
  epochs, idx, mask = schedule(rng, parts, COHORTS)
  approach_mod.compute_accuracy = lambda net, loader: (0.0, 0.0)  # eval stub
  args = types.SimpleNamespace(
    n_comm_round=len(COHORTS),
    print_interval=10**9,
    save_interval=10**9,
    lr=LR,
    rho=MOMENTUM,
    weight_decay=WEIGHT_DECAY,
    epochs=LOCAL_EPOCHS,
  )
  appr_args = types.SimpleNamespace(feddecorr=True, feddecorr_coef=COEF)
  logger = types.SimpleNamespace(info=lambda *a, **k: None)
  global_net = Net(*init)
  party2nets = {c: Net(*init) for c in range(NUM_CLIENTS)}
  loaders = {
    c: EpochLoader(x, labels, parts[c], epochs[c]) for c in range(NUM_CLIENTS)
  }
  trained = []
  appr = approach_cls(
    args,
    appr_args,
    logger,
    COHORTS,
    party2nets,
    global_net,
    loaders,
    [],  # global_train_dl: read by the stubbed compute_accuracy only
    [],  # test_dl: likewise (and its len() logged)
  )
  # run_fed's own loop, one round per call, to read the model in between.
  for r in range(len(COHORTS)):
    appr.args.n_comm_round = 1
    appr.party_list_rounds = [COHORTS[r]]
    appr.run_fed()
    trained.append([p.detach().numpy().copy() for p in global_net.parameters()])
  return {
    'round_images': images,
    'round_labels': labels.astype(np.int32),
    'round_client_sizes': np.array([len(p) for p in parts]),
    'round_init_w1': init[0],
    'round_init_b1': init[1],
    'round_init_w2': init[2],
    'round_init_b2': init[3],
    'round_cohorts': np.array(COHORTS),
    'round_example_idx': idx,
    'round_example_mask': mask,
    'round_w1': np.stack([t[0] for t in trained]),
    'round_b1': np.stack([t[1] for t in trained]),
    'round_w2': np.stack([t[2] for t in trained]),
    'round_b2': np.stack([t[3] for t in trained]),
    'round_lr': np.float64(LR),
    'round_momentum': np.float64(MOMENTUM),
    'round_weight_decay': np.float64(WEIGHT_DECAY),
    'round_gamma': np.float64(1.0),
    'round_coef': np.float64(COEF),
  }


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument('--repo', required=True)
  parser.add_argument('--out', default='tests/golden/feddecorr.npz')
  parser.add_argument('--commit', default='', help='if --repo is no git tree')
  args = parser.parse_args()
  torch.set_default_dtype(torch.float64)
  cpu_device_stub()
  repo = os.path.abspath(args.repo)
  sys.path.insert(0, repo)
  from approach import fedavg as approach_mod  # noqa: PLC0415
  import loss as loss_mod  # noqa: PLC0415

  out = {
    'repository': 'bytedance/FedDecorr',
    'commit': commit_of(repo, args.commit),
    'function': (
      'loss.py:FedDecorrLoss.forward; approach/fedavg.py:FedAvg.run_fed '
      '(_local_training with --feddecorr, global_aggregation)'
    ),
  }
  out.update(loss_level(loss_mod))
  out.update(round_level(approach_mod.FedAvg, approach_mod))
  np.savez_compressed(args.out, **out)
  print('wrote', args.out, os.path.getsize(args.out), 'bytes')


if __name__ == '__main__':
  main()
