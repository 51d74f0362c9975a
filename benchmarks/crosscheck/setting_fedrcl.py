"""FedRCL vs FedAvg in our setting, run by the authors' own trainer.

Answers "does the setting explain the ordering?" for docs/results/fedrcl.md
(first section, "FedRCL vs FedAvg at 500 rounds (alpha 0.1, 3 seeds)"):
runs github.com/skynbe/FedRCL at commit 378beb409add17838567ea25238afadb3258514f
(Seo, Kim, Kim and Han, CVPR 2024) UNCHANGED -- trainers/base_trainer.py
Trainer.__init__/train (client sampling, lr schedule, the round loop),
clients/base_client.py Client (their FedAvg client) and clients/rcl_client.py
RCLClient (FedRCL: local_train, _algorithm, _algorithm_rcl, utils/loss.py
CLLoss), servers/base.py Server (plain mean), utils/data.py get_dataset +
datasets/cifar.py cifar_dirichlet_balanced (the partition), datasets/build.py
get_transform (the augmentation), evalers/base_evaler.py Evaler (test
accuracy), utils/misc.py initalize_random_seed -- on Fashion-MNIST with OUR
small CNN, built in PyTorch here.

Commands (one run at a time, 1 torch thread; --resume continues a run from
its last checkpoint, written every 25 rounds):

  # from the repository root:
  PYTHONPATH=/path/to/pydeps/fedrcl:/path/to/pydeps/torchvision nice -n 10 \\
    /path/to/torch-env/bin/python benchmarks/crosscheck/setting_fedrcl.py run \\
      --repo=/path/to/FedRCL --method=fedavg --seed=0 \\
      --rounds=500 --out=runs/authors/fedrcl --resume
  ... --method=fedrcl ...            (the same for seeds 1 and 2)
  PYTHONPATH=... /path/to/torch-env/bin/python \\
    benchmarks/crosscheck/setting_fedrcl.py table --out=runs/authors/fedrcl

`run` writes <out>/<method>_seed<s>.json (test accuracy per evaluated round,
the losses and seconds of every round, the composed config) and
<out>/ckpt/<method>_seed<s>.pt; a run taken to --rounds=100 and then resumed
with --rounds=500 is the same computation as a straight 500-round run (the
trainer's global_rounds only names its final model file). `table` prints
their numbers beside ours (EMA 0.9 at round 500 -- the bias-corrected EMA of
launch/sweep.py over the per-round accuracies --, raw at 500, mean of rounds
496-500, the EMA every 50 rounds, the paired difference FedRCL - FedAvg with
its 95% t-interval, launch/paired.py paired_interval; and the same at round
100).

What is patched, and why (nothing of the method is replaced):
  * data (a): Fashion-MNIST from the IDX files (/usr/share/datasets/
    fashion-mnist, decompressed once into --data_root as torchvision's
    FashionMNIST reads them) through torchvision.datasets.FashionMNIST, the
    dataset class of the same family as the CIFAR10 class their
    datasets/build.py registers; transforms from their get_transform with
    the config entry their datasets/configs.yaml has for CIFAR
    (imsize 28 instead of 32; mean/std the Fashion-MNIST training set's,
    0.2860/0.3530, computed here). Their training transform is thus
    RandomRotation(10), RandomCrop(28, padding=4), RandomHorizontalFlip,
    ToTensor, Normalize; test: CenterCrop(28) (a no-op), ToTensor,
    Normalize, applied once to the 10,000 test images and kept
    (`PretransformedSet`: the transform has no randomness, so the Evaler
    sees the same tensors; it saves a third of the per-round PIL work).
  * model (b): `SmallCNN`, fedjax_metric/models/small_cnn.py at width 16,
    GroupNorm(2), embedding 128 in torch: conv3x3(16, stride 2, SAME) - GN -
    ReLU - conv3x3(32, stride 2, SAME) - GN - ReLU - dense(128) - ReLU -
    dense(10); flax's SAME padding (pad 0 before, 1 after for these stride-2
    convs), flax's initialisers (truncated lecun normal kernels, zero
    biases) and GroupNorm epsilon 1e-6. It returns the feature dict the way
    their ResNet18_base does: 'layer0', 'layer1' the two conv stages'
    outputs after GN and before ReLU (with no_relu=True, as the client
    calls it: feature_relu False), 'layer2' = 'logit' (ResNet18_base's
    'layer5'), 'feature' the dense embedding, num_layers 3 ("layer0 to
    layerN (fc)" as their models/resnet.py counts). Their _algorithm_rcl
    average-pools 4-D maps, so the contrastive levels are the spatial means
    of the two pre-ReLU conv stages: ours. Checked once against the flax
    SmallCNN with its weights copied in: logits and both pooled levels agree
    to 3.6e-7 (float32); 207,018 parameters; initial weight scales match.
  * config: their configs/config.yaml + client/{fedrcl,base}.yaml,
    dataset/cifar10.yaml, trainer/server/evaler/model base files composed
    as hydra's defaults list does (fedrcl_harness.compose), then the
    overrides of `overrides()` below, each listed there with its reason.
  * import-only dependencies (torchmetrics, matplotlib, wandb, imageio,
    torchinfo, umap, netcal, coloredlogs): empty modules
    (fedrcl_harness._EmptyModule); nothing run here calls them (Trainer.
    evaluate's plt.close() instantiates an empty class). torchvision and
    PIL are real (/path/to/pydeps/torchvision: torchvision 0.28.0, pillow);
    the wheel's compiled operators are built for a CUDA torch and do not
    register with this CPU torch, so the package __init__ (which registers
    them) is skipped and its pure-Python submodules (transforms, datasets)
    are imported directly (`load_torchvision`).
  * logging/bookkeeping: `RecordingTrainer` subclasses their Trainer and
    overrides only evaluate (calls theirs, keeps the accuracy; skips it at
    rounds outside the --eval_every/--dense_last schedule; by default every
    round is evaluated, as their eval.freq 1) and wandb_log (wandb is off:
    records the round's losses and time; every 25 rounds and at the end it
    writes the JSON and a checkpoint of the global model and the numpy/
    torch/python RNG states, so a resumed run continues the same random
    streams: 2 rounds + resume to 3 gives the 3-round run's accuracies).
  * partition: their get_dataset is called once before the run's seed is
    set, so that the split file exists and every run reads it (their
    cifar_dirichlet_balanced draws under temp_seed(0): the partition is the
    same for every seed; when it creates the file it also leaves torch's
    global RNG reseeded to 0, which would make the first run's torch
    stream differ from the others').

This script does not import fedjax_metric.
"""

