"""End to end: every config's :runlocal, resume == uninterrupted, finished runs
are kept, and bad input fails with a message that names the fix."""

import glob
import json
import os
import subprocess
import sys
import threading

import jax
import numpy as np
import orbax.checkpoint as ocp
import pytest

from fedjax_metric import assemble, executors, experiment
from fedjax_metric.data import cohort as cohort_lib
from fedjax_metric.data import sources

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CONFIGS = sorted(
  os.path.basename(p)[:-3]
  for p in glob.glob(os.path.join(ROOT, 'configs', '*.py'))
  if not os.path.basename(p).startswith(('_', 'common'))
)


def load_config(name, arg='runlocal'):
  import importlib

  module = importlib.import_module(f'configs.{name}')
  config = module.get_config(arg)
  config.unlock()
  config.progress = False
  return config


def read_metrics(workdir):
  with open(os.path.join(workdir, 'metrics.jsonl')) as f:
    return [json.loads(line) for line in f]


def final_params(workdir):
  with ocp.CheckpointManager(
    os.path.join(os.path.abspath(workdir), 'checkpoints')
  ) as m:
    restored = m.restore(m.latest_step())
  return restored['server_state']


# Each evaluation protocol's headline metric (a fraction in [0, 1]).
HEADLINE = {
  'classification': 'test_accuracy',
  'embedding_knn': 'test_knn_accuracy',
  'one_class': 'auroc_mean',
  'ssl': 'knn_accuracy',
}


@pytest.mark.parametrize('name', CONFIGS)
def test_every_config_runs_locally(name, tmp_path):
  config = load_config(name)
  # One evaluation, after round 2: a second one would only repeat the
  # first's code path (and the one-class protocols' evaluations are most of
  # their run time with the suite's XLA optimisations off).
  config.eval_every = 2
  headline = HEADLINE[config.eval_protocol]
  summary = experiment.run(config, str(tmp_path))
  assert summary['rounds_completed'] == 2
  assert 0.0 <= summary[headline] <= 1.0
  for f in (
    'config.json',
    'metrics.jsonl',
    'summary.json',
    'partition.json',
    'partition.png',
  ):
    assert os.path.exists(tmp_path / f), f
  assert glob.glob(str(tmp_path / 'events.out.tfevents.*'))
  rows = read_metrics(tmp_path)
  assert [r['round'] for r in rows] == [2]
  assert {'round', 'wall_time', headline, 'train_loss'} <= set(rows[0])
  if headline == 'auroc_mean':  # One-class: every class's AUROC too.
    assert {f'auroc_class_{c}' for c in range(10)} <= set(summary)
  if name == 'feduv':  # Hadamard rows of length 16: distance 8.
    assert summary['codeword_min_distance'] == 8


def test_vectorized_cohort_sampler_trains_fedquad(tmp_path):
  # FedQuad has its own (quadruplet) schedule, so this runs the cohort-wide
  # companions through a whole run; the draws differ from the per-client ones.
  config = load_config('fedquad')
  config.cohort_sampler = 'vectorized'
  summary = experiment.run(config, str(tmp_path))
  assert summary['rounds_completed'] == 2
  assert 0.1 < summary['test_accuracy'] <= 1.0  # Chance is 0.10.
  rows = read_metrics(tmp_path)
  assert all(np.isfinite(r['train_loss']) for r in rows)
  with open(tmp_path / 'config.json') as f:
    assert json.load(f)['cohort_sampler'] == 'vectorized'


def test_wall_time_of_a_row_includes_its_evaluation(tmp_path, monkeypatch):
  # A clock that moves only while the model is evaluated (100 s each time):
  # each row's wall_time must already count that row's evaluation.
  from fedjax_metric.evaluation import protocols

  class Clock:
    now = 0.0

    @staticmethod
    def time():
      return Clock.now

    perf_counter = time

  make_evaluator = protocols.make_evaluator

  def slow_evaluator(*args, **kwargs):
    evaluator = make_evaluator(*args, **kwargs)

    def every(*state):
      Clock.now += 100.0
      return evaluator.every(*state)

    return evaluator._replace(every=every)

  monkeypatch.setattr(experiment, 'time', Clock)
  monkeypatch.setattr(protocols, 'make_evaluator', slow_evaluator)
  config = load_config('fedavg')
  config.checkpoint_every = 100
  experiment.run(config, str(tmp_path))
  rows = read_metrics(tmp_path)
  assert [r['wall_time'] for r in rows] == [100.0, 200.0]
  assert [r['eval_seconds'] for r in rows] == [100.0, 100.0]


