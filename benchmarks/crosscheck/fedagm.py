"""FedAGM / FedACG's server (and FedAvgM's), run by the authors' own code.

Runs, UNCHANGED, github.com/geehokim/FedACG (Kim, Kim and Han,
'Communication-Efficient Federated Learning with Accelerated Client
Gradient', FedAGM arXiv:2201.03172 / FedACG CVPR 2024; the framework of
FedRCL's Table 5): trainers/base_trainer.py Trainer.__init__ and
Trainer.train (the round loop: FedACG lookahead, client deltas, server
step), servers/base.py ServerM (set_momentum, FedACG_lookahead, aggregate)
and, in part B, clients/base_client.py Client (CE + proximal term, SGD,
weight decay, gradient clipping, per-epoch LambdaLR). Writes the inputs and
the models it produced to tests/golden/fedagm.npz, which
tests/test_golden_fedrcl.py compares with fedjax_metric's FedAGM
(algorithms/fedagm.py lookahead / accelerate, optimizers 'fedagm') and
FedAvgM (server 'sgd' with momentum):

  PYTHONPATH=/path/to/pydeps/fedrcl /path/to/torch-env/bin/python \
      benchmarks/crosscheck/fedagm.py --repo=/path/to/FedACG \
      --out=tests/golden/fedagm.npz

Part A, the server on fixed deltas: every client returns the model it
received plus a fixed random delta of that round (a stub client), for 4
rounds of 3 clients, under configs/server/FedACG.yaml (lambda 0.85,
FedACG: True) and configs/server/FedAvgM.yaml (lambda 0.4). Recorded: the
model each client received (the lookahead) and the global model after each
round (what the trainer evaluates), and the final server momentum.

Part B, whole rounds: the authors' Client with configs/client/ACG.yaml (CE
+ 1e-3 * ||theta - received||^2) under FedACG.yaml, softmax regression
(one torch.nn.Linear on the flattened image / 255), 3 clients of 10, 14 and
8 examples, 3 rounds of 5 local epochs; the released trainer/base.yaml
values otherwise (lr 0.1, x 0.998 per round and per local epoch, weight
decay 1e-3, clip 10, batch 50: each epoch one full batch, so DataLoader's
shuffle changes nothing but the summation order). Recorded: the initial
weights, the data, the partition, the global model after each round and
the final server momentum. A second run with the proximal weight 0.05
(``prox_heavy``) makes the proximal term large enough to be told apart at
float32 precision (the comparison runs fedjax_metric's float32 engine).

Stubs: data (ArrayDataset), model (a torch Linear returning
{'logit': ...}, num_layers 1), device (CPU), evaluation (records the global
model), the import-only dependencies (benchmarks/crosscheck/
fedrcl_harness.py). Settings that differ from the authors' defaults and why:
  * float64 (``torch.set_default_dtype``), use_amp False (their default is
    fp16 autocast on a GPU): a float64 fixture.
  * trainer.num_clients 3, participation_rate 1.0 (all clients, in order:
    no random cohort), global_rounds 4 (A) / 3 (B), split.mode 'iid' with
    the partition given (the split file), pin_memory False (CPU), paths in
    a temporary directory. Part B: prox_heavy's weight 0.05 (see above).

This script does not import fedjax_metric.
"""

import argparse
import copy
import os
import tempfile

import fedrcl_harness as harness
import numpy as np
import torch

REPOSITORY = 'geehokim/FedACG'
FUNCTION = (
  'trainers/base_trainer.py:Trainer.train, servers/base.py:ServerM '
  '(set_momentum, FedACG_lookahead, aggregate), clients/base_client.py:Client'
)
NUM_CLIENTS = 3
NUM_CLASSES = 3


class LinearModel(torch.nn.Module):
  """Softmax regression: what the clients' _algorithm reads."""

  def __init__(self, dim, weight, bias):
    super().__init__()
    self.fc = torch.nn.Linear(dim, NUM_CLASSES)
    with torch.no_grad():
      self.fc.weight.copy_(torch.as_tensor(weight))
      self.fc.bias.copy_(torch.as_tensor(bias))
    self.num_layers = 1

  def forward(self, x):
    return {'logit': self.fc(x)}


