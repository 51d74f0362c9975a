r"""FedAU / FedAvg / MIFA with the authors' code in the protocol of our table.

Runs the released code of Wang and Ji, 'A Lightweight Method for Tackling
Unknown Participation Statistics in Federated Averaging', ICLR 2024
(github.com/IBM/fedau, a scratch copy of commit
6e9cce9b2e568666b5c3e0fab8f092a539884d7b), main.py by runpy, in the protocol
of docs/results/participation.md ("the gap against T": PMFL's heterogeneous
setting, Bernoulli participation, 1,000 rounds, evaluation every 25 rounds,
the top-5 mean of the test accuracy at T = 1,000), with our small CNN on
Fashion-MNIST:

  nice -n 10 /path/to/torch-env/bin/python benchmarks/crosscheck/setting_fedau.py \
      run --repo=/path/to/fedau --out=runs/authors/fedau \
      --weightings=average_participating,adaptive,mifa --seeds=1,2,3
  /path/to/torch-env/bin/python benchmarks/crosscheck/setting_fedau.py \
      summarize --out=runs/authors/fedau --ours=runs/authors/fedau/ours

Each (weighting, seed) is one process-internal call of their main.py with

  -data fashion -weighting W -iters-total 5000 -iters-per-round 5
  -iters-per-eval 125 -lr 0.1 -minibatch 16 -total-workers 250
  -participation bernoulli -gpu 0 -seeds S -save-checkpoint 0
  -save-final-model 0

(every other flag at its default: -lr-global 1, -k-adaptive 100000 (no
cutoff), -data-dirichlet-alpha 0.1, -participation-dirichlet-alpha 0.1,
-participation-prob-mean 0.1, -participation-prob-min 0.02, lr decay from
iteration 50,000, i.e. never within 5,000). One seed per call is the same
computation as their ``-seeds 1,2,3`` loop: main.py re-seeds `random`,
NumPy and torch and reloads the data at the top of every seed. A finished
(weighting, seed) has ``<out>/theirs/<weighting>_seed<S>.json`` and is
skipped on a rerun; an unfinished one starts again from round 0 (their loop
has no checkpoint), so resuming is rerunning the same command.

Patched at run time (their files are not edited):

  dataset.dataset (module replaced): `load_data` reads the Fashion-MNIST IDX
    files (/usr/share/datasets/fashion-mnist) instead of torchvision's
    download, and scales images as our pipeline does,
    x = (uint8 / 255 - mean) / std with the training set's mean and std
    (fedjax_metric/data/augment.py `channel_stats`; theirs is MNIST's
    0.1307 / 0.3081). Items are (float32 [1, 28, 28], int64 label tensor)
    and `.targets` an int64 tensor, as their FashionMNISTEnhanced gives.
  model.cnn_mnist (module replaced): `ModelCNNMnist` is our small CNN
    (fedjax_metric/models/small_cnn.py with configs/fedau.py's settings,
    fedjax_metric/paper_settings.py `participation_setting`: width 16,
    pool='stride', norm='none', embedding_dim 64) in PyTorch: conv3x3(16,
    stride 2, SAME) -> ReLU -> conv3x3(32, stride 2, SAME) -> ReLU ->
    flatten (NHWC order, as flax's reshape) -> Dense(64) -> ReLU ->
    Dense(10); flax's initialisers (lecun_normal kernels: truncated normal,
    fan-in, variance 1; zero biases). XLA's SAME padding for a stride-2 3x3
    on an even size pads 0 before and 1 after, so the convs pad (0, 1) by
    hand. The output equals the flax model's for the same weights
    (`check-model`: the flax side runs under .venv/bin/python).
  torchvision (stub module): config.py imports torchvision.transforms at
    the top; -data fashion uses none of its transforms (transform_train
    and transform_train_eval are None).
  Recording only, behaviour unchanged: `util.util.WorkerSampler` is
    subclassed to count each round's participants (it calls the released
    `sample` and returns its answer: the same RNG draws), and
    `statistic.collect_stat.CollectStatistics.collect_stat_eval` is wrapped
    to time the evaluations and write progress; the released method still
    computes and writes the statistics (their CSV, in the run's work
    directory, is what the JSON is read from).

Nothing else is changed: their partition (util/util.py `partition`,
`data_participation_each_node`: participation probabilities with the
'expected' normalisation), the Bernoulli sampler, the training loop
(persistent per-client DataLoaders, batch 16, plain SGD), the aggregation
(main.py), the loss (nn.CrossEntropyLoss) and the evaluation (whole test
set, whole training set, every 125 iterations = 25 rounds) are the released
code. torch runs single-threaded (torch.set_num_threads(1)) on the CPU.

The results: ``<out>/theirs/<weighting>_seed<S>.json`` (per evaluated round:
round, test and training accuracy, training loss; the participation
probabilities' summary; the per-round participant counts; timings), and
``summarize`` writes ``<out>/summary.json`` with our runs (launch.sweep
workdirs under --ours) beside theirs: the top-5 mean of the test accuracy
at T = 1,000, the final accuracy, and the paired differences per code base
with 95% t-intervals (launch/paired.py `paired_interval`).
"""

