"""FedAvg, FedProx, SCAFFOLD and Dirichlet-partition fixtures from NIID-Bench.

Runs the code of Xtra-Computing/NIID-Bench (Li, Diao, Chen and He,
'Federated Learning on Non-IID Data Silos: An Experimental Study', ICDE
2022) unchanged, in float64 on CPU, and writes four fixtures for
tests/test_golden_moon_niid.py:

  /path/to/torch-env/bin/python benchmarks/crosscheck/niid_bench.py \\
    --repo=/path/to/NIID-Bench [--out_dir=tests/golden] [--commit=SHA]

(--commit names the checkout's commit where --repo is no git work tree,
e.g. a ``git archive`` of 61b901ab645e62391772e9898384c2c3485b7a6c.)

* fedavg_niid_bench.npz, fedprox_niid_bench.npz and scaffold_niid_bench.npz:
  ``experiments.py`` run as a script (``runpy``, its ``__main__`` block
  with ``--alg=fedavg``, ``--alg=fedprox`` or ``--alg=scaffold``): the party
  sampling, ``local_train_net`` -> ``train_net`` (FedAvg: plain CE, SGD
  with their weight decay), ``local_train_net_fedprox``
  -> ``train_net_fedprox`` (CE + mu/2 ||w - w_global||^2 per batch),
  ``local_train_net_scaffold`` -> ``train_net_scaffold`` (a local SGD step,
  then ``w -= lr (c - c_i)``; option II's ``c_i+ = c_i - c + (x - y_i) /
  (K lr)``; the server's ``c += sum_S (c_i+ - c_i) / N``) and the
  size-weighted model average. Recorded (hooks that only read): every
  local step's loss (the tensor ``backward`` is called on), parameters
  before the step and gradients (a global optimizer step pre-hook); every
  local training's start and end parameters and the global model after
  each round (their ``compute_accuracy``, wrapped); every control variate
  they load (``load_state_dict`` of the control-variate models, wrapped).
  FedProx is run for mu = 0.001 (experiments.py's default), 0.01 (our
  default) and 0.5 (large: the proximal term dominates).
* niid_bench_partition.npz: ``utils.py: partition_data`` with
  ``partition='noniid-labeldir'`` on fixed labels (500 examples, 10
  classes of unequal sizes), after ``np.random.seed(s)`` as their
  ``__main__`` does: exact splits for 3 seeds x 4 settings (10 or 5
  parties, beta 0.5 or 0.1), each with how many Dirichlet draws it took
  (a retry draws K more), and the client sizes and classes held for 300
  seeds at beta 0.5 and 0.1 (10 parties), for statistics.

Stubs: the model for FedProx / SCAFFOLD is their own ``PerceptronModel``
(``nn.Linear(3, 2)``, what ``init_nets`` builds for ``--dataset=generated``),
subclassed only to record its initial weights; the data
(``partition_data`` returns a fixed 3-party split (3, 3, 13) of 19 random
float64 examples; ``get_dataloader`` returns fixed batches of 4 in
partition order, the same every epoch; ``load_cifar10_data`` returns the
fixed labels for the partition fixture), the device (CPU), and torchvision
/ PIL (not installed with this torch; a placeholder module: only their
data code uses them).

Settings that differ from experiments.py's defaults and why: the model
and data (tiny, so the tests run in seconds); 3 parties, 2 a round
(``--sample=0.7``), 3 rounds, 2 local epochs, batch 4 (small; partial
participation so that SCAFFOLD's 1/N differs from 1/|S|, unequal parties
so that K and the weights differ); lr 2^-6 = 0.015625 (default 0.01: a
binary fraction, because our engine hands SCAFFOLD's option II the rate in
float32); ``--init_seed=0`` draws parties {1, 2}, {0, 2}, {0, 2}, and the
sizes make every round's two parties hold 16 examples, so that the FedAvg
weights n_k / 16 are exact in binary (our engine normalises them in
float32), and the parties' local steps K = 2, 2, 8 (so that option II's
1 / (K lr) is exact in binary: our engine computes it in float32). Kept:
SGD, ``--rho=0`` (no momentum), weight decay ``--reg=1e-5``,
``--is_same_initial=1``, their random (nonzero) initial control variates.
"""

