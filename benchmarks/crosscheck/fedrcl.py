"""FedRCL's and FedSCL's multi-level loss, run by the authors' own code.

Runs, UNCHANGED, github.com/skynbe/FedRCL (Seo, Kim, Kim and Han, 'Relaxed
Contrastive Learning for Federated Learning', CVPR 2024):

  * clients/rcl_client.py RCLClient._algorithm_rcl -- the multi-level loss
    dict {'cossim', 'scl', 'penalty'} of one batch, each sub-loss the mean
    over the branch levels of the batch mean of utils/loss.py CLLoss;
  * clients/rcl_client.py RCLClient.get_weights -- the weights local_train
    sums those losses with (its ``sum(weights[k] * losses[k])``);
  * utils/loss.py CLLoss.forward(reduction=False) -- the per-example terms
    of each pair ('scl', 'penalty') at each level, called as _algorithm_rcl
    calls it (pooled features, ``topk_neg=rcl_loss.topk_neg``);

on fixed random feature maps, in float64, and writes the inputs, the losses,
the per-example terms and the gradients w.r.t. the features (torch
autograd) to tests/golden/fedrcl.npz. Then whole rounds: trainers/
base_trainer.py Trainer.__init__ and Trainer.train with RCLClient (setup,
local_train: SGD, weight decay 1e-3, clip_grad_norm_ 10, lr 0.1 x 0.998 per
round and per local epoch, 5 local epochs, batch 50) and servers/base.py
Server (plain mean), 3 clients of 10, 14 and 8 examples, 3 rounds, from
fixed initial weights of a 5-level MLP; the global model after each round
goes to tests/golden/fedrcl_rounds.npz, for three runs: 'rcl' (fedrcl.yaml),
'scl' (its penalty pair removed: FedSCL) and 'rcl_fedacg' (FedRCL behind
FedACG's server as in FedRCL's Table 5: ServerM with FedACG.yaml's lambda
0.85 and ACG.yaml's proximal weight 1e-3, values of geehokim/FedACG; the
FedRCL repository has the same ServerM but no FedACG config).
tests/test_golden_fedrcl.py reads both fixtures:

  PYTHONPATH=/path/to/pydeps/fedrcl /path/to/torch-env/bin/python \
      benchmarks/crosscheck/fedrcl.py --repo=/path/to/FedRCL \
      --out=tests/golden/fedrcl.npz \
      --rounds_out=tests/golden/fedrcl_rounds.npz

Stubs (no logic of the method is replaced):
  * data: fixed feature maps from a seeded NumPy generator, per class a
    centre plus noise of a class-dependent spread, so that some classes are
    collapsed (the penalty fires), some straddle the thresholds and some are
    spread; two singleton classes; a second batch in which most anchors
    have fewer negatives than topk_neg (2), and a third of one class only
    (no negatives at all).
  * model: `_algorithm_rcl` reads only ``local_results``/``global_results``
    and ``self.num_layers``; the client is built by RCLClient.__init__ with
    a stub nn.Module, the feature dicts are given (layer0-4 as [B, C, H, W]
    maps as ResNet18_base returns them, layer5 the logits, num_layers 6 as
    in models/resnet.py, so the branch_level [0..4] filter is exercised).
  * rounds: the model is `LevelsMLP` (a Linear per level, pre-ReLU taps
    'layer0'..'layer4', logits 'layer5', num_layers 6 as ResNet18_base) on
    flattened uint8 images / 255; data, partition, CPU device and the
    evaluation (it records the global model) are stubs of
    benchmarks/crosscheck/fedrcl_harness.py, which also explains the
    import-only dependencies replaced by empty modules and the packages to
    install (omegaconf, tqdm, tabulate).

Settings that differ from the authors' defaults (configs/client/fedrcl.yaml,
configs/config.yaml) and why:
  * float64 (``torch.set_default_dtype``) and no mixed precision: the
    authors train under ``autocast(enabled=use_amp)`` with use_amp True
    (fp16 on a GPU). The fixture is for a float64 comparison, so autocast is
    off: _algorithm_rcl is called directly, outside local_train.
  * rcl_loss.temp, the penalty pair's threshold and its weight (beta) are
    swept over CASES; the first case is the released default (0.05, 0.7,
    1). Everything else in fedrcl.yaml is as released (topk_pos 1, topk_neg
    2, branch_level [0..4], pairs 'scl' (supervised) and 'penalty'
    (unsupervised, intra_class_thresholding)).
  * rounds: trainer.num_clients 3, participation_rate 1.0 (all clients in
    order: no random cohort), global_rounds 3, split.mode 'iid' with the
    partition given, pin_memory False, paths in a temporary directory; the
    batch size 50 exceeds every client, so each local epoch is one full
    batch and DataLoader's shuffle changes only the summation order.
  * FedSCL: the repository has no FedSCL config. FedSCL is FedRCL without
    its divergence penalty (Table 3), so it is run here as the same
    fedrcl.yaml with the 'penalty' pair removed from rcl_loss.pairs.

This script does not import fedjax_metric.
"""

