"""launch.evaluate as a user meets it: one-line errors, and --out_dir for a
workdir the results cannot be written into."""

import json
import os
import subprocess
import sys

import pytest
from test_experiment import ROOT, load_config

from fedjax_metric import experiment
from launch import evaluate as evaluate_lib


@pytest.fixture(scope='module')
def finished_run(tmp_path_factory):
  workdir = str(tmp_path_factory.mktemp('evaluate') / 'run')
  config = load_config('fedavg')
  config.num_rounds = 2
  config.checkpoint_every = 1
  config.keep_checkpoints = 1  # Round 1's checkpoint is pruned.
  experiment.run(config, workdir)
  return workdir


def run_evaluate(*args):
  return subprocess.run(
    [sys.executable, '-m', 'launch.evaluate', *args],
    cwd=ROOT,
    capture_output=True,
    text=True,
    timeout=300,
  )


@pytest.mark.parametrize(
  'args, expected',
  [
    (['--workdir=/no/such/run'], "is /no/such/run a run's workdir"),
    (['--workdir={run}', '--round=1'], 'No checkpoint of round 1'),
    (
      ['--workdir={run}', '--set=ssl_eval.no_such_knob=1'],
      "the config has no field 'ssl_eval.no_such_knob'",
    ),
    (['--workdir={run}', 'stray'], 'unexpected arguments stray'),
    # absl's own message was two lines (FATAL ... / Pass --helpshort ...).
    ([], '--workdir is required'),
    (['--workdir={run}', '--round=x'], '--round=x: invalid literal for int()'),
    (['--workdir={run}', '--workdir={run}'], '--workdir is given twice'),
  ],
)
def test_mistakes_are_one_line(finished_run, args, expected):
  result = run_evaluate(*(a.format(run=finished_run) for a in args))
  assert result.returncode == 1
  lines = result.stderr.strip().splitlines()
  assert len(lines) == 1 and lines[0].startswith('error: '), result.stderr
  assert expected in lines[0]


def test_an_unwritable_output_is_refused_before_evaluating(
  finished_run, tmp_path
):
  blocker = tmp_path / 'a_file'
  blocker.write_text('')
  with pytest.raises(PermissionError, match='--out_dir'):
    evaluate_lib.evaluate(finished_run, out_dir=str(blocker / 'out'))


def test_out_dir_receives_the_results_and_the_export(finished_run, tmp_path):
  out = tmp_path / 'elsewhere'
  before = sorted(os.listdir(finished_run))
  result = run_evaluate(f'--workdir={finished_run}', f'--out_dir={out}')
  assert result.returncode == 0, result.stderr[-2000:]
  assert sorted(os.listdir(finished_run)) == before  # Nothing written there.
  with open(out / 'eval.json') as f:
    assert json.load(f)['round'] == 2
  assert (out / 'export' / 'round_2').is_dir()


def test_an_evaluation_under_other_overrides_gets_its_own_file():
  """A second evaluation with other --set values must not replace an
  earlier (perhaps hours-long) one: each set of overrides names its file."""
  assert evaluate_lib.eval_file_name(None, ()) == 'eval.json'
  assert evaluate_lib.eval_file_name(20, ()) == 'eval_20.json'
  one = evaluate_lib.eval_file_name(20, ('ssl_eval.linear_epochs=50',))
  other = evaluate_lib.eval_file_name(20, ('ssl_eval.linear_epochs=5',))
  assert one.startswith('eval_20_set-') and one.endswith('.json')
  assert len({one, other, 'eval_20.json'}) == 3