import argparse
import csv
import glob
import gzip
import json
import math
import os
import runpy
import sys
import time
import types

import numpy as np

DATA_DIR = '/usr/share/datasets/fashion-mnist'
WEIGHTINGS = ('average_participating', 'adaptive', 'mifa')
NAMES = {
  'average_participating': 'FedAvg',
  'adaptive': 'FedAU',
  'mifa': 'MIFA',
}
ITERS_PER_ROUND = 5
ROUNDS = 1000
EVAL_EVERY = 25  # rounds
TOP_K = 5
WIDTH = 16
EMBEDDING_DIM = 4 * WIDTH
NUM_CLASSES = 10


# ---------------------------------------------------------------------------
# Fashion-MNIST from the IDX files, scaled as our pipeline scales it.
# ---------------------------------------------------------------------------


def read_idx(path):
  with gzip.open(path, 'rb') as f:
    data = f.read()
  ndim = data[3]
  dims = [
    int.from_bytes(data[4 + 4 * i : 8 + 4 * i], 'big') for i in range(ndim)
  ]
  return np.frombuffer(data, np.uint8, offset=4 + 4 * ndim).reshape(dims)


def load_fashion(data_dir=DATA_DIR):
  """uint8 images [N, 28, 28] and int64 labels [N] of train and test."""
  out = {}
  for split, prefix in (('train', 'train'), ('test', 't10k')):
    images = read_idx(os.path.join(data_dir, f'{prefix}-images-idx3-ubyte.gz'))
    labels = read_idx(os.path.join(data_dir, f'{prefix}-labels-idx1-ubyte.gz'))
    out[split] = (images, labels.astype(np.int64))
  return out


def channel_stats(images):
  """fedjax_metric/data/augment.py `channel_stats`: float64, then float32."""
  x = images.astype(np.float64) / 255.0
  return np.float32(x.mean()), np.float32(max(x.std(), 1e-6))


def make_dataset_class():
  import torch

  class IdxDataset(torch.utils.data.Dataset):
    """Their FashionMNISTEnhanced's interface on our scaling."""

    def __init__(self, images, labels, mean, std):
      x = (images.astype(np.float32) / np.float32(255.0) - mean) / std
      self.data_transformed = torch.from_numpy(
        np.ascontiguousarray(x[:, None, :, :], np.float32)
      )
      self.targets = torch.from_numpy(labels.astype(np.int64))
      self.targets_transformed = self.targets

    def __len__(self):
      return len(self.targets)

    def __getitem__(self, index):
      return self.data_transformed[index], self.targets_transformed[index]

  return IdxDataset


def make_load_data(data_dir=DATA_DIR):
  IdxDataset = make_dataset_class()
  raw = load_fashion(data_dir)
  mean, std = channel_stats(raw['train'][0])

  def load_data(dataset, data_path, device):
    del data_path, device  # their 'cpu'; the data stay on the CPU
    assert dataset == 'FashionMNIST', dataset
    return (
      IdxDataset(*raw['train'], mean, std),
      IdxDataset(*raw['test'], mean, std),
    )

  return load_data, (float(mean), float(std))