import argparse
import importlib
import importlib.abc
import importlib.machinery
import logging
import os
import runpy
import subprocess
import sys
import tempfile
import types

import numpy as np
import torch
from torch.optim.optimizer import register_optimizer_step_pre_hook

IN_DIM = 3  # PerceptronModel's defaults: nn.Linear(3, 2)
NUM_CLASSES = 2
PART_SIZES = (3, 3, 13)  # batches of 4: (3), (3), (4, 4, 4, 1)
BATCH = 4
EPOCHS = 2
ROUNDS = 3
SAMPLE = 0.7  # int(3 * 0.7) = 2 parties a round
LR = 2.0**-6
REG = 1e-5
INIT_SEED = 0
FEDPROX_MUS = (0.001, 0.01, 0.5)
PARAM_NAMES = ('fc1.weight', 'fc1.bias')

PARTITION_N = 500
PARTITION_SETTINGS = ((10, 0.5), (10, 0.1), (5, 0.5), (5, 0.1))
PARTITION_SEEDS = (0, 1, 2)
STATS_SEEDS = 300
STATS_SETTINGS = ((10, 0.5), (10, 0.1))


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
    self.models = []  # PerceptronModel instances in creation order
    self.inits = []
    self.trainings = []  # [client, start params, end params]
    self.steps = []  # (training index, loss, params, grads)
    self.global_after = []
    self.loads = []  # (model index, params) of control-variate loads
    self.pending_loss = None
    self.client = None


REC = Recorder()


def param_list(module):
  return [p.detach().clone().numpy() for p in module.parameters()]


def install_hooks():
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
  load_state_dict = torch.nn.Module.load_state_dict

  def recording_load(self, *args, **kwargs):
    out = load_state_dict(self, *args, **kwargs)
    index = [i for i, m in enumerate(REC.models) if m is self]
    if index and index[0] > len(PART_SIZES):  # a control variate
      REC.loads.append((index[0], param_list(self)))
    return out

  torch.nn.Module.load_state_dict = recording_load


def make_data():
  rng = np.random.default_rng(1)
  n = sum(PART_SIZES)
  x = rng.normal(size=(n, IN_DIM))
  y = rng.integers(0, NUM_CLASSES, n).astype(np.int64)
  perm = rng.permutation(n)
  parts = np.split(perm, np.cumsum(PART_SIZES)[:-1])
  return x, y, [np.sort(p) for p in parts]


def party_rounds():
  """experiments.py's ``selected`` per round for the run's settings,
  replayed (np.random.seed(init_seed), then one shuffle a round)."""
  np.random.seed(INIT_SEED)
  out = []
  for _ in range(ROUNDS):
    arr = np.arange(len(PART_SIZES))
    np.random.shuffle(arr)
    out.append(arr[: int(len(PART_SIZES) * SAMPLE)])
  return out


