"""FedHyper's schedulers, run by the authors' own training script.

Runs, UNCHANGED, github.com/ATP-1010/FedHyper (Wang, Wang and Li, 'FedHyper:
A Universal and Robust Learning Rate Scheduler for Federated Learning with
Hypergradient Descent', ICLR 2024):

  * src/federated_main.py (the whole ``__main__`` script, by runpy): client
    sampling, FedAvg's uniform average (src/utils.py average_weights) and the
    global scheduler FedHyper-G (``args.function == 'FedHyper-G'``: the
    global rate 1 + agg, agg += <Delta_t, Delta_{t-1}> clipped to
    [-0.8, 4]);
  * src/update.py LocalUpdate.update_weights: local SGD and the client-side
    local scheduler FedHyper-CL (``args.function == 'FedHyper-CL'``:
    gamma = min(1.1, 1 + 0.1 <u, Delta_{t-1}> / (num_users frac) +
    <u, g_prev>), beta = clip(gamma beta, 0.1, 10), LambdaLR);

over a few rounds of a tiny softmax-regression model on fixed random data,
in float64, and writes to an .npz fixture (tests/test_golden_misc.py reads
it): the data, the initial weights, each round's selected clients, every
client's batches (dataset indices, in the order the loader gave them), the
parameters after every local step and the learning rate each step ran at,
the clients' returned models, the global model after every round and the
global rates (the script's ``Global_alpha``).

  /path/to/torch-env/bin/python benchmarks/crosscheck/fedhyper.py \\
      --repo=/path/to/FedHyper --out=tests/golden/fedhyper.npz

Cases (one run of the script each; prefix ``<case>/`` in the fixture):
  * ``G``: FedHyper-G alone, with the code's local optimizer (SGD, its
    hard-coded momentum 0.5).
  * ``GCL``: FedHyper-G and FedHyper-CL together, local SGD without
    momentum (PMFL's setting, which the library's CL targets).
  * ``GCL_momentum``: as ``GCL`` with the code's momentum 0.5 (the library
    scales the loss gradient, the code the learning rate: they differ by
    design; the test measures by how much).
  * ``GCL_epochs``: as ``GCL`` with two local epochs (the code leaves the
    first step of every epoch unadapted, the library only the round's
    first: measured too).

Stubs (no logic of the method is replaced):
  * data: ``utils.get_dataset`` returns a dataset of fixed Gaussian features
    (a seeded NumPy generator) and 3 labels, 4 users of 10 examples each
    (the first 8 train, LocalUpdate's 80/10/10 split); the dataset logs the
    indices the training loader reads, which gives each step's batch.
  * model: ``models.CNNMnist`` (the script's choice for --model cnn
    --dataset mnist) is replaced by one nn.Linear with fixed weights.
  * args: ``options.args_parser`` returns a Namespace (below), gpu off.
  * imports: tqdm (identity), tensorboardX (a SummaryWriter that drops
    scalars) and torchvision (only used by the replaced get_dataset) are
    empty stand-ins, so nothing needs installing.
  * recorders: torch.optim.SGD is a subclass that records the parameters
    after each step and the rate it ran at (its ``momentum`` forced to 0
    for the cases that ask for it: the code hard-codes 0.5);
    update.test_inference and LocalUpdate.update_weights are wrapped to read
    the global model after each round and the clients' inputs and outputs.
  * G and CL together: the script runs CL with the momentum form of the
    global scheduler only (``FedHyper-FULL`` = GM + CL); the library's
    combination is G + CL, so ``args.function`` is a str whose ``==`` is
    true for both 'FedHyper-G' and 'FedHyper-CL' (and only those), which
    runs both unchanged branches.

Settings that differ from the authors' defaults (src/options.py) and why:
  * float64 (``torch.set_default_dtype``): the fixture is for a tight
    comparison; the code runs float32 on a GPU.
  * 4 users, frac 0.5 (2 a round), 5 rounds, 1 local epoch (2 in
    ``GCL_epochs``), batch 3, lr 0.5, optimizer sgd: a tiny problem whose
    inner products are large enough to move both rates and hit their
    clips (defaults: 100 users, frac 0.1, 10 epochs, batch 64, lr 0.01,
    adam).
  * momentum 0 in ``GCL`` (see above).

This script does not import fedjax_metric.
"""