import argparse
import os
import tempfile

import fedrcl_harness as harness
import numpy as np
import torch
import torch.nn.functional as F

REPOSITORY = 'skynbe/FedRCL'
FUNCTION = (
  'clients/rcl_client.py:RCLClient._algorithm_rcl (+ get_weights), '
  'utils/loss.py:CLLoss.forward'
)
# (temperature, threshold, penalty weight beta): the released default first.
CASES = ((0.05, 0.7, 1.0), (0.1, 0.5, 1.0), (0.5, 0.9, 0.5), (0.2, 0.8, 2.0))
# Channels and spatial size of layer0..layer4 (ResNet-style 4-D maps).
LEVELS = ((4, 2), (6, 2), (8, 1), (12, 1), (16, 1))
NUM_LOGITS = 6


def load_authors(repo):
  """Imports RCLClient (and OmegaConf) with the checkout on sys.path."""
  harness.add_repo(repo)
  from clients.rcl_client import RCLClient  # noqa: E402
  from omegaconf import OmegaConf  # noqa: E402

  return RCLClient, OmegaConf


def make_args(OmegaConf, repo, temperature, threshold, beta, penalty=True):
  """The released client config with the swept values put in."""
  client = OmegaConf.load(os.path.join(repo, 'configs/client/fedrcl.yaml'))
  client.rcl_loss.temp = temperature
  pairs = []
  for pair in client.rcl_loss.pairs:
    if pair.name == 'penalty':
      if not penalty:
        continue
      pair.threshold = threshold
      pair.weight = beta
    pairs.append(pair)
  client.rcl_loss.pairs = pairs
  top = OmegaConf.load(os.path.join(repo, 'configs/config.yaml'))
  return OmegaConf.create(
    {'client': client, 'use_amp': False, 'seed': top.seed}
  )


class _StubModel(torch.nn.Module):
  """RCLClient.__init__ deep-copies its model; _algorithm_rcl never calls
  it (the features are given)."""

  def __init__(self):
    super().__init__()
    self.fc = torch.nn.Linear(2, 2)
    self.num_layers = len(LEVELS) + 1


def make_batch(rng, labels, spreads):
  """Feature maps [B, C, H, W] per level: a class centre plus per-pixel
  noise of the class's spread (scaled a little per level)."""
  labels = np.asarray(labels)
  classes = np.unique(labels)
  maps = []
  for level, (channels, size) in enumerate(LEVELS):
    centres = rng.normal(size=(classes.max() + 1, channels))
    scale = 0.8 + 0.1 * level
    noise = rng.normal(size=(len(labels), channels, size, size))
    spread = np.array([spreads[c] for c in labels]) * scale
    maps.append(
      centres[labels][:, :, None, None] + spread[:, None, None, None] * noise
    )
  logits = rng.normal(size=(len(labels), NUM_LOGITS))
  return maps, logits


