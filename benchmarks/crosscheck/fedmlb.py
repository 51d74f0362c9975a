"""FedMLB golden fixture from the authors' code (jinkyu032/FedMLB).

Runs, unchanged, the authors' client update (``local_update_method/
FedMLB.py: LocalUpdate.train``, with its ``KD``) and their server loop
(``global_update_method/base_aggregation.py: GlobalUpdate``) in float64 on
CPU, and writes tests/golden/fedmlb.npz for tests/test_golden_baselines.py:

  /path/to/torch-env/bin/python benchmarks/crosscheck/fedmlb.py \\
    --repo=/path/to/FedMLB [--out=tests/golden/fedmlb.npz] [--commit=SHA]

(--commit names the checkout's commit where --repo is no git work tree,
e.g. a ``git archive`` of d695dbf9aaf91b3586788113d06bb2a7941d6ca8.)

Loss level (the loss combination on fixed logits): LocalUpdate.train, one
step of one batch, drives a stub model whose parameters ARE the logits:
the main logits z [B, K] and one tensor h_b [B, K] per branch point,
returned as the branch 'features'; the stub global model passes a branch
feature through unchanged, so hybrid pathway b's logits are h_b. With SGD
at lr 1 (no momentum, weight decay or clipping), the step's parameter
change is minus the gradient of their loss w.r.t. z and every h_b; the
returned loss is its value. Two branches, 6 examples, 4 classes; settings
(temp, lambda2, lambda3) = (1, 1, 1) (the defaults) and (2, 0.7, 1.3),
lambda1 = 1 (the main CE's weight, which ours fixes at 1).

Round level: GlobalUpdate for 2 rounds over 4 clients of a label-skewed
48-example set of 6x6x1 uint8 images (x = image / 255, flattened),
participation 0.75 (3 clients a round, their np.random.choice, seeded),
2 local epochs of batch 8; the model a stub MLP with FedMLB's interface
(``forward(x, return_feature, level)`` as their ResNet18_FedMLB): two
Dense + ReLU blocks, each a branch point, then the classifier; the
authors' defaults lr 0.1, momentum 0, weight decay 1e-3, gradient
clipping at norm 10, learning-rate decay 0.998 a round, temp 1 and
lambda1 = lambda2 = lambda3 = 1. Stubs: ``get_model`` and ``get_dataset``
(the stub model, the partition), the DataLoader inside LocalUpdate (fixed
batches, one shuffled order per epoch, written to the fixture), ``wandb``,
the packages their module imports only for data sets (torchvision, PIL,
imageio, tqdm); the global model after each round is read back from the
checkpoint GlobalUpdate saves (save_freq 1, into a temporary directory).

Settings that differ from the README's command and why: the model and
data (tiny, so the test runs in seconds), 4 clients / 2 rounds / 2 local
epochs / batch 8 / participation 0.75 (small); the loss-level settings
above (to read the gradient off one step).
"""

import argparse
import importlib.machinery
import os
import subprocess
import sys
import tempfile
import types
from unittest import mock

import numpy as np
import torch

NUM_CLASSES = 3
HIDDEN = (8, 8)
BATCH = 8
LOCAL_EPOCHS = 2
ROUNDS = 2
NUM_CLIENTS = 4
PARTICIPATION = 0.75
LR = 0.1
LR_DECAY = 0.998
WEIGHT_DECAY = 1e-3
CLIP = 10.0


def commit_of(repo, given):
  """--commit, else the checkout's HEAD (a git archive has none)."""
  if given:
    return given
  return subprocess.check_output(
    ['git', '-C', repo, 'rev-parse', 'HEAD'], text=True
  ).strip()


class _Stub(types.ModuleType):
  """An import-only stub: any attribute is a MagicMock."""

  def __getattr__(self, name):
    if name.startswith('__'):
      raise AttributeError(name)
    return mock.MagicMock(name=f'{self.__name__}.{name}')


def import_authors(repo):
  for name in (
    'torchvision',
    'torchvision.transforms',
    'torchvision.datasets',
    'torchvision.datasets.accimage',
    'PIL',
    'PIL.Image',
    'imageio',
    'tqdm',
    'tqdm.autonotebook',
    'wandb',
  ):
    stub = _Stub(name)
    stub.__spec__ = importlib.machinery.ModuleSpec(name, None)
    sys.modules[name] = stub
  sys.path.insert(0, repo)
  from global_update_method import base_aggregation  # noqa: PLC0415
  from local_update_method import FedMLB  # noqa: PLC0415

  return FedMLB, base_aggregation


