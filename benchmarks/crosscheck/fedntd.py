"""FedNTD golden fixture from the authors' code (Lee-Gihun/FedNTD).

Runs, unchanged, the authors' not-true distillation loss
(``algorithms/fedntd/criterion.py: NTD_Loss``, with ``refine_as_not_true``)
and their round pieces (``algorithms/fedntd/Server.py: Server`` with its
``ClientTrainer.train``; ``BaseServer._clients_training`` and
``BaseServer._aggregation``) in float64 on CPU, and writes
tests/golden/fedntd.npz for tests/test_golden_baselines.py:

  /path/to/torch-env/bin/python benchmarks/crosscheck/fedntd.py \\
    --repo=/path/to/FedNTD [--out=tests/golden/fedntd.npz] [--commit=SHA]

(--commit names the checkout's commit where --repo is no git work tree,
e.g. a ``git archive`` of be00ee598139654abe650c446a7ba3bc4e340233.)

Loss level: fixed logits, global logits and labels (6 examples, 5 classes);
for (tau, beta) in (1, 1) (config/fedntd.json), (3, 1) (NTD_Loss's own
default tau) and (2, 0.5): the loss, its CE and NTD parts (``NTD_Loss.CE``
and ``NTD_Loss._ntd_loss``) and the gradient w.r.t. the local logits.

Round level: 4 clients of a label-skewed 48-example set of 6x6x1 uint8
images (x = image / 255, flattened), softmax regression (a torch Linear,
the stub model), 2 rounds of 3 clients, 2 local epochs of batch 8. The
round loop is BaseServer.run's without its evaluation and wandb logging:
clients (recorded; the test replays them) from BaseServer._client_sampling,
Server._clients_training (download_global, ClientTrainer.train,
upload_local), Server._aggregation, then load_state_dict and the
scheduler's step. Stubs: the data loaders (lists of fixed batches, one
shuffled order per epoch, written to the fixture), ``wandb`` (imported by
BaseServer, not used here), the CPU device.

Settings that differ from config/fedntd.json and why: the model (softmax
regression instead of fedavg_cifar, so the test runs in seconds), 4
clients / 2 rounds / 2 local epochs / batch 8 (small), the local learning
rate 0.05 (config: 0.01; larger so that a few steps move the model well
past float32 rounding). Kept: tau = beta = 1, SGD momentum 0.9, weight
decay 1e-5, the per-round StepLR(gamma=0.99) of the server optimizer's lr,
which the clients load.
"""

import argparse
import os
import subprocess
import sys
import types

import numpy as np
import torch

NUM_CLASSES = 5
ROUND_CLASSES = 3
LR = 0.05
MOMENTUM = 0.9
WEIGHT_DECAY = 1e-5
GAMMA = 0.99
BATCH = 8
LOCAL_EPOCHS = 2
ROUNDS = 2
NUM_CLIENTS = 4
SAMPLE_RATIO = 0.75


def commit_of(repo, given):
  """--commit, else the checkout's HEAD (a git archive has none)."""
  if given:
    return given
  return subprocess.check_output(
    ['git', '-C', repo, 'rev-parse', 'HEAD'], text=True
  ).strip()


def import_authors(repo):
  sys.modules.setdefault('wandb', types.ModuleType('wandb'))  # unused stub
  sys.path.insert(0, repo)
  from algorithms.fedntd import criterion  # noqa: PLC0415
  from algorithms.fedntd.Server import Server  # noqa: PLC0415

  return criterion, Server


def loss_level(criterion):
  rng = np.random.default_rng(0)
  logits = rng.normal(size=(6, NUM_CLASSES)) * 2.0
  dg_logits = rng.normal(size=(6, NUM_CLASSES)) * 2.0
  labels = np.array([0, 4, 2, 2, 1, 3])
  out = {
    'loss_logits': logits,
    'loss_dg_logits': dg_logits,
    'loss_labels': labels,
  }
  settings = [(1.0, 1.0), (3.0, 1.0), (2.0, 0.5)]
  out['loss_settings'] = np.array(settings)
  totals, ces, ntds, grads = [], [], [], []
  for tau, beta in settings:
    fn = criterion.NTD_Loss(num_classes=NUM_CLASSES, tau=tau, beta=beta)
    z = torch.tensor(logits, requires_grad=True)
    t = torch.tensor(labels)
    g = torch.tensor(dg_logits)
    loss = fn(z, t, g)
    (grad,) = torch.autograd.grad(loss, z)
    totals.append(loss.item())
    ces.append(fn.CE(z, t).item())
    ntds.append(fn._ntd_loss(z, g, t).item())
    grads.append(grad.numpy())
  out['loss_total'] = np.array(totals)
  out['loss_ce'] = np.array(ces)
  out['loss_ntd'] = np.array(ntds)  # includes their tau ** 2 factor
  out['loss_grad_logits'] = np.stack(grads)
  return out


class EpochLoader:
  """A client's data loader stub: epoch e of the round yields the fixed
  batches ``epochs[e]``; iterations past the training epochs (their
  evaluate_model on the train loader) yield the client's data once."""

  def __init__(self, x, y, epochs, rows):
    self.x, self.y, self.epochs, self.rows = x, y, epochs, rows
    self.calls = 0

  def __iter__(self):
    e = self.calls
    self.calls += 1
    batches = self.epochs[e] if e < len(self.epochs) else [self.rows]
    for rows in batches:
      yield torch.tensor(self.x[rows]), torch.tensor(self.y[rows])