def test_fedavg_learns_digits(tmp_path):
  config = load_config('fedavg', '')
  config.num_rounds = 4
  config.local.learning_rate = 0.1  # 0.05 needs 6 rounds for 0.75
  config.checkpoint_every = 100
  summary = experiment.run(config, str(tmp_path))
  assert summary['test_accuracy'] > 0.75  # Chance is 0.10.


def test_resume_equals_uninterrupted_run(tmp_path):
  config = load_config('fedavg')
  config.num_rounds = 4
  config.checkpoint_every = 2
  config.local.optimizer = 'sgd'
  config.local.momentum = 0.9
  straight = str(tmp_path / 'straight')
  resumed = str(tmp_path / 'resumed')
  experiment.run(config, straight)
  first = experiment.run(config, resumed, stop_after_round=3)
  assert first['rounds_completed'] == 3
  assert not os.path.exists(os.path.join(resumed, 'summary.json'))
  experiment.run(config, resumed)  # Restores round 3's checkpoint, finishes.
  a, b = final_params(straight), final_params(resumed)
  for x, y in zip(jax_leaves(a), jax_leaves(b)):
    np.testing.assert_array_equal(x, y)
  assert [r['round'] for r in read_metrics(resumed)] == [1, 2, 3, 4]
  assert (
    read_metrics(straight)[-1]['test_loss']
    == read_metrics(resumed)[-1]['test_loss']
  )
  # The reported statistics of the evaluations so far: a debiased EMA with
  # weight 0.9 and the mean of the 5 best, recomputed here; the resumed run
  # (which reads its first three evaluations back) logs the same.
  rows = read_metrics(straight)
  accuracy = [r['test_accuracy'] for r in rows]
  moment = 0.0
  for t, row in enumerate(rows, start=1):
    moment = 0.9 * moment + 0.1 * accuracy[t - 1]
    assert row['test_accuracy_ema'] == pytest.approx(moment / (1 - 0.9**t))
    best = sorted(accuracy[:t], reverse=True)[:5]
    assert row['test_accuracy_top5_mean'] == pytest.approx(np.mean(best))
  for key in ('test_accuracy_ema', 'test_accuracy_top5_mean'):
    assert [r[key] for r in read_metrics(resumed)] == [r[key] for r in rows]


def test_a_run_stopped_between_evaluations_logs_the_uninterrupted_rows(
  tmp_path,
):
  """Stopped after round 3 of 4 with evaluations every 2 rounds: no extra
  row at round 3, so after the resume every row, the headline's EMA and
  top-k included, is the uninterrupted run's."""
  config = load_config('fedavg')
  config.num_rounds, config.eval_every, config.checkpoint_every = 4, 2, 4
  straight, resumed = str(tmp_path / 'straight'), str(tmp_path / 'resumed')
  experiment.run(config, straight)
  assert (
    experiment.run(config, resumed, stop_after_round=3)['rounds_completed'] == 3
  )
  assert [r['round'] for r in read_metrics(resumed)] == [2]
  experiment.run(config, resumed)
  rows = [read_metrics(w) for w in (straight, resumed)]
  assert [r['round'] for r in rows[1]] == [2, 4]
  for a, b in zip(*rows):
    for key in ('test_accuracy', 'test_accuracy_ema', 'test_loss'):
      assert a[key] == b[key], key


@pytest.mark.parametrize('pattern', ['uniform', 'bernoulli', 'markov'])
def test_extending_num_rounds_equals_a_fresh_longer_run(tmp_path, pattern):
  """A finished 2-round run extended to 4 rounds ends bit for bit where a
  fresh 4-round run does: nothing the first rounds computed read T (the
  participation masks of a longer run start with the shorter one's)."""
  config = load_config('fedavg')
  config.participation.pattern = pattern
  config.num_rounds = 4
  experiment.run(config, str(tmp_path / 'fresh'))
  short = config.copy_and_resolve_references()
  short.num_rounds = 2
  experiment.run(short, str(tmp_path / 'extended'))
  experiment.run(config, str(tmp_path / 'extended'))
  a = final_params(tmp_path / 'fresh')
  b = final_params(tmp_path / 'extended')
  for x, y in zip(jax_leaves(a), jax_leaves(b)):
    np.testing.assert_array_equal(x, y)
  assert [r['round'] for r in read_metrics(tmp_path / 'extended')] == [
    1,
    2,
    3,
    4,
  ]


