"""Golden fixture for L-DAWA from the authors' released code.

Runs, UNCHANGED, the aggregation of github.com/yasar-rehman/L-DAWA (Rehman
et al., 'L-DAWA: Layer-wise Divergence Aware Weight Aggregation in
Federated Self-Supervised Visual Representation Learning', ICCV 2023) on
fixed weights, in float64, and writes tests/golden/l_dawa.npz, which
tests/test_golden_ssl.py compares with fedjax_metric (no torch there).

What is run:

* FL_Pretraining/main_CIFAR10_LDAWA.py ``my_aggregate`` (the L-DAWA step of
  ``SaveModelStrategy.aggregate_fit`` after the warm-up: every layer of
  every client scaled by min(cos(w_k^l, w_g^l), 1), then the plain mean) and
  ``aggregate`` (its FedAvg by example counts during the warm-up), on the
  Flower weight lists (state_dict order, BatchNorm statistics and the 0-d
  num_batches_tracked included) of four clients; L-DAWA-Agg.py
  ``my_aggregate`` (the same step, which also returns the per-layer
  cosines before clipping). Cases: one client layer identical to the
  global one (the clip at 1), one opposed to it (a negative weight), one
  all zero (left as is); and separately a global layer of zeros (flax and
  torch initialise biases to 0), where the released code divides by 0.
* FedU2's copy, github.com/XeniaLLL/FedU2 src/my/algo/LDAWA/functional.py
  ``layer_aggregate`` and ``calculate_ldawa_weights`` (one cosine over the
  whole flattened state dict; --fedu2-repo), on the same clients.
* inventory/src/objectives/simclr.py ``SimCLRObjective.get_loss``, the
  local loss of the released L-DAWA SimCLR runs (t = 0.07 in the released
  configs), on fixed projections, for comparison with our client loss.

Command:

  /path/to/torch-env/bin/python benchmarks/crosscheck/l_dawa.py \
      --repo=/path/to/yasar-rehman/L-DAWA --commit=<40 hex> \
      --fedu2-repo=/path/to/XeniaLLL/FedU2 --fedu2-commit=<40 hex> \
      --out=tests/golden/l_dawa.npz

Settings that differ from the authors' defaults, and why:

* The two files import flwr (0.17), ray, dotmap and the authors' fedssl
  package at the top, which are not needed by the aggregation functions;
  the functions' source is taken from the files with ``ast`` and executed
  unchanged in a namespace holding numpy, functools.reduce and the typing
  names their signatures use (``Weights`` = List[np.ndarray], as flwr
  defines it). The Flower strategy (server rounds, file I/O of the global
  weights, the start-round bookkeeping) is not run; its warm-up rule is
  read from aggregate_fit: FedAvg while the start round is <= 2.
* simclr.py is loaded by file path (its package __init__ is not needed).
* float64 weights (torch state dicts are float32 in the released runs; the
  aggregation is plain NumPy either way).
* Stub model: Linear(5, 4) -> BatchNorm1d(4) -> Linear(4, 3); the clients'
  weights are fixed perturbations of the global ones, standing for local
  training.
"""

import argparse
import ast
import copy
import functools
import importlib.util
import os
import subprocess
import sys
import typing

import numpy as np
import torch

STATE_KEYS = (
  'fc1.weight',
  'fc1.bias',
  'bn.weight',
  'bn.bias',
  'bn.running_mean',
  'bn.running_var',
  'bn.num_batches_tracked',
  'fc2.weight',
  'fc2.bias',
)
NUM_EXAMPLES = (50, 120, 30, 80)


def load_functions(path, names):
  """The named top-level functions of ``path``, unchanged."""
  with open(path) as f:
    tree = ast.parse(f.read())
  body = [
    n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name in names
  ]
  namespace = {
    'np': np,
    'reduce': functools.reduce,
    'List': typing.List,
    'Tuple': typing.Tuple,
    'Weights': typing.List[np.ndarray],
  }
  exec(compile(ast.Module(body, []), path, 'exec'), namespace)
  return [namespace[n] for n in names]