# ---------------------------------------------------------------------------
# Our small CNN in PyTorch.
# ---------------------------------------------------------------------------


def make_small_cnn_class(width=WIDTH, embedding_dim=EMBEDDING_DIM):
  import torch
  from torch import nn
  import torch.nn.functional as F

  def lecun_normal_(weight, fan_in):
    # jax.nn.initializers.lecun_normal: variance_scaling(1, fan_in,
    # truncated_normal): a standard normal truncated to [-2, 2], scaled by
    # sqrt(1 / fan_in) / 0.87962566103423978 (the truncated normal's sd).
    std = math.sqrt(1.0 / fan_in) / 0.87962566103423978
    nn.init.trunc_normal_(weight, mean=0.0, std=std, a=-2 * std, b=2 * std)

  class ModelCNNMnist(nn.Module):
    """fedjax_metric/models/small_cnn.py SmallCNN(width=16, pool='stride',
    norm='none', embedding_dim=64, num_classes=10) in PyTorch."""

    def __init__(self):
      super().__init__()
      self.conv1 = nn.Conv2d(1, width, 3, stride=2, padding=0)
      self.conv2 = nn.Conv2d(width, 2 * width, 3, stride=2, padding=0)
      self.fc1 = nn.Linear(7 * 7 * 2 * width, embedding_dim)
      self.fc2 = nn.Linear(embedding_dim, NUM_CLASSES)
      with torch.no_grad():
        for conv in (self.conv1, self.conv2):
          lecun_normal_(conv.weight, conv.in_channels * 9)
          nn.init.zeros_(conv.bias)
        for fc in (self.fc1, self.fc2):
          lecun_normal_(fc.weight, fc.in_features)
          nn.init.zeros_(fc.bias)

    def forward(self, x):
      # XLA 'SAME' for k = 3, s = 2 on an even size: 0 before, 1 after.
      x = F.relu(self.conv1(F.pad(x, (0, 1, 0, 1))))
      x = F.relu(self.conv2(F.pad(x, (0, 1, 0, 1))))
      x = x.permute(0, 2, 3, 1).reshape(x.shape[0], -1)  # flax's NHWC order
      return self.fc2(F.relu(self.fc1(x)))

  return ModelCNNMnist


# ---------------------------------------------------------------------------
# Running their main.py.
# ---------------------------------------------------------------------------


def _stub_module(name, **attrs):
  module = types.ModuleType(name)
  for k, v in attrs.items():
    setattr(module, k, v)
  sys.modules[name] = module
  return module


def author_argv(weighting, seed, iters_total):
  return [
    '-data', 'fashion',
    '-weighting', weighting,
    '-iters-total', str(iters_total),
    '-iters-per-round', str(ITERS_PER_ROUND),
    '-iters-per-eval', str(ITERS_PER_ROUND * EVAL_EVERY),
    '-lr', '0.1',
    '-minibatch', '16',
    '-total-workers', '250',
    '-participation', 'bernoulli',
    '-gpu', '0',
    '-seeds', str(seed),
    '-save-checkpoint', '0',
    '-save-final-model', '0',
  ]  # fmt: skip


