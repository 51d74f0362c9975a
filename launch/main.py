r"""Runs one experiment: a config file, overrides, and a workdir.

  python -m launch.main --config=configs/fedavg.py --workdir=runs/fedavg \
      --config.dataset.name=fashion_mnist --config.num_rounds=20

Running the same command again resumes from the workdir's last checkpoint.
Multi-process runs (one process per host, one shared workdir): pass
--coordinator_address, --num_processes and --process_id to every process, or
--distributed to let JAX detect them (SLURM, Open MPI, Cloud TPU). See
docs/multihost.md.
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
    'coordinator_address', None,
    'host:port of process 0 (multi-process; with --num_processes and '
    '--process_id).')
_NUM_PROCESSES = flags.DEFINE_integer('num_processes', None,
                                      'Processes in a multi-process run.')
_PROCESS_ID = flags.DEFINE_integer('process_id', None,
                                   'This process, in [0, num_processes).')
_DISTRIBUTED = flags.DEFINE_bool(
    'distributed', False,
    'Multi-process run with the parameters JAX detects (SLURM, Open MPI, '
    'Cloud TPU, JAX_COORDINATOR_ADDRESS); implied by the three flags above.')
_CPU_COLLECTIVES = flags.DEFINE_enum(
    'cpu_collectives', 'gloo', ['gloo', 'mpi'],
    'Cross-process collectives of the CPU backend in multi-process runs.')
flags.mark_flags_as_required(['config', 'workdir'])


def distributed_args(coordinator_address, num_processes, process_id):
  """`jax.distributed.initialize` arguments from the flags; None: not given.

  Checked here because a mistake otherwise shows up as a hang: processes
  waiting for a peer that will never connect.
  """
  given = [v is not None for v in (coordinator_address, num_processes,
                                   process_id)]
  if not any(given):
    return None
  if not all(given):
    raise app.UsageError(
        '--coordinator_address, --num_processes and --process_id go together: '
        'pass all three, or none (one process, or --distributed).')
  host, _, port = coordinator_address.rpartition(':')
  if not host or not port.isdigit():
    raise app.UsageError(f'--coordinator_address={coordinator_address!r} is '
                         'not host:port.')
  if num_processes < 1:
    raise app.UsageError(f'--num_processes={num_processes} must be >= 1.')
  if not 0 <= process_id < num_processes:
    raise app.UsageError(f'--process_id={process_id} must be in [0, '
                         f'{num_processes}).')
  return dict(coordinator_address=coordinator_address,
              num_processes=num_processes, process_id=process_id)


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f'Unexpected arguments: {argv[1:]}')
  if not flags.FLAGS['verbosity'].present:
    # orbax logs every checkpoint step at INFO; --verbosity=0 brings it back.
    logging.set_verbosity(logging.WARNING)
  kwargs = distributed_args(_COORDINATOR.value, _NUM_PROCESSES.value,
                            _PROCESS_ID.value)
  if kwargs is not None or _DISTRIBUTED.value:
    # Before anything starts the backend: the CPU client takes its collectives
    # when it is created, and initialize() must come first anyway.
    jax.config.update('jax_cpu_collectives_implementation',
                      _CPU_COLLECTIVES.value)
    jax.distributed.initialize(**(kwargs or {}))
  summary = train.run(_CONFIG.value, _WORKDIR.value)
  if jax.process_index() == 0:
    print(f"test_accuracy={summary.get('test_accuracy', float('nan')):.4f} "
          f"after {summary['rounds_completed']} rounds; "
          f'workdir: {_WORKDIR.value}')


if __name__ == '__main__':
  app.run(main)
