"""MOON golden fixture from the authors' code (QinbinLi/MOON).

Runs the authors' ``main.py`` unchanged, as a script (``runpy``, its
``__main__`` block with ``--alg=moon``): the party sampling, the model
pool, ``local_train_net`` -> ``train_net_fedcon`` (CE + mu * the
model-contrastive loss: cosine similarity of the trained model's projection
to the global model's (positive) and to the previous local model's
(negative), over the temperature) and the size-weighted averaging, in
float64 on CPU, and writes tests/golden/moon.npz for
tests/test_golden_moon_niid.py:

  /path/to/torch-env/bin/python benchmarks/crosscheck/moon.py \\
    --repo=/path/to/MOON [--out=tests/golden/moon.npz] [--commit=SHA]

(--commit names the checkout's commit where --repo is no git work tree,
e.g. a ``git archive`` of 8fcba3c4efc9a47eb24687a91ba94cfb2005103f.)

Recorded (nothing of theirs is changed; the hooks only read): every local
step's loss (the tensor ``backward`` is called on), parameters before the
step and their gradients (a global optimizer step pre-hook); every local
training's start and end parameters and the global model after each
round (through their ``compute_accuracy``, wrapped to record its model).
The same run is made twice, for mu = 1 (main.py's default) and mu = 5 (the
README's CIFAR-10 command, configs/moon.py's mu); the keys of each run are
prefixed ``mu1__`` and ``mu5__``.

Stubs: the model (``ModelFedCon`` replaced by ``TinyFedCon``: the same
``h -> l1 -> ReLU -> l2 = z -> l3 = logits`` head and the same
``(h, z, logits)`` outputs, on the flattened input as backbone, 6 -> 6 ->
4 -> 10), the data (``partition_data`` returns a fixed 3-party split (6, 10, 6) of
22 random float64 examples; ``get_dataloader`` returns fixed batches of 4 in
partition order, the same every epoch), the device (``.cuda()`` is a
no-op; ``--device=cuda:0`` only so that their ``compute_accuracy`` builds
its criterion: it has none for a torch.device('cpu')), and torchvision /
PIL (not installed with this torch; a placeholder module: only the data
code uses them).

Settings that differ from the authors' defaults and why: the model and
data (tiny, for a test that runs in seconds), 3 parties / 2 per round
(``--sample_fraction=0.7``) / 3 rounds / 2 local epochs / batch 4 (small;
partial participation so that a client's "previous model" is sometimes its
random initialisation), ``--out_dim=4``. Kept: SGD with momentum 0.9 and
weight decay 1e-5 (``--reg``, hard-coded momentum), lr 0.01 (the README's),
temperature 0.5, model_buffer_size 1, FIFO pool, ``load_first_net=1``.
"""

import argparse
import copy
import importlib
import importlib.abc
import importlib.machinery
import os
import random
import runpy
import subprocess
import sys
import tempfile
import types

import numpy as np
import torch
from torch.optim.optimizer import register_optimizer_step_pre_hook

IN_DIM = 6
OUT_DIM = 4
NUM_CLASSES = 10  # init_nets' n_classes for --dataset=cifar10
# Batches of 4: (4, 2), (4, 4, 2), (4, 2). Every round's two parties hold 16
# examples: the FedAvg weights n_k / 16 are exact in binary floating point
# (our engine normalises them in float32).
PART_SIZES = (6, 10, 6)
BATCH = 4
EPOCHS = 2
ROUNDS = 3
SAMPLE_FRACTION = 0.7  # int(3 * 0.7) = 2 parties a round
LR = 0.01
TEMPERATURE = 0.5
REG = 1e-5
MOMENTUM = 0.9  # train_net_fedcon's optim.SGD(..., momentum=0.9)
INIT_SEED = 0
MUS = (1.0, 5.0)
PARAM_NAMES = (
  'l1.weight',
  'l1.bias',
  'l2.weight',
  'l2.bias',
  'l3.weight',
  'l3.bias',
)