import argparse
import copy
import importlib.util
import json
import logging
import math
import os
import random
import sys
import time
import types

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import fedrcl_harness as harness  # noqa: E402

REPOSITORY = 'skynbe/FedRCL'
COMMIT = '378beb409add17838567ea25238afadb3258514f'
IDX_DIR = '/usr/share/datasets/fashion-mnist'
IDX_FILES = (
  'train-images-idx3-ubyte',
  'train-labels-idx1-ubyte',
  't10k-images-idx3-ubyte',
  't10k-labels-idx1-ubyte',
)
# Stubbed (import-only); torchvision and PIL are real here.
IMPORT_ONLY = tuple(
  m for m in harness.IMPORT_ONLY if m not in ('torchvision', 'PIL')
)
CHECKPOINT_EVERY = 25
# Ours, docs/results/fedrcl.md first section (EMA 0.9 at round 500, %).
OURS_EMA = {
  'fedavg': (82.58, 82.89, 81.51),
  'fedrcl': (79.58, 81.00, 77.66),
}
OURS_SUMMARY = {
  # mean +- sd over seeds: EMA 500, raw 500, mean of rounds 496-500.
  'fedavg': ('82.33 ± 0.73', '82.85 ± 1.39', '82.12 ± 1.14'),
  'fedrcl': ('79.41 ± 1.68', '79.90 ± 0.08', '79.34 ± 2.26'),
}


