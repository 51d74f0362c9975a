r"""Re-evaluates a saved run without training, and exports its global model.

Loads ``config.json`` of a finished or partial run, restores its latest
checkpoint (or ``--round=N``, the checkpoint saved after N rounds), and runs
the config's evaluation protocol in full: the metrics evaluated every round
and those of the end of a run (classification: test accuracy and the
representation metrics; 'one_class': AUROC; 'ssl': kNN monitor, linear
probe, fine-tuning on 1% / 10% of the labels, uniformity and effective rank,
evaluation/ssl.py). Prints the metrics and writes them to
``<workdir>/eval.json`` (``eval_<N>.json`` with --round; with --set, a
file of those overrides' own, ``eval[_<N>]_set-<hash>.json``, which
records them under ``overrides``).

It also exports the global model in plain formats, so that it can be loaded
outside the simulator, to ``<workdir>/export/round_<N>/``:

  * ``variables.msgpack``: the global variables (``params`` and, with
    BatchNorm, ``batch_stats``), ``flax.serialization.to_bytes``;
  * ``variables.npz``: the same arrays, one per '/'-joined path;
  * ``model.json``: the model's config block (``name`` + constructor fields),
    ``num_classes``, ``input_shape`` [H, W, C], and the input scaling the
    model was evaluated with (``x = (uint8 / 255 - mean) / std``).

`load_export` reads them back into a (model, variables, preprocess) triple.

  python -m launch.evaluate --workdir=runs/ssl/ssd_silo
  python -m launch.evaluate --workdir=runs/ssl/ssd_silo --round=20 \
      --set=ssl_eval.linear_epochs=50 --set=ssl_eval.finetune_epochs=20
  python -m launch.evaluate --workdir=runs/ssl/ssd_silo --noevaluate  # export

``--set=a.b=value`` overrides a config field for the evaluation only (the
value takes the field's type, as launch.sweep's --set: a tuple is a Python
literal, e.g. ``(0.01,)``; fedjax_metric/overrides.py).
"""

import hashlib
import json
import os
import sys
import time

from absl import app, flags, logging
import flax.serialization
import jax
import ml_collections
import numpy as np

from fedjax_metric import assemble, config_io, executors
from fedjax_metric import restore as restore_lib
from fedjax_metric.data import augment
from fedjax_metric.evaluation import protocols

from . import cli


def _flat_arrays(tree, prefix=''):
  """``{'a/b/c': np.ndarray}`` of a nested dict of arrays."""
  out = {}
  for key, value in tree.items():
    name = f'{prefix}{key}'
    if isinstance(value, dict):
      out.update(_flat_arrays(value, name + '/'))
    else:
      out[name] = np.asarray(value)
  return out


def _unflatten(flat):
  tree = {}
  for name, value in flat.items():
    *parents, leaf = name.split('/')
    node = tree
    for part in parents:
      node = node.setdefault(part, {})
    node[leaf] = value
  return tree


def export(
  directory, variables, config, *, num_classes, input_shape, mean, std, round_
):
  """Writes the global model as variables.msgpack, variables.npz, model.json.

  Args:
    directory: created if missing.
    variables: the global variables (``{'params': ..., 'batch_stats': ...}``).
    config: the run's config (its ``model`` block and identity are saved).
    num_classes, input_shape: what `assemble.build_model` needs to rebuild it.
    mean, std: [C] input scaling, ``x = (uint8 / 255 - mean) / std``.
    round_: the rounds of training behind these variables.

  Returns:
    ``directory``.
  """
  os.makedirs(directory, exist_ok=True)
  host = jax.tree.map(np.asarray, jax.device_get(dict(variables)))
  host = flax.serialization.to_state_dict(host)
  with open(os.path.join(directory, 'variables.msgpack'), 'wb') as f:
    f.write(flax.serialization.to_bytes(host))
  np.savez(os.path.join(directory, 'variables.npz'), **_flat_arrays(host))
  description = {
    'model': config.model.to_dict(),
    'num_classes': int(num_classes),
    'input_shape': [int(x) for x in input_shape],
    'input_mean': [float(x) for x in np.ravel(mean)],
    'input_std': [float(x) for x in np.ravel(std)],
    'precision': config.precision,
    'algorithm': config.algorithm,
    'dataset': config.dataset.name,
    'round': int(round_),
    'seed': int(config.seed),
  }
  with open(os.path.join(directory, 'model.json'), 'w') as f:
    json.dump(description, f, indent=2, sort_keys=True)
  return directory


def load_export(directory, *, npz=False):
  """Loads an `export` back: ``(model, variables, preprocess, description)``.

  ``model`` is the rebuilt `fedjax_metric.models.ModelFns` (apply with
  ``model.apply(variables['params'], {k: v for k != 'params'}, x,
  train=False)``), ``preprocess`` maps uint8 images [B, H, W, C] to the
  model's input, ``description`` is model.json. Reads variables.npz when
  ``npz`` is True, else variables.msgpack.
  """
  with open(os.path.join(directory, 'model.json')) as f:
    description = json.load(f)
  model = assemble.build_model(
    ml_collections.ConfigDict(description['model']),
    description['num_classes'],
    tuple(description['input_shape']),
    description.get('precision', 'default'),
  )
  if npz:
    with np.load(os.path.join(directory, 'variables.npz')) as arrays:
      variables = _unflatten({k: arrays[k] for k in arrays.files})
  else:
    with open(os.path.join(directory, 'variables.msgpack'), 'rb') as f:
      variables = flax.serialization.msgpack_restore(f.read())
  preprocess = augment.make_preprocess(
    description['input_mean'], description['input_std'], 'none'
  )
  return model, variables, preprocess, description


