"""FedUV's codeword loss and rounds, run by the (unofficial) public code.

No official code of FedUV (Hosseini, Park, Yun, Louizos, Soriaga and
Welling, 'Federated Learning of User Verification Models Without Sharing
Embeddings', ICML 2021) was released; the only public implementation is
the reproduction github.com/eggry/FedUV, with its FedLab submodule
(github.com/SMILELab-FL/FedLab at the submodule's commit 9f4a354). This
script runs, UNCHANGED:

  * feduv/pipeline.py FedUVPipeline.main: the round loop (sampling, the
    clients, the server, the final evaluation);
  * feduv/trainer.py FedUVSerialClientTrainer.train (local SGD on
    l_pos = mean_i max(0, 1 - f(x_i) . v_u / c)), local_process,
    uplink_package; feduv/handler.py FedUVServerHandler with FedLab's
    SyncServerHandler (uniform FedAvg: Aggregators.fedavg_aggregate) and
    RandomSampler;
  * feduv/cnn.py's embedding head, f(x) = sqrt(c) normalize(W h(x)) (see
    the model stub);

for a few rounds of a tiny model on fixed random data, in float64, and
writes an .npz fixture (tests/test_golden_misc.py reads it): the data, the
codewords, the initial weights, each round's clients and batches, the
global model after every round, every batch loss (``loss.item()`` of
train(), read from its AverageMeter) and the round's training loss (the
trainer's example-weighted mean of the batch losses).

  PYTHONPATH=/path/to/pydeps/feduv /path/to/torch-env/bin/python \\
      benchmarks/crosscheck/feduv.py --repo=/path/to/FedUV \\
      --fedlab=/path/to/FedLab@9f4a354 --out=tests/golden/feduv.npz

(/path/to/pydeps/feduv holds ``pip install --target ... pynvml nvidia-ml-py``:
FedLab's utils import pynvml.)

Stubs (no logic of the method is replaced):
  * model: feduv/cnn.py CNN_CelebA is a 5-block CNN on 64x64 CelebA faces
    ending in ``fc`` (bias-free) and the rescaling; here the trunk is the
    identity on D = 6 fixed features and the head is CNN_CelebA's:
    ``c_sqrt * F.normalize(fc(x), dim=-1)``, ``fc`` bias-free, c = 8.
  * data: feduv/partitioned_celeba.py PartitionedCelebA is replaced by an
    object with the same get_dataloader / get_user_code: 4 users of one
    class each, 10 training examples (30 CelebA images split 20/5/5 in the
    code), the training batches in a fixed shuffled order from a seeded
    NumPy generator (the code's DataLoader shuffles with torch's RNG), and
    small validation / test sets for the final evaluation.
  * codewords: PartitionedCelebA encodes each user's id and secret with a
    BCH code (galois); the stub hands out rows 1..4 of the 8 x 8 Sylvester
    Hadamard matrix instead (the library's code for c = 8, C = 4), so both
    sides train towards the same codewords. The codeword is an input of the
    loss; how it is made is not compared.
  * imports: FedLab's package imports PIL, torchvision, pandas and tqdm for
    its datasets and demos, none of them used here: empty stand-ins.
    tensorboardX's SummaryWriter is a recorder of the scalars it is given.

Settings that differ from the authors' defaults (main.py) and why:
  * float64 (``torch.set_default_dtype``).
  * 4 clients, sample_ratio 0.5 (2 a round), 4 rounds, batch 4, lr 0.1,
    1 local epoch (defaults: 1000 clients, 0.01, 20000 rounds, batch 20,
    lr 0.1, 1 epoch): a tiny problem.
  * validate_interval larger than the run (no validation passes); the
    final test evaluation runs as in the code and is not compared.

This script does not import fedjax_metric.
"""

import argparse
import importlib.machinery
import os
import subprocess
import sys
import types

import numpy as np
import scipy.linalg

NUM_CLIENTS = 4
CODE_LENGTH = 8
DIM = 6
PER_CLIENT = 10
HELD_OUT = 3
BATCH = 4
LR = 0.1
ROUNDS = 4
SAMPLE_RATIO = 0.5
SEED = 0


def stub_module(name, **attrs):
  module = types.ModuleType(name)
  module.__spec__ = importlib.machinery.ModuleSpec(name, None)
  module.__dict__.update(attrs)
  sys.modules[name] = module
  return module