def batches():
  rng = np.random.default_rng(20240617)
  # Class sizes 5, 4, 3, 2, 1, 1; spreads from collapsed to spread.
  main = np.repeat(np.arange(6), [5, 4, 3, 2, 1, 1])
  main = main[rng.permutation(len(main))]
  spreads_main = {0: 0.25, 1: 0.9, 2: 2.0, 3: 0.5, 4: 1.0, 5: 1.0}
  # Class 0 anchors have one negative only (topk_neg is 2).
  few = np.array([0, 1, 0, 0, 0, 0])
  spreads_few = {0: 0.7, 1: 1.0}
  one = np.array([2, 2, 2])
  spreads_one = {2: 0.6}
  out = {}
  for name, labels, spreads in (
    ('main', main, spreads_main),
    ('few', few, spreads_few),
    ('one', one, spreads_one),
  ):
    maps, logits = make_batch(rng, labels, spreads)
    global_maps, _ = make_batch(rng, labels, spreads)
    out[name] = (labels, maps, logits, global_maps)
  return out


def run_case(RCLClient, args, labels, maps, logits, global_maps):
  """The authors' loss dict, weighted total, per-example terms and the
  total's gradient w.r.t. each level's feature map."""
  client = RCLClient(args, client_index=0, model=_StubModel())
  client.num_layers = client.model.num_layers  # as RCLClient.setup sets it
  labels_t = torch.as_tensor(labels, dtype=torch.long)
  local = [torch.tensor(m, requires_grad=True) for m in maps]
  local_results = {f'layer{l}': f for l, f in enumerate(local)}
  local_results[f'layer{len(LEVELS)}'] = torch.tensor(logits)
  global_results = {
    f'layer{l}': torch.tensor(m) for l, m in enumerate(global_maps)
  }
  global_results[f'layer{len(LEVELS)}'] = torch.tensor(logits)
  losses = client._algorithm_rcl(
    local_results=local_results,
    global_results=global_results,
    labels=labels_t,
  )
  # local_train's reduction of the loss dict (cls and prox are the model's
  # CE and the proximal term, not part of this loss).
  weights = client.get_weights(epoch=0)
  for key in losses:
    weights.setdefault(key, 0)
  total = sum(weights[key] * losses[key] for key in losses)
  grads = torch.autograd.grad(total, local)
  # Per-example terms: CLLoss called exactly as _algorithm_rcl calls it.
  terms = {}
  with torch.no_grad():
    for name, criterion in client.rcl_criterions.items():
      if criterion is None:
        continue
      per_level = []
      for l in range(len(LEVELS)):
        new = F.adaptive_avg_pool2d(local[l], 1)
        old = F.adaptive_avg_pool2d(global_results[f'layer{l}'], 1)
        per_level.append(
          criterion(
            old_feat=old,
            new_feat=new,
            target=labels_t,
            reduction=False,
            topk_neg=args.client.rcl_loss.topk_neg,
          ).numpy()
        )
      terms[name] = np.stack(per_level)
  scalars = {
    k: float(v.detach())
    for k, v in losses.items()
    if isinstance(v, torch.Tensor)
  }
  return (
    scalars,
    float(total),
    [g.numpy() for g in grads],
    terms,
    weights,
  )


ROUNDS_FUNCTION = (
  'trainers/base_trainer.py:Trainer.train, clients/rcl_client.py:RCLClient '
  '(setup, local_train, _algorithm, _algorithm_rcl), servers/base.py:Server, '
  'ServerM'
)
# name: (penalty pair kept, server overrides, proximal weight).
ROUND_RUNS = {
  'rcl': (True, {'type': 'Server', 'momentum': -1}, 0.0),
  'scl': (False, {'type': 'Server', 'momentum': -1}, 0.0),
  # FedRCL behind FedACG's server (FedRCL's Table 5 combination): the
  # values of FedACG's configs/server/FedACG.yaml and client/ACG.yaml.
  'rcl_fedacg': (
    True,
    {'type': 'ServerM', 'momentum': 0.85, 'FedACG': True},
    1e-3,
  ),
}
ROUND_SIZES = (10, 14, 8)
ROUND_WIDTH = 8


