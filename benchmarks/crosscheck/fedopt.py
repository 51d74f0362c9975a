"""FedAdam and FedYogi golden fixture from the authors' code.

Reddi, Charles, Zaheer, Garrett, Rush, Konecny, Kumar and McMahan,
'Adaptive Federated Optimization', ICLR 2021; code:
github.com/google-research/federated (TensorFlow / TFF). Runs, UNCHANGED,
at the commit given:

  * utils/optimizers/optimizer_utils.py: ``define_optimizer_flags('server')``
    and ``create_optimizer_fn_from_flags('server')``, the way
    optimization/trainer.py builds the server optimizer from
    ``--server_optimizer=adam|yogi`` and ``--server_<name>_<arg>`` flags
    (absl flags, parsed here from an argv list); 'adam' is
    ``tf.keras.optimizers.Adam``, 'yogi' their own
    utils/optimizers/yogi.py ``Yogi``;
  * generalization/utils/fed_avg_schedule.py: ``build_server_init_fn``
    (the initial ServerState: ``_initialize_optimizer_vars`` applies a zero
    gradient to create the optimizer's variables, then the state stores
    them) and ``server_update`` (restores the model and the optimizer
    variables, applies ``-1.0 * weights_delta`` as the gradient). These
    functions are unchanged from the paper-era
    optimization/shared/fed_avg_schedule.py (at 6bd2508, 2021-04-07, the
    file differs only in docstrings and the client's metrics plumbing);
    the server step is rebuilt every round exactly as its
    ``build_fed_avg_process.server_update_fn`` does (a new model and a new
    optimizer from the flags, ``_initialize_optimizer_vars``, then
    ``server_update``): those four lines are repeated here, since the
    closure itself sits inside a TFF federated computation.

Stubs, and why: ``tensorflow_federated`` is not installed (it pins its
own TensorFlow version, and the server step needs none of its runtime): a
module stands in with what the functions call,
``tff.learning.ModelWeights.from_model`` (trainable and non-trainable
variables of the model), ``tff.structure.update_struct`` (``attr.evolve``)
and ``tff.tf_computation`` (runs the function once and returns its values
as NumPy arrays, as a TFF computation returns values, not variables); the
other names it is asked for at import are inert placeholders used only in
type annotations. The model: an object holding three float64 variables
(a 4x3 kernel, a bias of 3, a scale of 2); client training: none, each
round's client deltas are fixed random inputs and the weighted mean of
them (``tff.federated_mean(weights_delta, weight=client_weight)``) is
computed here in NumPy.

Recorded: the inputs, and for every run the model after every round, the
optimizer's step count (``iterations``) after every round and the
hyperparameters as the optimizer applies them to float64 variables
(``effective``: lr, beta_1, beta_2, epsilon in the moments, and the betas
of the bias correction's powers). Their values go through float32: Keras'
``_set_hyper`` variables (OptimizerV2: Adam v2 and their Yogi), the
rewritten Adam's learning-rate variable, and its ``tf.cast(self.beta_1,
dtype)`` of a Python float (the powers' betas are float32-rounded, the
moments' are not); the test feeds our optimizer those float64 values.

Runs: FedAdam and FedYogi each at (server lr, tau = epsilon, beta_2) in
(0.1, 1e-3, 0.99), (1.0, 1e-2, 0.99), (0.1, 1e-3, 0.999); beta_1 = 0.9.
FedYogi with ``--server_yogi_initial_accumulator_value=0`` (the paper's
setting, optimization/README.md and docs/hyperparameters.md), and once
with the class default 1.0. 'adam' resolves, under TensorFlow 2.15, to the
rewritten Keras Adam; under the TensorFlow 2.8 of their requirements.txt it
was the OptimizerV2 Adam, kept in TensorFlow 2.15 as
``tf.keras.optimizers.legacy.Adam``: the 'adam_v2' runs are that class,
built with the same keyword arguments the flags give (the same update
formula; recorded so the test checks both).

Settings that differ from the authors' defaults and why: float64 model
variables (theirs float32; to compare at float64 rounding); 6 rounds of 3
clients with fixed deltas in place of client training; beta_2 0.99 in two
settings (this library's default; their class default 0.999 is the third).

  /path/to/tfenv/bin/python benchmarks/crosscheck/fedopt.py \\
    --repo=/path/to/federated [--commit=SHA] [--out=tests/golden/fedopt.npz]

(--repo: a checkout, or a ``git archive`` of the commit's utils/ and
generalization/utils/ with --commit naming it; the fixture was made at
a5af8c4433c9ee2d2b1565f1bcc68c89e2000a6b. Needs ``tensorflow-cpu==2.15.1``
(the last with Keras 2 built in: their Yogi subclasses
``tf.keras.optimizers.legacy.Optimizer``), ``attrs`` and ``absl-py``, e.g.
``python3 -m venv tfenv && tfenv/bin/pip install tensorflow-cpu==2.15.1
attrs``.)

This script does not import fedjax_metric.
"""

