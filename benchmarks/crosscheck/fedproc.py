"""FedProc golden fixture from the authors' code (MuXutong/FedProc).

Runs, unchanged, the authors' prototypical contrastive loss
(``ContrastLoss.py: SupConLoss_new``), their client update
(``train.py: local_train_net`` -> ``train_net_fedproc``) and prototype
computation (``train.py: get_global_class_center``) in float64 on CPU, and
writes tests/golden/fedproc.npz for tests/test_golden_baselines.py:

  /path/to/torch-env/bin/python benchmarks/crosscheck/fedproc.py \\
    --repo=/path/to/FedProc [--out=tests/golden/fedproc.npz] [--commit=SHA]

(--commit names the checkout's commit where --repo is no git work tree,
e.g. a ``git archive`` of 3223a3438b0e0cb76b93a7f7b007abb8debc2a0e.)

Loss level: SupConLoss_new on features F.normalize(u) (their model's last
step, so u stands for the representation before it) of 7 examples in
D = 5, labels over 4 classes, and 4 prototypes (the un-normalised means
get_global_class_center returns; one a zero vector, a class never seen):
the loss and its gradient w.r.t. u.

Round level: main.py's FedProc loop for 3 rounds over 4 clients of a
label-skewed 48-example set of 6x6x1 uint8 images (x = image / 255,
flattened), full participation (main.py's default sample_fraction 1),
2 local epochs of batch 8: prototypes from the initial model before round
0 (main.py's ``flag``), then per round local_train_net (round 0 CE only,
then alpha = round / 100), get_global_class_center on the trained local
models (the old prototype kept for a class nobody held), and main.py's
aggregation (fed_avg_freqs = n_k / sum of all parties' n; main.py's
lines, copied here because they sit in its __main__ block). The stub model
returns (h, z, logits) as their ModelFedCon: h = relu(Dense(x)), z =
F.normalize(h), logits = Dense(z). Stubs: get_dataloader (fixed batches,
one shuffled order per epoch, written to the fixture; for the prototypes
the client's examples in order), compute_accuracy (evaluation only),
``.cuda()`` (the identity: CPU; DataParallel without GPUs is the module),
the logger, the packages their modules import only for data sets and
logging (torchvision, PIL, pandas), and DATA_nclass['stub'] = 3. The
released train.py imports ``SupConLoss`` from ContrastLoss.py, which does
not define it (an ImportError as published); a None stands in for it
(the FedProc path, --scloss SupConLoss_new, does not use it).

Settings that differ from main.py's defaults and why: the model and data
(tiny, so the test runs in seconds; ModelFedCon's projection head is
reduced to the normalisation), 4 clients / 3 rounds / 2 local epochs /
batch 8 (small). Kept: SGD lr 0.1, momentum 0.9 (fixed in
train_net_fedproc), weight decay (--reg) 1e-5, alpha's hard-coded 100.
"""

import argparse
import copy
import importlib.machinery
import os
import subprocess
import sys
import types
from unittest import mock

import numpy as np
import torch
import torch.nn.functional as F

LR = 0.1
MOMENTUM = 0.9  # train_net_fedproc's fixed value
REG = 1e-5
BATCH = 8
LOCAL_EPOCHS = 2
ROUNDS = 3
NUM_CLIENTS = 4
NUM_CLASSES = 3
HIDDEN = 8


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
    'torchvision.models',
    'torchvision.transforms',
    'torchvision.datasets',
    'PIL',
    'pandas',
  ):
    stub = _Stub(name)
    stub.__spec__ = importlib.machinery.ModuleSpec(name, None)
    sys.modules[name] = stub
  torch.Tensor.cuda = lambda self, *a, **k: self  # CPU device stub
  torch.nn.Module.cuda = lambda self, *a, **k: self
  sys.path.insert(0, repo)
  import ContrastLoss  # noqa: PLC0415

  # train.py imports a SupConLoss that ContrastLoss.py (at this commit) does
  # not define, so the released train.py cannot be imported as is; the
  # FedProc path (args.scloss == 'SupConLoss_new') never uses it.
  if not hasattr(ContrastLoss, 'SupConLoss'):
    ContrastLoss.SupConLoss = None
  import train  # noqa: PLC0415

  return ContrastLoss, train