class LevelsMLP(torch.nn.Module):
  """Stands in for ResNet18_base: 5 hidden Linear layers whose pre-ReLU
  outputs are 'layer0'..'layer4' (no_relu=True, as the client calls it with
  feature_relu False), the logits 'layer5' and 'logit'; num_layers 6 as
  models/resnet.py."""

  def __init__(self, weights):
    super().__init__()
    self.layers = torch.nn.ModuleList()
    for w, b in weights:
      layer = torch.nn.Linear(w.shape[1], w.shape[0])
      with torch.no_grad():
        layer.weight.copy_(torch.as_tensor(w))
        layer.bias.copy_(torch.as_tensor(b))
      self.layers.append(layer)
    self.num_layers = len(weights)

  def forward(self, x, no_relu=True):
    results = {}
    h = x
    for l, layer in enumerate(self.layers[:-1]):
      pre = layer(h if l == 0 else torch.relu(h))
      results[f'layer{l}'] = pre if no_relu else torch.relu(pre)
      h = pre
    results['feature'] = torch.relu(h)
    logit = self.layers[-1](torch.relu(h))
    results[f'layer{len(self.layers) - 1}'] = logit
    results['logit'] = logit
    return results


def run_rounds(repo, tmp, rng, name):
  """Trainer.train of the checkout with RCLClient on a LevelsMLP: three
  rounds, three clients; the fixture entries of run ``name``."""
  from clients.rcl_client import RCLClient
  from servers.base import Server, ServerM

  penalty, server, prox_weight = ROUND_RUNS[name]
  num_classes, num_rounds = 3, 3
  images = harness.uint8_images(rng, sum(ROUND_SIZES))
  labels = rng.integers(0, num_classes, sum(ROUND_SIZES))
  order = rng.permutation(sum(ROUND_SIZES))
  parts = np.split(order, np.cumsum(ROUND_SIZES)[:-1])
  dims = [int(np.prod(images.shape[1:]))] + [ROUND_WIDTH] * 5 + [num_classes]
  weights = [
    (
      rng.normal(size=(o, i)) / np.sqrt(i),
      0.1 * rng.normal(size=(o,)),
    )
    for i, o in zip(dims[:-1], dims[1:])
  ]
  client = load_yaml(repo, 'configs/client/fedrcl.yaml')
  if not penalty:
    client.rcl_loss.pairs = [
      p for p in client.rcl_loss.pairs if p.name != 'penalty'
    ]
  client.prox_loss.weight = prox_weight
  overrides = {
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
      'num_clients': len(ROUND_SIZES),
      'participation_rate': 1.0,
      'global_rounds': num_rounds,
    },
    'server': server,
  }
  args = harness.compose(repo, {'client': 'fedrcl'}, overrides)
  args.client = client
  assert args.batch_size >= max(ROUND_SIZES)  # one full batch per epoch
  data = harness.ArrayDataset(
    images.reshape(len(images), -1).astype(np.float64) / 255.0,
    labels,
    num_classes,
  )
  server_cls = ServerM if server['type'] == 'ServerM' else Server
  models, trainer = harness.run_trainer(
    args, LevelsMLP(weights), RCLClient, server_cls(args), data, parts
  )
  p = name
  out = {
    f'{p}/images': images,
    f'{p}/labels': labels,
    f'{p}/penalty': np.array(penalty),
    f'{p}/prox_weight': np.array(float(prox_weight)),
    f'{p}/server_momentum': np.array(float(args.server.momentum)),
    f'{p}/fedacg': np.array(bool(args.server.get('FedACG'))),
    f'{p}/temperature': np.array(float(args.client.rcl_loss.temp)),
    f'{p}/local_lr': np.array(float(args.trainer.local_lr)),
    f'{p}/local_lr_decay': np.array(float(args.trainer.local_lr_decay)),
    f'{p}/local_epochs': np.array(int(args.trainer.local_epochs)),
    f'{p}/batch_size': np.array(int(args.batch_size)),
    f'{p}/weight_decay': np.array(float(args.optimizer.wd)),
    f'{p}/optimizer_momentum': np.array(float(args.optimizer.momentum)),
    f'{p}/grad_clip_norm': np.array(10.0),  # hard-coded in local_train
  }
  for pair in args.client.rcl_loss.pairs:
    if pair.name == 'penalty':
      out[f'{p}/threshold'] = np.array(float(pair.threshold))
      out[f'{p}/beta'] = np.array(float(pair.weight))
  for l, (w, b) in enumerate(weights):
    out[f'{p}/init/layers.{l}.weight'] = w
    out[f'{p}/init/layers.{l}.bias'] = b
  for c, part in enumerate(parts):
    out[f'{p}/part/{c}'] = part
  for r in range(num_rounds):
    out.update(harness.state_arrays(f'{p}/global/{r}', models[r]))
  print(name, 'final', {k: v.flatten()[:2] for k, v in models[-1].items()})
  return out