import argparse
import importlib
import os
import subprocess
import sys
import types

import numpy as np

ROUNDS = 6
CLIENTS = 3
SHAPES = {'kernel': (4, 3), 'bias': (3,), 'scale': (2,)}
NAMES = tuple(SHAPES)
BETA_1 = 0.9
SETTINGS = {  # name: (server lr, epsilon = tau, beta_2)
  's1': (0.1, 1e-3, 0.99),
  's2': (1.0, 1e-2, 0.99),
  's3': (0.1, 1e-3, 0.999),
}


def make_inputs():
  """Initial model, per-round client deltas [R, C, ...] and weights [R, C].

  The deltas' scale changes across rounds and leaves (0.05, 0.005, 0.2 per
  leaf; round 4 ten times smaller), so that tau matters in some coordinates
  and Yogi's second moment both grows and shrinks; one coordinate's mean
  delta is exactly 0 in round 2.
  """
  rng = np.random.default_rng(20210503)
  init = {k: rng.normal(size=s) for k, s in SHAPES.items()}
  scale = {'kernel': 0.05, 'bias': 0.005, 'scale': 0.2}
  round_scale = np.ones(ROUNDS)
  round_scale[3] = 0.1
  deltas = {
    k: scale[k]
    * round_scale[:, None].reshape((ROUNDS, 1) + (1,) * len(s))
    * rng.normal(size=(ROUNDS, CLIENTS) + s)
    for k, s in SHAPES.items()
  }
  deltas['bias'][1, :, 0] = 0.0
  weights = rng.integers(2, 12, size=(ROUNDS, CLIENTS)).astype(np.float64)
  return init, deltas, weights


def mean_deltas(deltas, weights):
  """tff.federated_mean(weights_delta, weight=client_weight), per round."""
  w = weights / weights.sum(axis=1, keepdims=True)
  return {k: np.einsum('rc,rc...->r...', w, d) for k, d in deltas.items()}


def stub_tff():
  """The few TFF names fed_avg_schedule calls, and inert placeholders for
  the ones it only names in annotations."""
  import attr
  import tensorflow as tf

  class Inert:
    """A callable placeholder: attribute access and calls give another."""

    def __call__(self, *args, **kwargs):
      return Inert()

    def __getattr__(self, name):
      return Inert()

    def __getitem__(self, item):
      return Inert()

  def from_model(model):
    return ModelWeights(
      list(model.trainable_variables), list(model.non_trainable_variables)
    )

  def tf_computation(fn):
    def values():
      return tf.nest.map_structure(np.asarray, fn())

    return values

  ModelWeights = attr.make_class(
    'ModelWeights', ['trainable', 'non_trainable'], frozen=True
  )
  ModelWeights.from_model = staticmethod(from_model)
  tff = types.ModuleType('tensorflow_federated')
  tff.__getattr__ = lambda name: Inert()
  tff.learning = types.SimpleNamespace(
    ModelWeights=ModelWeights,
    Model=Inert(),
    MetricFinalizersType=Inert(),
    metrics=types.SimpleNamespace(sum_then_finalize=Inert()),
  )
  tff.structure = types.SimpleNamespace(
    update_struct=lambda s, **kw: attr.evolve(s, **kw)
  )
  tff.tf_computation = tf_computation
  sys.modules['tensorflow_federated'] = tff