def load_torchvision():
  """torchvision's pure-Python packages without its __init__ (see the
  module docstring): a package module whose __path__ is the installed one."""
  if 'torchvision' in sys.modules:
    return
  spec = importlib.util.find_spec('torchvision')
  if spec is None:
    raise SystemExit(
      'torchvision not found: pip install --target /path/to/pydeps/torchvision '
      '--no-deps torchvision==0.28.0 pillow, and put it on PYTHONPATH'
    )
  module = types.ModuleType('torchvision')
  module.__path__ = list(spec.submodule_search_locations)
  module.__file__ = spec.origin
  sys.modules['torchvision'] = module
  import torchvision.datasets  # noqa: F401
  import torchvision.transforms  # noqa: F401


def add_repo(repo):
  load_torchvision()
  harness.add_repo(repo, stubbed=IMPORT_ONLY)  # torchvision and PIL real


# ----------------------------------------------------------------- model --


def _lecun_normal_(weight, fan_in):
  """flax.linen's default kernel init: variance_scaling(1, fan_in,
  truncated_normal), i.e. a normal truncated at +-2 sd, rescaled so the
  variance is 1 / fan_in."""
  std = math.sqrt(1.0 / fan_in) / 0.87962566103423978
  nn.init.trunc_normal_(weight, mean=0.0, std=std, a=-2 * std, b=2 * std)