def make_federation(rng):
  images = rng.integers(0, 256, (48, 6, 6, 1)).astype(np.uint8)
  labels = rng.integers(0, ROUND_CLASSES, 48)
  # Label skew: client c holds mostly classes c and c + 1 (mod 3).
  parts = [[] for _ in range(NUM_CLIENTS)]
  for i, y in enumerate(labels):
    choices = [c for c in range(NUM_CLIENTS) if y in (c % 3, (c + 1) % 3)]
    parts[choices[i % len(choices)]].append(i)
  return images, labels, [np.array(p) for p in parts]


def round_level(server_cls):
  rng = np.random.default_rng(1)
  images, labels, parts = make_federation(rng)
  x = images.reshape(len(images), -1).astype(np.float64) / 255.0
  model = torch.nn.Linear(x.shape[1], ROUND_CLASSES)
  with torch.no_grad():
    model.weight.copy_(torch.tensor(rng.normal(size=(3, 36)) * 0.3))
    model.bias.copy_(torch.tensor(rng.normal(size=3) * 0.3))
  init_w = model.weight.detach().numpy().copy()
  init_b = model.bias.detach().numpy().copy()
  optimizer = torch.optim.SGD(
    model.parameters(), lr=LR, momentum=MOMENTUM, weight_decay=WEIGHT_DECAY
  )
  scheduler = torch.optim.lr_scheduler.StepLR(optimizer, 1, gamma=GAMMA)
  local = {c: {'datasize': len(p), 'train': None} for c, p in enumerate(parts)}
  test = [(torch.tensor(x[:8]), torch.tensor(labels[:8]))]
  data = {
    'num_classes': ROUND_CLASSES,
    'local': local,
    'global': {'test': test},
  }
  server = server_cls(
    types.SimpleNamespace(tau=1.0, beta=1.0),
    model,
    data,
    optimizer,
    scheduler,
    n_rounds=ROUNDS,
    sample_ratio=SAMPLE_RATIO,
    local_epochs=LOCAL_EPOCHS,
    device='cpu',
  )
  max_steps = LOCAL_EPOCHS * max(-(-len(p) // BATCH) for p in parts)
  cohort_ids, example_idx, example_mask, weights = [], [], [], []
  for r in range(ROUNDS):
    sampled = server._client_sampling(r)
    idx = np.zeros((len(sampled), max_steps, BATCH), np.int32)
    mask = np.zeros((len(sampled), max_steps, BATCH), bool)
    for slot, c in enumerate(sampled):
      epochs, step = [], 0
      for _ in range(LOCAL_EPOCHS):
        order = rng.permutation(parts[c])
        batches = [order[i : i + BATCH] for i in range(0, len(order), BATCH)]
        epochs.append(batches)
        for rows in batches:
          idx[slot, step, : len(rows)] = rows
          mask[slot, step, : len(rows)] = True
          step += 1
      local[c]['train'] = EpochLoader(x, labels, epochs, parts[c])
    weights_r, sizes = server._clients_training(sampled)[:2]
    server.model.load_state_dict(server._aggregation(weights_r, sizes))
    server.scheduler.step()
    cohort_ids.append(np.asarray(sampled))
    example_idx.append(idx)
    example_mask.append(mask)
    weights.append(
      (
        server.model.weight.detach().numpy().copy(),
        server.model.bias.detach().numpy().copy(),
      )
    )
  return {
    'round_images': images,
    'round_labels': labels.astype(np.int32),
    'round_client_sizes': np.array([len(p) for p in parts]),
    'round_init_weight': init_w,
    'round_init_bias': init_b,
    'round_cohorts': np.stack(cohort_ids),
    'round_example_idx': np.stack(example_idx),
    'round_example_mask': np.stack(example_mask),
    'round_weight': np.stack([w for w, _ in weights]),
    'round_bias': np.stack([b for _, b in weights]),
    'round_lr': np.float64(LR),
    'round_momentum': np.float64(MOMENTUM),
    'round_weight_decay': np.float64(WEIGHT_DECAY),
    'round_gamma': np.float64(GAMMA),
    'round_tau': np.float64(1.0),
    'round_beta': np.float64(1.0),
  }


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument('--repo', required=True)
  parser.add_argument('--out', default='tests/golden/fedntd.npz')
  parser.add_argument('--commit', default='', help='if --repo is no git tree')
  args = parser.parse_args()
  torch.set_default_dtype(torch.float64)
  criterion, server_cls = import_authors(os.path.abspath(args.repo))
  out = {
    'repository': 'Lee-Gihun/FedNTD',
    'commit': commit_of(args.repo, args.commit),
    'function': (
      'algorithms/fedntd/criterion.py:NTD_Loss.forward,_ntd_loss; '
      'algorithms/fedntd/Server.py:Server (BaseServer._clients_training, '
      '_aggregation, _client_sampling; ClientTrainer.train)'
    ),
  }
  out.update(loss_level(criterion))
  out.update(round_level(server_cls))
  np.savez_compressed(args.out, **out)
  print('wrote', args.out, os.path.getsize(args.out), 'bytes')


if __name__ == '__main__':
  main()