class StubModel:
  """The model: three float64 variables, nothing else TFF's ModelWeights
  reads."""

  def __init__(self, tf, init):
    self.trainable_variables = [
      tf.Variable(init[k], dtype=tf.float64, name=k) for k in NAMES
    ]
    self.non_trainable_variables = []


def parse_flags(flags, argv):
  """Resets and parses the absl flags, as a fresh trainer.py would."""
  flags.FLAGS.unparse_flags()
  flags.FLAGS(['fedopt'] + argv)


def server_optimizer_fn(modules, optimizer, lr, eps, beta_2, v0):
  """Their create_optimizer_fn_from_flags('server') for this run's flags
  ('adam_v2': the OptimizerV2 Adam with the same keyword arguments)."""
  import tensorflow as tf

  flags = modules['absl.flags']
  if optimizer == 'adam_v2':
    return lambda learning_rate=lr: tf.keras.optimizers.legacy.Adam(
      learning_rate=learning_rate,
      beta_1=BETA_1,
      beta_2=beta_2,
      epsilon=eps,
    )
  argv = [f'--server_optimizer={optimizer}', f'--server_learning_rate={lr}']
  if optimizer == 'adam':
    argv += [
      f'--server_adam_beta_1={BETA_1}',
      f'--server_adam_beta_2={beta_2}',
      f'--server_adam_epsilon={eps}',
    ]
  else:
    argv += [
      f'--server_yogi_beta1={BETA_1}',
      f'--server_yogi_beta2={beta_2}',
      f'--server_yogi_epsilon={eps}',
      f'--server_yogi_initial_accumulator_value={v0}',
    ]
  parse_flags(flags, argv)
  return modules['optimizer_utils'].create_optimizer_fn_from_flags('server')


def effective_hypers(tf, opt):
  """(lr, beta_1, beta_2, epsilon, B1, B2) as the optimizer applies them to
  float64 variables: beta_1 and beta_2 in the moments, B1 and B2 in the
  bias correction's powers."""
  f64 = tf.float64
  if hasattr(opt, '_get_hyper'):  # OptimizerV2: Adam (v2) and their Yogi
    eps = (
      opt._get_hyper('epsilon', f64) if 'epsilon' in opt._hyper else opt.epsilon
    )
    b1 = float(opt._get_hyper('beta_1', f64))
    b2 = float(opt._get_hyper('beta_2', f64))
    lr = float(opt._get_hyper('learning_rate', f64))
    return [lr, b1, b2, float(eps), b1, b2]
  # The rewritten Keras Adam: a float32 learning-rate variable; the moments
  # use the Python floats, the powers ``tf.cast(self.beta_1, dtype)``, which
  # goes through a float32 tensor.
  return [
    float(tf.cast(opt.learning_rate, f64)),
    float(opt.beta_1),
    float(opt.beta_2),
    float(opt.epsilon),
    float(tf.cast(opt.beta_1, f64)),
    float(tf.cast(opt.beta_2, f64)),
  ]


def run(modules, init, means, optimizer, setting, v0):
  """Their server over the rounds: models [R] per leaf, iterations [R],
  effective hyperparameters."""
  import tensorflow as tf

  schedule = modules['fed_avg_schedule']
  lr, eps, beta_2 = SETTINGS[setting]
  opt_fn = server_optimizer_fn(modules, optimizer, lr, eps, beta_2, v0)
  model_fn = lambda: StubModel(tf, init)
  state = schedule.build_server_init_fn(model_fn, lambda: opt_fn(lr))()
  models = {k: [] for k in NAMES}
  iterations = []
  for r in range(ROUNDS):
    # build_fed_avg_process.server_update_fn (a constant server rate).
    model = model_fn()
    server_optimizer = opt_fn(lr)
    schedule._initialize_optimizer_vars(model, server_optimizer)
    delta = [tf.constant(means[k][r], tf.float64) for k in NAMES]
    state = schedule.server_update(model, server_optimizer, state, delta)
    state = tf.nest.map_structure(np.asarray, state)
    for k, v in zip(NAMES, state.model.trainable):
      models[k].append(v)
    iterations.append(int(server_optimizer.iterations.numpy()))
  hypers = effective_hypers(tf, server_optimizer)
  return {k: np.stack(v) for k, v in models.items()}, iterations, hypers


