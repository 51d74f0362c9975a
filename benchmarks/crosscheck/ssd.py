"""Golden fixture for SSD / FedAlignUniform from the authors' released code.

Runs, UNCHANGED, the functions of github.com/hc-fang/ssd (Fang et al.,
'Soft Separation and Distillation: Toward Global Uniformity in Federated
Unsupervised Learning', ICCV 2025) on fixed inputs, in float64, and writes
tests/golden/ssd.npz, which tests/test_golden_ssl.py compares with
fedjax_metric (no torch needed there).

What is run:

* methods/loss.py: ``align_loss``, ``uniform_loss``, ``subspace_loss``
  (detach=True, norm=True: the DSR loss) and ``distillation_loss`` (KL,
  T = 0.5) on fixed projector / encoder outputs, with the inputs
  normalised exactly as ``FedAlignUniformClient.fit`` does
  (``F.normalize(z_pro)``); the client's total loss of Eq. 10 with the
  released coefficients (1, 1, 1, 0.1); values and gradients w.r.t. the raw
  projector and encoder outputs (torch autograd).
* methods/fedalignuniform/server.py: ``generate_weighted_subspaces`` (the
  per-client scaling matrices S_k) on a basis and index sets drawn by the
  lines of ``FedAlignUniformServer.fit`` (subspace_mode='fixed'), copied
  here because they sit inline in ``fit``.
* utils/evaluate.py: ``uniform_loss`` (the uniformity metric) and
  ``knn_predict`` (weighted kNN, k = 200, T = 0.1). The released code has no
  effective-rank computation (utils/plot.py only plots given values).
* A round-level run: ``FedAlignUniformClient.fit`` (unchanged) for three
  clients from the same global encoder / projector, then the server's
  aggregation ``fedbox.utils.functional.model_average`` with weights
  ``len(client.aug_train_loader)``, two rounds, for SSD (DSR + PD) and for
  FedAlignUniform (both off).

Command (torch venv; geoopt is imported, unused, by methods/loss.py,
tensorloader by utils/evaluate.py, tqdm by the client):

  /path/to/torch-env/bin/pip install --target /path/to/pydeps/ssl geoopt \
      tensorloader tqdm
  PYTHONPATH=/path/to/pydeps/ssl /path/to/torch-env/bin/python \
      benchmarks/crosscheck/ssd.py --repo=/path/to/hc-fang/ssd \
      --commit=<40 hex, if the checkout has no .git> \
      --out=tests/golden/ssd.npz

Settings that differ from the authors' defaults, and why:

* float64 everywhere (``torch.set_default_dtype``) and ``use_autocast=False``
  (the released client runs fp16 autocast on CUDA; there is no GPU here and
  the comparison is of the algorithm, not of fp16 rounding). The GradScaler
  the client creates is then a no-op.
* Stubs for data, model and device: a tiny encoder Linear(36, 6) and
  projector Linear(6, 8) -> ReLU -> Linear(8, 6) (ResNet-18 and the
  512-2048-512 projector in the paper), the device is the CPU, the loaders
  are fixed lists of (view1, view2) batches with a deterministic 'view'
  (view1 = x / 255, view2 = the horizontally flipped image / 255) instead of
  SimCLR augmentation, so both sides see the same views. ``wandb`` (imported
  by server.py for logging) is replaced by an empty module when it is not
  installed; nothing here logs.
* Losses on D = 8 (B = 10 rows, client 1's S_k of K = 3 with m = 2); in
  the rounds D = 6 embedding dims and K = 3 clients with m = 2 directions
  each (the server hard-codes dim = 512 and the script m = 10; the
  script's comment gives m = D // K, which is what we use), scale
  alpha = 10 (subspace_weight_range [10, 10], as the released config).
* Two local epochs, lr 0.1 (base_lr 0.2 x 128 / 256, as released), momentum
  0.9, weight decay 1e-4; batch size 4.
"""

import argparse
import copy
import os
import subprocess
import sys
import types

import numpy as np
import torch