class _Placeholder(types.ModuleType):
  """A module whose every attribute is an inert class (torchvision, PIL)."""

  __path__ = []

  def __getattr__(self, attr):
    if attr.startswith('__'):
      raise AttributeError(attr)
    value = type(attr, (), {'__init__': lambda self, *a, **k: None})
    setattr(self, attr, value)
    return value


class _PlaceholderFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
  def __init__(self, roots):
    self.roots = roots

  def find_spec(self, name, path=None, target=None):
    if name.split('.')[0] in self.roots:
      return importlib.machinery.ModuleSpec(name, self, is_package=True)
    return None

  def create_module(self, spec):
    return _Placeholder(spec.name)

  def exec_module(self, module):
    pass


def placeholder_missing(*roots):
  missing = []
  for root in roots:
    try:
      importlib.import_module(root)
    except Exception:
      sys.modules.pop(root, None)
      missing.append(root)
  if missing:
    sys.meta_path.insert(0, _PlaceholderFinder(set(missing)))
  return missing


class FixedLoader:
  """A data loader stub: the same list of (x, y) batches every epoch."""

  def __init__(self, x, y, idx, batch):
    self.batches = [
      (torch.tensor(x[idx[i : i + batch]]), torch.tensor(y[idx[i : i + batch]]))
      for i in range(0, len(idx), batch)
    ]

  def __iter__(self):
    return iter(self.batches)

  def __len__(self):
    return len(self.batches)


class Recorder:
  def __init__(self):
    self.models = []  # TinyFedCon instances in creation order
    self.inits = []
    self.trainings = []  # (client, start params, end params)
    self.steps = []  # (training index, loss, params, grads)
    self.global_after = []
    self.pending_loss = None
    self.client = None


REC = Recorder()


def param_list(module):
  return [p.detach().clone().numpy() for p in module.parameters()]


def make_tiny_fedcon():
  class TinyFedCon(torch.nn.Module):
    """ModelFedCon's head and outputs on an identity backbone (model.py)."""

    def __init__(self, base_model, out_dim, n_classes, net_configs=None):
      super().__init__()
      del base_model, net_configs
      self.features = torch.nn.Flatten()
      self.l1 = torch.nn.Linear(IN_DIM, IN_DIM)
      self.l2 = torch.nn.Linear(IN_DIM, out_dim)
      self.l3 = torch.nn.Linear(out_dim, n_classes)
      REC.models.append(self)
      REC.inits.append(param_list(self))

    def forward(self, x):
      h = self.features(x)
      h = h.squeeze()
      x = self.l1(h)
      x = torch.nn.functional.relu(x)
      x = self.l2(x)
      y = self.l3(x)
      return h, x, y

  return TinyFedCon


def make_data():
  rng = np.random.default_rng(0)
  n = sum(PART_SIZES)
  x = rng.normal(size=(n, IN_DIM))
  y = rng.integers(0, NUM_CLASSES, n).astype(np.int64)
  perm = rng.permutation(n)
  cuts = np.cumsum(PART_SIZES)[:-1]
  parts = [np.sort(p) for p in np.split(perm, cuts)]
  return x, y, parts


def party_rounds():
  """main.py's party_list_rounds for the run's settings, replayed."""
  random.seed(INIT_SEED)
  n = len(PART_SIZES)
  k = int(n * SAMPLE_FRACTION)
  return [random.sample(list(range(n)), k) for _ in range(ROUNDS)]


