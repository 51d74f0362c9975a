"""Golden fixture for FedX from the authors' released code.

Runs, UNCHANGED, the functions of github.com/Sungwon-Han/FEDX (Han et al.,
'FedX: Unsupervised Federated Learning with Cross Knowledge Distillation',
ECCV 2022) on fixed inputs, in float64, and writes tests/golden/fedx.npz,
which tests/test_golden_ssl.py compares with fedjax_metric (no torch there).

What is run:

* losses.py ``nt_xent`` and ``js_loss`` as ``train_net_fedx`` (main.py)
  calls them: the local and global contrastive losses
  nt_xent(z_1, z_2), nt_xent(q_1, z^g_2) and the local and global relational
  losses js_loss(z_1, z_2, z_r; t, ts), js_loss(q_1, q_2, z^g_r; t, tt), with
  main.py's defaults t = tt = ts = 0.1, and js_loss with its own default
  t2 = 0.01; values and gradients w.r.t. the local projections z (all 3B
  rows: the random batch's rows are the local anchors) and predictions q;
  the global model's projections z^g are under no_grad in main.py.
* A round-level run: main.py's ``local_train_net`` and ``train_net_fedx``
  (their source taken from main.py by ``ast`` and executed unchanged: main.py
  itself cannot be imported without torchvision and the CIFAR data), two
  local epochs for three clients, then the aggregation lines of main.py's
  round loop (copied here: they sit inline under ``__main__``), two rounds.

Command:

  /path/to/torch-env/bin/python benchmarks/crosscheck/fedx.py \
      --repo=/path/to/Sungwon-Han/FEDX --commit=<40 hex> \
      --out=tests/golden/fedx.npz

Settings that differ from the authors' defaults, and why:

* float64 (torch.set_default_dtype).
* ``utils`` (losses.py takes only ``F`` = torch.nn.functional from it;
  utils.py imports torchvision and the datasets) is replaced by a module
  holding ``F = torch.nn.functional``.
* Device stub: ``.cuda()`` on modules and tensors returns them unchanged
  (CPU only).
* Data stub: each client's loader is a fixed list of (view1, view2, target,
  index) batches of 4 (drop_last, as utils.get_dataloader), in a fixed
  order every epoch, with deterministic views (view1 = x / 255, view2 = the
  horizontally flipped image / 255) instead of SimCLR augmentation. The
  loader also has the ``.next()`` method ``train_net_fedx`` calls on the
  random loader's iterator (Python 2 style; a torch DataLoader iterator has
  none). The random loader is ``copy.deepcopy(train_dataloader)``; a
  shuffling DataLoader's copy draws its own order, so the stub's copy
  iterates another fixed order; the rows it hands out are recorded.
* Model stub: features Linear(36, 6) (a ResNet-18 in the paper), projection
  Linear(6, 5) -> ReLU -> Linear(5, 5), prediction Linear(5, 5) -> ReLU ->
  Linear(5, 5) (ModelFedX's heads with out_dim 5 instead of 256).
* lr 0.01, momentum 0.9, weight decay 1e-5, SGD (main.py's defaults), two
  local epochs (10 in main.py), full participation.
"""

import argparse
import ast
import copy
import logging
import os
import subprocess
import sys
import types

import numpy as np
import torch

D_IN, D_FEAT, D_PROJ = 36, 6, 5
SHAPE = (6, 6, 1)
BATCH = 4
EPOCHS = 2
ROUNDS = 2
CLIENT_SIZES = (7, 12, 5)  # drop_last: 1, 3 and 1 batches of 4
LR, MOMENTUM, REG = 0.01, 0.9, 1e-5
T, TT, TS = 0.1, 0.1, 0.1


def import_authors(repo):
  sys.path.insert(0, repo)
  utils = types.ModuleType('utils')
  utils.F = torch.nn.functional
  sys.modules['utils'] = utils
  import losses

  # train_net_fedx and local_train_net, unchanged, from main.py's source.
  with open(os.path.join(repo, 'main.py')) as f:
    tree = ast.parse(f.read())
  wanted = [
    node
    for node in tree.body
    if isinstance(node, ast.FunctionDef)
    and node.name in ('train_net_fedx', 'local_train_net')
  ]
  namespace = {
    'torch': torch,
    'optim': torch.optim,
    'copy': copy,
    'nt_xent': losses.nt_xent,
    'js_loss': losses.js_loss,
    'logger': logging.getLogger('fedx'),
  }
  exec(compile(ast.Module(wanted, []), 'main.py', 'exec'), namespace)
  return types.SimpleNamespace(
    losses=losses,
    train_net_fedx=namespace['train_net_fedx'],
    local_train_net=namespace['local_train_net'],
  )