import argparse
import importlib.machinery
import os
import runpy
import subprocess
import sys
import tempfile
import types

import numpy as np

NUM_USERS = 4
FRAC = 0.5
PER_USER = 10
TRAIN_PER_USER = 8  # LocalUpdate keeps the first 80% for training
DIM = 5
NUM_CLASSES = 3
ROUNDS = 5
BATCH = 3
LR = 0.5
SEED = 0

CASES = {
  # name: (functions, local epochs, local momentum)
  'G': (('FedHyper-G',), 1, 0.5),
  'GCL': (('FedHyper-G', 'FedHyper-CL'), 1, 0.0),
  'GCL_momentum': (('FedHyper-G', 'FedHyper-CL'), 1, 0.5),
  'GCL_epochs': (('FedHyper-G', 'FedHyper-CL'), 2, 0.0),
}


class Functions(str):
  """``args.function``: equal to each of the named functions."""

  def __new__(cls, names):
    obj = super().__new__(cls, '+'.join(names))
    obj.names = tuple(names)
    return obj

  def __eq__(self, other):
    return other in self.names

  def __ne__(self, other):
    return not self.__eq__(other)

  __hash__ = str.__hash__


def make_data():
  rng = np.random.default_rng(SEED)
  n = NUM_USERS * PER_USER
  features = rng.normal(size=(n, DIM)) * 1.5
  labels = rng.integers(0, NUM_CLASSES, n)
  weight = rng.normal(size=(NUM_CLASSES, DIM)) * 0.3
  bias = rng.normal(size=(NUM_CLASSES,)) * 0.1
  # Users hold shuffled, disjoint index sets.
  order = rng.permutation(n)
  groups = {
    u: order[u * PER_USER : (u + 1) * PER_USER] for u in range(NUM_USERS)
  }
  return features, labels, weight, bias, groups


def stub_module(name):
  module = types.ModuleType(name)
  # torch._dynamo looks modules up by their spec.
  module.__spec__ = importlib.machinery.ModuleSpec(name, None)
  return module


def install_stubs():
  """Empty stand-ins for imports the stubbed paths never use."""
  import torch._dynamo  # noqa: F401  (before the stand-ins exist)

  tqdm = stub_module('tqdm')
  tqdm.tqdm = lambda iterable, *a, **k: iterable
  sys.modules['tqdm'] = tqdm
  tbx = stub_module('tensorboardX')

  class SummaryWriter:
    def __init__(self, *args, **kwargs):
      pass

    def add_scalar(self, *args, **kwargs):
      pass

  tbx.SummaryWriter = SummaryWriter
  sys.modules['tensorboardX'] = tbx
  tv = stub_module('torchvision')
  tv.datasets = types.SimpleNamespace()
  tv.transforms = types.SimpleNamespace()
  sys.modules['torchvision'] = tv


