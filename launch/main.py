r"""Runs one experiment: a config file, overrides, and a workdir.

  python -m launch.main --config=configs/fedavg.py --workdir=runs/fedavg \
      --config.dataset.name=fashion_mnist --config.num_rounds=20

Running the same command again resumes from the workdir's last checkpoint.
Multi-process runs (one process per host): pass --coordinator_address,
--num_processes and --process_id (jax.distributed.initialize).
"""

from absl import app
from absl import flags
from absl import logging
import jax
from ml_collections import config_flags

from fedjax_metric import train

_CONFIG = config_flags.DEFINE_config_file(
    'config', None, 'Path to a config file, e.g. configs/fedavg.py[:runlocal].',
    lock_config=True)
_WORKDIR = flags.DEFINE_string('workdir', None, 'Output directory.')
_COORDINATOR = flags.DEFINE_string(
    'coordinator_address', None, 'host:port of process 0 (multi-process).')
_NUM_PROCESSES = flags.DEFINE_integer('num_processes', None, 'Processes.')
_PROCESS_ID = flags.DEFINE_integer('process_id', None, 'This process.')
flags.mark_flags_as_required(['config', 'workdir'])


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f'Unexpected arguments: {argv[1:]}')
  if _COORDINATOR.value:
    jax.distributed.initialize(_COORDINATOR.value, _NUM_PROCESSES.value,
                               _PROCESS_ID.value)
  if not flags.FLAGS['verbosity'].present:
    # orbax logs every checkpoint step at INFO; --verbosity=0 brings it back.
    logging.set_verbosity(logging.WARNING)
  summary = train.run(_CONFIG.value, _WORKDIR.value)
  print(f"test_accuracy={summary.get('test_accuracy', float('nan')):.4f} "
        f"after {summary['rounds_completed']} rounds; "
        f'workdir: {_WORKDIR.value}')


if __name__ == '__main__':
  app.run(main)