def loss_level(contrast):
  rng = np.random.default_rng(0)
  u = rng.normal(size=(7, 5))
  labels = np.array([0, 1, 1, 3, 0, 1, 3])
  centers = rng.normal(size=(4, 5)) * 0.4
  centers[2] = 0.0  # a class no client has held: a zero prototype
  z = torch.tensor(u, requires_grad=True)
  loss = contrast.SupConLoss_new()(
    features=F.normalize(z, p=2, dim=1),
    labels=torch.tensor(labels),
    center=[torch.tensor(c) for c in centers],
  )
  (grad,) = torch.autograd.grad(loss, z)
  return {
    'loss_u': u,
    'loss_labels': labels,
    'loss_centers': centers,
    'loss_value': np.float64(loss.item()),
    'loss_grad_u': grad.numpy(),
  }


class Net(torch.nn.Module):
  """(h, z, logits) as ModelFedCon.forward, z the normalised h."""

  def __init__(self, w1, b1, w2, b2):
    super().__init__()
    self.fc = torch.nn.Linear(w1.shape[1], w1.shape[0])
    self.l3 = torch.nn.Linear(w2.shape[1], w2.shape[0])
    with torch.no_grad():
      for p, v in zip(self.parameters(), (w1, b1, w2, b2)):
        p.copy_(torch.tensor(v))

  def forward(self, x):
    h = torch.relu(self.fc(x.flatten(1)))
    z = F.normalize(h, p=2, dim=1)
    return h, z, self.l3(z)


class Loader:
  def __init__(self, x, y, epochs):
    self.x, self.y, self.epochs, self.calls = x, y, epochs, 0

  def __iter__(self):
    batches = self.epochs[min(self.calls, len(self.epochs) - 1)]
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


