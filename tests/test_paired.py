"""launch/paired.py: paired differences over seeds and their 95% interval,
against a re-derivation with the t quantile written out."""

import math
import os
import subprocess
import sys

import numpy as np
import pytest
from test_sweep import _fake_run

from launch import paired, sweep

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# t_{0.975, 4}: the 95% two-sided quantile on 4 degrees of freedom.
T_975_4 = 2.7764451051977987


def test_interval_is_mean_plus_minus_t_sd_over_root_n():
  d = [0.5, 1.5, 1.0, 2.0, 0.0]
  got = paired.paired_interval(d)
  half = T_975_4 * np.std(d, ddof=1) / math.sqrt(5)
  assert got['n'] == 5 and got['mean'] == pytest.approx(1.0)
  assert got['low'] == pytest.approx(1.0 - half, rel=1e-12)
  assert got['high'] == pytest.approx(1.0 + half, rel=1e-12)
  assert paired.verdict(got) == '>'
  assert paired.verdict(paired.paired_interval([-1, -2, -1.5])) == '<'
  assert paired.verdict(paired.paired_interval([-1, 2, 0.5])) == '~'
  assert paired.verdict(paired.paired_interval([3.0])) == '?'
  # A NaN difference (a run that diverged) is named, not called 'n < 2'.
  assert paired.verdict(paired.paired_interval([1.0, math.nan, 2.0])) == '!'
  assert paired.VERDICTS['!'] == 'NaN in a run'


def _root(tmp_path):
  """fedavg and two methods over seeds 0-4; 'lead' is 1 point ahead in
  every seed (with seed noise shared by both: only pairing sees it), 'mix'
  is ahead in some seeds and behind in others; 'lead' lacks seed 1 (a
  middle seed: pairing by position would then pair the wrong runs)."""
  noise = [0.05, -0.04, 0.02, -0.03, 0.0]
  for seed in range(5):
    base = 0.8 + noise[seed]
    _fake_run(
      tmp_path,
      f'a{seed}',
      algorithm='fedavg',
      alpha=0.1,
      seed=seed,
      accuracies=[0.5, base],
    )
    if seed != 1:
      _fake_run(
        tmp_path,
        f'b{seed}',
        algorithm='lead',
        alpha=0.1,
        seed=seed,
        accuracies=[0.5, base + 0.01 + 0.001 * seed],
      )
    mix = [0.02, -0.015, 0.01, -0.01, 0.0][seed]
    _fake_run(
      tmp_path,
      f'c{seed}',
      algorithm='mix',
      alpha=0.1,
      seed=seed,
      accuracies=[0.5, base + mix],
    )
  return str(tmp_path)


def test_pairs_by_seed_and_calls_a_tie_a_tie(tmp_path):
  runs = sweep.find_runs([_root(tmp_path)])
  cells = paired.paired_cells(
    runs,
    ['algorithm'],
    ['partition.alpha'],
    'fedavg',
    'test_accuracy',
    'final',
  )
  lead, unpaired, values = cells[('lead', '0.1')]
  assert (lead['n'], unpaired) == (4, 1)
  assert sorted(values) == [0, 2, 3, 4]
  assert lead['mean'] == pytest.approx(0.01225)  # 0.010, 0.012, 0.013, 0.014
  assert paired.verdict(lead) == '>'
  # Unpaired (or paired by position), the seed noise (sd 0.035) hides the
  # 1-point lead: the same runs compared without their seeds are a tie.
  noise = [0.05, -0.04, 0.02, -0.03, 0.0]
  lead_runs = [0.8 + noise[s] + 0.01 + 0.001 * s for s in (0, 2, 3, 4)]
  base_runs = [0.8 + n for n in noise]
  by_position = [a - b for a, b in zip(lead_runs, base_runs)]
  assert paired.verdict(paired.paired_interval(by_position)) == '~'
  mix = cells[('mix', '0.1')][0]
  assert paired.verdict(mix) == '~'
  table = paired.format_markdown(cells, scale=100, digits=2, baseline='fedavg')
  assert '| lead | 0.1 | 4 (1 unpaired) | +1.23 [' in table
  assert '| holds (>) |' in table and '| tie |' in table


def _paired(root, *flags):
  return subprocess.run(
    [sys.executable, '-m', 'launch.paired', f'--root={root}', *flags],
    cwd=REPO,
    capture_output=True,
    text=True,
    timeout=120,
    stdin=subprocess.DEVNULL,
  )


def test_the_command_prints_the_table(tmp_path):
  root = _root(tmp_path)
  done = _paired(root, '--baseline=fedavg', '--cols=partition.alpha')
  assert done.returncode == 0, done.stderr
  assert '| mix | 0.1 | 5 |' in done.stdout
  missing = _paired(root, '--baseline=fedavgg')
  assert missing.returncode != 0
  assert 'fedavgg' in missing.stderr and len(missing.stderr.splitlines()) == 1


def test_comma_lists_give_one_table_per_metric_and_reading(tmp_path):
  root = _root(tmp_path)
  base = ('--baseline=fedavg', '--cols=partition.alpha')
  single = _paired(root, *base, '--metric=test_accuracy', '--at=round:1')
  assert single.returncode == 0, single.stderr
  assert '###' not in single.stdout
  both = _paired(
    root,
    *base,
    '--metric=test_accuracy,test_accuracy_ema',
    '--at=final,round:1',
  )
  assert both.returncode == 0, both.stderr
  sections = both.stdout.strip().split('\n\n')
  headings = [x for x in sections if x.startswith('### ')]
  assert headings == [
    '### test_accuracy at final',
    '### test_accuracy at round:1',
    '### test_accuracy_ema at final',
    '### test_accuracy_ema at round:1',
  ]
  # Each table is the one its single call prints (round 1: every method
  # at 0.5, so no difference; final: the lead shows).
  at_round_1 = sections[sections.index('### test_accuracy at round:1') + 1]
  assert at_round_1 == single.stdout.strip()
  assert '+0.00 [' in at_round_1 and '+1.15 [' not in at_round_1
  # A bad reading anywhere in the list: one line, and no table printed.
  bad = _paired(root, *base, '--at=final,round:99')
  assert bad.returncode != 0 and bad.stdout == ''
  assert len(bad.stderr.splitlines()) == 1 and '99' in bad.stderr