def grads(value, inputs):
  out = torch.autograd.grad(value, inputs, retain_graph=True, allow_unused=True)
  return [
    np.zeros(tuple(x.shape)) if g is None else g.numpy()
    for g, x in zip(out, inputs)
  ]


def losses_level(authors, out):
  L = authors.losses
  rng = np.random.default_rng(0)
  b = 8
  proj1 = rng.normal(size=(3 * b, D_PROJ)) + 0.3 * rng.normal(size=D_PROJ)
  pred1 = proj1 + 0.5 * rng.normal(size=proj1.shape)
  proj2 = proj1 + 0.3 * rng.normal(size=proj1.shape)
  out.update(loss_proj1=proj1, loss_pred1=pred1, loss_proj2=proj2)
  tz = torch.tensor(proj1, requires_grad=True)
  tq = torch.tensor(pred1, requires_grad=True)
  tg = torch.tensor(proj2)  # the global model's, under no_grad
  # train_net_fedx's splits and calls.
  pred1_original, pred1_pos, _ = tq.split([b, b, b], dim=0)
  proj1_original, proj1_pos, proj1_random = tz.split([b, b, b], dim=0)
  _, proj2_pos, proj2_random = tg.split([b, b, b], dim=0)
  values = {
    'nt_local': L.nt_xent(proj1_original, proj1_pos, T),
    'nt_global': L.nt_xent(pred1_original, proj2_pos, T),
    'js_global': L.js_loss(pred1_original, pred1_pos, proj2_random, T, TT),
    'js_local': L.js_loss(proj1_original, proj1_pos, proj1_random, T, TS),
    'js_default_t2': L.js_loss(proj1_original, proj1_pos, proj1_random),
  }
  values['total'] = (values['nt_local'] + values['nt_global']) + (
    values['js_global'] + values['js_local']
  )
  for name, value in values.items():
    out[f'loss_{name}'] = value.item()
    gz, gq = grads(value, (tz, tq))
    out[f'loss_{name}_grad_proj1'] = gz
    out[f'loss_{name}_grad_pred1'] = gq


class StubNet(torch.nn.Module):
  """ModelFedX's forward: (h, proj, pred) with tiny layers."""

  def __init__(self):
    super().__init__()
    self.features = torch.nn.Linear(D_IN, D_FEAT)
    self.num_ftrs = D_FEAT
    self.projectionMLP = torch.nn.Sequential(
      torch.nn.Linear(D_FEAT, D_PROJ),
      torch.nn.ReLU(inplace=True),
      torch.nn.Linear(D_PROJ, D_PROJ),
    )
    self.predictionMLP = torch.nn.Sequential(
      torch.nn.Linear(D_PROJ, D_PROJ),
      torch.nn.ReLU(inplace=True),
      torch.nn.Linear(D_PROJ, D_PROJ),
    )

  def forward(self, x):
    h = self.features(x.reshape(x.shape[0], -1))
    proj = self.projectionMLP(h)
    pred = self.predictionMLP(proj)
    return h, proj, pred


class StubIterator:
  def __init__(self, batches, log):
    self.batches = iter(batches)
    self.log = log

  def __next__(self):
    item = next(self.batches)
    if self.log is not None:
      self.log.append(item[3].numpy().copy())
    return item

  next = __next__  # train_net_fedx calls random_dataloader.next()

  def __iter__(self):
    return self


class StubLoader:
  """A fixed list of batches; its deep copy iterates ``copy_batches`` and
  records what it hands out in ``random_log``."""

  def __init__(self, batches, copy_batches, random_log, log=None):
    self.batches = batches
    self.copy_batches = copy_batches
    self.random_log = random_log
    self.log = log

  def __len__(self):
    return len(self.batches)

  def __iter__(self):
    return StubIterator(self.batches, self.log)

  def __deepcopy__(self, memo):
    return StubLoader(
      self.copy_batches, self.copy_batches, None, log=self.random_log
    )


def stub_views(raw):
  x = raw.astype(np.float64) / 255.0
  return x, x[:, :, ::-1, :].copy()


def loader_items(images, rows):
  x1, x2 = stub_views(images[rows])
  return (
    torch.tensor(x1),
    torch.tensor(x2),
    torch.zeros(len(rows), dtype=torch.long),
    torch.tensor(rows),
  )


