"""Golden fixture for FedU2 from the authors' released code.

Runs, UNCHANGED, the functions of github.com/XeniaLLL/FedU2 (Liao et al.,
'Rethinking the Representation in Federated Unsupervised Learning with
Non-IID Data', CVPR 2024) on fixed inputs and writes tests/golden/fedu2.npz,
which tests/test_golden_ssl.py compares with fedjax_metric (no torch there).

What is run:

* src/my/loss/sw_loss.py ``RepresentationTagentCollapse(num_tangent_space=6)``
  (the flexible uniform regulariser, FUR; 6 projections) on L2-normalised
  projections, as ``SimclrModel.forward`` feeds it, and
  src/my/algo/fedU2/functional.py ``nt_xent_loss`` (tau = 0.07): values and
  gradients w.r.t. the raw projections, float64. FUR draws its tangent
  points, uniform reference samples and projection directions with
  ``torch.randn`` inside ``forward``; the draws are recorded (torch.randn is
  wrapped by a recorder that returns the same tensors) and stored, so that
  our `tangent_sliced_wasserstein` can be given the same draws.
* src/my/algo/commons/min_norm_solvers.py
  ``MinNormSolver.find_min_norm_element`` on v_i = 2 g_i / ||g_i|| started
  from the client weights (as ``MTL.mgda`` calls it for 'EUA'), float64.
* The server step: src/my/algo/fedU2/server.py
  ``FedEUAServer.eua_aggregation_dual`` (BatchNorm buffers averaged with the
  client weights, then src/my/algo/commons/mtl.py
  ``MTL.update_global_model`` with 'EUA': one SGD step of gmodel_lr = 8 on
  sum lambda_i v_i) for four clients of a tiny model with BatchNorm, after
  ``sharpen`` of the normalised client weights, for the released
  sharpen_ratio 1 (main.py) and the server's default 0.36. This runs in
  float32: ``MTL.mgda`` builds its weights with ``torch.FloatTensor``, so
  float64 parameters would not multiply with them.

Command:

  /path/to/torch-env/bin/pip install --target /path/to/pydeps/ssl geoopt \
      tensorloader tqdm cvxpy osqp clarabel scs highspy qdldl \
      'sparsediffpy<0.7' geomloss==0.2.6
  PYTHONPATH=/path/to/pydeps/ssl /path/to/torch-env/bin/python \
      benchmarks/crosscheck/fedu2.py --repo=/path/to/XeniaLLL/FedU2 \
      --commit=<40 hex> --out=tests/golden/fedu2.npz

(geoopt: the sphere's log map; cvxpy: imported by mtl.py for its 'Nash'
option, unused here; geomloss 0.2.6: imported by my/loss/sk_loss.py, whose
``geomloss.utils`` later releases removed; tensorloader: commons/evaluate.)

Settings that differ from the authors' defaults, and why:

* float64 for the losses and the solver (torch.set_default_dtype); the
  server step in float32 (see above).
* The package ``my.algo.fedU2``'s __init__ is not executed: it imports
  fedsimsiam_client.py, which imports ``FedDecorrLoss`` and ``CCASSGLoss``
  from functional.py, where neither is defined (the released package fails
  to import). A bare package module with the same __path__ stands in, so
  server.py and functional.py load unchanged. ``wandb`` (logging only) is an
  empty module when not installed.
* Stub model: Linear(5, 4) -> BatchNorm1d(4) -> ReLU -> Linear(4, 3) (the
  released SimclrModel is a ResNet-18 with a projector and a rotation head);
  the clients' models are the global one plus fixed random changes
  (parameters and BatchNorm statistics), standing for local training.
"""

import argparse
import os
import subprocess
import sys
import types

import numpy as np
import torch