class _Anything:
  def __getattr__(self, name):
    return _Anything()

  def __call__(self, *args, **kwargs):
    return _Anything()


def install_stubs(scalars):
  import torch._dynamo  # noqa: F401  (before the stand-ins exist)

  stub_module('PIL', Image=_Anything())
  stub_module('PIL.Image')
  stub_module('torchvision', datasets=_Anything(), transforms=_Anything())
  stub_module('torchvision.datasets')
  stub_module('torchvision.transforms')
  stub_module('pandas', DataFrame=_Anything())
  stub_module('tqdm', tqdm=lambda x, *a, **k: x)

  class SummaryWriter:
    def __init__(self, *args, **kwargs):
      pass

    def add_scalar(self, name, value, step):
      scalars.append((name, value, step))

  stub_module('tensorboardX', SummaryWriter=SummaryWriter)
  stub_module('omegaconf', OmegaConf=_Anything())
  stub_module('galois', BCH=_Anything())


def make_data():
  rng = np.random.default_rng(SEED)
  n = NUM_CLIENTS * PER_CLIENT
  # Each client's examples around its own direction, so the codeword
  # alignment is learnable and the hinge is active.
  centres = rng.normal(size=(NUM_CLIENTS, DIM))
  features = np.repeat(centres, PER_CLIENT, axis=0) + rng.normal(
    scale=0.7, size=(n, DIM)
  )
  labels = np.repeat(np.arange(NUM_CLIENTS), PER_CLIENT)
  held = np.repeat(centres, HELD_OUT, axis=0) + rng.normal(
    scale=0.7, size=(NUM_CLIENTS * HELD_OUT, DIM)
  )
  weight = rng.normal(size=(CODE_LENGTH, DIM)) * 0.5
  codes = scipy.linalg.hadamard(CODE_LENGTH)[1 : 1 + NUM_CLIENTS]
  return features, labels, held, weight, codes.astype(np.float64)


