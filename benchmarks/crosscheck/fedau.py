"""FedAU / MIFA / FedVarp golden fixture from the authors' code (IBM/fedau).

Runs, unchanged, the released code of Wang and Ji, 'A Lightweight Method for
Tackling Unknown Participation Statistics in Federated Averaging', ICLR 2024
(github.com/IBM/fedau), in float64 on CPU, and writes tests/golden/fedau.npz
for tests/test_golden_fedau.py:

  /path/to/torch-env/bin/python benchmarks/crosscheck/fedau.py \\
    --repo=/path/to/fedau [--out=tests/golden/fedau.npz] [--commit=SHA]

(--commit names the checkout's commit where --repo is no git work tree, e.g.
a ``git archive`` of 6e9cce9b2e568666b5c3e0fab8f092a539884d7b.)

Three parts, keys prefixed ``part_``, ``agg_`` and ``rounds_``:

  part_*   util/util.py `data_participation_each_node` (with its `partition`)
           on 1000 labels of 10 classes, 20 clients, the config defaults
           (data Dirichlet 0.1, participation Dirichlet 0.1, mean 0.1, min
           0.02), seed 1: the index lists, the Dirichlet draws (replayed from
           NumPy's global RandomState, which the code uses) and the
           probabilities. Then `WorkerSampler` for 'bernoulli',
           'markov-0.05' and 'cyclic-100' on those probabilities, driven as
           main.py drives it (all N samplers made, then every round
           client 0..N-1 call `sample()`), 250 rounds: the masks, and the
           uniform doubles the samplers consumed (replayed: one double per
           np.random.binomial(1, p) call, checked against the RNG's state),
           the markov transition probabilities, the cyclic run lengths and
           initial rounds_to_switch.
  agg_*    main.py's loop, run by runpy, with a stub model whose local
           training adds a fixed update Delta[t, n] (12 rounds, 5 clients, 6
           weights, 1 local iteration) and a stub `WorkerSampler` subclass
           that answers a fixed participation mask (an empty round, a
           client closed by the cutoff K = 3 before its first participation,
           one client that never joins), for -weighting adaptive (K = 3 and
           the default K = 100000), known_prob, average_all,
           average_participating, mifa and fedvarp, eta_g = 1.5: the global
           model after every round (recorded by the stub CollectStatistics,
           which main.py calls every round with w_global), and FedAU's
           weights from its own -save-weight-stats CSV (printed %.4f).
  rounds_* main.py's loop, run by runpy, with the real model/model.py
           `Model` around a stub ModelCNNMnist (softmax regression, a torch
           Linear(36, 3) with fixed initial weights) on 40 fixed 6x6x1 uint8
           images (x = image / 255), 4 clients from the real partition (data
           Dirichlet 1.0), real bernoulli `WorkerSampler` participation
           (participation Dirichlet 10, mean 0.4, seed 7; its mask is
           recorded), 8 rounds of 3 local SGD steps
           (lr 0.5, batch 40: every step is the client's full data, so the
           DataLoader's shuffling cannot matter), eta_g = 1.5, for adaptive
           (K = 2), known_prob, average_participating, mifa and fedvarp: the
           global model after every round.

Stubs: `torchvision` (imported by config.py and dataset/dataset.py; only
its transforms of the image datasets use it, and -data fashion selects
none), dataset/dataset.py `load_data` (the fixed arrays above),
statistic/collect_stat.py (records w_global instead of evaluating), the
model (above), and for agg_* `WorkerSampler.sample` (the fixed mask).
util/util.py (partition, probabilities, samplers) and main.py's loop are
the released code.

Settings that differ from the authors' defaults and why: float64
(torch.set_default_dtype), CPU (-gpu 0), -data fashion (no image
transforms), tiny data / model / populations / round counts (the test runs
in seconds), -iters-per-round 1 (agg) and 3 (rounds) with
-iters-per-eval equal to it (so main.py reports w_global after every
round), -lr 0.5 and -lr-global 1.5 (updates well above float32 rounding;
eta_g != 1 checks where the server step is scaled), -k-adaptive 3 / 2
(the default 100000 never fires in a short run), -participation-prob-mean
0.4, -participation-dirichlet-alpha 10 and -seeds 7 for rounds_* (4
clients: every client joins, one round nobody does), -data-dirichlet-alpha
10 (agg) and 1.0 (rounds) so that no client is empty (the code's loader
cannot serve an empty client), -save-checkpoint 0 -save-final-model 0.
"""