def run_main(repo, mu, x, y, parts):
  """Their main.py as a script; returns what was recorded and its globals."""
  global REC
  REC = Recorder()
  utils = importlib.import_module('utils')
  model = importlib.import_module('model')
  # main.py takes ModelFedCon from `from utils import *` (utils imported
  # it from model), so both names are replaced.
  model.ModelFedCon = utils.ModelFedCon = make_tiny_fedcon()
  dataidx_map = {i: parts[i] for i in range(len(parts))}
  all_idx = np.arange(len(y))
  train_dl_global = FixedLoader(x, y, all_idx, BATCH)
  test_dl = FixedLoader(x, y, all_idx, BATCH)
  client_dls = {i: FixedLoader(x, y, p, BATCH) for i, p in enumerate(parts)}

  def partition_data(dataset, datadir, logdir, partition, n_parties, beta):
    return x, y, x, y, dataidx_map, {}

  def get_dataloader(
    dataset, datadir, train_bs, test_bs, dataidxs=None, noise_level=0
  ):
    assert train_bs == BATCH
    if dataidxs is None:
      return train_dl_global, test_dl, list(range(len(y))), list(range(len(y)))
    (client,) = [i for i, p in dataidx_map.items() if p is dataidxs]
    REC.client = client
    return client_dls[client], test_dl, None, None

  compute_accuracy = utils.compute_accuracy

  def recording_accuracy(net, dataloader, *args, **kwargs):
    inner = getattr(net, 'module', net)
    if dataloader is train_dl_global and inner is REC.models[len(parts)]:
      REC.global_after.append(param_list(inner))
    elif dataloader is client_dls.get(REC.client):
      if REC.trainings and REC.trainings[-1][2] is None:
        REC.trainings[-1][2] = param_list(inner)
      else:
        REC.trainings.append([REC.client, param_list(inner), None])
    return compute_accuracy(net, dataloader, *args, **kwargs)

  utils.partition_data = partition_data
  utils.get_dataloader = get_dataloader
  utils.compute_accuracy = recording_accuracy
  logdir = tempfile.mkdtemp(prefix='moon_logs_')
  sys.argv = [
    'main.py',
    '--dataset=cifar10',
    '--model=simple-cnn',
    '--alg=moon',
    f'--lr={LR}',
    f'--mu={mu}',
    f'--temperature={TEMPERATURE}',
    f'--epochs={EPOCHS}',
    f'--comm_round={ROUNDS}',
    f'--n_parties={len(parts)}',
    f'--sample_fraction={SAMPLE_FRACTION}',
    f'--batch-size={BATCH}',
    f'--out_dim={OUT_DIM}',
    f'--reg={REG}',
    f'--init_seed={INIT_SEED}',
    '--partition=noniid',
    '--device=cuda:0',
    f'--logdir={logdir}/',
    f'--modeldir={logdir}/models/',
  ]
  out = runpy.run_path(os.path.join(repo, 'main.py'), run_name='__main__')
  return REC, out


def install_hooks():
  torch.nn.Module.cuda = lambda self, *a, **k: self
  torch.Tensor.cuda = lambda self, *a, **k: self
  backward = torch.Tensor.backward

  def recording_backward(self, *args, **kwargs):
    REC.pending_loss = float(self.detach())
    return backward(self, *args, **kwargs)

  torch.Tensor.backward = recording_backward

  def step_pre_hook(optimizer, args, kwargs):
    params = optimizer.param_groups[0]['params']
    REC.steps.append(
      (
        len(REC.trainings) - 1,
        REC.pending_loss,
        [p.detach().clone().numpy() for p in params],
        [p.grad.detach().clone().numpy() for p in params],
      )
    )

  register_optimizer_step_pre_hook(step_pre_hook)


def stacked(arrays_per_item):
  """[T][P] arrays -> {name: [T, ...]}."""
  return {
    name: np.stack([a[i] for a in arrays_per_item])
    for i, name in enumerate(PARAM_NAMES)
  }