def round_level(authors, out):
  torch.nn.Module.cuda = lambda self, *a, **k: self  # device stub
  torch.Tensor.cuda = lambda self, *a, **k: self
  rng = np.random.default_rng(2)
  n_total = sum(CLIENT_SIZES)
  images = rng.integers(0, 256, (n_total,) + SHAPE).astype(np.uint8)
  starts = np.cumsum((0,) + CLIENT_SIZES[:-1])
  net_dataidx_map = {}
  loaders, orders = {}, []
  for k, n in enumerate(CLIENT_SIZES):
    idx = starts[k] + np.arange(n)
    net_dataidx_map[k] = idx
    keep = n // BATCH * BATCH  # drop_last
    order = rng.permutation(idx)[:keep].reshape(-1, BATCH)
    copy_order = rng.permutation(idx)[:keep].reshape(-1, BATCH)
    orders.append(order)
    loaders[k] = StubLoader(
      [loader_items(images, r) for r in order],
      [loader_items(images, r) for r in copy_order],
      random_log=[],
    )
  torch.manual_seed(4)
  global_model = StubNet()
  nets = {k: StubNet() for k in range(len(CLIENT_SIZES))}
  init = {k: v.numpy().copy() for k, v in global_model.state_dict().items()}
  args = types.SimpleNamespace(
    epochs=EPOCHS,
    lr=LR,
    optimizer='sgd',
    temperature=T,
    reg=REG,
    tt=TT,
    ts=TS,
    n_parties=len(CLIENT_SIZES),
  )
  party_list_this_round = list(range(len(CLIENT_SIZES)))
  most = max(CLIENT_SIZES) // BATCH
  after = []
  for round_idx in range(ROUNDS):
    for k in loaders:
      loaders[k].random_log.clear()
    # main.py's round loop, minus evaluation and logging.
    global_w = global_model.state_dict()
    nets_this_round = {k: nets[k] for k in party_list_this_round}
    for net in nets_this_round.values():
      net.load_state_dict(global_w)
    authors.local_train_net(
      nets_this_round,
      args,
      net_dataidx_map,
      loaders,
      dict.fromkeys(loaders),
      train_dl=None,
      test_dl=[],
      global_model=global_model,
      device='cpu',
    )
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
    global_model.load_state_dict(copy.deepcopy(global_w))
    # The random loader's rows of every local step, [K, S, B], -1 padded.
    per_client = []
    for k in range(len(CLIENT_SIZES)):
      log = np.stack(loaders[k].random_log)  # [steps, B]
      padded = np.full((EPOCHS * most, BATCH), -1)
      padded[: len(log)] = log
      per_client.append(padded)
    out[f'round{round_idx + 1}_random_rows'] = np.stack(per_client)
    after.append(
      {k: v.numpy().copy() for k, v in global_model.state_dict().items()}
    )
  batches = np.full((len(CLIENT_SIZES), most, BATCH), -1)
  for k, order in enumerate(orders):
    batches[k, : len(order)] = order
  out.update(
    round_images=images,
    round_client_sizes=np.asarray(CLIENT_SIZES),
    round_client_batches=batches,
  )
  for key, value in init.items():
    out[f'round_init/{key}'] = value
  for r, state in enumerate(after):
    for key, value in state.items():
      out[f'round{r + 1}/{key}'] = value


def main():
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  parser.add_argument('--repo', required=True)
  parser.add_argument('--out', default='tests/golden/fedx.npz')
  parser.add_argument(
    '--commit', default='', help='the checkout commit if --repo has no .git'
  )
  args = parser.parse_args()
  torch.set_default_dtype(torch.float64)
  authors = import_authors(os.path.abspath(args.repo))
  commit = (
    args.commit
    or subprocess.run(
      ['git', '-C', args.repo, 'rev-parse', 'HEAD'],
      capture_output=True,
      text=True,
    ).stdout.strip()
  )
  if len(commit) != 40:
    raise SystemExit('pass --commit=<40 hex> (no git checkout at --repo)')
  out = {
    'repository': 'Sungwon-Han/FEDX',
    'commit': commit,
    'function': (
      'losses.py:nt_xent,js_loss; main.py:train_net_fedx,local_train_net '
      "and the __main__ round loop's aggregation"
    ),
    'temperature': T,
    'tt': TT,
    'ts': TS,
    'lr': LR,
    'momentum': MOMENTUM,
    'weight_decay': REG,
    'batch_size': BATCH,
    'local_epochs': EPOCHS,
    'rounds': ROUNDS,
  }
  losses_level(authors, out)
  round_level(authors, out)
  os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
  np.savez_compressed(args.out, **out)
  print(f'wrote {args.out}: {len(out)} entries, commit {commit}')


if __name__ == '__main__':
  main()