def import_authors(repo):
  src = os.path.join(repo, 'src')
  sys.path.insert(0, src)
  try:
    import wandb  # noqa: F401
  except ImportError:
    sys.modules['wandb'] = types.ModuleType('wandb')
  import my.algo  # noqa: F401

  package = types.ModuleType('my.algo.fedU2')
  package.__path__ = [os.path.join(src, 'my', 'algo', 'fedU2')]
  sys.modules['my.algo.fedU2'] = package
  from my.algo.commons import mtl
  from my.algo.commons.min_norm_solvers import MinNormSolver
  from my.algo.fedU2 import functional
  from my.algo.fedU2.server import FedEUAServer
  from my.loss import sw_loss

  return types.SimpleNamespace(
    mtl=mtl,
    MinNormSolver=MinNormSolver,
    functional=functional,
    FedEUAServer=FedEUAServer,
    sw_loss=sw_loss,
  )


class RecordRandn:
  """Wraps torch.randn: returns exactly what it returns, keeps a copy."""

  def __init__(self):
    self.draws = []
    self.original = torch.randn

  def __enter__(self):
    def randn(*args, **kwargs):
      x = self.original(*args, **kwargs)
      self.draws.append(x.detach().clone())
      return x

    torch.randn = randn
    return self

  def __exit__(self, *exc):
    torch.randn = self.original


def losses_level(authors, out):
  normalize = torch.nn.functional.normalize
  rng = np.random.default_rng(0)
  b, d = 10, 8
  p1, p2 = rng.normal(size=(2, b, d)) + 0.5 * rng.normal(size=(1, 1, d))
  out.update(loss_p1=p1, loss_p2=p2)
  tp1 = torch.tensor(p1, requires_grad=True)
  tp2 = torch.tensor(p2, requires_grad=True)
  h1, h2 = normalize(tp1, dim=1), normalize(tp2, dim=1)  # SimclrModel
  fur = authors.sw_loss.RepresentationTagentCollapse(num_tangent_space=6)
  torch.manual_seed(11)
  values = {}
  for view, h in (('1', h1), ('2', h2)):
    with RecordRandn() as rec:
      values[f'fur{view}'] = fur(h)
    draws = rec.draws
    assert len(draws) == 2 + b, len(draws)
    # forward: tangent points, reference samples (both normalised), then
    # one [K, D] projection matrix per tangent point.
    out[f'fur{view}_tangent'] = normalize(draws[0]).numpy()
    out[f'fur{view}_reference'] = normalize(draws[1]).numpy()
    out[f'fur{view}_projections'] = torch.stack(draws[2:]).numpy()
  values['nt_xent'] = authors.functional.nt_xent_loss(h1, h2, 0.07)
  values['total'] = values['nt_xent'] + 0.01 * (values['fur1'] + values['fur2'])
  for name, value in values.items():
    out[f'loss_{name}'] = value.item()
    g1, g2 = torch.autograd.grad(
      value, (tp1, tp2), retain_graph=True, allow_unused=True
    )
    for k, grad in (('p1', g1), ('p2', g2)):
      out[f'loss_{name}_grad_{k}'] = (
        np.zeros((b, d)) if grad is None else grad.numpy()
      )


def solver_level(authors, out):
  rng = np.random.default_rng(1)
  for c in (2, 4, 6):
    common = rng.normal(size=30)
    g = rng.normal(size=(c, 30)) + 0.6 * common
    g *= rng.uniform(0.2, 3.0, size=(c, 1))
    grads = torch.tensor(g.T)  # [P, C], as MTL builds it
    vecs = 2 * grads / grads.norm(p=2, dim=0)  # the 'EUA' line of mtl.py
    weights = rng.integers(1, 8, size=c).astype(np.float64)
    init = np.array([w / sum(weights) for w in weights])  # MTL's init_alpha
    sol, _ = authors.MinNormSolver.find_min_norm_element(
      [vecs.t()[t] for t in range(c)], sample_weights=init
    )
    out[f'solver{c}_g'] = g
    out[f'solver{c}_weights'] = weights
    out[f'solver{c}_lambda'] = np.asarray(sol, np.float64)


class StubModel(torch.nn.Module):
  def __init__(self):
    super().__init__()
    self.fc1 = torch.nn.Linear(5, 4)
    self.bn = torch.nn.BatchNorm1d(4)
    self.fc2 = torch.nn.Linear(4, 3)

  def forward(self, x):
    return self.fc2(torch.relu(self.bn(self.fc1(x))))


