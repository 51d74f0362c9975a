r"""Runs one experiment: a config, overrides, and a workdir.

  python -m launch.main --config=configs/fedavg.py --workdir=runs/fedavg \
      --config.dataset.name=fashion_mnist --config.num_rounds=20
  fedjax-metric --config=fedquad:runlocal --workdir=runs/x   # installed

``--config`` takes a config file's path or a packaged config's name
(``fedquad``, the file's name in configs/).

Running the same command again resumes from the workdir's last checkpoint.
SIGTERM or Ctrl-C saves a checkpoint after the round in progress and exits
with 128 + the signal number. A mistake in the command (a bad value, a missing
dataset, another config on a used workdir) is one line on stderr and exit
status 1; --verbose adds the traceback.
Multi-process runs (one process per host, one shared workdir): pass
--coordinator_address, --num_processes and --process_id to every process, or
--distributed to let JAX detect them (SLURM, Open MPI, Cloud TPU). See
docs/multihost.md.
"""

import functools
import signal
import sys

from absl import app, flags, logging
import jax
import ml_collections
from ml_collections import config_flags

from fedjax_metric import config_io, experiment, overrides

from . import cli

_CONFIG = config_flags.DEFINE_config_file(
  'config',
  None,
  'A packaged config by name, e.g. fedavg[:runlocal], or a config file, '
  'e.g. configs/fedavg.py[:runlocal].',
  lock_config=True,
)
_WORKDIR = flags.DEFINE_string('workdir', None, 'Output directory.')
_COORDINATOR = flags.DEFINE_string(
  'coordinator_address',
  None,
  'host:port of process 0 (multi-process; with --num_processes and '
  '--process_id).',
)
_NUM_PROCESSES = flags.DEFINE_integer(
  'num_processes', None, 'Processes in a multi-process run.'
)
_PROCESS_ID = flags.DEFINE_integer(
  'process_id', None, 'This process, in [0, num_processes).'
)
_DISTRIBUTED = flags.DEFINE_bool(
  'distributed',
  False,
  'Multi-process run with the parameters JAX detects (SLURM, Open MPI, '
  'Cloud TPU, JAX_COORDINATOR_ADDRESS); implied by the three flags above.',
)
_CPU_COLLECTIVES = flags.DEFINE_enum(
  'cpu_collectives',
  'gloo',
  ['gloo', 'mpi'],
  'Cross-process collectives of the CPU backend in multi-process runs.',
)
cli.define_verbose()
flags.mark_flags_as_required(['config', 'workdir'])


def config_names_to_files(argv):
  """``--config=fedquad:runlocal`` -> the packaged file's path; a path
  (``configs/fedquad.py:runlocal``, ``my_config.py``) is kept as it is."""
  resolved = []
  items = iter(argv)
  for item in items:
    if item == '--config':  # The two-word form: --config fedavg.
      item = f'--config={next(items, "")}'
    if item.startswith('--config='):
      name, sep, arg = item[len('--config=') :].partition(':')
      path = config_io.config_file(name)
      config_io.check_python_file(path)
      item = f'--config={path}{sep}{arg}'
    resolved.append(item)
  return resolved


def override_error(argv, error) -> str:
  """One line for a ``--config.a.b=value`` that does not fit the config.

  ml_collections reports a mistyped field as a chain of KeyError /
  AttributeError and a field under a value (``local.optimizer.lr``) as a
  TypeError; this names the override, the block it missed and the closest
  field there. Other parse errors keep their own message.
  """
  config_arg = next((a for a in argv if a.startswith('--config=')), None)
  if config_arg is None:
    return cli.flag_error(error)
  try:
    config = config_io.load_config(config_arg[len('--config=') :])
  except Exception:  # pylint: disable=broad-except
    return cli.flag_error(error)  # The config itself fails: its own message.
  for item in argv:
    if not item.startswith('--config.'):
      continue
    key = item[len('--config.') :].split('=', 1)[0]
    try:
      overrides.find_field(config, key)
    except overrides.FieldError as e:
      block = e.block or 'the config'
      if e.is_value:
        return (
          f'--config.{key}: {block} is a value ({e.value!r}), not a block '
          'of fields.'
        )
      hint = f'; did you mean {e.close!r}?' if e.close else '.'
      return f'--config.{key}: {block} has no field {e.name!r}{hint}'
  return cli.flag_error(error)