class StubModel(torch.nn.Module):
  def __init__(self):
    super().__init__()
    self.fc1 = torch.nn.Linear(5, 4)
    self.bn = torch.nn.BatchNorm1d(4)
    self.fc2 = torch.nn.Linear(4, 3)

  def forward(self, x):
    return self.fc2(self.bn(self.fc1(x)))


def make_weights(rng):
  """Global weights and four clients' (Flower lists in STATE_KEYS order)."""
  torch.manual_seed(0)
  model = StubModel()
  with torch.no_grad():
    model.fc1.bias.add_(0.1)  # non-zero (torch's init is not zero here)
    model.bn.weight.copy_(torch.tensor(rng.uniform(0.5, 1.5, 4)))
    model.bn.bias.copy_(torch.tensor(rng.normal(size=4)))
    model.bn.running_mean.copy_(torch.tensor(rng.normal(size=4)))
    model.bn.running_var.copy_(torch.tensor(rng.uniform(0.5, 2.0, 4)))
    model.bn.num_batches_tracked.fill_(7)
  state = model.state_dict()
  assert tuple(state) == STATE_KEYS, tuple(state)
  glob = [state[k].numpy().copy() for k in STATE_KEYS]
  clients = []
  for c in range(4):
    w = []
    for k, g in zip(STATE_KEYS, glob):
      if g.ndim == 0:
        w.append(np.asarray(g + 3 + c, g.dtype))
        continue
      x = g * rng.uniform(0.6, 1.4) + 0.4 * rng.normal(size=g.shape)
      if c == 1 and k == 'fc1.bias':
        x = g.copy()  # cosine 1 up to rounding: the clip
      if c == 2 and k == 'fc2.weight':
        x = -g + 0.2 * rng.normal(size=g.shape)  # a negative cosine
      if c == 3 and k == 'bn.bias':
        x = np.zeros_like(g)  # a zero layer: left as is
      w.append(x)
    clients.append(w)
  return model, glob, clients