import argparse
import collections
import glob
import os
import runpy
import subprocess
import sys
import tempfile
import types

import numpy as np
import torch

SEED = 1

# part_*
PART_EXAMPLES = 1000
PART_CLASSES = 10
PART_CLIENTS = 20
PART_ROUNDS = 250
PART_PATTERNS = ('bernoulli', 'markov-0.05', 'cyclic-100')

# agg_*
AGG_MASK = np.array(
  [
    [1, 0, 1, 0, 0],
    [0, 1, 0, 0, 0],
    [0, 0, 0, 0, 0],  # nobody: MIFA still moves, FedVarp does not
    [1, 1, 1, 0, 0],  # client 3: closed by K = 3 here (3 rounds out)
    [0, 0, 1, 0, 0],
    [1, 0, 0, 1, 0],  # client 3's first participation: omega = K, not 1
    [0, 0, 0, 0, 0],
    [0, 1, 1, 0, 0],
    [1, 0, 0, 0, 0],
    [0, 0, 1, 1, 0],
    [1, 1, 0, 0, 0],
    [0, 0, 1, 0, 0],
  ],
  dtype=bool,
)  # client 4 never participates
AGG_DIM = 6
AGG_LR_GLOBAL = 1.5
AGG_K = 3
AGG_RUNS = (
  ('adaptive_k3', 'adaptive', AGG_K),
  ('adaptive', 'adaptive', None),
  ('known_prob', 'known_prob', None),
  ('average_all', 'average_all', None),
  ('average_participating', 'average_participating', None),
  ('mifa', 'mifa', None),
  ('fedvarp', 'fedvarp', None),
)

# rounds_*
ROUNDS_EXAMPLES = 40
ROUNDS_CLASSES = 3
ROUNDS_CLIENTS = 4
ROUNDS = 8
ROUNDS_STEPS = 3
ROUNDS_LR = 0.5
ROUNDS_LR_GLOBAL = 1.5
ROUNDS_K = 2
ROUNDS_PROB_MEAN = 0.4
ROUNDS_PARTICIPATION_ALPHA = 10.0
# Seed 7's mask has an empty round (3), every client joins, and K = 2 fires.
ROUNDS_SEED = 7
ROUNDS_RUNS = (
  ('adaptive_k2', 'adaptive', ROUNDS_K),
  ('known_prob', 'known_prob', None),
  ('average_participating', 'average_participating', None),
  ('mifa', 'mifa', None),
  ('fedvarp', 'fedvarp', None),
)


# ---------------------------------------------------------------------------
# Stubs and module handling.
# ---------------------------------------------------------------------------

AUTHOR_MODULES = (
  'config',
  'util',
  'util.util',
  'model',
  'model.model',
  'model.cnn_mnist',
  'dataset',
  'dataset.dataset',
  'statistic',
  'statistic.collect_stat',
)


class StubDataset(torch.utils.data.Dataset):
  """Fixed examples: (float64 image / 255 flattened, int label)."""

  def __init__(self, images, labels):
    self.images = torch.tensor(
      images.reshape(len(images), -1).astype(np.float64) / 255.0
    )
    self.targets = torch.tensor(labels, dtype=torch.int64)

  def __len__(self):
    return len(self.targets)

  def __getitem__(self, i):
    return self.images[i], int(self.targets[i])


def _install_torchvision_stub():
  tv = types.ModuleType('torchvision')
  tv.transforms = types.ModuleType('torchvision.transforms')
  sys.modules['torchvision'] = tv
  sys.modules['torchvision.transforms'] = tv.transforms