@pytest.mark.parametrize('pattern', ['uniform', 'bernoulli'])
def test_rounds_in_one_program_equal_round_by_round_runs(tmp_path, pattern):
  """rounds_per_call=0 (automatic: 3 here, the evaluation interval) and
  rounds_per_call=1 give the same models and the same per-evaluation
  metrics, with uniform sampling and under a participation pattern (cohorts
  of varying size, rounds nobody joins); a run stopped after round 3 and
  resumed in the program form ends the same way."""
  runs = {}
  for name, rounds_per_call, stop in (
    ('scan', 0, None),
    ('round_by_round', 1, None),
    ('resumed', 0, 3),
  ):
    config = load_config('fedavg')
    config.executor = 'sequential'
    config.participation.pattern = pattern
    config.participation.mean = 0.3
    config.num_rounds, config.eval_every, config.checkpoint_every = 6, 3, 6
    config.rounds_per_call = rounds_per_call
    workdir = str(tmp_path / name)
    if stop:
      first = experiment.run(config, workdir, stop_after_round=stop)
      assert first['rounds_completed'] == stop
    summary = experiment.run(config, workdir)
    assert summary['rounds_per_call'] == (rounds_per_call or 3)
    runs[name] = (final_params(workdir), read_metrics(workdir))
  for name in ('round_by_round', 'resumed'):
    params, rows = runs[name]
    for x, y in zip(jax_leaves(runs['scan'][0]), jax_leaves(params)):
      np.testing.assert_allclose(x, y, atol=1e-6)
    assert [r['round'] for r in rows] == [3, 6]
    for a, b in zip(runs['scan'][1], rows):
      for key in ('train_loss', 'test_accuracy', 'test_loss'):
        np.testing.assert_allclose(a[key], b[key], rtol=1e-5)


def test_validation_split_is_held_out_of_the_clients_and_logged(tmp_path):
  config = load_config('fedavg')
  config.dataset.validation_fraction = 0.2
  experiment.run(config, str(tmp_path))
  with open(tmp_path / 'partition.json') as f:
    partitioned = json.load(f)['num_examples']
  full = len(sources.load('digits', 'train').labels)
  held = len(sources.hold_out(sources.load('digits', 'train'), 0.2)[1].labels)
  assert partitioned == full - held and 0.15 * full < held < 0.25 * full
  row = read_metrics(str(tmp_path))[-1]
  for name in ('val_accuracy', 'val_loss', 'test_accuracy'):
    assert 0 <= row[name] <= (1 if 'accuracy' in name else 100), name
  assert row['val_accuracy'] != row['test_accuracy']


def test_rounds_per_call_follows_the_cadence():
  program = executors.ExecutorChoice('vmap')
  choose = executors.choose_rounds_per_call
  # Every evaluation, checkpoint, start and end falls on a call boundary.
  assert (
    choose(0, program, boundaries=(500, 250, 0, 10000), round_bytes=1)[0] == 250
  )
  assert (
    choose(0, program, boundaries=(50, 250, 100, 1000), round_bytes=1)[0] == 50
  )
  assert choose(0, program, boundaries=(3, 5, 0, 30), round_bytes=1)[0] == 1
  # An explicit value is an upper bound, met by a divisor of the cadence.
  assert (
    choose(30, program, boundaries=(100, 100, 0, 1000), round_bytes=1)[0] == 25
  )
  # The stacked cohorts stay under the memory cap.
  big = executors.STACKED_COHORT_BYTES // 10
  assert choose(0, program, boundaries=(100,), round_bytes=big)[0] == 10
  # The host executor drives clients from Python: one round per call.
  host = executors.ExecutorChoice('host')
  assert choose(0, host, boundaries=(100,), round_bytes=1)[0] == 1
  with pytest.raises(ValueError, match='rounds_per_call'):
    choose(-1, program, boundaries=(100,), round_bytes=1)


def jax_leaves(tree):
  import jax

  return [np.asarray(x) for x in jax.tree.leaves(tree)]