D_IN, D, HIDDEN = 36, 6, 8  # 6x6x1 images, embedding width, projector hidden
SHAPE = (6, 6, 1)
ALPHA = 10.0
LR, MOMENTUM, WEIGHT_DECAY = 0.1, 0.9, 1e-4
BATCH = 4
EPOCHS = 2
ROUNDS = 2
CLIENT_SIZES = (8, 12, 4)  # 2, 3 and 1 full batches of 4


def import_authors(repo):
  sys.path.insert(0, repo)
  try:
    import wandb  # noqa: F401
  except ImportError:
    sys.modules['wandb'] = types.ModuleType('wandb')
  from fedbox.utils.functional import model_average
  from methods import loss as loss_mod
  from methods.fedalignuniform.client import FedAlignUniformClient
  from methods.fedalignuniform.server import FedAlignUniformServer
  from utils import evaluate

  return types.SimpleNamespace(
    loss=loss_mod,
    Client=FedAlignUniformClient,
    Server=FedAlignUniformServer,
    model_average=model_average,
    evaluate=evaluate,
  )


def t64(x):
  return torch.tensor(np.asarray(x, np.float64), requires_grad=True)


def grad_of(value, inputs):
  grads = torch.autograd.grad(
    value, inputs, allow_unused=True, retain_graph=True
  )
  return [
    np.zeros(tuple(x.shape)) if g is None else g.detach().numpy()
    for g, x in zip(grads, inputs)
  ]


def make_subspaces(authors, n_clients, dim, per_client, weight_range, seed):
  """The subspace lines of ``FedAlignUniformServer.fit`` (mode 'fixed'),
  with ``self.dim`` = dim, then the released generate_weighted_subspaces."""
  np.random.seed(seed)
  torch.manual_seed(seed)
  indices = np.arange(dim)
  np.random.shuffle(indices)
  subspace_indices = [
    indices[i * per_client : (i + 1) * per_client] for i in range(n_clients)
  ]
  subspace_weights = [
    np.random.uniform(low=weight_range[0], high=weight_range[1])
    for _ in range(n_clients)
  ]
  random_matrix = torch.randn(dim, dim)
  orthonormal_basis, _ = torch.linalg.qr(random_matrix)
  random_subspaces = [orthonormal_basis.clone() for _ in range(n_clients)]
  subspaces = authors.Server.generate_weighted_subspaces(
    None, random_subspaces, subspace_indices, subspace_weights
  )
  return subspaces, np.stack(subspace_indices), orthonormal_basis


def loss_level(authors, out):
  L = authors.loss
  rng = np.random.default_rng(0)
  b, d = 10, 8
  p1, p2 = rng.normal(size=(2, b, d)) + 0.4 * rng.normal(size=(1, 1, d))
  h1, h2 = rng.normal(size=(2, b, d))
  subspaces, sub_idx, _ = make_subspaces(authors, 3, d, 2, [ALPHA, ALPHA], 17)
  scaling = subspaces[1].detach().numpy()
  out.update(
    loss_p1=p1,
    loss_p2=p2,
    loss_h1=h1,
    loss_h2=h2,
    loss_subspaces=np.stack([s.numpy() for s in subspaces]),
    loss_subspace_indices=sub_idx,
    loss_scaling=scaling,
  )
  normalize = torch.nn.functional.normalize

  def terms():
    tp1, tp2, th1, th2 = t64(p1), t64(p2), t64(h1), t64(h2)
    z1, z2 = normalize(tp1, dim=1), normalize(tp2, dim=1)
    s = torch.tensor(scaling)
    return (tp1, tp2, th1, th2), {
      'align': L.align_loss(z1, z2),
      'uniform1': L.uniform_loss(z1),
      'uniform': (L.uniform_loss(z1) + L.uniform_loss(z2)) / 2,
      'dsr1': L.subspace_loss(z1, s, True, True),
      'dsr': (
        L.subspace_loss(z1, s, True, True) + L.subspace_loss(z2, s, True, True)
      )
      / 2,
      'distill1': L.distillation_loss(th1, tp1),
      'distill': (L.distillation_loss(th1, tp1) + L.distillation_loss(th2, tp2))
      / 2,
    }

  inputs, values = terms()
  for name, value in values.items():
    out[f'loss_{name}'] = value.item()
    gp1, gp2, gh1, gh2 = grad_of(value, inputs)
    out[f'loss_{name}_grad_p1'] = gp1
    out[f'loss_{name}_grad_p2'] = gp2
    out[f'loss_{name}_grad_h1'] = gh1
    out[f'loss_{name}_grad_h2'] = gh2
  # The client's Eq. 10 with the released coefficients (the lines of
  # FedAlignUniformClient.fit).
  inputs, v = terms()
  total = v['align'] + 1.0 * v['uniform'] + 1.0 * v['dsr'] + 0.1 * v['distill']
  out['loss_total'] = total.item()
  for name, g in zip(('p1', 'p2', 'h1', 'h2'), grad_of(total, inputs)):
    out[f'loss_total_grad_{name}'] = g