def fresh_author_modules(repo, argv):
  """Forgets the authors' modules (config.py parses sys.argv on import)."""
  for name in AUTHOR_MODULES:
    sys.modules.pop(name, None)
  sys.argv = ['main.py'] + list(argv)
  if repo not in sys.path:
    sys.path.insert(0, repo)
  _install_torchvision_stub()


def _stub_module(name, **attrs):
  module = types.ModuleType(name)
  for k, v in attrs.items():
    setattr(module, k, v)
  sys.modules[name] = module
  return module


class Recorder:
  """Stub statistic.collect_stat.CollectStatistics: keeps w_global."""

  trajectory = []

  def __init__(self, results_eval_file_prefix=None):
    del results_eval_file_prefix
    Recorder.trajectory = []

  def collect_stat_eval(
    self, seed, num_iter, model, train_loader, test_loader, w_global=None
  ):
    del seed, num_iter, model, train_loader, test_loader
    Recorder.trajectory.append(w_global.detach().clone().numpy())


def _run_main(repo, argv, *, images, labels, model_module=None, sampler=None):
  """Runs main.py once; returns (module globals, recorded w_global list)."""
  fresh_author_modules(repo, argv)
  train = StubDataset(images, labels)
  _stub_module('dataset.dataset', load_data=lambda *a, **k: (train, train))
  _stub_module('statistic.collect_stat', CollectStatistics=Recorder)
  if model_module is not None:
    model_module()
  if sampler is not None:
    import util.util as util  # after the argv is set

    util.WorkerSampler = sampler(util.WorkerSampler)
  g = runpy.run_path(os.path.join(repo, 'main.py'), run_name='__main__')
  return g, np.array(Recorder.trajectory)


def _base_argv(weighting, k, iters, rounds, lr, lr_global, alpha, n, seed=SEED):
  argv = [
    '-data',
    'fashion',
    '-weighting',
    weighting,
    '-gpu',
    '0',
    '-seeds',
    str(seed),
    '-iters-per-round',
    str(iters),
    '-iters-per-eval',
    str(iters),
    '-iters-total',
    str(iters * rounds),
    '-lr',
    str(lr),
    '-lr-global',
    str(lr_global),
    '-total-workers',
    str(n),
    '-data-dirichlet-alpha',
    str(alpha),
    '-save-checkpoint',
    '0',
    '-save-final-model',
    '0',
  ]
  if k is not None:
    argv += ['-k-adaptive', str(k)]
  return argv


# ---------------------------------------------------------------------------
# part_*: partition, probabilities, samplers.
# ---------------------------------------------------------------------------


def _same_state(a, b):
  return all(
    np.array_equal(x, y) if isinstance(x, np.ndarray) else x == y
    for x, y in zip(a, b)
  )