def run_experiments(repo, alg, x, y, parts, mu=0.0):
  """Their experiments.py as a script; returns the recorder and globals."""
  global REC
  REC = Recorder()
  utils = importlib.import_module('utils')
  model = importlib.import_module('model')

  class PerceptronModel(model.PerceptronModel):
    """Their PerceptronModel, recording each instance and its init."""

    def __init__(self, *args, **kwargs):
      super().__init__(*args, **kwargs)
      REC.models.append(self)
      REC.inits.append(param_list(self))

  # experiments.py takes the name from `from utils import *` (which utils
  # imported from model); model.py's own name stays, for its super() call.
  utils.PerceptronModel = PerceptronModel
  dataidx_map = {i: parts[i] for i in range(len(parts))}
  all_idx = np.arange(len(y))
  train_dl_global = FixedLoader(x, y, all_idx, BATCH)
  test_dl = FixedLoader(x, y, all_idx, BATCH)
  client_dls = {i: FixedLoader(x, y, p, BATCH) for i, p in enumerate(parts)}

  def partition_data(dataset, datadir, logdir, partition, n_parties, beta):
    return x, y, x, y, dataidx_map, {}

  def get_dataloader(
    dataset,
    datadir,
    train_bs,
    test_bs,
    dataidxs=None,
    noise_level=0,
    net_id=None,
    total=0,
  ):
    assert train_bs == BATCH and noise_level == 0
    if dataidxs is None:
      return train_dl_global, test_dl, list(all_idx), list(all_idx)
    (client,) = [i for i, p in dataidx_map.items() if p is dataidxs]
    REC.client = client
    return client_dls[client], test_dl, None, None

  compute_accuracy = utils.compute_accuracy

  def recording_accuracy(net, dataloader, *args, **kwargs):
    loader = dataloader
    if isinstance(loader, list) and len(loader) == 1:
      loader = loader[0]  # train_net_scaffold wraps its loader in a list
    if loader is train_dl_global and net is REC.models[len(parts)]:
      REC.global_after.append(param_list(net))
    elif loader is client_dls.get(REC.client):
      if REC.trainings and REC.trainings[-1][2] is None:
        REC.trainings[-1][2] = param_list(net)
      else:
        REC.trainings.append([REC.client, param_list(net), None])
    return compute_accuracy(net, dataloader, *args, **kwargs)

  utils.partition_data = partition_data
  utils.get_dataloader = get_dataloader
  utils.compute_accuracy = recording_accuracy
  logdir = tempfile.mkdtemp(prefix='niid_logs_')
  sys.argv = [
    'experiments.py',
    '--dataset=generated',
    '--model=mlp',
    f'--alg={alg}',
    f'--lr={LR}',
    f'--mu={mu}',
    f'--epochs={EPOCHS}',
    f'--comm_round={ROUNDS}',
    f'--n_parties={len(parts)}',
    f'--sample={SAMPLE}',
    f'--batch-size={BATCH}',
    f'--reg={REG}',
    '--rho=0',
    f'--init_seed={INIT_SEED}',
    '--is_same_initial=1',
    '--partition=noniid-labeldir',
    '--device=cpu',
    f'--logdir={logdir}/',
    f'--modeldir={logdir}/models/',
  ]
  out = runpy.run_path(
    os.path.join(repo, 'experiments.py'), run_name='__main__'
  )
  return REC, out


def stacked(arrays_per_item, prefix):
  return {
    f'{prefix}__{name}': np.stack([a[i] for a in arrays_per_item])
    for i, name in enumerate(PARAM_NAMES)
  }


def collect_training(rec, rounds, prefix):
  n = len(PART_SIZES)
  expect = [int(c) for r in rounds for c in sorted(r)]
  got = [t[0] for t in rec.trainings]
  assert got == expect, (got, expect)
  assert len(rec.global_after) == ROUNDS
  fixture = {
    f'{prefix}train_client': np.asarray(got),
    f'{prefix}train_round': np.repeat(np.arange(ROUNDS), len(rounds[0])),
    f'{prefix}step_train': np.asarray([s[0] for s in rec.steps]),
    f'{prefix}step_loss': np.asarray([s[1] for s in rec.steps]),
  }
  fixture.update(stacked(rec.inits[n : n + 1], f'{prefix}init_global'))
  fixture.update(stacked([t[1] for t in rec.trainings], f'{prefix}train_start'))
  fixture.update(stacked([t[2] for t in rec.trainings], f'{prefix}train_end'))
  fixture.update(stacked(rec.global_after, f'{prefix}global_after'))
  fixture.update(stacked([s[2] for s in rec.steps], f'{prefix}step_param'))
  fixture.update(stacked([s[3] for s in rec.steps], f'{prefix}step_grad'))
  return fixture