def load_yaml(repo, path):
  from omegaconf import OmegaConf

  return OmegaConf.load(os.path.join(repo, path))


def main():
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  parser.add_argument('--repo', required=True, help='FedRCL checkout')
  parser.add_argument('--commit', default='', help='if not a git work tree')
  parser.add_argument('--out', default='tests/golden/fedrcl.npz')
  parser.add_argument('--rounds_out', default='tests/golden/fedrcl_rounds.npz')
  flags = parser.parse_args()
  commit = harness.repo_commit(flags.repo, flags.commit)
  repo = os.path.abspath(flags.repo)
  torch.set_default_dtype(torch.float64)
  RCLClient, OmegaConf = load_authors(repo)
  header = {
    'repository': np.array(REPOSITORY),
    'commit': np.array(commit),
    'dtype': np.array('float64, autocast off'),
  }
  out = {
    **header,
    'function': np.array(FUNCTION),
    'temperatures': np.array([c[0] for c in CASES]),
    'thresholds': np.array([c[1] for c in CASES]),
    'betas': np.array([c[2] for c in CASES]),
    'topk_pos': np.array(1),
    'topk_neg': np.array(2),
    'branch_level': np.arange(len(LEVELS)),
  }
  default = make_args(OmegaConf, repo, *CASES[0])
  assert default.client.rcl_loss.topk_pos == 1
  assert default.client.rcl_loss.topk_neg == 2
  assert list(default.client.rcl_loss.branch_level) == [0, 1, 2, 3, 4]
  names = []
  for name, (labels, maps, logits, global_maps) in batches().items():
    names.append(name)
    out[f'{name}/labels'] = labels
    for l, m in enumerate(maps):
      out[f'{name}/level{l}'] = m
    for k, (temperature, threshold, beta) in enumerate(CASES):
      for method, penalty in (('rcl', True), ('scl', False)):
        args = make_args(OmegaConf, repo, temperature, threshold, beta, penalty)
        scalars, total, grads, terms, weights = run_case(
          RCLClient, args, labels, maps, logits, global_maps
        )
        prefix = f'{name}/case{k}/{method}'
        out[f'{prefix}/total'] = np.array(total)
        out[f'{prefix}/scl'] = np.array(scalars['scl'])
        for l, g in enumerate(grads):
          out[f'{prefix}/grad{l}'] = g
        out[f'{prefix}/scl_terms'] = terms['scl']
        if penalty:
          out[f'{prefix}/penalty'] = np.array(scalars['penalty'])
          out[f'{prefix}/penalty_terms'] = terms['penalty']
          assert weights['penalty'] == beta and weights['scl'] == 1
        else:
          assert 'penalty' not in scalars
        print(
          f'{prefix}: total {total:.12g}',
          {k: round(v, 6) for k, v in scalars.items()},
        )
      pen = out[f'{name}/case{k}/rcl/penalty_terms']
      fired = pen > 1.5 * np.log1p(np.exp(-2.0 / temperature))
      print(f'  penalty fired at {int(fired.sum())} of {fired.size}')
  out['batches'] = np.array(names)
  np.savez_compressed(flags.out, **out)
  print(f'wrote {flags.out}: {os.path.getsize(flags.out)} bytes')

  rounds = {**header, 'function': np.array(ROUNDS_FUNCTION)}
  rng = np.random.default_rng(20240618)
  with tempfile.TemporaryDirectory() as tmp:
    for name in ROUND_RUNS:
      rounds.update(run_rounds(repo, os.path.join(tmp, name), rng, name))
  np.savez_compressed(flags.rounds_out, **rounds)
  print(f'wrote {flags.rounds_out}: {os.path.getsize(flags.rounds_out)} bytes')


if __name__ == '__main__':
  main()