def evaluation_level(authors, out):
  E = authors.evaluate
  rng = np.random.default_rng(1)
  feats = rng.normal(size=(30, 5)) + 0.8 * rng.normal(size=(1, 5))
  normalize = torch.nn.functional.normalize
  # As server.py feeds it: L2-normalised features.
  out['eval_features'] = feats
  out['eval_uniformity'] = E.uniform_loss(normalize(torch.tensor(feats), dim=1))
  classes, n_bank, n_test = 5, 300, 40
  centres = rng.normal(size=(classes, 8))
  bank_y = rng.integers(0, classes, n_bank)
  bank = centres[bank_y] + 1.3 * rng.normal(size=(n_bank, 8))
  test_y = rng.integers(0, classes, n_test)
  test = centres[test_y] + 1.3 * rng.normal(size=(n_test, 8))
  bank_n = normalize(torch.tensor(bank), dim=1)
  test_n = normalize(torch.tensor(test), dim=1)
  # knn_fit_predict's call: bank transposed, k = 200, T = 0.1.
  pred = E.knn_predict(
    test_n, bank_n.t().contiguous(), torch.tensor(bank_y), classes, 200, 0.1
  )[:, 0]
  out.update(
    knn_bank=bank,
    knn_bank_labels=bank_y,
    knn_test=test,
    knn_test_labels=test_y,
    knn_pred=pred.numpy(),
    knn_k=200,
    knn_temperature=0.1,
    knn_num_classes=classes,
  )


class StubEncoder(torch.nn.Module):
  """Flatten + Linear: a ResNet's place (its fc already Identity)."""

  def __init__(self):
    super().__init__()
    self.fc = torch.nn.Linear(D_IN, D)

  def forward(self, x):
    return self.fc(x.reshape(x.shape[0], -1))


def make_projector():
  return torch.nn.Sequential(
    torch.nn.Linear(D, HIDDEN), torch.nn.ReLU(), torch.nn.Linear(HIDDEN, D)
  )


def stub_views(raw):
  """The deterministic 'views' both sides use (NHWC, float64)."""
  x = raw.astype(np.float64) / 255.0
  return x, x[:, :, ::-1, :].copy()


def flat_state(prefix, module):
  return {
    f'{prefix}.{k}': v.detach().numpy().copy()
    for k, v in module.state_dict().items()
  }