def run_case(repo, name, functions, local_ep, momentum):
  import torch

  src = os.path.join(repo, 'src')
  if src not in sys.path:
    sys.path.insert(0, src)
  import models
  import options
  import update
  import utils

  features, labels, weight, bias, groups = make_data()
  log = {'active': False, 'reads': []}

  class Data(torch.utils.data.Dataset):
    def __len__(self):
      return len(labels)

    def __getitem__(self, i):
      if log['active']:
        log['reads'].append(int(i))
      return features[i], labels[i]

  dataset = Data()
  utils.get_dataset = lambda args: (dataset, dataset, groups)

  class TinyLinear(torch.nn.Module):
    def __init__(self, args):
      super().__init__()
      self.fc = torch.nn.Linear(DIM, NUM_CLASSES)
      with torch.no_grad():
        self.fc.weight.copy_(torch.as_tensor(weight))
        self.fc.bias.copy_(torch.as_tensor(bias))

    def forward(self, x):
      return self.fc(x)

  models.CNNMnist = TinyLinear

  args = argparse.Namespace(
    epochs=ROUNDS,
    num_users=NUM_USERS,
    frac=FRAC,
    local_ep=local_ep,
    local_bs=BATCH,
    lr=LR,
    function=Functions(functions),
    ad_lr=1,
    momentum=momentum,
    model='cnn',
    kernel_num=9,
    kernel_sizes='3,4,5',
    num_channels=1,
    norm='batch_norm',
    num_filters=32,
    max_pool='True',
    dataset='mnist',
    num_classes=NUM_CLASSES,
    gpu=0,
    optimizer='sgd',
    iid=0,
    gpu_id=0,
    unequal=0,
    stopping_rounds=10,
    verbose=0,
    seed=SEED,
  )
  options.args_parser = lambda: args

  steps = []  # per client-round: list of (lr, params after)

  class RecordingSGD(torch.optim.SGD):
    def __init__(self, params, lr, momentum=0.0, **kwargs):
      super().__init__(params, lr=lr, momentum=momentum_used, **kwargs)

    def step(self, closure=None):
      lr = self.param_groups[0]['lr']
      out = super().step(closure)
      flat = torch.cat(
        [p.detach().reshape(-1) for g in self.param_groups for p in g['params']]
      )
      steps[-1].append((lr, flat.numpy().copy()))
      return out

  momentum_used = momentum
  original_sgd = torch.optim.SGD
  torch.optim.SGD = RecordingSGD

  clients = []  # (round, idx, gtl, batches, returned vector)
  original_update = update.LocalUpdate.update_weights

  def update_weights(self, model, global_round, idx):
    steps.append([])
    log['reads'] = []
    log['active'] = True
    try:
      w, loss, lr_new = original_update(self, model, global_round, idx)
    finally:
      log['active'] = False
    vector = torch.cat([w['fc.weight'].reshape(-1), w['fc.bias'].reshape(-1)])
    clients.append(
      (
        global_round,
        int(idx),
        self.gtl.detach().numpy().copy(),
        list(log['reads']),
        vector.numpy().copy(),
      )
    )
    return w, loss, lr_new

  update.LocalUpdate.update_weights = update_weights

  globals_after = []
  original_test = update.test_inference

  def test_inference(args, model, test_dataset):
    globals_after.append(
      torch.nn.utils.parameters_to_vector(model.parameters())
      .detach()
      .numpy()
      .copy()
    )
    return original_test(args, model, test_dataset)

  update.test_inference = test_inference

  np.random.seed(SEED)
  torch.manual_seed(SEED)
  cwd = os.getcwd()
  with tempfile.TemporaryDirectory() as tmp:
    os.makedirs(os.path.join(tmp, 'save', 'objects'))
    os.chdir(tmp)
    try:
      result = runpy.run_path(
        os.path.join(src, 'federated_main.py'), run_name='__main__'
      )
    finally:
      os.chdir(cwd)
      torch.optim.SGD = original_sgd
      update.LocalUpdate.update_weights = original_update
      update.test_inference = original_test

  m = max(int(FRAC * NUM_USERS), 1)
  num_steps = local_ep * int(np.ceil(TRAIN_PER_USER / BATCH))
  d = DIM * NUM_CLASSES + NUM_CLASSES
  selected = np.zeros((ROUNDS, m), np.int64)
  batches = -np.ones((ROUNDS, m, num_steps, BATCH), np.int64)
  step_lr = np.zeros((ROUNDS, m, num_steps))
  step_params = np.zeros((ROUNDS, m, num_steps, d))
  gtl = np.zeros((ROUNDS, m, d))
  returned = np.zeros((ROUNDS, m, d))
  assert len(clients) == ROUNDS * m
  for j, (r, idx, g, reads, vec) in enumerate(clients):
    slot = j % m
    assert r == j // m
    selected[r, slot] = idx
    gtl[r, slot] = g
    returned[r, slot] = vec
    # Split the reads into the loader's batches (full ones, then the rest,
    # per epoch).
    position = 0
    for s in range(num_steps):
      in_epoch = s % (num_steps // local_ep)
      size = min(BATCH, TRAIN_PER_USER - in_epoch * BATCH)
      batches[r, slot, s, :size] = reads[position : position + size]
      position += size
    assert position == len(reads), (position, len(reads))
    assert len(steps[j]) == num_steps
    for s, (lr, params) in enumerate(steps[j]):
      step_lr[r, slot, s] = lr
      step_params[r, slot, s] = params
  # test_inference runs once after every round and once more at the end.
  assert len(globals_after) == ROUNDS + 1
  return {
    'selected': selected,
    'batches': batches,
    'step_lr': step_lr,
    'step_params': step_params,
    'previous_update': gtl,
    'client_models': returned,
    'global_models': np.stack(globals_after[:ROUNDS]),
    'global_rates': np.asarray(result['Global_alpha'], np.float64),
    'local_epochs': np.int64(local_ep),
    'momentum': np.float64(momentum),
    'functions': np.asarray('+'.join(functions)),
  }


def git_commit(repo):
  commit = subprocess.check_output(
    ['git', '-C', repo, 'rev-parse', 'HEAD'], text=True
  ).strip()
  assert len(commit) == 40, commit
  return commit


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument('--repo', required=True)
  parser.add_argument('--out', default='tests/golden/fedhyper.npz')
  parser.add_argument(
    '--commit', default='', help="the checkout's commit, if not a git tree"
  )
  flags = parser.parse_args()

  import torch

  torch.set_default_dtype(torch.float64)
  torch.set_num_threads(1)
  install_stubs()
  features, labels, weight, bias, groups = make_data()
  out = {
    'repository': np.asarray('ATP-1010/FedHyper'),
    'commit': np.asarray(flags.commit or git_commit(flags.repo)),
    'function': np.asarray(
      'src/federated_main.py:__main__ (FedHyper-G); '
      'src/update.py:LocalUpdate.update_weights (FedHyper-CL); '
      'src/utils.py:average_weights'
    ),
    'features': features,
    'labels': labels,
    'initial_weight': weight,
    'initial_bias': bias,
    'groups': np.stack([groups[u] for u in range(NUM_USERS)]),
    'num_users': np.int64(NUM_USERS),
    'frac': np.float64(FRAC),
    'train_per_user': np.int64(TRAIN_PER_USER),
    'batch_size': np.int64(BATCH),
    'lr': np.float64(LR),
    'rounds': np.int64(ROUNDS),
    'global_clip': np.asarray([-0.8, 4.0]),
    'local_constants': np.asarray([0.1, 1.1, 0.1, 10.0]),
    'cases': np.asarray(list(CASES)),
  }
  for name, (functions, local_ep, momentum) in CASES.items():
    for key, value in run_case(
      flags.repo, name, functions, local_ep, momentum
    ).items():
      out[f'{name}/{key}'] = value
  os.makedirs(os.path.dirname(os.path.abspath(flags.out)), exist_ok=True)
  np.savez_compressed(flags.out, **out)
  print(f'wrote {flags.out} ({os.path.getsize(flags.out)} bytes)')
  for name in CASES:
    print(name, 'global rates', out[f'{name}/global_rates'])
    print(name, 'step lr', out[f'{name}/step_lr'].reshape(ROUNDS, -1))


if __name__ == '__main__':
  main()