STATE_KEYS = (
  'fc1.weight',
  'fc1.bias',
  'bn.weight',
  'bn.bias',
  'bn.running_mean',
  'bn.running_var',
  'fc2.weight',
  'fc2.bias',
)


def server_level(authors, out, name, sharpen_ratio):
  """FedEUAServer.eua_aggregation_dual on fixed client models (float32)."""
  torch.set_default_dtype(torch.float32)
  rng = np.random.default_rng(2)
  torch.manual_seed(5)
  model = StubModel()
  with torch.no_grad():
    model.bn.running_mean.copy_(torch.tensor(rng.normal(size=4)))
    model.bn.running_var.copy_(torch.tensor(rng.uniform(0.5, 2, size=4)))
  start = {k: v.clone() for k, v in model.state_dict().items()}
  scales = (0.05, 0.2, 0.5, 1.0)  # updates of very different sizes
  clients = []
  for c, scale in enumerate(scales):
    state = {}
    for k, v in start.items():
      if k.endswith('num_batches_tracked'):
        state[k] = v + 3
      else:
        noise = torch.tensor(rng.normal(size=tuple(v.shape)), dtype=v.dtype)
        state[k] = v + scale * (noise + 0.3 * (c % 2))
    clients.append(state)
  batches = [3.0, 1.0, 2.0, 5.0]  # len(client.aug_train_loader)
  # FedEUAServer.fit: weights normalised, then sharpened.
  client_weights = torch.tensor(batches).float()
  client_weights = client_weights / client_weights.sum()
  client_weights = authors.functional.sharpen(client_weights, sharpen_ratio)
  server = types.SimpleNamespace(
    mtl_method='EUA',
    model=model,
    extract_buffers=authors.FedEUAServer.extract_buffers,
    mtl_class=authors.mtl.MTL(
      mtl_method='EUA', join_clients=len(clients), server_lr=8.0
    ),
  )
  solver = authors.MinNormSolver.find_min_norm_element
  recorded = []

  def record(*args, **kwargs):
    sol = solver(*args, **kwargs)
    recorded.append(np.asarray(sol[0], np.float64))
    return sol

  authors.MinNormSolver.find_min_norm_element = record
  try:
    authors.FedEUAServer.eua_aggregation_dual(
      server, [dict(s) for s in clients], client_weights.cpu()
    )
  finally:
    authors.MinNormSolver.find_min_norm_element = solver
  after = model.state_dict()
  out[f'{name}_sharpen'] = sharpen_ratio
  out[f'{name}_batches'] = np.asarray(batches)
  out[f'{name}_weights'] = client_weights.numpy().astype(np.float64)
  out[f'{name}_lambda'] = recorded[0]
  out[f'{name}_server_lr'] = 8.0
  for k in STATE_KEYS:
    out[f'{name}_start/{k}'] = start[k].numpy()
    out[f'{name}_after/{k}'] = after[k].numpy()
    for c, state in enumerate(clients):
      out[f'{name}_client{c}/{k}'] = state[k].numpy()
  torch.set_default_dtype(torch.float64)


def main():
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  parser.add_argument('--repo', required=True)
  parser.add_argument('--out', default='tests/golden/fedu2.npz')
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
    'repository': 'XeniaLLL/FedU2',
    'commit': commit,
    'function': (
      'src/my/loss/sw_loss.py:RepresentationTagentCollapse.forward; '
      'src/my/algo/fedU2/functional.py:nt_xent_loss,sharpen; '
      'src/my/algo/commons/min_norm_solvers.py:'
      'MinNormSolver.find_min_norm_element; '
      'src/my/algo/fedU2/server.py:FedEUAServer.eua_aggregation_dual; '
      'src/my/algo/commons/mtl.py:MTL.update_global_model'
    ),
    'temperature': 0.07,
    'fur_weight': 0.01,
    'num_tangent_space': 6,
    'num_projections': 6,
  }
  losses_level(authors, out)
  solver_level(authors, out)
  server_level(authors, out, 'eua', 1.0)
  server_level(authors, out, 'eua_sharp', 0.36)
  os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
  np.savez_compressed(args.out, **out)
  print(f'wrote {args.out}: {len(out)} entries, commit {commit}')


if __name__ == '__main__':
  main()
