"""FedLC golden fixture from third-party implementations (no official code).

FedLC (Zhang, Li, Li, Xu, Wu, Ding and Wu, 'Federated Learning with Label
Distribution Skew via Logits Calibration', ICML 2022) has no code release
by its authors that we could find (searched: GitHub code and issues, web
pages; repositories named FedLC are other methods; FL-bench, a Flower
baseline pull request, fluke and the two below are reimplementations).
This fixture comes from the two reimplementations closest to FedRCL:

* geehokim/FedACG (the framework FedRCL's code derives from; its
  configs/client/LC.yaml is FedLC with tau = 1): ``utils/loss.py: FedLC``,
  the calibrated cross-entropy, unchanged. Loss level: fixed logits [6, 5],
  labels and a client's class counts with one class absent (count 0, an
  infinite margin), tau in (1, 0.1, 2): the loss and its gradient w.r.t.
  the logits.
* bytedance/FedDecorr (``approach/fedlogitcal.py: FedLogitCal``, run by
  ``FedAvg.run_fed``): a round-level check. 4 clients of a label-skewed
  48-example set of 6x6x1 uint8 images (x = image / 255, flattened; every
  client lacks one of the 3 classes), softmax regression (a torch Linear
  named ``classifier``, as their nets), 2 rounds with the cohorts
  [0, 1, 2] and [3, 1, 0], 2 local epochs of batch 8, lr 0.1, momentum
  0.9, weight decay 1e-5 (their defaults), calibration_temp (tau) 1.

  /path/to/torch-env/bin/python benchmarks/crosscheck/fedlc.py \\
    --acg_repo=/path/to/FedACG --decorr_repo=/path/to/FedDecorr \\
    [--out=tests/golden/fedlc.npz] [--acg_commit=SHA] [--decorr_commit=SHA]

(--*_commit name the checkouts' commits where they are no git work trees,
e.g. ``git archive`` of FedACG 62b6e953f5511043bf3cdc161f518454190505f0
and FedDecorr 973e4af2d416e8dacda1fb19a328e440f9e815af.)

Stubs: FedACG's ``utils`` package is entered without its __init__ (which
imports data-set code needing torchvision); FedDecorr's data loaders (lists
of fixed batches, one shuffled order per epoch, written to the fixture;
``.dataset.target`` for the class counts and ``len(.dataset)`` for the
aggregation), ``compute_accuracy`` (evaluation only), ``.cuda()`` (the
identity: CPU), the logger.

Settings that differ from the defaults and why: FedDecorr's
calibration_temp default is 0.1; here tau = 1, FedACG's LC.yaml value and
ours (so one tau serves both checks; 0.1 is in the loss-level set). The
model, data and sizes are tiny so the test runs in seconds.
"""

import argparse
import importlib
import os
import subprocess
import sys
import types

import numpy as np
import torch

TAUS = (1.0, 0.1, 2.0)
ROUND_TAU = 1.0
LR = 0.1
MOMENTUM = 0.9
WEIGHT_DECAY = 1e-5
BATCH = 8
LOCAL_EPOCHS = 2
NUM_CLIENTS = 4
NUM_CLASSES = 3
COHORTS = [[0, 1, 2], [3, 1, 0]]


def commit_of(repo, given):
  """The given commit, else the checkout's HEAD (a git archive has none)."""
  if given:
    return given
  return subprocess.check_output(
    ['git', '-C', repo, 'rev-parse', 'HEAD'], text=True
  ).strip()


def import_fedacg_loss(repo):
  """utils/loss.py (and the utils/helper.py it imports), without running
  utils/__init__.py."""
  package = types.ModuleType('utils')
  package.__path__ = [os.path.join(repo, 'utils')]
  sys.modules['utils'] = package
  module = importlib.import_module('utils.loss')
  for name in [
    n for n in sys.modules if n == 'utils' or n.startswith('utils.')
  ]:
    del sys.modules[name]  # FedDecorr has a utils module of its own
  return module


def loss_level(acg_loss):
  rng = np.random.default_rng(0)
  logits = rng.normal(size=(6, 5)) * 2.0
  counts = np.array([12.0, 3.0, 0.0, 1.0, 30.0])  # class 2 absent
  labels = np.array([0, 4, 1, 3, 4, 0])
  values, grads = [], []
  for tau in TAUS:
    z = torch.tensor(logits, requires_grad=True)
    loss = acg_loss.FedLC(torch.tensor(counts), z, torch.tensor(labels), tau)
    (grad,) = torch.autograd.grad(loss, z)
    values.append(loss.item())
    grads.append(grad.numpy())
  return {
    'loss_logits': logits,
    'loss_counts': counts,
    'loss_labels': labels,
    'loss_taus': np.array(TAUS),
    'loss_value': np.array(values),
    'loss_grad_logits': np.stack(grads),
  }