def run_one(repo, weighting, seed, rounds, out_dir, load_data, scaling):
  import torch

  # The golden fixture's driver, beside this file (it imports torch, which
  # `summarize`'s environment lacks: imported here, not at the top).
  sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
  import fedau as golden  # pylint: disable=g-import-not-at-top

  torch.set_num_threads(1)
  work = os.path.join(out_dir, 'work', f'{weighting}_seed{seed}')
  os.makedirs(work, exist_ok=True)
  for old in glob.glob(os.path.join(work, '*.csv')):
    os.remove(old)  # their CollectStatistics appends
  progress_path = os.path.join(work, 'progress.log')
  iters_total = rounds * ITERS_PER_ROUND
  argv = author_argv(weighting, seed, iters_total)

  # Their modules forgotten, argv theirs, torchvision stubbed: as the
  # golden fixture's driver does (benchmarks/crosscheck/fedau.py).
  golden.fresh_author_modules(repo, argv)
  _stub_module('dataset.dataset', load_data=load_data)
  _stub_module('model.cnn_mnist', ModelCNNMnist=make_small_cnn_class())

  import statistic.collect_stat as collect_stat  # their module, after argv
  import util.util as util

  counts = []  # participants per round
  calls = {'n': 0}
  num_clients = 250

  class CountingSampler(util.WorkerSampler):
    """The released sampler; its answers are counted."""

    def sample(self):
      got = super().sample()
      if calls['n'] % num_clients == 0:
        counts.append(0)
      calls['n'] += 1
      counts[-1] += int(bool(got))
      return got

  util.WorkerSampler = CountingSampler

  timing = {'start': time.time(), 'eval_seconds': 0.0, 'evals': []}
  original_eval = collect_stat.CollectStatistics.collect_stat_eval

  def timed_eval(self, seed_, num_iter, *args, **kwargs):
    t0 = time.time()
    result = original_eval(self, seed_, num_iter, *args, **kwargs)
    t1 = time.time()
    timing['eval_seconds'] += t1 - t0
    timing['evals'].append((num_iter // ITERS_PER_ROUND, t1 - timing['start']))
    with open(progress_path, 'a') as f:
      f.write(
        f'round {num_iter // ITERS_PER_ROUND} wall {t1 - timing["start"]:.1f}s '
        f'eval {t1 - t0:.1f}s\n'
      )
    return result

  collect_stat.CollectStatistics.collect_stat_eval = timed_eval

  cwd = os.getcwd()
  os.chdir(work)
  try:
    g = runpy.run_path(os.path.join(repo, 'main.py'), run_name='__main__')
  finally:
    os.chdir(cwd)
  wall = time.time() - timing['start']

  (csv_path,) = glob.glob(os.path.join(work, '*.csv'))
  evaluations = []
  with open(csv_path) as f:
    for row in csv.DictReader(f):
      evaluations.append(
        {
          'round': int(row['num_iter']) // ITERS_PER_ROUND,
          'test_accuracy': float(row['test_accuracy']),
          'train_accuracy': float(row['training_accuracy']),
          'train_loss': float(row['training_loss']),
        }
      )
  p = np.asarray(g['participation_prob_each_node'], np.float64)
  sizes = np.array([len(g['dict_users'][n]) for n in range(num_clients)])
  counts = np.array(counts[:rounds])
  return {
    'code': 'IBM/fedau@6e9cce9b2e568666b5c3e0fab8f092a539884d7b (scratch copy)',
    'driver': 'benchmarks/crosscheck/setting_fedau.py',
    'method': NAMES.get(weighting, weighting),
    'weighting': weighting,
    'seed': seed,
    'rounds': rounds,
    'argv': argv,
    'input_scaling': {'mean': scaling[0], 'std': scaling[1]},
    'model': f'small_cnn width {WIDTH}, embedding {EMBEDDING_DIM}, stride',
    'num_params': int(
      sum(x.numel() for x in make_small_cnn_class()().parameters())
    ),
    'participation_probabilities': {
      'mean': float(p.mean()),
      'min': float(p.min()),
      'max': float(p.max()),
      'at_floor': int((p <= 0.02 + 1e-12).sum()),
      'values': p.tolist(),
    },
    'client_sizes': {
      'min': int(sizes.min()),
      'max': int(sizes.max()),
      'below_batch': int((sizes < 16).sum()),
    },
    'participants_per_round': {
      'mean': float(counts.mean()),
      'min': int(counts.min()),
      'max': int(counts.max()),
      'empty_rounds': int((counts == 0).sum()),
      'counts': counts.tolist(),
    },
    'evaluations': evaluations,
    'wall_seconds': wall,
    'eval_seconds': timing['eval_seconds'],
    'seconds_per_round_without_eval': (wall - timing['eval_seconds']) / rounds,
    'seconds_per_round': wall / rounds,
    'torch_threads': torch.get_num_threads(),
  }


def cmd_run(args):
  out_dir = os.path.abspath(args.out)
  repo = os.path.abspath(args.repo)
  theirs = os.path.join(out_dir, 'theirs')
  os.makedirs(theirs, exist_ok=True)
  load_data, scaling = make_load_data(args.data_dir)
  for seed in [int(s) for s in args.seeds.split(',')]:
    for weighting in args.weightings.split(','):
      suffix = '' if args.rounds == ROUNDS else f'_r{args.rounds}'
      path = os.path.join(theirs, f'{weighting}_seed{seed}{suffix}.json')
      if os.path.exists(path):
        print(f'skip {path} (done)', flush=True)
        continue
      print(f'run {weighting} seed {seed}, {args.rounds} rounds', flush=True)
      result = run_one(
        repo, weighting, seed, args.rounds, out_dir, load_data, scaling
      )
      with open(path + '.tmp', 'w') as f:
        json.dump(result, f)
      os.replace(path + '.tmp', path)
      print(
        f'done {path}: {result["seconds_per_round"]:.3f} s/round, '
        f'final test {result["evaluations"][-1]["test_accuracy"]:.4f}',
        flush=True,
      )


# ---------------------------------------------------------------------------
# check-model: the torch model against fedjax_metric's (run in .venv).
# ---------------------------------------------------------------------------


def cmd_export_flax(args):
  """Writes our flax SmallCNN's initial parameters, 8 random images and its
  logits to ``args.npz`` (run with .venv/bin/python)."""
  import jax
  import jax.numpy as jnp

  sys.path.insert(0, os.path.join(os.path.dirname(__file__), '..', '..'))
  from fedjax_metric.models import small_cnn

  module = small_cnn.SmallCNN(
    num_classes=NUM_CLASSES, width=WIDTH, embedding_dim=EMBEDDING_DIM,
    pool='stride', norm='none', conv_impl='xla',
  )  # fmt: skip
  images = np.random.default_rng(0).normal(size=(8, 28, 28, 1))
  images = images.astype(np.float32)
  variables = module.init(
    jax.random.PRNGKey(0), jnp.asarray(images), train=False
  )
  logits = module.apply(variables, jnp.asarray(images), train=False)['logits']
  params = jax.tree.map(np.asarray, variables['params'])
  flat = {'images': images, 'logits': np.asarray(logits)}
  for layer, leaves in params.items():
    for leaf, value in leaves.items():
      flat[f'{layer}/{leaf}'] = value
  np.savez(args.npz, **flat)


def cmd_check_model(args):
  """Same weights in both models, same images: the logits must agree; and
  the initialisers' per-layer sd. Runs export-flax under --flax_python."""
  import subprocess
  import tempfile

  import torch

  with tempfile.TemporaryDirectory() as tmp:
    path = os.path.join(tmp, 'flax.npz')
    subprocess.check_call(
      [args.flax_python, os.path.abspath(__file__), 'export-flax',
       f'--npz={path}']
    )  # fmt: skip
    ref = dict(np.load(path))
  images, logits = ref.pop('images'), ref.pop('logits')
  convs = sorted({k.split('/')[0] for k in ref if k.startswith('Conv')})
  denses = sorted({k.split('/')[0] for k in ref if k.startswith('Dense')})
  model = make_small_cnn_class()()
  with torch.no_grad():
    for layer, key in zip((model.conv1, model.conv2), convs):
      kernel = ref[f'{key}/kernel'].transpose(3, 2, 0, 1).copy()
      layer.weight.copy_(torch.from_numpy(kernel))
      layer.bias.copy_(torch.from_numpy(ref[f'{key}/bias']))
    for layer, key in zip((model.fc1, model.fc2), denses):
      layer.weight.copy_(torch.from_numpy(ref[f'{key}/kernel'].T.copy()))
      layer.bias.copy_(torch.from_numpy(ref[f'{key}/bias']))
    out = model(torch.from_numpy(images.transpose(0, 3, 1, 2).copy()))
  err = float(np.abs(out.numpy() - logits).max())
  n_flax = int(sum(v.size for v in ref.values()))
  n_torch = int(sum(x.numel() for x in model.parameters()))
  print(f'params flax {n_flax} torch {n_torch}; max |logit diff| {err:.2e}')
  fresh = make_small_cnn_class()()
  layers = (fresh.conv1, fresh.conv2, fresh.fc1, fresh.fc2)
  for layer, key in zip(layers, convs + denses):
    print(
      f'{key}: init sd flax {ref[f"{key}/kernel"].std():.4f} '
      f'torch {layer.weight.std().item():.4f}, '
      f'max |w|/sd flax {np.abs(ref[f"{key}/kernel"]).max() / ref[f"{key}/kernel"].std():.2f} '
      f'torch {(layer.weight.abs().max() / layer.weight.std()).item():.2f}'
    )
  assert n_flax == n_torch and err < 1e-4, (n_flax, n_torch, err)
  print('ok')


# ---------------------------------------------------------------------------
# summarize: theirs beside ours.
# ---------------------------------------------------------------------------


def top_k(evaluations, key='test_accuracy', at=ROUNDS, k=TOP_K):
  vals = sorted(
    (
      e[key] for e in evaluations if e['round'] <= at and e.get(key) is not None
    ),
    reverse=True,
  )
  return float(np.mean(vals[:k]))


def final(evaluations, key='test_accuracy', at=ROUNDS):
  rows = [e for e in evaluations if e['round'] <= at]
  return float(rows[-1][key])


def _paired_interval(d):
  sys.path.insert(0, os.path.join(os.path.dirname(__file__), '..', '..'))
  from launch.paired import paired_interval

  return paired_interval(d)


def read_ours(root):
  """launch.sweep workdirs under ``root``: {(weighting, seed): evaluations}."""
  out = {}
  for cfg_path in glob.glob(
    os.path.join(root, '**', 'config.json'), recursive=True
  ):
    workdir = os.path.dirname(cfg_path)
    metrics = os.path.join(workdir, 'metrics.jsonl')
    if not os.path.exists(metrics):
      continue
    with open(cfg_path) as f:
      config = json.load(f)
    if config.get('algorithm') == 'mifa':
      weighting = 'mifa'
    elif config.get('algorithm') == 'fedau':
      weighting = config['algorithm_kwargs']['aggregation']
    else:
      continue
    rows = []
    with open(metrics) as f:
      for line in f:
        r = json.loads(line)
        if 'test_accuracy' in r:
          rows.append(
            {
              'round': int(r['round']),
              'test_accuracy': float(r['test_accuracy']),
              'train_accuracy': r.get('train_accuracy'),
            }
          )
    rows.sort(key=lambda r: r['round'])
    finished = os.path.exists(os.path.join(workdir, 'summary.json'))
    key = (weighting, int(config['seed']))
    if key in out and out[key]['finished'] and not finished:
      continue  # a finished workdir of the same run wins
    with open(metrics) as f:
      last = [json.loads(line) for line in f][-1]
    part = {}
    part_path = os.path.join(workdir, 'participation.json')
    if os.path.exists(part_path):
      with open(part_path) as f:
        part = json.load(f)
    active = part.get('active_per_round')
    out[key] = {
      'mean_p': part.get('mean_probability'),
      'participants_per_round': float(np.mean(active)) if active else None,
      'evaluations': rows,
      'finished': finished,
      'workdir': workdir,
      'executor': config.get('executor'),
      'seconds_per_round': last.get('total_wall_time', math.nan)
      / max(rows[-1]['round'], 1)
      if rows
      else None,
    }
  return out


def read_theirs(root):
  out = {}
  for path in glob.glob(os.path.join(root, '*_seed*.json')):
    base = os.path.basename(path)[: -len('.json')]
    if '_r' in base.split('_seed')[1]:
      continue  # smoke runs
    with open(path) as f:
      r = json.load(f)
    out[(r['weighting'], int(r['seed']))] = r
  return out


def cmd_summarize(args):
  out_dir = os.path.abspath(args.out)
  theirs = read_theirs(os.path.join(out_dir, 'theirs'))
  ours = read_ours(os.path.abspath(args.ours))
  summary = {'T': ROUNDS, 'statistic': f'top-{TOP_K} mean test accuracy, %'}
  for side, runs in (('theirs', theirs), ('ours', ours)):
    table = {}
    for (w, s), r in sorted(runs.items()):
      ev = r['evaluations']
      if not ev or ev[-1]['round'] < ROUNDS:
        continue
      table.setdefault(w, {})[s] = {
        'top5_test': 100 * top_k(ev),
        'final_test': 100 * final(ev),
        'top5_train': 100 * top_k(ev, 'train_accuracy')
        if ev[-1].get('train_accuracy') is not None
        else None,
        'evaluations': len([e for e in ev if e['round'] > 0]),
      }
      if side == 'ours':
        table[w][s]['mean_p'] = r['mean_p']
        table[w][s]['participants_per_round'] = r['participants_per_round']
        table[w][s]['seconds_per_round'] = r['seconds_per_round']
        table[w][s]['executor'] = r['executor']
        table[w][s]['workdir'] = r['workdir']
      if side == 'theirs':
        table[w][s]['seconds_per_round'] = r['seconds_per_round']
        table[w][s]['seconds_per_round_without_eval'] = r[
          'seconds_per_round_without_eval'
        ]
        table[w][s]['mean_p'] = r['participation_probabilities']['mean']
        table[w][s]['participants_per_round'] = r['participants_per_round'][
          'mean'
        ]
    stats = {}
    for w, per_seed in table.items():
      for key in ('top5_test', 'final_test'):
        v = np.array([per_seed[s][key] for s in sorted(per_seed)])
        stats.setdefault(w, {})[key] = {
          'mean': float(v.mean()),
          'sd': float(v.std(ddof=1)) if len(v) > 1 else None,
          'n': len(v),
        }
    diffs = {}
    for a, b in (('adaptive', 'average_participating'), ('adaptive', 'mifa'),
                 ('mifa', 'average_participating')):  # fmt: skip
      if a in table and b in table:
        seeds = sorted(set(table[a]) & set(table[b]))
        for key in ('top5_test', 'final_test'):
          d = [table[a][s][key] - table[b][s][key] for s in seeds]
          diffs.setdefault(f'{NAMES[a]} - {NAMES[b]}', {})[key] = {
            'seeds': seeds,
            'per_seed': d,
            **_paired_interval(d),
          }
    summary[side] = {'per_seed': table, 'stats': stats, 'paired': diffs}
  with open(os.path.join(out_dir, 'summary.json'), 'w') as f:
    json.dump(summary, f, indent=1, default=str)
  print(json.dumps(dict(summary), indent=1, default=str))


def main():
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  sub = parser.add_subparsers(dest='cmd', required=True)
  run = sub.add_parser('run')
  run.add_argument('--repo', required=True, help='a checkout of IBM/fedau')
  run.add_argument('--out', default='runs/authors/fedau')
  run.add_argument('--data_dir', '--data-dir', default=DATA_DIR)
  run.add_argument('--weightings', default=','.join(WEIGHTINGS))
  run.add_argument('--seeds', default='1,2,3')
  run.add_argument('--rounds', type=int, default=ROUNDS)
  check = sub.add_parser('check-model')
  check.add_argument('--flax_python', default='.venv/bin/python')
  export = sub.add_parser('export-flax')
  export.add_argument('--npz', required=True)
  summ = sub.add_parser('summarize')
  summ.add_argument('--out', default='runs/authors/fedau')
  summ.add_argument('--ours', default='runs/authors/fedau/ours')
  args = parser.parse_args()
  if args.cmd == 'run':
    cmd_run(args)
  elif args.cmd == 'check-model':
    cmd_check_model(args)
  elif args.cmd == 'export-flax':
    cmd_export_flax(args)
  else:
    cmd_summarize(args)


if __name__ == '__main__':
  main()