def test_nan_loss_stops_with_advice_and_keeps_checkpoint(tmp_path):
  config = load_config('fedavg')
  config.num_rounds = 3
  config.local.learning_rate = 1e30
  with pytest.raises(FloatingPointError, match='learning_rate'):
    experiment.run(config, str(tmp_path))
  assert not os.path.exists(tmp_path / 'summary.json')


def test_missing_dataset_names_files_and_fix(tmp_path):
  config = load_config('fedavg')
  config.dataset.name = 'mnist'
  config.dataset.data_dir = str(tmp_path / 'nowhere')
  with pytest.raises(sources.DatasetNotFoundError, match='train-images'):
    experiment.run(config, str(tmp_path / 'run'))


def test_impossible_partition_is_a_clear_error(tmp_path):
  config = load_config('fedavg')
  config.num_clients = 5000
  config.clients_per_round = 4
  with pytest.raises(ValueError, match='5000'):
    experiment.run(config, str(tmp_path))


def run_cli(*args, cwd=ROOT):
  return subprocess.run(
    [sys.executable, '-m', 'launch.main', *args],
    cwd=cwd,
    capture_output=True,
    text=True,
    timeout=300,
  )


def test_cli_overrides_and_locked_config(tmp_path):
  ok = run_cli(
    '--config=configs/fedavg.py:runlocal',
    '--config.num_rounds=1',
    '--config.seed=3',
    '--config.partition.alpha=0.3',
    '--config.model.conv_impl=patches',
    '--config.progress=False',
    f'--workdir={tmp_path}/a',
  )
  assert ok.returncode == 0, ok.stderr[-2000:]
  assert 'test_accuracy=' in ok.stdout
  assert 'convolutions: patches' in ok.stdout + ok.stderr
  with open(tmp_path / 'a' / 'config.json') as f:
    saved = json.load(f)
  assert (saved['num_rounds'], saved['seed'], saved['partition']['alpha']) == (
    1,
    3,
    0.3,
  )
  assert saved['model']['conv_impl'] == 'patches'


@pytest.mark.parametrize(
  'mistake, expected',
  [
    # The README's own example of a mistyped field.
    (
      '--config.num_round=5',
      "error: --config.num_round: the config has no field 'num_round'; "
      "did you mean 'num_rounds'?",
    ),
    (
      '--config.local.learning_rat=0.1',
      'error: --config.local.learning_rat: local has no field '
      "'learning_rat'; did you mean 'learning_rate'?",
    ),
    # An option the algorithm does not take (fedavg has no mu).
    (
      '--config.algorithm_kwargs.mu=1',
      'error: --config.algorithm_kwargs.mu: algorithm_kwargs has no field '
      "'mu'.",
    ),
    # A field under a value, not a block.
    (
      '--config.local.optimizer.lr=3',
      'error: --config.local.optimizer.lr: local.optimizer is a value '
      "('sgd'), not a block of fields.",
    ),
    (
      'extra',
      'error: unexpected argument(s) extra; every option is --name=value '
      '(--helpfull lists them).',
    ),
  ],
)
def test_a_mistaken_override_is_one_line(mistake, expected, tmp_path):
  bad = run_cli(
    '--config=configs/fedavg.py:runlocal', mistake, f'--workdir={tmp_path}/b'
  )
  assert bad.returncode == 1
  assert bad.stderr.strip().splitlines() == [expected], bad.stderr[-2000:]
  assert not (tmp_path / 'b').exists()  # Nothing written.


@pytest.mark.skipif(
  jax.default_backend() != 'cpu',
  reason="experiment.run shards over the default backend's devices and this "
  'test needs 4 (a one-GPU machine has 1); test_engine runs the sharded '
  'round on 4 explicit CPU devices everywhere.',
)
def test_run_with_sharded_vmap_equals_host_executor(tmp_path):
  """3 clients per round on 4 devices: 4 slots, one padding slot."""
  finals = {}
  for executor in ('host', 'vmap'):
    config = load_config('fedavg')
    config.clients_per_round = 3
    config.executor = executor
    config.num_devices = 4
    summary = experiment.run(config, str(tmp_path / executor))
    assert summary['executor'] == executor
    # conv_impl='auto': batched matmuls where clients train together.
    assert summary['conv_impl'] == {'host': 'xla', 'vmap': 'patches'}[executor]
    finals[executor] = final_params(str(tmp_path / executor))
  assert assemble.num_cohort_slots(config, 4) == 4
  for x, y in zip(jax_leaves(finals['host']), jax_leaves(finals['vmap'])):
    np.testing.assert_allclose(x, y, atol=1e-5)