def collect(rec, out, prefix, rounds):
  n = len(PART_SIZES)
  fixture = {}
  # Training order = the rounds' parties in main.py's order.
  expect = [c for r in rounds for c in r]
  got = [t[0] for t in rec.trainings]
  assert got == expect, (got, expect)
  assert len(rec.global_after) == ROUNDS
  train_round = np.repeat(np.arange(ROUNDS), len(rounds[0]))
  for key, value in stacked(rec.inits[:n]).items():
    fixture[f'{prefix}init_client__{key}'] = value
  for key, value in stacked(rec.inits[n : n + 1]).items():
    fixture[f'{prefix}init_global__{key}'] = value[0]
  for key, value in stacked([t[1] for t in rec.trainings]).items():
    fixture[f'{prefix}train_start__{key}'] = value
  for key, value in stacked([t[2] for t in rec.trainings]).items():
    fixture[f'{prefix}train_end__{key}'] = value
  for key, value in stacked(rec.global_after).items():
    fixture[f'{prefix}global_after__{key}'] = value
  fixture[f'{prefix}train_round'] = train_round
  fixture[f'{prefix}train_client'] = np.asarray(got)
  fixture[f'{prefix}step_train'] = np.asarray([s[0] for s in rec.steps])
  fixture[f'{prefix}step_loss'] = np.asarray([s[1] for s in rec.steps])
  for key, value in stacked([s[2] for s in rec.steps]).items():
    fixture[f'{prefix}step_param__{key}'] = value
  for key, value in stacked([s[3] for s in rec.steps]).items():
    fixture[f'{prefix}step_grad__{key}'] = value
  # The run's own final objects agree with what was recorded.
  final_global = param_list(out['global_model'])
  for a, b in zip(final_global, rec.global_after[-1]):
    np.testing.assert_array_equal(a, b)
  return fixture


def git_commit(repo, commit):
  if commit:
    return commit
  return subprocess.check_output(
    ['git', '-C', repo, 'rev-parse', 'HEAD'], text=True
  ).strip()


def main():
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  parser.add_argument('--repo', required=True)
  parser.add_argument('--out', default='tests/golden/moon.npz')
  parser.add_argument('--commit', default='')
  args = parser.parse_args()
  repo = os.path.abspath(args.repo)
  out_path = os.path.abspath(args.out)
  commit = git_commit(repo, args.commit)
  torch.set_default_dtype(torch.float64)
  placeholder_missing('torchvision', 'PIL')
  sys.path.insert(0, repo)
  os.chdir(tempfile.mkdtemp(prefix='moon_run_'))
  install_hooks()
  x, y, parts = make_data()
  rounds = party_rounds()
  fixture = {
    'repository': np.asarray('QinbinLi/MOON'),
    'commit': np.asarray(commit),
    'function': np.asarray(
      'main.py:train_net_fedcon (via local_train_net and the __main__ '
      'block with --alg=moon)'
    ),
    'images': x,
    'labels': y,
    'part_sizes': np.asarray(PART_SIZES),
    'parts': np.concatenate(parts),
    'party_rounds': np.asarray(rounds),
    'mus': np.asarray(MUS),
    'temperature': np.asarray(TEMPERATURE),
    'lr': np.asarray(LR),
    'momentum': np.asarray(MOMENTUM),
    'weight_decay': np.asarray(REG),
    'batch_size': np.asarray(BATCH),
    'epochs': np.asarray(EPOCHS),
    'rounds': np.asarray(ROUNDS),
    'init_seed': np.asarray(INIT_SEED),
    'param_names': np.asarray(PARAM_NAMES),
  }
  for mu in MUS:
    # A fresh import of their modules per run (main.py reads them by name).
    for name in ('utils', 'model', 'datasets', 'resnetcifar'):
      sys.modules.pop(name, None)
    rec, out = run_main(repo, mu, copy.deepcopy(x), y, parts)
    fixture.update(collect(rec, out, f'mu{int(mu)}__', rounds))
  os.makedirs(os.path.dirname(out_path), exist_ok=True)
  np.savez_compressed(out_path, **fixture)
  print(f'wrote {out_path} ({os.path.getsize(out_path)} bytes)')


if __name__ == '__main__':
  main()