def git_commit(repo):
  commit = subprocess.check_output(
    ['git', '-C', repo, 'rev-parse', 'HEAD'], text=True
  ).strip()
  assert len(commit) == 40, commit
  return commit


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument('--repo', required=True)
  parser.add_argument(
    '--fedlab',
    default='',
    help='the FedLab submodule checkout (default: <repo>/FedLab)',
  )
  parser.add_argument('--out', default='tests/golden/feduv.npz')
  parser.add_argument(
    '--commit', default='', help="the checkout's commit, if not a git tree"
  )
  flags = parser.parse_args()

  import torch
  import torch.nn.functional as F

  torch.set_default_dtype(torch.float64)
  torch.set_num_threads(1)
  scalars = []
  install_stubs(scalars)
  # This script is feduv.py: its folder must not shadow the package.
  here = os.path.dirname(os.path.abspath(__file__))
  sys.path[:] = [p for p in sys.path if os.path.abspath(p or '.') != here]
  sys.path.insert(0, flags.fedlab or os.path.join(flags.repo, 'FedLab'))
  sys.path.insert(0, flags.repo)
  from feduv.handler import FedUVServerHandler
  from feduv.pipeline import FedUVPipeline
  from feduv.trainer import FedUVSerialClientTrainer

  features, labels, held, weight, codes = make_data()
  rng = np.random.default_rng(SEED + 1)

  class Head(torch.nn.Module):
    """CNN_CelebA's head on an identity trunk."""

    def __init__(self, c):
      super().__init__()
      self.c = c
      self.c_sqrt = float(np.sqrt(c))
      self.fc = torch.nn.Linear(DIM, c, bias=False)
      with torch.no_grad():
        self.fc.weight.copy_(torch.as_tensor(weight))

    def forward(self, x):
      x = self.fc(x)
      x = self.c_sqrt * F.normalize(x, dim=-1)  # scaling
      return x

  batches_log = []

  class Parts:
    """PartitionedCelebA's interface on fixed data."""

    def get_dataloader(self, cid, type, batch_size=None, shuffle=False):
      own = np.arange(cid * PER_CLIENT, (cid + 1) * PER_CLIENT)
      if type == 'train_pos':
        if batch_size is None:  # the evaluation's warm-up pass
          return [
            (torch.as_tensor(features[own]), torch.as_tensor(labels[own]))
          ]
        order = rng.permutation(own) if shuffle else own
        chunks = [
          order[i : i + batch_size] for i in range(0, len(order), batch_size)
        ]
        batches_log.append((cid, chunks))
        return [
          (torch.as_tensor(features[b]), torch.as_tensor(labels[b]))
          for b in chunks
        ]
      rows = np.arange(cid * HELD_OUT, (cid + 1) * HELD_OUT)
      if type.endswith('_pos'):
        x = held[rows]
      else:
        x = np.delete(held, rows, axis=0)
      return [(torch.as_tensor(x), torch.zeros(len(x)))]

    def get_user_code(self, cid):
      return torch.as_tensor(codes[cid])

  model = Head(CODE_LENGTH)
  trainer = FedUVSerialClientTrainer(model, NUM_CLIENTS, cuda=False)
  trainer.setup_dataset(Parts())
  trainer.setup_optim(1, BATCH, LR, 0.01, 8000)
  # Record every batch loss train() adds to its meter (patched after the
  # trainer's own round meter was made, so only the meters of train() and,
  # after the last round, of the evaluation record).
  import feduv.trainer as trainer_module

  step_losses = []

  class RecordingMeter(trainer_module.AverageMeter):
    def update(self, val, n=1):
      step_losses.append((val, n))
      return super().update(val, n)

  trainer_module.AverageMeter = RecordingMeter
  handler = FedUVServerHandler(
    model=model,
    global_round=ROUNDS,
    num_clients=NUM_CLIENTS,
    sample_ratio=SAMPLE_RATIO,
    validate_interval=ROUNDS + 1,
    cuda=False,
  )
  globals_after = []
  original_load = handler.load

  def load(payload):
    done = original_load(payload)
    if done:
      globals_after.append(handler.model_parameters.numpy().copy())
    return done

  handler.load = load
  np.random.seed(SEED)
  torch.manual_seed(SEED)
  writer = sys.modules['tensorboardX'].SummaryWriter()
  FedUVPipeline(handler=handler, trainer=trainer, metric_writter=writer).main()

  per_round = int(max(1, SAMPLE_RATIO * NUM_CLIENTS))
  steps = int(np.ceil(PER_CLIENT / BATCH))
  selected = np.zeros((ROUNDS, per_round), np.int64)
  batches = -np.ones((ROUNDS, per_round, steps, BATCH), np.int64)
  assert len(batches_log) == ROUNDS * per_round
  for j, (cid, chunks) in enumerate(batches_log):
    r, slot = divmod(j, per_round)
    selected[r, slot] = cid
    for s, chunk in enumerate(chunks):
      batches[r, slot, s, : len(chunk)] = chunk
  train_loss = np.array([v for name, v, _ in scalars if name == 'train_loss'])
  batch_loss = np.full((ROUNDS, per_round, steps), np.nan)
  # The final evaluation's meters come after the training's.
  assert len(step_losses) > ROUNDS * per_round * steps
  for j, (value, n) in enumerate(step_losses[: ROUNDS * per_round * steps]):
    r, rest = divmod(j, per_round * steps)
    batch_loss[r, rest // steps, rest % steps] = value
    assert n == (batches[r, rest // steps, rest % steps] >= 0).sum()
  assert len(train_loss) == ROUNDS and len(globals_after) == ROUNDS
  out = {
    'repository': np.asarray('eggry/FedUV'),
    'commit': np.asarray(flags.commit or git_commit(flags.repo)),
    'fedlab_commit': np.asarray('9f4a354917b1ff86e8f5556adbdc43361ff257c0'),
    'function': np.asarray(
      'feduv/pipeline.py:FedUVPipeline.main; '
      'feduv/trainer.py:FedUVSerialClientTrainer.train; '
      'feduv/handler.py:FedUVServerHandler (FedLab SyncServerHandler)'
    ),
    'features': features,
    'labels': labels,
    'codewords': codes,
    'initial_weight': weight,
    'selected': selected,
    'batches': batches,
    'global_models': np.stack(globals_after),  # fc.weight [c, D], flat
    'train_loss': train_loss,
    'batch_loss': batch_loss,
    'lr': np.float64(LR),
    'batch_size': np.int64(BATCH),
    'num_clients': np.int64(NUM_CLIENTS),
  }
  os.makedirs(os.path.dirname(os.path.abspath(flags.out)), exist_ok=True)
  np.savez_compressed(flags.out, **out)
  print(f'wrote {flags.out} ({os.path.getsize(flags.out)} bytes)')
  print('selected', selected.tolist(), 'train_loss', train_loss)


if __name__ == '__main__':
  main()