def participation_part(repo):
  fresh_author_modules(repo, ['-data', 'fashion', '-gpu', '0'])
  import util.util as util

  labels = np.random.default_rng(0).integers(0, PART_CLASSES, PART_EXAMPLES)
  data = StubDataset(np.zeros((PART_EXAMPLES, 1), np.uint8), labels)
  np.random.seed(SEED)
  dict_users, p = util.data_participation_each_node(data, PART_CLIENTS)
  state_after = np.random.get_state()
  # Replay the draws: partition's Dirichlet [N, J], then the multiplier.
  np.random.seed(SEED)
  dist = np.random.dirichlet(
    util.data_dirichlet_alpha * np.ones(PART_CLASSES), PART_CLIENTS
  )
  m = np.random.dirichlet(
    util.participation_dirichlet_alpha * np.ones(PART_CLASSES), 1
  )
  assert _same_state(np.random.get_state(), state_after), 'replay mismatch'
  sizes = np.array([len(dict_users[n]) for n in range(PART_CLIENTS)])
  assert sizes.min() > 0, f'an empty client: {sizes}'
  p = np.asarray(p, np.float64)
  assert np.all(p < 1.0), 'p = 1 makes a markov to_off of 0'
  out = {
    'part_labels': labels.astype(np.int64),
    'part_num_clients': PART_CLIENTS,
    'part_data_alpha': util.data_dirichlet_alpha,
    'part_participation_alpha': util.participation_dirichlet_alpha,
    'part_prob_mean': util.participation_prob_mean,
    'part_prob_min': util.participation_prob_min,
    'part_dirichlet': dist,
    'part_multiplier': m[0],
    'part_indices': np.concatenate(
      [dict_users[n] for n in range(PART_CLIENTS)]
    ),
    'part_sizes': sizes,
    'part_probabilities': p,
    'part_rounds': PART_ROUNDS,
    'part_seed': SEED,
  }
  for k, pattern in enumerate(PART_PATTERNS):
    name = pattern.split('-')[0]
    seed = SEED + 1 + k
    np.random.seed(seed)
    samplers = [util.WorkerSampler(pattern, p[n]) for n in range(PART_CLIENTS)]
    if name == 'cyclic':
      out['part_cyclic_first_switch'] = np.array(
        [s.rounds_to_switch for s in samplers], np.int64
      )
      out['part_cyclic_active'] = np.array(
        [s.active_rounds for s in samplers], np.int64
      )
      out['part_cyclic_inactive'] = np.array(
        [s.inactive_rounds for s in samplers], np.int64
      )
      out['part_cyclic_cycle'] = samplers[0].cycle
    if name == 'markov':
      out['part_markov_to_on'] = np.array(
        [s.transition_to_active_prob for s in samplers]
      )
      out['part_markov_to_off'] = np.array(
        [s.transition_to_inactive_prob for s in samplers]
      )
      out['part_markov_rate'] = float(pattern.split('-')[1])
    mask = np.zeros((PART_ROUNDS, PART_CLIENTS), bool)
    for t in range(PART_ROUNDS):
      for n in range(PART_CLIENTS):
        mask[t, n] = samplers[n].sample()
    out[f'part_{name}_mask'] = mask
    if name != 'cyclic':
      state_after = np.random.get_state()
      draws = PART_ROUNDS * PART_CLIENTS + (
        PART_CLIENTS if name == 'markov' else 0
      )
      np.random.seed(seed)
      uniforms = np.random.random_sample(draws)
      assert _same_state(np.random.get_state(), state_after), name
      out[f'part_{name}_uniforms'] = uniforms
      out[f'part_{name}_seed'] = seed
  return out


# ---------------------------------------------------------------------------
# agg_*: main.py's aggregation with fixed updates.
# ---------------------------------------------------------------------------


class _FixedUpdateModel:
  """Stub model/model.py Model: one local step adds DELTAS[t, n]."""

  deltas = None
  w0 = None
  current = None  # (t, n) of the client being trained, set by the sampler

  def __init__(self, rand_seed=None, learning_rate=None, **kwargs):
    del rand_seed, learning_rate, kwargs
    self.w = torch.tensor(_FixedUpdateModel.w0)
    owner = self

    class Net(torch.nn.Module):
      def forward(self, x):
        return torch.zeros((), requires_grad=True) + 0.0 * x.sum()

    class Opt:
      def zero_grad(self):
        pass

      def step(self):
        t, n = _FixedUpdateModel.current
        owner.w = owner.w + torch.tensor(_FixedUpdateModel.deltas[t, n])

    self.model = Net()
    self.optimizer = Opt()
    self.loss_fn = lambda output, labels: output

  def update_learning_rate(self, learning_rate):
    del learning_rate

  def get_weight(self):
    return self.w.clone()

  def assign_weight(self, w):
    self.w = w.clone()


def _fixed_mask_sampler(mask):
  def make(base):
    class FixedSampler(base):
      """The released sampler's __init__; sample() reads `mask`."""

      made = 0

      def __init__(self, method, participation_prob):
        super().__init__(method, participation_prob)
        self.client = FixedSampler.made
        FixedSampler.made += 1
        self.calls = 0

      def sample(self):
        t, self.calls = self.calls, self.calls + 1
        if mask[t, self.client]:
          _FixedUpdateModel.current = (t, self.client)
        return bool(mask[t, self.client])

    return FixedSampler

  return make