class FixedLoader:
  """The DataLoader stub inside LocalUpdate: epoch e yields ``epochs[e]``
  (lists of positions into the client's DatasetSplit), collated."""

  def __init__(self, split, epochs):
    self.split, self.epochs, self.calls = split, epochs, 0

  def __len__(self):
    return len(self.epochs[0])

  def __iter__(self):
    batches = self.epochs[self.calls]
    self.calls += 1
    for positions in batches:
      items = [self.split[int(i)] for i in positions]
      yield (
        torch.stack([a for a, _ in items]),
        torch.stack([b for _, b in items]),
      )


def args_namespace(**kwargs):
  base = dict(
    momentum=0.0,
    weight_decay=WEIGHT_DECAY,
    select_level=-1,
    temp=1.0,
    lambda1=1.0,
    lambda2=1.0,
    lambda3=1.0,
    gr_clipping_max_norm=CLIP,
  )
  base.update(kwargs)
  return types.SimpleNamespace(**base)


# ------------------------------------------------------------ loss level


class LogitModel(torch.nn.Module):
  """Parameters are the logits: main z and a tensor per branch point. The
  'images' are example indices. Called with level >= 1 (the global
  model's hybrid pathway from a branch point), it returns its input."""

  def __init__(self, main, branches):
    super().__init__()
    self.main = torch.nn.Parameter(torch.tensor(main))
    self.branches = torch.nn.ParameterList(
      [torch.nn.Parameter(torch.tensor(h)) for h in branches]
    )

  def forward(self, x, return_feature=False, level=0):
    if level > 0:
      return x
    rows = x.long()
    out = [h[rows] for h in self.branches] + [self.main[rows]]
    return tuple(out) if return_feature else out[-1]


def loss_level(fedmlb):
  rng = np.random.default_rng(0)
  size, classes = 6, 4
  main = rng.normal(size=(size, classes)) * 2.0
  branches = rng.normal(size=(2, size, classes)) * 2.0
  labels = np.array([0, 3, 1, 1, 2, 0])
  dataset = [(np.int64(i), np.int64(y)) for i, y in enumerate(labels)]
  settings = [(1.0, 1.0, 1.0), (2.0, 0.7, 1.3)]
  values, grad_main, grad_branches = [], [], []
  for temp, lam2, lam3 in settings:
    args = args_namespace(
      weight_decay=0.0,
      temp=temp,
      lambda2=lam2,
      lambda3=lam3,
      gr_clipping_max_norm=1e12,
    )
    update = fedmlb.LocalUpdate(
      args, 1.0, 1, 'cpu', size, dataset=dataset, idxs=range(size)
    )
    update.ldr_train = FixedLoader(update.ldr_train.dataset, [[range(size)]])
    model = LogitModel(main, branches)
    state, loss = update.train(model)
    values.append(loss)
    grad_main.append(main - state['main'].numpy())
    grad_branches.append(
      np.stack([branches[b] - state[f'branches.{b}'].numpy() for b in range(2)])
    )
  return {
    'loss_main': main,
    'loss_branches': branches,
    'loss_labels': labels,
    'loss_settings': np.array(settings),
    'loss_value': np.array(values),
    'loss_grad_main': np.stack(grad_main),
    'loss_grad_branches': np.stack(grad_branches),
  }


# ----------------------------------------------------------- round level


class BranchNet(torch.nn.Module):
  """Two Dense + ReLU blocks (branch points out0, out1), then the
  classifier; ``level`` as in their ResNet18_FedMLB.forward."""

  def __init__(self, weights):
    super().__init__()
    dims = [36, *HIDDEN, NUM_CLASSES]
    self.fcs = torch.nn.ModuleList(
      [torch.nn.Linear(a, b) for a, b in zip(dims[:-1], dims[1:])]
    )
    with torch.no_grad():
      for fc, (w, b) in zip(self.fcs, weights):
        fc.weight.copy_(torch.tensor(w))
        fc.bias.copy_(torch.tensor(b))

  def forward(self, x, return_feature=False, level=0):
    out0 = torch.relu(self.fcs[0](x.flatten(1))) if level <= 0 else x
    out1 = torch.relu(self.fcs[1](out0)) if level <= 1 else out0
    logit = self.fcs[2](out1)
    return (out0, out1, logit) if return_feature else logit


def make_federation(rng):
  images = rng.integers(0, 256, (48, 6, 6, 1)).astype(np.uint8)
  labels = rng.integers(0, NUM_CLASSES, 48)
  parts = [[] for _ in range(NUM_CLIENTS)]
  for i, y in enumerate(labels):
    choices = [c for c in range(NUM_CLIENTS) if y in (c % 3, (c + 1) % 3)]
    parts[choices[i % len(choices)]].append(i)
  return images, labels, [np.array(p) for p in parts]