def evaluate(
  workdir,
  *,
  round_=None,
  overrides=(),
  write=True,
  run_evaluation=True,
  export_model=True,
  out_dir=None,
):
  """Re-evaluates checkpoint ``round_`` (default the latest) and exports it.

  ``out_dir`` (default ``workdir``) receives eval.json and export/; it is
  checked writable before anything is computed.

  Runs the evaluator's ``every`` and ``final`` on the saved state, under
  the run's matmul precision.

  Returns:
    The metrics dict (also written to eval.json / eval_<round>.json), with
    ``export_dir`` where the model was exported.
  """
  config = config_io.load_config(overrides=overrides, workdir=workdir)
  out_dir = out_dir or workdir
  if (write and run_evaluation) or export_model:
    _check_writable(out_dir)
  with executors.matmul_precision(config.precision):
    run = restore_lib.restore(config, workdir, round_)
    metrics = {'round': run['round'], 'algorithm': config.algorithm}
    if run_evaluation:
      evaluator = protocols.make_evaluator(
        assemble.eval_settings(config),
        model=run['model'],
        preprocess=run['preprocess'],
        train=run['train'],
        test=run['test'],
        clients=run['clients'],
        validation=run['validation'],
      )
      if evaluator.reads_client_table and run['table_placement'] != 'device':
        raise ValueError(
          f"This evaluation reads every client's row, and {workdir} kept its "
          f'client table off the device ({run["table_placement"]}), where '
          "only the newest round's rows exist: the run's own metrics.jsonl "
          'holds its evaluations.'
        )
      start = time.time()
      state = (run['server_state'], run['client_table'])
      metrics.update(evaluator.every(*state))
      metrics.update(evaluator.final(*state))
      metrics['eval_wall_time'] = time.time() - start
  metrics['overrides'] = list(overrides)
  chief = jax.process_index() == 0
  if export_model and chief:
    mean, std = restore_lib.input_scaling(config, run['train'].images)
    metrics['export_dir'] = export(
      os.path.join(out_dir, 'export', f'round_{run["round"]}'),
      run['server_state'].variables,
      config,
      num_classes=run['train'].num_classes,
      input_shape=run['train'].images.shape[1:],
      mean=mean,
      std=std,
      round_=run['round'],
    )
  if write and run_evaluation and chief:
    name = eval_file_name(None if round_ is None else run['round'], overrides)
    tmp = os.path.join(out_dir, name + '.tmp')
    with open(tmp, 'w') as f:
      json.dump(metrics, f, indent=2, sort_keys=True)
    os.replace(tmp, os.path.join(out_dir, name))
  return metrics


def eval_file_name(round_, overrides) -> str:
  """``eval[_<round>][_set-<hash>].json``: an evaluation under other
  ``--set`` overrides gets a file of its own (the hash of the overrides, in
  order), so it never replaces one made under other settings."""
  name = 'eval' if round_ is None else f'eval_{round_}'
  if overrides:
    digest = hashlib.sha1('\n'.join(overrides).encode()).hexdigest()[:8]
    name += f'_set-{digest}'
  return name + '.json'


def _check_writable(directory):
  """Fails before the evaluation, not after it, on a directory the results
  cannot be written to."""
  try:
    os.makedirs(directory, exist_ok=True)
  except OSError as e:
    raise PermissionError(
      f'cannot create {directory} ({e.strerror}); pass --out_dir=DIR.'
    ) from e
  if not os.access(directory, os.W_OK):
    raise PermissionError(
      f'{directory} is not writable; pass --out_dir=DIR for eval.json and '
      'export/.'
    )


def define_flags():
  """The command line, defined only when this file runs as a script.

  Importing the module (the tests) then registers no absl flags, which would
  clash with launch.main's (``--workdir``) in the same process.
  """
  flags.DEFINE_string('workdir', None, "A run's workdir.")
  flags.DEFINE_integer(
    'round',
    None,
    'Checkpoint to load: the one saved '
    'after this many rounds; default the latest.',
  )
  flags.DEFINE_multi_string(
    'set', [], 'Config override for the evaluation, key.path=value.'
  )
  flags.DEFINE_boolean(
    'evaluate', True, 'Run the evaluation protocol (--noevaluate: export only).'
  )
  flags.DEFINE_boolean(
    'export', True, 'Export the global model to <workdir>/export/round_<N>/.'
  )
  flags.DEFINE_string(
    'out_dir',
    None,
    'Where eval.json and export/ go (default: the workdir; for a workdir '
    'you cannot write to).',
  )
  cli.define_verbose()
  flags.mark_flags_as_required(['workdir'])


@cli.one_line_errors
def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f'unexpected arguments {" ".join(argv[1:])}')
  f = flags.FLAGS
  if not f['verbosity'].present:
    logging.set_verbosity(logging.WARNING)
  metrics = evaluate(
    f.workdir,
    round_=f['round'].value,
    overrides=f.set,
    run_evaluation=f.evaluate,
    export_model=f.export,
    out_dir=f.out_dir,
  )
  for name in sorted(metrics):
    print(f'{name}: {metrics[name]}')


if __name__ == '__main__':
  define_flags()
  app.run(main, flags_parser=cli.flags_parser(sys.modules[__name__]))
