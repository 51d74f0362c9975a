r"""What a sweep's shared compilation cache saves: the same sweep, cache off and on.

`launch.sweep run` and `fedjax-metric reproduce` give their points one
persistent JAX compilation cache (launch/sweep_run.py). This script runs one
small grid twice into fresh roots, ``--compilation_cache=off`` and then
``--compilation_cache=<root>/jax_cache`` (cold for its first point, warm for
the rest), one point at a time, and reports each point's wall time (its
process, start-up and data loading included, as the sweep logs it) and the
whole sweep's:

  python -m benchmarks.compilation_cache --out=benchmarks/compilation_cache.md

The default grid is FedQuad's CPU protocol (8 rounds of 8 local steps,
Fashion-MNIST, small CNN, alpha 0.3) over seeds 0-2: short runs, where
compilation is a large share. Results vary with other load on the machine;
the report names the machine and its load average.
"""

import os
import re
import subprocess
import sys
import tempfile
import time
from typing import Dict, List

from absl import app, flags

from benchmarks import machine

FLAGS = flags.FLAGS
flags.DEFINE_string(
  'config',
  'configs/fedquad.py:dataset=fashion_mnist,model=small_cnn',
  'The config of every point.',
)
flags.DEFINE_string(
  'set',
  'num_rounds=8;local.steps=8;model.width=16;plot_partition=false;'
  'checkpoint_every=1000;partition.alpha=0.3',
  'Overrides of every point.',
)
flags.DEFINE_string('grid', 'seed=0,1,2', 'The points.')
flags.DEFINE_string('out', None, 'Also write the markdown report here.')

_DONE = re.compile(r'\[(\d+)/\d+\] done in (\d+) s')


def run_sweep(root: str, cache: str) -> Dict[str, object]:
  """One ``launch.sweep run`` into ``root``: its wall time and each point's."""
  command = [
    sys.executable,
    '-m',
    'launch.sweep',
    'run',
    f'--root={root}',
    f'--config={FLAGS.config}',
    f'--set={FLAGS.set}',
    f'--grid={FLAGS.grid}',
    f'--compilation_cache={cache}',
  ]
  # The caller's own cache would be shared by both sweeps.
  environment = {
    k: v for k, v in os.environ.items() if k != 'JAX_COMPILATION_CACHE_DIR'
  }
  start = time.perf_counter()
  result = subprocess.run(
    command,
    cwd=machine.REPO_ROOT,
    env=environment,
    capture_output=True,
    text=True,
    check=True,
  )
  seconds = time.perf_counter() - start
  points = [int(s) for _, s in _DONE.findall(result.stdout)]
  return {'seconds': seconds, 'points': points}


def report(runs: Dict[str, Dict[str, object]]) -> str:
  load = os.getloadavg()
  lines = [
    '# A sweep with and without its shared compilation cache',
    '',
    f'`python -m benchmarks.compilation_cache` on {machine.cpu_name()}; '
    f'load average at the end {load[0]:.2f} / {load[1]:.2f} / {load[2]:.2f} '
    '(1 / 5 / 15 min).',
    '',
    f'Config `{FLAGS.config}`, `--set={FLAGS.set}`, `--grid={FLAGS.grid}`, '
    'one point at a time.',
    '',
    '| cache | each point (s, as the sweep logs it) | whole sweep (s) |',
    '|---|---|---|',
  ]
  for name, run in runs.items():
    points = ', '.join(str(p) for p in run['points'])
    lines.append(f'| {name} | {points} | {run["seconds"]:.0f} |')
  return '\n'.join(lines) + '\n'


def main(argv: List[str]):
  del argv
  with tempfile.TemporaryDirectory() as scratch:
    runs = {
      'off': run_sweep(os.path.join(scratch, 'off'), 'off'),
      'on (cold, then warm)': run_sweep(
        os.path.join(scratch, 'on'),
        os.path.join(scratch, 'on', 'jax_cache'),
      ),
    }
  text = report(runs)
  print(text)
  if FLAGS.out:
    with open(FLAGS.out, 'w') as f:
      f.write(text)


if __name__ == '__main__':
  app.run(main)