def collect_scaffold(rec, out):
  """Control variates: their initial c (= every c_i), then each training's
  new c_i and each round's new c, from the recorded loads."""
  n = len(PART_SIZES)
  c_global = 2 * n + 1
  loads = rec.loads
  # init: each c_i loads c_global's initial state.
  initial = list(loads[:n])
  assert [i for i, _ in initial] == list(range(n + 1, 2 * n + 1))
  for _, params in initial:
    for a, b in zip(params, rec.inits[c_global]):
      np.testing.assert_array_equal(a, b)
  rest = loads[n:]
  c_local_after, c_global_after = [], []
  for index, params in rest:
    if index == c_global:
      c_global_after.append(params)
    else:
      c_local_after.append((index - n - 1, params))
  assert [k for k, _ in c_local_after] == [t[0] for t in rec.trainings]
  assert len(c_global_after) == ROUNDS
  final = param_list(out['c_global'])
  for a, b in zip(final, c_global_after[-1]):
    np.testing.assert_array_equal(a, b)
  fixture = stacked(rec.inits[c_global : c_global + 1], 'c_init')
  fixture.update(stacked([p for _, p in c_local_after], 'c_local_after'))
  fixture.update(stacked(c_global_after, 'c_global_after'))
  return fixture


def partition_fixture():
  """Their partition_data on fixed labels: exact splits and statistics."""
  utils = importlib.import_module('utils')
  rng = np.random.default_rng(2)
  # 10 classes of unequal sizes, every class present (their loop runs over
  # K = 10 classes and draws for each, present or not).
  probs = rng.dirichlet(np.full(10, 5.0))
  labels = rng.choice(10, PARTITION_N, p=probs)
  labels[:10] = np.arange(10)
  labels = rng.permutation(labels).astype(np.int64)
  utils.load_cifar10_data = lambda datadir: (
    np.zeros((PARTITION_N, 1)),
    labels,
    np.zeros((1, 1)),
    labels[:1],
  )
  dirichlet = np.random.dirichlet
  calls = [0]

  def counting_dirichlet(*args, **kwargs):
    calls[0] += 1
    return dirichlet(*args, **kwargs)

  np.random.dirichlet = counting_dirichlet
  logging.disable(logging.INFO)  # their per-split class statistics

  def run(n_parties, beta, seed):
    np.random.seed(seed)
    calls[0] = 0
    out = utils.partition_data(
      'cifar10', '', '', 'noniid-labeldir', n_parties, beta=beta
    )
    net_dataidx_map = out[4]
    return [np.asarray(net_dataidx_map[j]) for j in range(n_parties)], calls[0]

  fixture = {'partition_labels': labels}
  settings, splits, draws = [], [], []
  for n_parties, beta in PARTITION_SETTINGS:
    for seed in PARTITION_SEEDS:
      parts, count = run(n_parties, beta, seed)
      settings.append((n_parties, beta, seed))
      splits.append(parts)
      draws.append(count)
  fixture['exact_settings'] = np.asarray(settings)
  fixture['exact_dirichlet_draws'] = np.asarray(draws)
  fixture['exact_sizes'] = np.concatenate(
    [[len(p) for p in parts] for parts in splits]
  ).astype(np.int64)
  fixture['exact_indices'] = np.concatenate(
    [np.concatenate(parts) for parts in splits]
  ).astype(np.int16)
  for i, (n_parties, beta) in enumerate(STATS_SETTINGS):
    sizes, classes, tries = [], [], []
    for seed in range(STATS_SEEDS):
      parts, count = run(n_parties, beta, seed)
      sizes.append([len(p) for p in parts])
      classes.append([len(np.unique(labels[p])) for p in parts])
      tries.append(count // 10)
    fixture[f'stats{i}_setting'] = np.asarray((n_parties, beta))
    fixture[f'stats{i}_sizes'] = np.asarray(sizes, np.int16)
    fixture[f'stats{i}_classes'] = np.asarray(classes, np.int8)
    fixture[f'stats{i}_attempts'] = np.asarray(tries, np.int16)
  np.random.dirichlet = dirichlet
  logging.disable(logging.NOTSET)
  return fixture


def git_commit(repo, commit):
  if commit:
    return commit
  return subprocess.check_output(
    ['git', '-C', repo, 'rev-parse', 'HEAD'], text=True
  ).strip()


def common(commit, function):
  return {
    'repository': np.asarray('Xtra-Computing/NIID-Bench'),
    'commit': np.asarray(commit),
    'function': np.asarray(function),
  }


def run_settings(x, y, parts, rounds):
  return {
    'images': x,
    'labels': y,
    'part_sizes': np.asarray(PART_SIZES),
    'parts': np.concatenate(parts),
    'party_rounds': np.asarray(rounds),
    'lr': np.asarray(LR),
    'momentum': np.asarray(0.0),
    'weight_decay': np.asarray(REG),
    'batch_size': np.asarray(BATCH),
    'epochs': np.asarray(EPOCHS),
    'rounds': np.asarray(ROUNDS),
    'init_seed': np.asarray(INIT_SEED),
    'param_names': np.asarray(PARAM_NAMES),
  }


def fresh_modules():
  for name in ('utils', 'model', 'datasets', 'resnetcifar', 'vggmodel'):
    sys.modules.pop(name, None)


def save(path, fixture):
  np.savez_compressed(path, **fixture)
  print(f'wrote {path} ({os.path.getsize(path)} bytes)')


def main():
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  parser.add_argument('--repo', required=True)
  parser.add_argument('--out_dir', default='tests/golden')
  parser.add_argument('--commit', default='')
  args = parser.parse_args()
  repo = os.path.abspath(args.repo)
  out_dir = os.path.abspath(args.out_dir)
  commit = git_commit(repo, args.commit)
  torch.set_default_dtype(torch.float64)
  placeholder_missing('torchvision', 'PIL')
  sys.path.insert(0, repo)
  os.chdir(tempfile.mkdtemp(prefix='niid_run_'))
  os.makedirs(out_dir, exist_ok=True)

  fixture = common(
    commit, "utils.py:partition_data (partition='noniid-labeldir')"
  )
  fixture.update(partition_fixture())
  save(os.path.join(out_dir, 'niid_bench_partition.npz'), fixture)

  install_hooks()
  x, y, parts = make_data()
  rounds = party_rounds()
  fixture = common(
    commit,
    'experiments.py:train_net_fedprox (via local_train_net_fedprox and '
    'the __main__ block with --alg=fedprox)',
  )
  fixture.update(run_settings(x, y, parts, rounds))
  fixture['mus'] = np.asarray(FEDPROX_MUS)
  for i, mu in enumerate(FEDPROX_MUS):
    fresh_modules()
    rec, _ = run_experiments(repo, 'fedprox', x, y, parts, mu=mu)
    fixture.update(collect_training(rec, rounds, f'run{i}__'))
  save(os.path.join(out_dir, 'fedprox_niid_bench.npz'), fixture)

  fresh_modules()
  rec, _ = run_experiments(repo, 'fedavg', x, y, parts)
  fixture = common(
    commit,
    'experiments.py:train_net (via local_train_net and the __main__ block '
    'with --alg=fedavg)',
  )
  fixture.update(run_settings(x, y, parts, rounds))
  fixture.update(collect_training(rec, rounds, ''))
  save(os.path.join(out_dir, 'fedavg_niid_bench.npz'), fixture)

  fresh_modules()
  rec, out = run_experiments(repo, 'scaffold', x, y, parts)
  fixture = common(
    commit,
    'experiments.py:train_net_scaffold and local_train_net_scaffold (via '
    'the __main__ block with --alg=scaffold)',
  )
  fixture.update(run_settings(x, y, parts, rounds))
  fixture.update(collect_training(rec, rounds, ''))
  fixture.update(collect_scaffold(rec, out))
  save(os.path.join(out_dir, 'scaffold_niid_bench.npz'), fixture)


if __name__ == '__main__':
  main()