def round_level(fedmlb, base_aggregation):
  rng = np.random.default_rng(1)
  images, labels, parts = make_federation(rng)
  x = images.reshape(len(images), -1).astype(np.float64) / 255.0
  dims = [36, *HIDDEN, NUM_CLASSES]
  init = [
    (rng.normal(size=(b, a)) * 0.3, rng.normal(size=b) * 0.3 + 0.1)
    for a, b in zip(dims[:-1], dims[1:])
  ]
  trainset = [(x[i], np.int64(labels[i])) for i in range(len(labels))]
  client_of = {tuple(p): c for c, p in enumerate(parts)}
  served = []  # (client, epochs as global example indices), in call order

  def loader(split, batch_size, shuffle):
    assert batch_size == BATCH and shuffle
    client = client_of[tuple(split.idxs)]
    epochs = []
    for _ in range(LOCAL_EPOCHS):
      order = rng.permutation(len(split))
      epochs.append([order[i : i + BATCH] for i in range(0, len(order), BATCH)])
    served.append((client, [[parts[client][b] for b in e] for e in epochs]))
    return FixedLoader(split, epochs)

  fedmlb.DataLoader = loader
  base_aggregation.get_model = lambda args: BranchNet(init)
  base_aggregation.get_dataset = lambda args, trainset, mode: {
    c: list(p) for c, p in enumerate(parts)
  }
  testloader = [(torch.tensor(x[:8]), torch.tensor(labels[:8]))]
  with tempfile.TemporaryDirectory() as log_dir:
    args = args_namespace(
      participation_rate=PARTICIPATION,
      num_of_clients=NUM_CLIENTS,
      global_epochs=ROUNDS,
      local_epochs=LOCAL_EPOCHS,
      batch_size=BATCH,
      lr=LR,
      learning_rate_decay=LR_DECAY,
      mode='dirichlet',
      print_freq=1,
      save_freq=1,
      log_dir=log_dir,
      set='stub',
      arch='BranchNet',
    )
    np.random.seed(0)  # their client sampling
    base_aggregation.GlobalUpdate(
      args, 'cpu', trainset, testloader, fedmlb.LocalUpdate
    )
    states = [
      torch.load(
        os.path.join(log_dir, f'stub_BranchNet_{r + 1}.pth'),
        weights_only=True,
      )['model_state_dict']
      for r in range(ROUNDS)
    ]
  per_round = max(int(PARTICIPATION * NUM_CLIENTS), 1)
  max_steps = LOCAL_EPOCHS * max(-(-len(p) // BATCH) for p in parts)
  cohorts = np.zeros((ROUNDS, per_round), np.int32)
  idx = np.zeros((ROUNDS, per_round, max_steps, BATCH), np.int32)
  mask = np.zeros(idx.shape, bool)
  for k, (client, epochs) in enumerate(served):
    r, slot = divmod(k, per_round)
    cohorts[r, slot] = client
    steps = [rows for e in epochs for rows in e]
    for s, rows in enumerate(steps):
      idx[r, slot, s, : len(rows)] = rows
      mask[r, slot, s, : len(rows)] = True
  out = {
    'round_images': images,
    'round_labels': labels.astype(np.int32),
    'round_client_sizes': np.array([len(p) for p in parts]),
    'round_cohorts': cohorts,
    'round_example_idx': idx,
    'round_example_mask': mask,
    'round_lr': np.float64(LR),
    'round_momentum': np.float64(0.0),
    'round_weight_decay': np.float64(WEIGHT_DECAY),
    'round_gamma': np.float64(LR_DECAY),
    'round_clip': np.float64(CLIP),
  }
  for i, (w, b) in enumerate(init):
    out[f'round_init_w{i}'] = w
    out[f'round_init_b{i}'] = b
    out[f'round_w{i}'] = np.stack(
      [s[f'fcs.{i}.weight'].numpy() for s in states]
    )
    out[f'round_b{i}'] = np.stack([s[f'fcs.{i}.bias'].numpy() for s in states])
  return out


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument('--repo', required=True)
  parser.add_argument('--out', default='tests/golden/fedmlb.npz')
  parser.add_argument('--commit', default='', help='if --repo is no git tree')
  args = parser.parse_args()
  torch.set_default_dtype(torch.float64)
  repo = os.path.abspath(args.repo)
  fedmlb, base_aggregation = import_authors(repo)
  out = {
    'repository': 'jinkyu032/FedMLB',
    'commit': commit_of(repo, args.commit),
    'function': (
      'local_update_method/FedMLB.py:LocalUpdate.train (KD); '
      'global_update_method/base_aggregation.py:GlobalUpdate'
    ),
  }
  out.update(loss_level(fedmlb))
  out.update(round_level(fedmlb, base_aggregation))
  np.savez_compressed(args.out, **out)
  print('wrote', args.out, os.path.getsize(args.out), 'bytes')


if __name__ == '__main__':
  main()