def aggregation_part(repo):
  rng = np.random.default_rng(11)
  num_rounds, num_clients = AGG_MASK.shape
  deltas = rng.normal(size=(num_rounds, num_clients, AGG_DIM))
  w0 = rng.normal(size=AGG_DIM)
  images = rng.integers(0, 256, (60, 1)).astype(np.uint8)
  labels = np.arange(60) % 3
  _FixedUpdateModel.deltas, _FixedUpdateModel.w0 = deltas, w0
  out = {
    'agg_mask': AGG_MASK,
    'agg_deltas': deltas,
    'agg_w0': w0,
    'agg_lr_global': AGG_LR_GLOBAL,
    'agg_k': AGG_K,
    'agg_runs': np.array([r[0] for r in AGG_RUNS]),
  }
  cwd = os.getcwd()
  for name, weighting, k in AGG_RUNS:
    argv = _base_argv(
      weighting, k, 1, num_rounds, 0.1, AGG_LR_GLOBAL, 10.0, num_clients
    )
    argv += ['-save-weight-stats', '1']
    with tempfile.TemporaryDirectory() as tmp:
      os.chdir(tmp)
      try:
        g, traj = _run_main(
          repo,
          argv,
          images=images,
          labels=labels,
          model_module=lambda: _stub_module(
            'model.model', Model=_FixedUpdateModel
          ),
          sampler=_fixed_mask_sampler(AGG_MASK),
        )
        (csv,) = glob.glob('aggregationWeights_*.csv')
        rows = np.genfromtxt(csv, delimiter=',', skip_header=1)
      finally:
        os.chdir(cwd)
    assert traj.shape == (num_rounds, AGG_DIM), traj.shape
    out[f'agg_{name}_w'] = traj
    if name == 'known_prob' or name == 'adaptive_k3':
      out['agg_probabilities'] = np.asarray(
        g['participation_prob_each_node'], np.float64
      )
    if weighting == 'adaptive':
      # Columns: seed, num_iter, then one weight per client (nan: none
      # yet). A non-participant's column repeats its last weight.
      out[f'agg_{name}_csv_weights'] = rows[:, 2:]
  return out


# ---------------------------------------------------------------------------
# rounds_*: real local SGD of a tiny linear model in main.py's loop.
# ---------------------------------------------------------------------------


def _linear_model_module(weight, bias):
  class ModelCNNMnist(torch.nn.Module):
    """Stub for model/cnn_mnist.py: softmax regression, fixed weights."""

    def __init__(self):
      super().__init__()
      self.fc = torch.nn.Linear(weight.shape[1], weight.shape[0])
      with torch.no_grad():
        self.fc.weight.copy_(torch.tensor(weight))
        self.fc.bias.copy_(torch.tensor(bias))

    def forward(self, x):
      return self.fc(x)

  def install():
    _stub_module('model.cnn_mnist', ModelCNNMnist=ModelCNNMnist)

  return install


def _recording_sampler(log):
  def make(base):
    class RecordingSampler(base):
      """The released sampler, its answers appended to `log`."""

      def sample(self):
        got = super().sample()
        log.append(bool(got))
        return got

    return RecordingSampler

  return make