def main():
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  parser.add_argument('--repo', required=True)
  parser.add_argument('--fedu2-repo', required=True)
  parser.add_argument('--out', default='tests/golden/l_dawa.npz')
  parser.add_argument('--commit', default='')
  parser.add_argument('--fedu2-commit', default='')
  args = parser.parse_args()
  torch.set_default_dtype(torch.float64)

  def commit_of(repo, given):
    commit = (
      given
      or subprocess.run(
        ['git', '-C', repo, 'rev-parse', 'HEAD'], capture_output=True, text=True
      ).stdout.strip()
    )
    if len(commit) != 40:
      raise SystemExit(f'pass the 40-hex commit of {repo} (no git checkout)')
    return commit

  strategy = os.path.join(args.repo, 'FL_Pretraining', 'main_CIFAR10_LDAWA.py')
  my_aggregate, fedavg_aggregate = load_functions(
    strategy, ('my_aggregate', 'aggregate')
  )
  (my_aggregate_logged,) = load_functions(
    os.path.join(args.repo, 'L-DAWA-Agg.py'), ('my_aggregate',)
  )
  spec = importlib.util.spec_from_file_location(
    'ldawa_simclr',
    os.path.join(args.repo, 'inventory', 'src', 'objectives', 'simclr.py'),
  )
  simclr = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(simclr)
  sys.path.insert(0, os.path.join(args.fedu2_repo, 'src'))
  spec = importlib.util.spec_from_file_location(
    'fedu2_ldawa',
    os.path.join(
      args.fedu2_repo, 'src', 'my', 'algo', 'LDAWA', 'functional.py'
    ),
  )
  fedu2_ldawa = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(fedu2_ldawa)

  out = {
    'repository': 'yasar-rehman/L-DAWA',
    'commit': commit_of(args.repo, args.commit),
    'function': (
      'FL_Pretraining/main_CIFAR10_LDAWA.py:my_aggregate,aggregate; '
      'L-DAWA-Agg.py:my_aggregate; '
      'inventory/src/objectives/simclr.py:SimCLRObjective.get_loss'
    ),
    'fedu2_repository': 'XeniaLLL/FedU2',
    'fedu2_commit': commit_of(args.fedu2_repo, args.fedu2_commit),
    'fedu2_function': (
      'src/my/algo/LDAWA/functional.py:layer_aggregate,calculate_ldawa_weights'
    ),
    'state_keys': np.asarray(STATE_KEYS),
    'num_examples': np.asarray(NUM_EXAMPLES),
    'warmup_rule': 'FedAvg while strt_rnd <= 2 (aggregate_fit)',
  }
  rng = np.random.default_rng(0)
  model, glob, clients = make_weights(rng)
  for i, k in enumerate(STATE_KEYS):
    out[f'global/{k}'] = glob[i]
    for c, w in enumerate(clients):
      out[f'client{c}/{k}'] = w[i]

  results = [(copy.deepcopy(w), n) for w, n in zip(clients, NUM_EXAMPLES)]
  for i, x in enumerate(my_aggregate(results, copy.deepcopy(glob))):
    out[f'ldawa/{STATE_KEYS[i]}'] = np.asarray(x)
  results = [(copy.deepcopy(w), n) for w, n in zip(clients, NUM_EXAMPLES)]
  logged, delta_c = my_aggregate_logged(results, copy.deepcopy(glob))
  for i, x in enumerate(logged):
    out[f'ldawa_logged/{STATE_KEYS[i]}'] = np.asarray(x)
  cosines = np.full((len(clients), len(STATE_KEYS)), np.nan)
  for c in range(len(clients)):
    for layer, v in delta_c[str(c)]:
      cosines[c, int(layer)] = v
  out['cosines'] = cosines  # NaN: not scaled (0-d, or a zero client layer)
  results = [(copy.deepcopy(w), n) for w, n in zip(clients, NUM_EXAMPLES)]
  for i, x in enumerate(fedavg_aggregate(results)):
    out[f'warmup/{STATE_KEYS[i]}'] = np.asarray(x)

  # A zero global layer (fc1.bias): the released code divides by 0.
  zero_glob = copy.deepcopy(glob)
  zero_glob[1] = np.zeros_like(zero_glob[1])
  results = [(copy.deepcopy(w), n) for w, n in zip(clients, NUM_EXAMPLES)]
  with np.errstate(divide='ignore', invalid='ignore'):
    for i, x in enumerate(my_aggregate(results, zero_glob)):
      out[f'zero_global/{STATE_KEYS[i]}'] = np.asarray(x)

  # FedU2's copy: one cosine over the whole state dict.
  names = list(STATE_KEYS)
  local_models = [
    {k: torch.tensor(w[i]) for i, k in enumerate(names)} for w in clients
  ]
  weights = fedu2_ldawa.calculate_ldawa_weights(local_models, model)
  out['fedu2_weights'] = np.array([float(w) for w in weights])
  aggregated = fedu2_ldawa.layer_aggregate(local_models, model)
  for k in names:
    out[f'fedu2/{k}'] = aggregated[k].numpy()

  # The released local loss (view 1's anchors against both views).
  b, d = 8, 6
  z1, z2 = rng.normal(size=(2, b, d)) + 0.5 * rng.normal(size=d)
  tz1 = torch.tensor(z1, requires_grad=True)
  tz2 = torch.tensor(z2, requires_grad=True)
  loss = simclr.SimCLRObjective(tz1, tz2, t=0.07).get_loss()
  g1, g2 = torch.autograd.grad(loss, (tz1, tz2))
  out.update(
    simclr_z1=z1,
    simclr_z2=z2,
    simclr_t=0.07,
    simclr_loss=loss.item(),
    simclr_grad_z1=g1.numpy(),
    simclr_grad_z2=g2.numpy(),
  )

  os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
  np.savez_compressed(args.out, **out)
  print(f'wrote {args.out}: {len(out)} entries, commit {out["commit"]}')


if __name__ == '__main__':
  main()