# What `fedjax-metric --help` adds to this module's help.
SUBCOMMANDS = """Other commands of fedjax-metric:
  fedjax-metric reproduce --help   # one paper table: its sweep, then the table
  fedjax-metric scale --help       # the population-scale study"""


def parse_flags(argv, epilog=''):
  """absl's parsing, with its errors as one line (and exit status 1);
  --help and a flag given twice first (`cli.check_command_line`)."""
  cli.check_command_line(argv, sys.modules[__name__], epilog)
  try:
    argv = config_names_to_files(argv)
  except ValueError as e:
    sys.exit(f'error: {cli.one_line(e)}')
  try:
    return flags.FLAGS(argv)
  except (flags.Error, AttributeError, KeyError, TypeError, ValueError) as e:
    if '--verbose' in argv:
      raise
    sys.exit(f'error: {override_error(argv, e)}')


def distributed_args(coordinator_address, num_processes, process_id):
  """`jax.distributed.initialize` arguments from the flags; None: not given.

  Checked here because a mistake otherwise shows up as a hang: processes
  waiting for a peer that will never connect.
  """
  given = [
    v is not None for v in (coordinator_address, num_processes, process_id)
  ]
  if not any(given):
    return None
  if not all(given):
    raise app.UsageError(
      '--coordinator_address, --num_processes and --process_id go together: '
      'pass all three, or none (one process, or --distributed).'
    )
  host, _, port = coordinator_address.rpartition(':')
  if not host or not port.isdigit():
    raise app.UsageError(
      f'--coordinator_address={coordinator_address!r} is not host:port.'
    )
  if num_processes < 1:
    raise app.UsageError(f'--num_processes={num_processes} must be >= 1.')
  if not 0 <= process_id < num_processes:
    raise app.UsageError(
      f'--process_id={process_id} must be in [0, {num_processes}).'
    )
  return dict(
    coordinator_address=coordinator_address,
    num_processes=num_processes,
    process_id=process_id,
  )


@cli.one_line_errors
def main(argv):
  if len(argv) > 1:
    sys.exit(
      f'error: unexpected argument(s) {" ".join(argv[1:])}; every option is '
      '--name=value (--helpfull lists them).'
    )
  if not flags.FLAGS['verbosity'].present:
    # orbax logs every checkpoint step at INFO; --verbosity=0 brings it back.
    logging.set_verbosity(logging.WARNING)
  kwargs = distributed_args(
    _COORDINATOR.value, _NUM_PROCESSES.value, _PROCESS_ID.value
  )
  if kwargs is not None or _DISTRIBUTED.value:
    # Before anything starts the backend: the CPU client takes its collectives
    # when it is created, and initialize() must come first anyway.
    jax.config.update(
      'jax_cpu_collectives_implementation', _CPU_COLLECTIVES.value
    )
    jax.distributed.initialize(**(kwargs or {}))
  config = _CONFIG.value
  if not isinstance(config, ml_collections.ConfigDict) and not cli.verbose():
    try:
      config.keys()  # A config file that failed to load raises its error.
    except OSError as e:
      cause = str(e.__cause__ or e).strip().splitlines()[-1].strip()
      sys.exit(f'error: cannot load --config: {cause}')
  try:
    summary = experiment.run(config, _WORKDIR.value)
  except KeyboardInterrupt:
    # A second Ctrl-C: the round in progress was not finished.
    if cli.verbose():
      raise
    print(
      f'Interrupted; the last checkpoint in {_WORKDIR.value} is kept. '
      'Run the same command again to resume.',
      file=sys.stderr,
    )
    sys.exit(128 + signal.SIGINT)
  except cli.user_errors() as e:
    if cli.verbose():
      raise
    sys.exit(f'error: {cli.one_line(e)}')
  if 'stopped_by' in summary:  # SIGTERM / SIGINT: a checkpoint was saved.
    sys.exit(128 + signal.Signals[summary['stopped_by']])
  if jax.process_index() == 0:
    # The evaluation protocol's headline metric: test_accuracy, auroc_mean...
    headline = summary.get('headline', 'test_accuracy')
    print(
      f'{headline}={summary.get(headline, float("nan")):.4f} '
      f'after {summary["rounds_completed"]} rounds; '
      f'workdir: {_WORKDIR.value}'
    )


def run_main(epilog=''):
  """The ``fedjax-metric`` console command (``epilog``: after its --help)."""
  app.run(main, flags_parser=functools.partial(parse_flags, epilog=epilog))


if __name__ == '__main__':
  run_main()