def test_model_fields_that_do_not_fit_are_a_clear_error(tmp_path):
  config = load_config('fedavg')
  config.model.unlock()
  config.model.depth = 50
  with pytest.raises(ValueError, match='depth'):
    experiment.run(config, str(tmp_path))


def test_representation_metrics_are_logged_when_enabled(tmp_path):
  config = load_config('fedavg')
  config.representation_examples = 200
  experiment.run(config, str(tmp_path))
  row = read_metrics(tmp_path)[-1]
  for name in (
    'effective_rank',
    'vci',
    'within_class_trace',
    'between_class_trace',
    'uniformity',
  ):
    assert np.isfinite(row[f'test_{name}']), name
  assert 1.0 <= row['test_effective_rank'] <= 16  # runlocal embedding_dim


def test_prefetch_yields_in_order_and_builds_ahead():
  started = []
  building_4 = threading.Event()

  def build(i):
    started.append(i)
    if i == 4:
      building_4.set()
    return i * i

  cohorts = cohort_lib.prefetch(build, range(3, 7))
  assert next(cohorts) == 9
  # While the caller holds round 3's cohort, round 4's is built in a thread.
  assert building_4.wait(timeout=10)
  assert list(cohorts) == [16, 25, 36]
  assert sorted(started) == [3, 4, 5, 6]  # Each built once.


def test_the_loss_terms_and_throughput_are_logged(tmp_path):
  """Each named term of the loss is logged per evaluation as train_<term>
  (the mean over the real examples trained since the last evaluation, as
  train_loss is), so FedQuad's rows satisfy its Algorithm 1 total
  train_loss = beta * train_metric + train_ce; throughput too."""
  config = load_config('fedquad')
  beta = config.algorithm_kwargs.beta
  experiment.run(config, str(tmp_path))
  rows = read_metrics(tmp_path)
  assert len(rows) == 2
  rounds_per_row = config.eval_every
  for row in rows:
    assert {'train_ce', 'train_metric'} <= set(row)
    np.testing.assert_allclose(
      row['train_loss'],
      beta * row['train_metric'] + row['train_ce'],
      rtol=1e-5,
    )
    assert row['train_metric'] > 0 and row['train_ce'] > 0
    assert row['examples_per_second'] > 0 and row['rounds_per_second'] > 0
    # Same interval: clients / rounds is the cohort size.
    np.testing.assert_allclose(
      row['clients_per_second'] / row['rounds_per_second'],
      config.clients_per_round,
      rtol=1e-6,
    )
    # The interval splits into the round programs, the wait for the host's
    # cohorts and the rest (logging, checkpoints): parts within the whole.
    interval = rounds_per_row / row['rounds_per_second']
    assert row['round_seconds'] > 0 and row['cohort_wait_seconds'] >= 0
    assert row['round_seconds'] + row['cohort_wait_seconds'] <= interval


def test_a_batch_larger_than_any_client_is_said(tmp_path, capsys):
  config = load_config('fedavg')
  config.num_rounds = 1
  # digits has 1,438 training examples: no client holds 1,500. (A larger
  # batch costs padded rows in every step: kept small here.)
  config.local.batch_size = 1500
  experiment.run(config, str(tmp_path))
  out = capsys.readouterr().out
  with open(tmp_path / 'partition.json') as f:
    largest = json.load(f)['max_size']
  assert (
    f"batch_size=1500 is larger than any client's data (the largest "
    f'holds {largest})'
  ) in out


def test_a_run_killed_before_its_summary_completes_it_in_full(tmp_path):
  """Killed after the last checkpoint, before summary.json: the rerun writes
  the summary a straight run writes (the last row's round, train_loss,
  eval_seconds ... from metrics.jsonl), not a shorter one."""
  config = load_config('fedavg')
  experiment.run(config, str(tmp_path))
  with open(tmp_path / 'summary.json') as f:
    straight = json.load(f)
  os.remove(tmp_path / 'summary.json')
  resumed = experiment.run(config, str(tmp_path))
  for key in ('round', 'train_loss', 'eval_seconds', 'test_accuracy'):
    assert resumed[key] == straight[key], key
  with open(tmp_path / 'summary.json') as f:
    assert json.load(f)['train_loss'] == straight['train_loss']