def git_commit(repo, commit):
  if commit:
    return commit
  return subprocess.check_output(
    ['git', '-C', repo, 'rev-parse', 'HEAD'], text=True
  ).strip()


def load_their_modules(repo):
  os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '2')
  sys.path.insert(0, repo)
  stub_tff()
  from absl import flags

  optimizer_utils = importlib.import_module('utils.optimizers.optimizer_utils')
  optimizer_utils.define_optimizer_flags('server')
  return {
    'absl.flags': flags,
    'optimizer_utils': optimizer_utils,
    'fed_avg_schedule': importlib.import_module(
      'generalization.utils.fed_avg_schedule'
    ),
  }


RUNS = (  # (name, optimizer, setting, initial accumulator of Yogi)
  [(f'adam_{s}', 'adam', s, None) for s in SETTINGS]
  + [(f'adam_v2_{s}', 'adam_v2', s, None) for s in SETTINGS]
  + [(f'yogi_{s}', 'yogi', s, 0.0) for s in SETTINGS]
  + [('yogi_s1_v0_1', 'yogi', 's1', 1.0)]
)


def main():
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  parser.add_argument('--repo', required=True)
  parser.add_argument('--out', default='tests/golden/fedopt.npz')
  parser.add_argument('--commit', default='')
  args = parser.parse_args()
  repo = os.path.abspath(args.repo)
  out_path = os.path.abspath(args.out)
  commit = git_commit(repo, args.commit)
  modules = load_their_modules(repo)
  import tensorflow as tf

  init, deltas, weights = make_inputs()
  means = mean_deltas(deltas, weights)
  fixture = {
    'repository': np.asarray('google-research/federated'),
    'commit': np.asarray(commit),
    'function': np.asarray(
      'utils/optimizers/optimizer_utils.py:create_optimizer_fn_from_flags, '
      'utils/optimizers/yogi.py:Yogi, generalization/utils/'
      'fed_avg_schedule.py:build_server_init_fn and server_update'
    ),
    'tensorflow': np.asarray(tf.__version__),
    'names': np.asarray(NAMES),
    'client_weights': weights,
    'runs': np.asarray([name for name, *_ in RUNS]),
  }
  for k in NAMES:
    fixture[f'init/{k}'] = init[k]
    fixture[f'deltas/{k}'] = deltas[k]
    fixture[f'mean_delta/{k}'] = means[k]
  for name, optimizer, setting, v0 in RUNS:
    models, iterations, hypers = run(
      modules, init, means, optimizer, setting, v0
    )
    lr, eps, beta_2 = SETTINGS[setting]
    fixture[f'{name}/optimizer'] = np.asarray(optimizer)
    fixture[f'{name}/setting'] = np.asarray([lr, BETA_1, beta_2, eps])
    fixture[f'{name}/effective'] = np.asarray(hypers)
    fixture[f'{name}/initial_accumulator'] = np.asarray(
      np.nan if v0 is None else v0
    )
    fixture[f'{name}/iterations'] = np.asarray(iterations)
    for k in NAMES:
      fixture[f'{name}/model/{k}'] = models[k]
    print(name, 'iterations', iterations, 'hypers', hypers)
  os.makedirs(os.path.dirname(out_path), exist_ok=True)
  np.savez_compressed(out_path, **fixture)
  print(f'wrote {out_path} ({os.path.getsize(out_path)} bytes)')


if __name__ == '__main__':
  main()
