"""Bit-level fingerprints of every packaged config's ``runlocal`` run.

A refactoring of the algorithms or of the round must not change a single
bit of what a run computes. This script trains each packaged config's
``runlocal`` variant (synthetic data, a few rounds, in-process, float32 at
'highest' matmul precision as the config sets it) and writes, per config,
the SHA-256 of every leaf of the final global variables and of every
number in the metrics history. Run it before and after a change and
compare:

  python -m benchmarks.algorithm_fingerprints --out=/tmp/before.json
  ... change the code ...
  python -m benchmarks.algorithm_fingerprints --out=/tmp/after.json \
      --compare=/tmp/before.json

An existing ``--out`` is resumed (its runs are kept). ``--compare`` prints
each config whose leaves differ (and which leaves) and
exits 1 if any does. Fingerprints are only comparable on one machine with
one JAX/XLA version: they are a same-session check, not a committed fixture.
``--configs=fedavg,moon`` restricts the set to those configs and their
variants (``--noextra`` leaves out the server optimizer, weighting and
participation variants that configs reach only through overrides).
"""

import hashlib
import json
import os
import sys
import tempfile

from absl import app, flags
import jax
import numpy as np

_OUT = flags.DEFINE_string('out', None, 'JSON file to write.', required=True)
_COMPARE = flags.DEFINE_string(
  'compare', None, 'An earlier output to compare with.'
)
_CONFIGS = flags.DEFINE_list(
  'configs', None, 'Config names (default: every file in configs/).'
)
_IGNORE = flags.DEFINE_list(
  'ignore',
  [],
  'Leaves not compared (e.g. metrics_history, for a baseline '
  'written before throughputs were left out of it).',
)
_EXTRA = flags.DEFINE_bool(
  'extra', True, 'Also the server / weighting variants.'
)

# Variants a config file reaches only through its arguments or overrides:
# (label, config name, config argument, {field path: value}).
_FEDAGM = {'server.optimizer': 'fedagm', 'server.momentum': 0.85}
EXTRA_VARIANTS = (
  ('fedavg+fedagm', 'fedavg', 'runlocal', _FEDAGM),
  ('fedrcl+fedagm', 'fedrcl', 'runlocal', _FEDAGM),
  ('fedavg+uniform', 'fedavg', 'runlocal', {'server.weighting': 'uniform'}),
  ('fedavg+adam', 'fedavg', 'runlocal', {'server.optimizer': 'adam'}),
  ('fedau+markov', 'fedau', 'runlocal,pattern=markov', {}),
  ('pmfl+cyclic', 'pmfl', 'runlocal,pattern=cyclic', {}),
)


def _digest(array) -> str:
  array = np.ascontiguousarray(np.asarray(array))
  header = f'{array.dtype.str}{array.shape}'.encode()
  return hashlib.sha256(header + array.tobytes()).hexdigest()[:16]


def _is_timing(key: str) -> bool:
  return key.endswith(('seconds', '_s', 'per_second')) or 'time' in key


def fingerprint(config) -> dict:
  """``{leaf path: digest}`` of the final variables, and the history's."""
  from fedjax_metric import experiment, metrics_log

  with tempfile.TemporaryDirectory() as workdir:
    trained = experiment.train(config, workdir)
    history = metrics_log.read_metrics(os.path.join(workdir, 'metrics.jsonl'))
  leaves = {
    jax.tree_util.keystr(path): _digest(leaf)
    for path, leaf in jax.tree_util.tree_flatten_with_path(trained.variables)[0]
  }
  # Timings and throughputs change from run to run; the rest must not.
  numbers = [
    [key, value]
    for record in history
    for key, value in sorted(record.items())
    if isinstance(value, (int, float)) and not _is_timing(key)
  ]
  leaves['metrics_history'] = hashlib.sha256(
    json.dumps(numbers, sort_keys=True).encode()
  ).hexdigest()[:16]
  return leaves


def _variants():
  names = sorted(
    f[:-3]
    for f in os.listdir('configs')
    if f.endswith('.py') and f != '__init__.py'
  )
  variants = [(name, name, 'runlocal', {}) for name in names]
  if _EXTRA.value:
    variants += list(EXTRA_VARIANTS)
  if _CONFIGS.value:  # Configs by name, or the variants' labels.
    variants = [
      v
      for v in variants
      if v[0] in _CONFIGS.value or (v[1] in _CONFIGS.value and _EXTRA.value)
    ]
  return variants


def main(argv):
  del argv
  import fedjax_metric as fm

  results = {}
  if os.path.exists(_OUT.value):  # Resume: keep the runs already done.
    with open(_OUT.value) as f:
      results = json.load(f)
  for label, name, arg, fields in _variants():
    if label in results:
      continue
    config = fm.get_config(f'configs/{name}.py', arg)
    for path, value in fields.items():
      *parents, field = path.split('.')
      block = config
      for parent in parents:
        block = block[parent]
      block[field] = value
    results[label] = fingerprint(config)
    print(f'{label}: {len(results[label])} leaves', flush=True)
    with open(_OUT.value, 'w') as f:
      json.dump(results, f, indent=1, sort_keys=True)
  if not _COMPARE.value:
    return
  with open(_COMPARE.value) as f:
    before = json.load(f)
  changed = 0
  for label, leaves in results.items():
    if label not in before:
      changed += 1  # Nothing to compare with is not a pass.
      print(f'{label}: not in {_COMPARE.value}')
      continue
    differ = sorted(
      k
      for k in set(leaves) | set(before[label])
      if leaves.get(k) != before[label].get(k) and k not in _IGNORE.value
    )
    if differ:
      changed += 1
      print(f'{label}: {len(differ)} leaves differ: {differ[:5]}')
  print(f'{len(results) - changed} of {len(results)} runs bit-identical.')
  sys.exit(1 if changed else 0)


if __name__ == '__main__':
  app.run(main)