class Net(torch.nn.Module):
  def __init__(self, w, b):
    super().__init__()
    self.classifier = torch.nn.Linear(w.shape[1], w.shape[0])
    with torch.no_grad():
      self.classifier.weight.copy_(torch.tensor(w))
      self.classifier.bias.copy_(torch.tensor(b))

  def forward(self, x):
    return self.classifier(x.flatten(1))


class Dataset:
  def __init__(self, y, rows):
    self.rows = rows
    self.target = y[rows]

  def __len__(self):
    return len(self.rows)


class EpochLoader:
  """A client's loader stub: its k-th iteration (its k-th local epoch over
  the run; evaluation is stubbed) yields the fixed batches ``epochs[k]``."""

  def __init__(self, x, y, rows, epochs):
    self.x, self.y, self.epochs = x, y, epochs
    self.dataset = Dataset(y, rows)
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


def round_level(repo):
  torch.Tensor.cuda = lambda self, *a, **k: self  # CPU device stub
  torch.nn.Module.cuda = lambda self, *a, **k: self
  sys.path.insert(0, repo)
  from approach import fedavg as fedavg_mod  # noqa: PLC0415
  from approach import fedlogitcal  # noqa: PLC0415

  rng = np.random.default_rng(1)
  images, labels, parts = make_federation(rng)
  x = images.reshape(len(images), -1).astype(np.float64) / 255.0
  w = rng.normal(size=(NUM_CLASSES, x.shape[1])) * 0.3
  b = rng.normal(size=NUM_CLASSES) * 0.3
  epochs, idx, mask = schedule(rng, parts, COHORTS)
  stub = lambda net, loader: (0.0, 0.0)  # noqa: E731  evaluation stub
  fedavg_mod.compute_accuracy = stub
  fedlogitcal.compute_accuracy = stub
  args = types.SimpleNamespace(
    n_comm_round=1,
    print_interval=10**9,
    save_interval=10**9,
    lr=LR,
    rho=MOMENTUM,
    weight_decay=WEIGHT_DECAY,
    epochs=LOCAL_EPOCHS,
  )
  global_net = Net(w, b)
  appr = fedlogitcal.FedLogitCal(
    args,
    types.SimpleNamespace(calibration_temp=ROUND_TAU),
    types.SimpleNamespace(info=lambda *a, **k: None),
    None,
    {c: Net(w, b) for c in range(NUM_CLIENTS)},
    global_net,
    {c: EpochLoader(x, labels, parts[c], epochs[c]) for c in range(4)},
    [],  # global_train_dl: read by the stubbed compute_accuracy only
    [],  # test_dl: likewise (and its len() logged)
  )
  weights, biases = [], []
  for cohort in COHORTS:  # run_fed's loop, one round a call
    appr.party_list_rounds = [cohort]
    appr.run_fed()
    weights.append(global_net.classifier.weight.detach().numpy().copy())
    biases.append(global_net.classifier.bias.detach().numpy().copy())
  counts = np.array(
    [np.bincount(labels[p], minlength=NUM_CLASSES) for p in parts]
  )
  return {
    'round_images': images,
    'round_labels': labels.astype(np.int32),
    'round_client_sizes': np.array([len(p) for p in parts]),
    'round_class_counts': counts,
    'round_init_weight': w,
    'round_init_bias': b,
    'round_cohorts': np.array(COHORTS),
    'round_example_idx': idx,
    'round_example_mask': mask,
    'round_weight': np.stack(weights),
    'round_bias': np.stack(biases),
    'round_tau': np.float64(ROUND_TAU),
    'round_lr': np.float64(LR),
    'round_momentum': np.float64(MOMENTUM),
    'round_weight_decay': np.float64(WEIGHT_DECAY),
    'round_gamma': np.float64(1.0),
  }


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument('--acg_repo', required=True)
  parser.add_argument('--decorr_repo', required=True)
  parser.add_argument('--out', default='tests/golden/fedlc.npz')
  parser.add_argument('--acg_commit', default='')
  parser.add_argument('--decorr_commit', default='')
  args = parser.parse_args()
  torch.set_default_dtype(torch.float64)
  acg = os.path.abspath(args.acg_repo)
  decorr = os.path.abspath(args.decorr_repo)
  out = {
    'repository': 'geehokim/FedACG',
    'commit': commit_of(acg, args.acg_commit),
    'function': 'utils/loss.py:FedLC',
    'round_repository': 'bytedance/FedDecorr',
    'round_commit': commit_of(decorr, args.decorr_commit),
    'round_function': (
      'approach/fedlogitcal.py:FedLogitCal._local_training, run by '
      'approach/fedavg.py:FedAvg.run_fed (global_aggregation)'
    ),
  }
  out.update(loss_level(import_fedacg_loss(acg)))
  out.update(round_level(decorr))
  np.savez_compressed(args.out, **out)
  print('wrote', args.out, os.path.getsize(args.out), 'bytes')


if __name__ == '__main__':
  main()