class FixedDeltaClient:
  """Part A's client: returns the model it received plus DELTAS[round][i]
  (the interface Trainer.local_update calls: setup, local_train)."""

  DELTAS = None
  received = []

  def __init__(self, args, client_index, model):
    self.args = args
    self.client_index = client_index
    self.model = model

  def setup(self, state_dict, device, local_dataset, global_epoch, **kwargs):
    self.state = copy.deepcopy(state_dict)
    self.epoch = global_epoch
    FixedDeltaClient.received.append(
      (global_epoch, self.client_index, copy.deepcopy(state_dict))
    )

  def local_train(self, global_epoch, **kwargs):
    delta = FixedDeltaClient.DELTAS[global_epoch][self.client_index]
    out = {k: v + torch.as_tensor(delta[k]) for k, v in self.state.items()}
    return out, {}


def overrides(tmp, rounds, **extra):
  out = {
    'use_amp': False,
    'pin_memory': False,
    'num_workers': 0,
    'wandb': False,
    'multiprocessing': False,
    'checkpoint_path': os.path.join(tmp, 'checkpoints'),
    'save_freq': 0,
    'eval': {'freq': 1},
    'split': {'mode': 'iid', 'unbalanced': False},
    'dataset': {'client_path': os.path.join(tmp, 'client_data')},
    'trainer': {
      'num_clients': NUM_CLIENTS,
      'participation_rate': 1.0,
      'global_rounds': rounds,
    },
  }
  for key, value in extra.items():
    out.setdefault(key, {}).update(value)
  return out


def part_a(repo, tmp, server_name, rng):
  """The server on fixed deltas; returns the fixture entries."""
  from servers.base import ServerM

  rounds = 4
  weight = rng.normal(size=(NUM_CLASSES, 4))
  bias = rng.normal(size=(NUM_CLASSES,))
  deltas = [
    [
      {
        'fc.weight': 0.1 * rng.normal(size=(NUM_CLASSES, 4)),
        'fc.bias': 0.1 * rng.normal(size=(NUM_CLASSES,)),
      }
      for _ in range(NUM_CLIENTS)
    ]
    for _ in range(rounds)
  ]
  FixedDeltaClient.DELTAS = deltas
  FixedDeltaClient.received = []
  args = harness.compose(repo, {'server': server_name}, overrides(tmp, rounds))
  data = harness.ArrayDataset(np.zeros((6, 4)), np.arange(6) % 3, 3)
  parts = [[0, 1], [2, 3], [4, 5]]
  models, trainer = harness.run_trainer(
    args,
    LinearModel(4, weight, bias),
    FixedDeltaClient,
    ServerM(args),
    data,
    parts,
  )
  p = f'a_{server_name}'
  out = {
    f'{p}/momentum': np.array(args.server.momentum),
    f'{p}/fedacg': np.array(bool(args.server.get('FedACG'))),
    f'{p}/init/fc.weight': weight,
    f'{p}/init/fc.bias': bias,
  }
  for r in range(rounds):
    for c in range(NUM_CLIENTS):
      for k, v in deltas[r][c].items():
        out[f'{p}/delta/{r}/{c}/{k}'] = v
    out.update(harness.state_arrays(f'{p}/global/{r}', models[r]))
  for epoch, client, state in FixedDeltaClient.received:
    if client == 0:
      out.update(harness.state_arrays(f'{p}/received/{epoch}', state))
    else:  # every client gets the same model
      for k, v in state.items():
        first = out[f'{p}/received/{epoch}/{k}']
        assert np.array_equal(v.numpy(), first)
  out.update(
    harness.state_arrays(f'{p}/final_momentum', trainer.server.global_momentum)
  )
  print(p, 'final', {k: v.flatten()[:3] for k, v in models[-1].items()})
  return out


