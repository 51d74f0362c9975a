"""Shared stubs for running the FedRCL / FedACG authors' code (CPU, float64).

github.com/skynbe/FedRCL and github.com/geehokim/FedACG share one framework
(hydra configs, trainers/base_trainer.py Trainer, clients/, servers/). This
module lets benchmarks/crosscheck/fedrcl.py and fedagm.py import it and run
its Trainer.train loop UNCHANGED with stubs for the data, the model, the
device, evaluation and the import-only dependencies:

  * import-only dependencies (torchvision, PIL, torchmetrics, matplotlib,
    wandb, imageio, torchinfo, umap, netcal, coloredlogs): the package
    __init__s import them for data loading, plotting and logging; nothing
    the runs here call uses them, so they are empty modules. omegaconf, tqdm
    and tabulate are real (``pip install --target /path/to/pydeps/fedrcl
    omegaconf tqdm tabulate``; put that directory on PYTHONPATH), and so is
    scikit-learn, which evalers/base_evaler.py and servers/base.py import
    at module level (install it into the torch environment).
  * data: `ArrayDataset`, fixed float64 inputs and int labels; the clients'
    index lists are written to the split file Trainer.__init__ reads
    (utils/data.py get_dataset), so the partition is fixed.
  * evaluation: `RecordingEvaler` stores the global model each round
    (Trainer.evaluate hands it the model after the server step) instead of
    computing a test accuracy.
  * configs: the released yaml files composed as hydra's defaults list
    does (configs/config.yaml + one file per group), then the overrides the
    caller names (clients, rounds, batch size, paths, CPU).

This module does not import fedjax_metric.
"""

import importlib.abc
import importlib.machinery
import os
import subprocess
import sys
import types

import numpy as np
import torch

IMPORT_ONLY = (
  'torchvision',
  'PIL',
  'torchmetrics',
  'matplotlib',
  'wandb',
  'imageio',
  'torchinfo',
  'umap',
  'netcal',
  'coloredlogs',
)


class _EmptyModule(types.ModuleType):
  """Every attribute a fresh empty class: importable and subclassable; the
  code run here never calls it."""

  def __getattr__(self, name):
    if name.startswith('__'):
      raise AttributeError(name)
    return type(name, (), {})


class _StubFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
  """Imports of the top-level packages in ``stubbed`` give empty modules."""

  def __init__(self, stubbed=IMPORT_ONLY):
    self.stubbed = tuple(stubbed)

  def find_spec(self, fullname, path, target=None):
    if fullname.split('.')[0] in self.stubbed:
      return importlib.machinery.ModuleSpec(fullname, self, is_package=True)
    return None

  def create_module(self, spec):
    module = _EmptyModule(spec.name)
    module.__path__ = []
    return module

  def exec_module(self, module):
    pass


def add_repo(repo, stubbed=IMPORT_ONLY):
  """Puts the checkout at ``repo`` first on sys.path, with the packages in
  ``stubbed`` imported as empty modules."""
  if not any(isinstance(f, _StubFinder) for f in sys.meta_path):
    sys.meta_path.insert(0, _StubFinder(stubbed))
  sys.path.insert(0, os.path.abspath(repo))


def repo_commit(repo, commit=''):
  """``commit`` or the checkout's HEAD (40 hex digits)."""
  commit = (
    commit
    or subprocess.run(
      ['git', '-C', repo, 'rev-parse', 'HEAD'],
      capture_output=True,
      text=True,
      check=True,
    ).stdout.strip()
  )
  assert len(commit) == 40, commit
  return commit


def compose(repo, groups, overrides):
  """configs/config.yaml with one yaml per group (hydra's defaults list:
  ``groups`` maps 'client' -> 'fedrcl' etc.), then ``overrides`` merged."""
  from omegaconf import OmegaConf

  cfg = OmegaConf.load(os.path.join(repo, 'configs/config.yaml'))
  defaults = cfg.pop('defaults')
  chosen = {}
  for entry in defaults:
    if isinstance(entry, str) or 'override' in next(iter(entry)):
      continue
    ((group, name),) = entry.items()
    chosen[group] = name
  chosen.update(groups)
  for group, name in chosen.items():
    path = os.path.join(repo, 'configs', group, f'{name}.yaml')
    cfg[group] = OmegaConf.load(path)
  return OmegaConf.merge(cfg, OmegaConf.create(overrides))


class ArrayDataset(torch.utils.data.Dataset):
  """Fixed inputs [N, ...] and labels [N] (``classes``: what the clients
  read the number of classes from)."""

  def __init__(self, inputs, labels, num_classes):
    self.inputs = torch.as_tensor(inputs)
    self.labels = torch.as_tensor(labels, dtype=torch.long)
    self.classes = list(range(num_classes))

  def __len__(self):
    return len(self.labels)

  def __getitem__(self, i):
    return self.inputs[i], self.labels[i]


class RecordingEvaler:
  """Stands in for evalers/base_evaler.py: keeps each round's model."""

  records = []

  def __init__(self, test_loader, device, args, **kwargs):
    del test_loader, device, args, kwargs
    RecordingEvaler.records = []

  def eval(self, model, epoch):
    RecordingEvaler.records.append(
      (epoch, {k: v.detach().clone() for k, v in model.state_dict().items()})
    )
    return {'acc': 0.0}


def write_split(args, parts):
  """The file utils/data.py get_dataset reads for mode 'iid' (a dict
  client -> example indices), so Trainer.__init__ takes ``parts``."""
  assert args.split.mode == 'iid' and not args.split.unbalanced
  directory = os.path.join(
    args.dataset.client_path, args.dataset.name, 'balanced'
  )
  os.makedirs(directory, exist_ok=True)
  path = os.path.join(directory, f'iid_clients{args.trainer.num_clients}.txt')
  with open(path, 'w') as f:
    print({c: [int(i) for i in p] for c, p in enumerate(parts)}, file=f)


def run_trainer(args, model, client_type, server, dataset, parts):
  """Trainer.__init__ and Trainer.train of the checkout on sys.path,
  unchanged, on CPU, seeded by utils/misc.py initalize_random_seed as
  federated_train.py does (so the fixture is reproducible bit for bit);
  returns the global model after each round and the trainer."""
  from trainers.base_trainer import Trainer
  from utils import initalize_random_seed

  write_split(args, parts)
  initalize_random_seed(args)  # as federated_train.py: DataLoader's shuffle
  trainer = Trainer(
    model=model,
    client_type=client_type,
    server=server,
    evaler_type=RecordingEvaler,
    datasets={'train': dataset, 'test': dataset},
    device=torch.device('cpu'),
    args=args,
  )
  trainer.train()
  records = RecordingEvaler.records
  assert [e for e, _ in records] == list(range(args.trainer.global_rounds))
  return [state for _, state in records], trainer


def state_arrays(prefix, state):
  """``{prefix/name: array}`` of a state dict."""
  return {f'{prefix}/{k}': v.detach().numpy().copy() for k, v in state.items()}


def uint8_images(rng, num, shape=(6, 6, 1)):
  return rng.integers(0, 256, (num,) + shape).astype(np.uint8)