class SmallCNN(nn.Module):
  """fedjax_metric/models/small_cnn.py SmallCNN (pool 'stride', norm
  'group', projection_dim 0) in torch, with the feature dict of FedRCL's
  ResNet18_base (models/resnet_base.py)."""

  def __init__(self, num_classes=10, width=16, embedding_dim=128, image=28):
    super().__init__()
    self.conv1 = nn.Conv2d(1, width, 3, stride=2, padding=0)
    self.gn1 = nn.GroupNorm(2, width, eps=1e-6)
    self.conv2 = nn.Conv2d(width, 2 * width, 3, stride=2, padding=0)
    self.gn2 = nn.GroupNorm(2, 2 * width, eps=1e-6)
    side = image
    for _ in range(2):
      side = -(-side // 2)  # SAME, stride 2
    self.fc1 = nn.Linear(2 * width * side * side, embedding_dim)
    self.fc = nn.Linear(embedding_dim, num_classes)
    self.num_layers = 3  # layer0, layer1 (conv stages), layer2 (logits)
    for conv in (self.conv1, self.conv2):
      _lecun_normal_(conv.weight, conv.in_channels * 9)
      nn.init.zeros_(conv.bias)
    for dense in (self.fc1, self.fc):
      _lecun_normal_(dense.weight, dense.in_features)
      nn.init.zeros_(dense.bias)

  @staticmethod
  def _same(x):
    """flax 'SAME' for a 3x3 stride-2 conv: total pad (out-1)*2+3-in, the
    smaller half before (0 before, 1 after for even sizes)."""
    h, w = x.shape[-2:]
    ph = max((-(-h // 2) - 1) * 2 + 3 - h, 0)
    pw = max((-(-w // 2) - 1) * 2 + 3 - w, 0)
    return F.pad(x, (pw // 2, pw - pw // 2, ph // 2, ph - ph // 2))

  def forward(self, x, no_relu=True):
    results = {}
    out = self.gn1(self.conv1(self._same(x)))
    results['layer0'] = out if no_relu else F.relu(out)
    out = F.relu(out)
    out = self.gn2(self.conv2(self._same(out)))
    results['layer1'] = out if no_relu else F.relu(out)
    out = F.relu(out)
    out = F.relu(self.fc1(out.flatten(1)))
    logit = self.fc(out)
    results['feature'] = out
    results['logit'] = logit
    results['layer2'] = logit
    return results


# ------------------------------------------------------------------ data --


def prepare_idx(data_root):
  """The IDX files, decompressed where torchvision's FashionMNIST reads
  them (<root>/FashionMNIST/raw/)."""
  import gzip
  import shutil

  raw = os.path.join(data_root, 'FashionMNIST', 'raw')
  os.makedirs(raw, exist_ok=True)
  for name in IDX_FILES:
    dst = os.path.join(raw, name)
    if not os.path.exists(dst):
      with gzip.open(os.path.join(IDX_DIR, name + '.gz'), 'rb') as f:
        with open(dst + '.tmp', 'wb') as g:
          shutil.copyfileobj(f, g)
      os.replace(dst + '.tmp', dst)


def build_datasets(args, data_root):
  """Their datasets/build.py build_datasets with FashionMNIST for CIFAR10:
  their get_transform with a configs.yaml-style entry for 28x28x1."""
  from datasets.build import get_transform
  from torchvision.datasets import FashionMNIST

  prepare_idx(data_root)
  plain = FashionMNIST(data_root, train=True, download=False)
  x = plain.data.double() / 255.0
  config = {
    'imsize': 28,
    'mean': [float(x.mean())],
    'std': [float(x.std(unbiased=False))],
    'num_classes': 10,
  }
  out = {}
  for split, train in (('train', True), ('test', False)):
    out[split] = FashionMNIST(
      data_root,
      train=train,
      download=False,
      transform=get_transform(args, train, config),
    )
  out['test'] = PretransformedSet(out['test'])
  return out, config


class PretransformedSet(torch.utils.data.Dataset):
  """A dataset whose transform is deterministic (the test set's
  CenterCrop, ToTensor, Normalize), transformed once: the same tensors the
  Evaler's DataLoader would get each round, without redoing 10,000 PIL
  conversions per evaluation."""

  def __init__(self, dataset):
    self.classes = dataset.classes
    self.class_to_idx = dataset.class_to_idx
    items = [dataset[i] for i in range(len(dataset))]
    self.inputs = torch.stack([x for x, _ in items])
    self.labels = [int(y) for _, y in items]

  def __len__(self):
    return len(self.labels)

  def __getitem__(self, i):
    return self.inputs[i], self.labels[i]


# ---------------------------------------------------------------- config --


def overrides(method, seed, rounds, out, data_root):
  """Values put over the released configs, each with its reason."""
  run = f'{method}_seed{seed}'
  o = {
    'seed': seed,  # 0, 1, 2 (config.yaml: 0)
    # fp16 autocast: CPU, float32 (config.yaml: True, a CUDA GradScaler).
    'use_amp': False,
    'pin_memory': False,  # no GPU
    'wandb': False,
    'multiprocessing': False,
    'exp_name': run,
    'checkpoint_path': os.path.join(out, 'checkpoints', run),
    'dataset': {
      'name': 'FashionMNIST',  # data (a)
      'path': data_root,
      'client_path': os.path.join(out, 'client_data'),
      'download': False,
    },
    'split': {'alpha': 0.1},  # our table's alpha (config.yaml: 0.3)
    'trainer': {'global_rounds': rounds},  # 500 (trainer/base.yaml: 1000)
  }
  if method == 'fedrcl':
    # branch_level names ResNet-18's five feature levels [0..4]; ours has
    # two (layer2 is the logits, as ResNet's layer5, which [0..4] leaves
    # out), so [0, 1]: the same "every feature level, not the logits".
    o['client'] = {'rcl_loss': {'branch_level': [0, 1]}}
  return o


def compose(repo, method, seed, rounds, out, data_root):
  client = {'fedrcl': 'fedrcl', 'fedavg': 'base'}[method]
  return harness.compose(
    repo,
    {'client': client, 'dataset': 'cifar10'},
    overrides(method, seed, rounds, out, data_root),
  )


def evaluated(round_, rounds, every, dense_last):
  """1-based round is evaluated: every ``every`` rounds, round 1 and each
  of the last ``dense_last`` rounds."""
  return round_ == 1 or round_ % every == 0 or round_ > rounds - dense_last


# ------------------------------------------------------------------- run --


def make_trainer_class(Trainer):
  class RecordingTrainer(Trainer):
    """Their Trainer; evaluate and wandb_log (logging) overridden only to
    record, schedule evaluations and checkpoint."""

    def setup_recording(self, state, path, ckpt, schedule):
      self.record = state
      self.record_path = path
      self.ckpt_path = ckpt
      self.schedule = schedule
      self.round_start = time.time()

    def evaluate(self, epoch, local_datasets=None):
      if not self.schedule(epoch + 1):
        return None
      t = time.time()
      self._in_evaluate = True  # its own wandb_log call is not a round's end
      try:
        res = super().evaluate(epoch=epoch, local_datasets=local_datasets)
      finally:
        self._in_evaluate = False
      self.record['evaluations'].append(
        {'round': epoch + 1, 'test_accuracy': float(res['acc'])}
      )
      self.record['eval_seconds'].append(time.time() - t)
      return res

    def wandb_log(self, log, step=None):
      super().wandb_log(log, step=step)  # wandb off: nothing
      if getattr(self, '_in_evaluate', False):
        return
      now = time.time()
      rec = self.record
      rec['train'].append(
        {'round': step + 1, **{k: float(v) for k, v in log.items()}}
      )
      rec['seconds_per_round'].append(now - self.round_start)
      rec['rounds_done'] = step + 1
      self.round_start = now
      last = rec['evaluations'][-1] if rec['evaluations'] else None
      print(
        f'[{rec["method"]} s{rec["seed"]}] round {step + 1}: '
        f'{now - rec["_t0"]:.0f}s, {rec["seconds_per_round"][-1]:.2f}s/round'
        + (
          f', acc@{last["round"]} {last["test_accuracy"]:.2f}' if last else ''
        ),
        flush=True,
      )
      final = step + 1 == self.global_rounds
      if (step + 1) % CHECKPOINT_EVERY == 0 or final:
        save_checkpoint(self, step + 1)
        write_json(rec, self.record_path)

  return RecordingTrainer


def write_json(rec, path):
  tmp = path + '.tmp'
  with open(tmp, 'w') as f:
    json.dump({k: v for k, v in rec.items() if not k.startswith('_')}, f)
  os.replace(tmp, path)


def save_checkpoint(trainer, round_done):
  state = {
    'round': round_done,
    'model': copy.deepcopy(trainer.model.state_dict()),
    'torch_rng': torch.get_rng_state(),
    'numpy_rng': np.random.get_state(),
    'python_rng': random.getstate(),
    'record': {
      k: v for k, v in trainer.record.items() if not k.startswith('_')
    },
  }
  tmp = trainer.ckpt_path + '.tmp'
  torch.save(state, tmp)
  os.replace(tmp, trainer.ckpt_path)


def run(flags):
  torch.set_num_threads(1)
  logging.basicConfig(level=logging.WARNING, format='%(message)s')
  add_repo(flags.repo)
  from clients.build import get_client_type
  from evalers.build import get_evaler_type
  from omegaconf import OmegaConf
  from servers.build import build_server
  from trainers.base_trainer import Trainer
  from utils import get_dataset, initalize_random_seed

  out = os.path.abspath(flags.out)
  data_root = os.path.abspath(flags.data_root)
  os.makedirs(os.path.join(out, 'ckpt'), exist_ok=True)
  name = f'{flags.method}_seed{flags.seed}'
  json_path = os.path.join(out, f'{name}.json')
  ckpt_path = os.path.join(out, 'ckpt', f'{name}.pt')
  args = compose(
    flags.repo, flags.method, flags.seed, flags.rounds, out, data_root
  )
  datasets, data_config = build_datasets(args, data_root)
  # The split file first (see the module docstring), then the run's seed.
  get_dataset(args, datasets['train'], mode=args.split.mode)

  # As federated_train.py: seed, model, client/server/evaler types, Trainer.
  initalize_random_seed(args)
  model = SmallCNN(num_classes=10, width=16, embedding_dim=128)
  client_type = get_client_type(args)
  server = build_server(args)
  evaler_type = get_evaler_type(args)
  trainer = make_trainer_class(Trainer)(
    model=model,
    client_type=client_type,
    server=server,
    evaler_type=evaler_type,
    datasets=datasets,
    device=torch.device('cpu'),
    args=args,
  )
  schedule = lambda r: evaluated(
    r, flags.rounds, flags.eval_every, flags.dense_last
  )
  record = {
    'method': flags.method,
    'seed': flags.seed,
    'repository': REPOSITORY,
    'commit': COMMIT,
    'model': 'SmallCNN(width 16, GroupNorm(2), embedding 128), torch',
    'rounds_planned': flags.rounds,
    'rounds_done': 0,
    'eval_schedule': {
      'every': flags.eval_every,
      'dense_last': flags.dense_last,
      'also': [1],
    },
    'data_config': data_config,
    'config': OmegaConf.to_container(args, resolve=True),
    'torch_threads': torch.get_num_threads(),
    'evaluations': [],
    'eval_seconds': [],
    'train': [],
    'seconds_per_round': [],
    'resumed_at': [],
  }
  if flags.resume and os.path.exists(ckpt_path):
    state = torch.load(ckpt_path, weights_only=False)
    trainer.model.load_state_dict(state['model'])
    trainer.start_round = state['round']
    record = state['record']
    record['resumed_at'].append(state['round'])
    record['rounds_planned'] = flags.rounds  # a run may be extended
    torch.set_rng_state(state['torch_rng'])
    np.random.set_state(state['numpy_rng'])
    random.setstate(state['python_rng'])
    print(f'resumed {name} at round {state["round"]}', flush=True)
    if state['round'] >= flags.rounds:
      print('already complete')
      return
  record['_t0'] = time.time()
  trainer.setup_recording(record, json_path, ckpt_path, schedule)
  trainer.train()
  write_json(record, json_path)
  print(f'wrote {json_path}')


# ----------------------------------------------------------------- table --


def ema(values, decay=0.9):
  """launch/sweep.py ema: bias-corrected EMA over the evaluations."""
  out, s = [], 0.0
  for t, x in enumerate(values, start=1):
    s = decay * s + (1 - decay) * x
    out.append(s / (1 - decay**t))
  return np.asarray(out)


def ema_curve(evaluations, rounds):
  """EMA(0.9) after each of rounds 1..rounds over the per-round series; a
  round that was not evaluated takes the linear interpolation of its
  evaluated neighbours (none is missing when every round was evaluated,
  the default here). Returns (curve [rounds], every round evaluated)."""
  r = np.asarray([e['round'] for e in evaluations], float)
  a = np.asarray([e['test_accuracy'] for e in evaluations], float)
  full = np.interp(np.arange(1, rounds + 1), r, a)
  return ema(full), bool(set(r.astype(int)) >= set(range(1, rounds + 1)))


# Ours, docs/results/fedrcl.md: FedRCL - FedAvg EMA gap, mean over seeds 0-2.
OURS_GAP = {100: -2.35, 200: -2.85, 300: -2.68, 400: -2.74, 500: -2.91}
MILESTONES = tuple(range(50, 501, 50))


def load_run(out, method, seed):
  path = os.path.join(out, f'{method}_seed{seed}.json')
  if not os.path.exists(path):
    return None
  rec = json.load(open(path))
  ev = rec['evaluations']
  done = ev[-1]['round'] if ev else 0
  acc = {e['round']: e['test_accuracy'] for e in ev}
  curve, exact = ema_curve(ev, done) if ev else (np.zeros(0), True)
  secs = rec['seconds_per_round']
  return {
    'done': done,
    'acc': acc,
    'ema': {r: float(curve[r - 1]) for r in MILESTONES if r <= done},
    'exact': exact,
    'raw500': acc.get(500),
    'last5': (
      float(np.mean([acc[r] for r in range(496, 501)])) if done >= 500 else None
    ),
    'sec_per_round': float(np.median(secs)) if secs else None,
    'resumed_at': rec.get('resumed_at', []),
  }


def fmt(x):
  return '' if x is None else f'{x:.2f}'


def rows_with_data(runs, R):
  return any(r and R in r['ema'] for r in runs.values())


def load_paired_interval():
  """launch/paired.py's paired_interval. That module imports absl and the
  launch package (not in the torch venv); then the function alone is taken
  from its source, unchanged."""
  root = os.path.join(HERE, '..', '..')
  sys.path.insert(0, root)
  try:
    from launch.paired import paired_interval

    return paired_interval
  except ImportError:
    import ast
    import typing

    path = os.path.join(root, 'launch', 'paired.py')
    tree = ast.parse(open(path).read())
    fn = next(
      n
      for n in tree.body
      if isinstance(n, ast.FunctionDef) and n.name == 'paired_interval'
    )
    ns = {
      'math': math,
      'np': np,
      'Sequence': typing.Sequence,
      'Dict': typing.Dict,
    }
    exec(compile(ast.Module([fn], []), path, 'exec'), ns)
    return ns['paired_interval']


def table(flags):
  paired_interval = load_paired_interval()

  out = flags.out
  runs = {
    (m, s): load_run(out, m, s) for s in (0, 1, 2) for m in ('fedavg', 'fedrcl')
  }
  print(
    'Per run (test accuracy %, their code; ours from docs/results/fedrcl.md):\n'
  )
  print(
    '| method | seed | rounds done | s/round (median) | their EMA 0.9 @500 '
    '| their raw @500 | their mean 496-500 | our EMA 0.9 @500 |'
  )
  print('|---|---|---|---|---|---|---|---|')
  for (m, s), r in runs.items():
    if r is None:
      print(f'| {m} | {s} | 0 | | | | | {OURS_EMA[m][s]:.2f} |')
      continue
    print(
      f'| {m} | {s} | {r["done"]} | {fmt(r["sec_per_round"])} | '
      f'{fmt(r["ema"].get(500))} | {fmt(r["raw500"])} | {fmt(r["last5"])} | '
      f'{OURS_EMA[m][s]:.2f} |'
    )
  print(
    '\nOur mean ± sd over seeds 0-2 (EMA @500, raw @500, mean 496-500): '
    + '; '.join(f'{m}: {", ".join(v)}' for m, v in OURS_SUMMARY.items())
  )
  print('\nEMA 0.9 of their runs at rounds 50-500 (over rounds 1..R):\n')
  print('| method | seed | ' + ' | '.join(f'R{r}' for r in MILESTONES) + ' |')
  print('|---|---|' + '---|' * len(MILESTONES))
  for (m, s), r in runs.items():
    if r:
      print(
        f'| {m} | {s} | '
        + ' | '.join(fmt(r['ema'].get(R)) for R in MILESTONES)
        + ' |'
      )
  print('\nPaired difference FedRCL - FedAvg of the EMA (points), per round:\n')
  print(
    '| round | their code: seeds 0 / 1 / 2 | their mean [95% t-interval] '
    '| ours: mean over seeds 0-2 |'
  )
  print('|---|---|---|---|')
  for R in MILESTONES:
    if not rows_with_data(runs, R) and R not in OURS_GAP:
      continue
    d = []
    for s in (0, 1, 2):
      a, b = runs[('fedavg', s)], runs[('fedrcl', s)]
      d.append(
        b['ema'][R] - a['ema'][R]
        if a and b and R in a['ema'] and R in b['ema']
        else None
      )
    have = [x for x in d if x is not None]
    iv = paired_interval(have) if have else None
    cell = (
      f'{iv["mean"]:+.2f} [{iv["low"]:+.2f}, {iv["high"]:+.2f}] (n={iv["n"]})'
      if iv and iv['n'] >= 2
      else (f'{iv["mean"]:+.2f} (n=1)' if iv else '')
    )
    print(
      f'| {R} | '
      + ' / '.join('–' if x is None else f'{x:+.2f}' for x in d)
      + f' | {cell} | {fmt(OURS_GAP.get(R))} |'
    )
  ours = [OURS_EMA['fedrcl'][s] - OURS_EMA['fedavg'][s] for s in (0, 1, 2)]
  iv = paired_interval(ours)
  print(
    '\nOurs at round 500, per seed: '
    + ' / '.join(f'{x:+.2f}' for x in ours)
    + f'; mean {iv["mean"]:+.2f} [{iv["low"]:+.2f}, {iv["high"]:+.2f}] (n=3, t, 2 df).'
  )
  print('\nAt round 100 (an interim point while the runs go on to 500):\n')
  print('| method | seed | EMA 0.9 @100 | raw @100 | mean 96-100 |')
  print('|---|---|---|---|---|')
  for (m, s), r in runs.items():
    if r and r['done'] >= 100:
      print(
        f'| {m} | {s} | {fmt(r["ema"][100])} | {fmt(r["acc"][100])} | '
        f'{fmt(float(np.mean([r["acc"][k] for k in range(96, 101)])))} |'
      )
  for key, label in (
    ('ema', 'EMA @100'),
    ('last5', 'mean 96-100'),
    ('raw', 'raw @100'),
  ):
    d = []
    for s in (0, 1, 2):
      a, b = runs[('fedavg', s)], runs[('fedrcl', s)]
      if a and b and a['done'] >= 100 and b['done'] >= 100:
        val = lambda r: (
          r['ema'][100]
          if key == 'ema'
          else r['acc'][100]
          if key == 'raw'
          else float(np.mean([r['acc'][k] for k in range(96, 101)]))
        )
        d.append(val(b) - val(a))
    if d:
      iv = paired_interval(d)
      print(
        f'FedRCL - FedAvg, {label}: '
        + ' / '.join(f'{x:+.2f}' for x in d)
        + f'; mean {iv["mean"]:+.2f} [{iv["low"]:+.2f}, {iv["high"]:+.2f}] (n={iv["n"]})'
      )
  inexact = [k for k, r in runs.items() if r and not r['exact']]
  if inexact:
    print(f'(EMA with interpolated rounds for {inexact}.)')


def main():
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  sub = parser.add_subparsers(dest='cmd', required=True)
  r = sub.add_parser('run')
  r.add_argument('--repo', required=True, help='a checkout of skynbe/FedRCL')
  r.add_argument('--method', choices=('fedavg', 'fedrcl'), required=True)
  r.add_argument('--seed', type=int, default=0)
  r.add_argument('--rounds', type=int, default=500)
  r.add_argument('--out', default='runs/authors/fedrcl')
  r.add_argument('--data_root', default='runs/authors/fmnist_torchvision')
  r.add_argument('--eval_every', type=int, default=1)
  r.add_argument('--dense_last', type=int, default=20)
  r.add_argument('--resume', action='store_true')
  t = sub.add_parser('table')
  t.add_argument('--out', default='runs/authors/fedrcl')
  flags = parser.parse_args()
  if flags.cmd == 'run':
    run(flags)
  else:
    table(flags)


if __name__ == '__main__':
  main()