def part_b(repo, tmp, rng, name, prox_weight):
  """Whole FedACG rounds with the authors' client; fixture entries."""
  from clients.base_client import Client
  from servers.base import ServerM

  rounds = 3
  sizes = (10, 14, 8)
  images = harness.uint8_images(rng, sum(sizes))
  labels = rng.integers(0, NUM_CLASSES, sum(sizes))
  order = rng.permutation(sum(sizes))
  parts = np.split(order, np.cumsum(sizes)[:-1])
  dim = int(np.prod(images.shape[1:]))
  weight = 0.1 * rng.normal(size=(NUM_CLASSES, dim))
  bias = 0.1 * rng.normal(size=(NUM_CLASSES,))
  args = harness.compose(
    repo,
    {'server': 'FedACG', 'client': 'ACG'},
    overrides(tmp, rounds, client={'prox_loss': {'weight': prox_weight}}),
  )
  data = harness.ArrayDataset(
    images.reshape(len(images), -1).astype(np.float64) / 255.0,
    labels,
    NUM_CLASSES,
  )
  models, trainer = harness.run_trainer(
    args, LinearModel(dim, weight, bias), Client, ServerM(args), data, parts
  )
  p = f'b_{name}'
  out = {
    f'{p}/images': images,
    f'{p}/labels': labels,
    f'{p}/init/fc.weight': weight,
    f'{p}/init/fc.bias': bias,
    f'{p}/prox_weight': np.array(float(args.client.prox_loss.weight)),
    f'{p}/momentum': np.array(float(args.server.momentum)),
    f'{p}/local_lr': np.array(float(args.trainer.local_lr)),
    f'{p}/local_lr_decay': np.array(float(args.trainer.local_lr_decay)),
    f'{p}/local_epochs': np.array(int(args.trainer.local_epochs)),
    f'{p}/batch_size': np.array(int(args.batch_size)),
    f'{p}/weight_decay': np.array(float(args.optimizer.wd)),
    f'{p}/optimizer_momentum': np.array(float(args.optimizer.momentum)),
    f'{p}/grad_clip_norm': np.array(10.0),  # hard-coded in local_train
  }
  assert args.batch_size >= max(sizes)  # one full batch per local epoch
  for c, part in enumerate(parts):
    out[f'{p}/part/{c}'] = part
  for r in range(rounds):
    out.update(harness.state_arrays(f'{p}/global/{r}', models[r]))
  out.update(
    harness.state_arrays(f'{p}/final_momentum', trainer.server.global_momentum)
  )
  print(p, 'final', {k: v.flatten()[:3] for k, v in models[-1].items()})
  return out


def main():
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  parser.add_argument('--repo', required=True, help='FedACG checkout')
  parser.add_argument('--commit', default='', help='if not a git work tree')
  parser.add_argument('--out', default='tests/golden/fedagm.npz')
  flags = parser.parse_args()
  commit = harness.repo_commit(flags.repo, flags.commit)
  repo = os.path.abspath(flags.repo)
  torch.set_default_dtype(torch.float64)
  harness.add_repo(repo)
  rng = np.random.default_rng(20220301)
  out = {
    'repository': np.array(REPOSITORY),
    'commit': np.array(commit),
    'function': np.array(FUNCTION),
    'dtype': np.array('float64, autocast off'),
    'num_clients': np.array(NUM_CLIENTS),
  }
  with tempfile.TemporaryDirectory() as tmp:
    for server_name in ('FedACG', 'FedAvgM'):
      out.update(part_a(repo, os.path.join(tmp, server_name), server_name, rng))
    for name, prox_weight in (('default', 1e-3), ('prox_heavy', 0.05)):
      out.update(part_b(repo, os.path.join(tmp, name), rng, name, prox_weight))
  np.savez_compressed(flags.out, **out)
  print(f'wrote {flags.out}: {os.path.getsize(flags.out)} bytes')


if __name__ == '__main__':
  main()