def rounds_part(repo):
  rng = np.random.default_rng(5)
  images = rng.integers(0, 256, (ROUNDS_EXAMPLES, 6, 6, 1)).astype(np.uint8)
  labels = rng.integers(0, ROUNDS_CLASSES, ROUNDS_EXAMPLES).astype(np.int64)
  weight = rng.normal(scale=0.3, size=(ROUNDS_CLASSES, 36))
  bias = rng.normal(scale=0.1, size=ROUNDS_CLASSES)
  out = {
    'rounds_images': images,
    'rounds_labels': labels,
    'rounds_kernel0': weight.T.copy(),  # [36, 3], flax Dense's layout
    'rounds_bias0': bias,
    'rounds_steps': ROUNDS_STEPS,
    'rounds_lr': ROUNDS_LR,
    'rounds_lr_global': ROUNDS_LR_GLOBAL,
    'rounds_k': ROUNDS_K,
    'rounds_seed': ROUNDS_SEED,
    'rounds_batch': ROUNDS_EXAMPLES,
    'rounds_runs': np.array([r[0] for r in ROUNDS_RUNS]),
  }
  reference = None
  for name, weighting, k in ROUNDS_RUNS:
    argv = _base_argv(
      weighting,
      k,
      ROUNDS_STEPS,
      ROUNDS,
      ROUNDS_LR,
      ROUNDS_LR_GLOBAL,
      1.0,
      ROUNDS_CLIENTS,
      seed=ROUNDS_SEED,
    )
    argv += [
      '-minibatch',
      str(ROUNDS_EXAMPLES),
      '-participation-prob-mean',
      str(ROUNDS_PROB_MEAN),
      '-participation-dirichlet-alpha',
      str(ROUNDS_PARTICIPATION_ALPHA),
    ]
    log = []
    g, traj = _run_main(
      repo,
      argv,
      images=images,
      labels=labels,
      model_module=_linear_model_module(weight, bias),
      sampler=_recording_sampler(log),
    )
    mask = np.array(log).reshape(ROUNDS, ROUNDS_CLIENTS)
    parts = [np.asarray(g['dict_users'][n]) for n in range(ROUNDS_CLIENTS)]
    probs = np.asarray(g['participation_prob_each_node'], np.float64)
    # Same seed, same draws: every run sees the same partition and mask.
    if reference is None:
      reference = (mask, parts, probs)
      assert max(len(q) for q in parts) <= ROUNDS_EXAMPLES
      assert min(len(q) for q in parts) > 0
      assert not mask.sum(1).all() and mask.sum(0).all(), mask
      out['rounds_mask'] = mask
      out['rounds_indices'] = np.concatenate(parts)
      out['rounds_sizes'] = np.array([len(q) for q in parts])
      out['rounds_probabilities'] = probs
    else:
      assert np.array_equal(mask, reference[0])
      assert all(np.array_equal(a, b) for a, b in zip(parts, reference[1]))
    assert traj.shape == (ROUNDS, ROUNDS_CLASSES * 37), traj.shape
    # Model.get_weight flattens the state dict: weight [3, 36], bias [3].
    kernels = traj[:, :108].reshape(ROUNDS, ROUNDS_CLASSES, 36)
    out[f'rounds_{name}_kernel'] = kernels.transpose(0, 2, 1)
    out[f'rounds_{name}_bias'] = traj[:, 108:]
  return out


def _commit(repo, given):
  if given:
    return given
  return subprocess.check_output(
    ['git', '-C', repo, 'rev-parse', 'HEAD'], text=True
  ).strip()


def main():
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  parser.add_argument('--repo', required=True)
  parser.add_argument('--out', default='tests/golden/fedau.npz')
  parser.add_argument('--commit', default='')
  args = parser.parse_args()
  repo = os.path.abspath(args.repo)
  commit = _commit(repo, args.commit)
  assert len(commit) == 40, commit
  out_path = os.path.abspath(args.out)
  saved_argv = list(sys.argv)
  torch.set_default_dtype(torch.float64)
  fixture = collections.OrderedDict(
    repository='IBM/fedau',
    commit=commit,
    function=(
      'util/util.py:data_participation_each_node, util/util.py:partition, '
      'util/util.py:WorkerSampler, main.py:__main__ (the round loop)'
    ),
  )
  fixture.update(participation_part(repo))
  fixture.update(aggregation_part(repo))
  fixture.update(rounds_part(repo))
  sys.argv = saved_argv
  np.savez_compressed(out_path, **fixture)
  print(f'wrote {out_path} ({os.path.getsize(out_path)} bytes)')
  m = fixture
  print('p:', np.round(m['part_probabilities'], 4))
  for name in ('bernoulli', 'markov', 'cyclic'):
    print(name, 'rate', m[f'part_{name}_mask'].mean())
  print('rounds mask:\n', m['rounds_mask'].astype(int))


if __name__ == '__main__':
  main()