def round_level(authors, out, name, *, subspace_coeff, distill_coeff):
  rng = np.random.default_rng(2)
  n_total = sum(CLIENT_SIZES)
  images = rng.integers(0, 256, (n_total,) + SHAPE).astype(np.uint8)
  starts = np.cumsum((0,) + CLIENT_SIZES[:-1])
  # Each client's batch order (fixed: the same in both epochs and rounds).
  client_batches = []
  for k, n in enumerate(CLIENT_SIZES):
    perm = starts[k] + rng.permutation(n)
    client_batches.append(perm.reshape(-1, BATCH))
  torch.manual_seed(3)
  encoder, projector = StubEncoder(), make_projector()
  init = {
    **flat_state('encoder', encoder),
    **flat_state('projector', projector),
  }
  subspaces, sub_idx, _ = make_subspaces(
    authors, len(CLIENT_SIZES), D, D // len(CLIENT_SIZES), [ALPHA, ALPHA], 17
  )
  clients = []
  for k in range(len(CLIENT_SIZES)):
    loader = []
    for rows in client_batches[k]:
      x1, x2 = stub_views(images[rows])
      loader.append((torch.tensor(x1), torch.tensor(x2)))
    clients.append(
      authors.Client(
        id=k,
        encoder=copy.deepcopy(encoder),
        projector=copy.deepcopy(projector),
        aug_train_loader=loader,
        train_set=None,
        local_epochs=EPOCHS,
        lr=LR,
        momentum=MOMENTUM,
        weight_decay=WEIGHT_DECAY,
        temperature=0.07,
        uniform_coeff=1.0,
        subspace_coeff=subspace_coeff,
        subspace_norm=True,
        subspace_detach=True,
        distill_coeff=distill_coeff,
        distill_method='KL',
        device=torch.device('cpu'),
        use_autocast=False,
      )
    )
  use_subspace = subspace_coeff > 0
  states = []
  for _ in range(ROUNDS):
    # The body of FedAlignUniformServer.fit's round loop (full
    # participation), without its evaluation and logging.
    client_weights = [len(c.aug_train_loader) for c in clients]
    responses = []
    for i, client in enumerate(clients):
      responses.append(
        client.fit(
          global_encoder=encoder,
          global_projector=projector,
          lr=LR,
          current_round=0,
          subspace=subspaces[i] if use_subspace else None,
        )
      )
    encoder.load_state_dict(
      authors.model_average([r['encoder'] for r in responses], client_weights)
    )
    projector.load_state_dict(
      authors.model_average([r['projector'] for r in responses], client_weights)
    )
    states.append(
      {**flat_state('encoder', encoder), **flat_state('projector', projector)}
    )
  out[f'{name}_images'] = images
  out[f'{name}_client_batches'] = np.concatenate(
    [
      np.pad(b, ((0, 3 - len(b)), (0, 0)), constant_values=-1)[None]
      for b in client_batches
    ]
  )
  out[f'{name}_client_sizes'] = np.asarray(CLIENT_SIZES)
  out[f'{name}_subspaces'] = np.stack([s.numpy() for s in subspaces])
  out[f'{name}_subspace_indices'] = sub_idx
  out[f'{name}_subspace_coeff'] = subspace_coeff
  out[f'{name}_distill_coeff'] = distill_coeff
  for key, value in init.items():
    out[f'{name}_init/{key}'] = value
  for r, state in enumerate(states):
    for key, value in state.items():
      out[f'{name}_round{r + 1}/{key}'] = value


def main():
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  parser.add_argument('--repo', required=True)
  parser.add_argument('--out', default='tests/golden/ssd.npz')
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
    'repository': 'hc-fang/ssd',
    'commit': commit,
    'function': (
      'methods/loss.py:align_loss,uniform_loss,subspace_loss,'
      'distillation_loss; methods/fedalignuniform/server.py:'
      'FedAlignUniformServer.generate_weighted_subspaces; '
      'methods/fedalignuniform/client.py:FedAlignUniformClient.fit; '
      'fedbox/utils/functional.py:model_average; '
      'utils/evaluate.py:uniform_loss,knn_predict'
    ),
    'alpha': ALPHA,
    'uniform_t': 2.0,
    'distill_temperature': 0.5,
    'coefficients': np.array([1.0, 1.0, 1.0, 0.1]),  # align, uni, dsr, pd
    'lr': LR,
    'momentum': MOMENTUM,
    'weight_decay': WEIGHT_DECAY,
    'batch_size': BATCH,
    'local_epochs': EPOCHS,
    'rounds': ROUNDS,
  }
  loss_level(authors, out)
  evaluation_level(authors, out)
  round_level(authors, out, 'ssd_round', subspace_coeff=1.0, distill_coeff=0.1)
  round_level(authors, out, 'fau_round', subspace_coeff=0.0, distill_coeff=0.0)
  os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
  np.savez_compressed(args.out, **out)
  print(f'wrote {args.out}: {len(out)} entries, commit {out["commit"]}')


if __name__ == '__main__':
  main()