def round_level(train):
  rng = np.random.default_rng(1)
  images, labels, parts = make_federation(rng)
  x = images.reshape(len(images), -1).astype(np.float64) / 255.0
  init = (
    rng.normal(size=(HIDDEN, x.shape[1])) * 0.3,
    rng.normal(size=HIDDEN) * 0.3 + 0.2,
    rng.normal(size=(NUM_CLASSES, HIDDEN)) * 0.5,
    rng.normal(size=NUM_CLASSES) * 0.3,
  )
  max_steps = LOCAL_EPOCHS * max(-(-len(p) // BATCH) for p in parts)
  idx = np.zeros((ROUNDS, NUM_CLIENTS, max_steps, BATCH), np.int32)
  mask = np.zeros(idx.shape, bool)
  schedule = {}  # (round, client) -> epochs of batches
  for r in range(ROUNDS):
    for c in range(NUM_CLIENTS):
      epochs, step = [], 0
      for _ in range(LOCAL_EPOCHS):
        order = rng.permutation(parts[c])
        batches = [order[i : i + BATCH] for i in range(0, len(order), BATCH)]
        epochs.append(batches)
        for rows in batches:
          idx[r, c, step, : len(rows)] = rows
          mask[r, c, step, : len(rows)] = True
          step += 1
      schedule[r, c] = epochs

  where = {'round': 0, 'mode': 'train'}
  client_of = {tuple(p): c for c, p in enumerate(parts)}

  def get_dataloader(dataset, datadir, train_bs, test_bs, dataidxs=None):
    assert dataset == 'stub' and train_bs == BATCH
    if dataidxs is None:  # the global loaders: unused by fedproc's loop
      return [], [], None, None
    c = client_of[tuple(dataidxs)]
    if where['mode'] == 'train':
      loader = Loader(x, labels, schedule[where['round'], c])
    else:  # prototypes: the client's examples once, in order
      rows = parts[c]
      loader = Loader(
        x, labels, [[rows[i : i + BATCH] for i in range(0, len(rows), BATCH)]]
      )
    return loader, [], None, None

  def compute_accuracy(net, loader, get_confusion_matrix=False, device='cpu'):
    return (0.0, None, 0.0) if get_confusion_matrix else (0.0, 0.0)

  train.get_dataloader = get_dataloader
  train.compute_accuracy = compute_accuracy
  train.DATA_nclass['stub'] = NUM_CLASSES
  args = types.SimpleNamespace(
    alg='fedproc',
    dataset='stub',
    datadir='',
    batch_size=BATCH,
    epochs=LOCAL_EPOCHS,
    lr=LR,
    optimizer='sgd',
    reg=REG,
    n_parties=NUM_CLIENTS,
    comm_round=ROUNDS,
    save_feature=0,
    scloss='SupConLoss_new',
  )
  logger = types.SimpleNamespace(info=lambda *a, **k: None)
  net_dataidx_map = {c: list(p) for c, p in enumerate(parts)}
  global_model = Net(*init)
  nets = {c: Net(*init) for c in range(NUM_CLIENTS)}
  party_list = list(range(NUM_CLIENTS))
  trained, centers = [], []
  # main.py's fedproc loop (its __main__ block), without logging,
  # evaluation, server momentum and saving.
  flag = 0
  for round in range(ROUNDS):  # noqa: A001  (main.py's name)
    where['round'] = round
    global_w = global_model.state_dict()
    nets_this_round = {k: nets[k] for k in party_list}
    for net in nets_this_round.values():
      net.load_state_dict(global_w)
    if flag == 0:
      where['mode'] = 'center'
      global_class_center = train.get_global_class_center(
        None, args.n_parties, nets_this_round, args, net_dataidx_map,
        logger=logger,
      )  # fmt: skip
      flag = 1
    where['mode'] = 'train'
    train.local_train_net(
      nets_this_round, args, net_dataidx_map, train_dl=None, test_dl=[],
      round=round, device='cpu', logger=logger,
      global_class_center=global_class_center, logdir=None,
    )  # fmt: skip
    global_class_center_old = copy.deepcopy(global_class_center)
    where['mode'] = 'center'
    global_class_center = train.get_global_class_center(
      global_class_center_old, args.n_parties, nets_this_round, args,
      net_dataidx_map, logger=logger,
    )  # fmt: skip
    total_data_points = sum(
      [len(net_dataidx_map[r]) for r in range(args.n_parties)]
    )
    fed_avg_freqs = [
      len(net_dataidx_map[r]) / total_data_points for r in range(args.n_parties)
    ]
    for net_id, net in enumerate(nets_this_round.values()):
      net_para = net.state_dict()
      if net_id == 0:
        for key in net_para:
          global_w[key] = net_para[key] * fed_avg_freqs[net_id]
      else:
        for key in net_para:
          global_w[key] += net_para[key] * fed_avg_freqs[net_id]
    global_model.load_state_dict(global_w)
    trained.append(
      [p.detach().numpy().copy() for p in global_model.parameters()]
    )
    centers.append(np.stack([c.numpy() for c in global_class_center]))
  out = {
    'round_images': images,
    'round_labels': labels.astype(np.int32),
    'round_client_sizes': np.array([len(p) for p in parts]),
    'round_cohorts': np.tile(np.arange(NUM_CLIENTS), (ROUNDS, 1)),
    'round_example_idx': idx,
    'round_example_mask': mask,
    'round_prototypes': np.stack(centers),
    'round_lr': np.float64(LR),
    'round_momentum': np.float64(MOMENTUM),
    'round_weight_decay': np.float64(REG),
    'round_gamma': np.float64(1.0),
    'round_alpha_rounds': np.float64(100.0),
  }
  for i, name in enumerate(('w1', 'b1', 'w2', 'b2')):
    out[f'round_init_{name}'] = init[i]
    out[f'round_{name}'] = np.stack([t[i] for t in trained])
  return out


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument('--repo', required=True)
  parser.add_argument('--out', default='tests/golden/fedproc.npz')
  parser.add_argument('--commit', default='', help='if --repo is no git tree')
  args = parser.parse_args()
  torch.set_default_dtype(torch.float64)
  repo = os.path.abspath(args.repo)
  contrast, train = import_authors(repo)
  out = {
    'repository': 'MuXutong/FedProc',
    'commit': commit_of(repo, args.commit),
    'function': (
      'ContrastLoss.py:SupConLoss_new.forward; train.py:local_train_net '
      '(train_net_fedproc), get_global_class_center; main.py fedproc loop'
    ),
  }
  out.update(loss_level(contrast))
  out.update(round_level(train))
  np.savez_compressed(args.out, **out)
  print('wrote', args.out, os.path.getsize(args.out), 'bytes')


if __name__ == '__main__':
  main()
