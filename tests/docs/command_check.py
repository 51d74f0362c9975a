"""Parses documented command lines of one module without running them.

``python tests/docs/command_check.py MODULE`` reads a JSON list of argument
lists (what follows ``python -m MODULE``) on stdin and prints a JSON list
with, for each, ``None`` or the error that command would stop with. The
module runs as ``__main__`` with `absl.app.run` replaced, so its flags are
defined exactly as on the command line and nothing else happens. Then
each argument list is parsed by the module's own flags parser, and:

* ``launch.main``: the config (file, ``:arg`` and ``--config.*``
  overrides) must pass `validation.validate`, as `experiment.run` checks it;
* ``launch.sweep run``: every point's config (each ``--config`` with the
  ``--set`` and ``--grid`` overrides) must pass `validation.validate`;
* ``benchmarks.rounds_bench``: every ``--cases`` name must be a case.

Whether the datasets are on this machine is not checked. Each command is
checked in a forked child (`in_a_child`).

Used by tests/docs/test_doc_commands.py; one process per module, because
the modules define flags of the same names.
"""

import importlib
import json
import os
import runpy
import sys
from unittest import mock

from absl import app, flags


def load(module):
  """The module's globals and the ``(main, flags_parser)`` it would run."""
  captured = {}

  def fake_run(main, argv=None, flags_parser=None):
    del argv
    captured.update(main=main, flags_parser=flags_parser)

  with mock.patch.object(app, 'run', fake_run):
    namespace = runpy.run_module(module, run_name='__main__')
  return namespace, captured.get('flags_parser')


def check(module, namespace, parser, args):
  from fedjax_metric import overrides, validation  # pylint: disable=g-import-not-at-top
  from fedjax_metric.data import sources  # pylint: disable=g-import-not-at-top

  # Whether this machine holds the datasets is not the documents' concern.
  sources.check_available = lambda *args, **kwargs: None

  argv = [module] + list(args)
  sys.argv = argv  # ml_collections reads --config.* overrides from sys.argv.
  try:
    rest = parser(argv) if parser else flags.FLAGS(argv)
  except SystemExit as e:  # The module's parser reports and exits.
    return f'exit {e.code}'
  except flags.Error as e:
    return f'{type(e).__name__}: {e}'
  try:
    if module == 'launch.main':
      validation.validate(flags.FLAGS.config)
    elif module == 'launch.sweep' and rest[1:2] == ['run']:
      points = namespace['make_points'](
        'root',
        flags.FLAGS.config,
        overrides.assignments(flags.FLAGS.set),
        overrides.parse_assignments(flags.FLAGS.grid),
      )
      for point in points:
        validation.validate(namespace['resolve'](point.spec, point.overrides))
    elif module == 'benchmarks.rounds_bench':
      unknown = set(flags.FLAGS.cases or ()) - set(namespace['CASES'])
      if unknown:
        return f'unknown cases {sorted(unknown)}'
  except Exception as e:  # pylint: disable=broad-except
    return f'{type(e).__name__}: {e}'
  return None


def in_a_child(function, *args):
  """``function(*args)`` in a forked copy of this process: parsing sets
  flags for good (ml_collections registers a config's ``--config.*`` fields
  when it parses ``--config``), so each command starts from the state the
  module left at import."""
  read, write = os.pipe()
  pid = os.fork()
  if pid == 0:  # The child.
    os.close(read)
    try:
      result = function(*args)
    except BaseException as e:  # pylint: disable=broad-except
      result = f'{type(e).__name__}: {e}'
    with os.fdopen(write, 'w') as f:
      json.dump(result, f)
    os._exit(0)  # pylint: disable=protected-access
  os.close(write)
  with os.fdopen(read) as f:
    text = f.read()
  os.waitpid(pid, 0)
  return json.loads(text) if text else 'the check crashed'


def main():
  module = sys.argv[1]
  commands = json.load(sys.stdin)
  namespace, parser = load(module)
  importlib.import_module('fedjax_metric.validation')  # Once, not per child.

  verdicts = [
    in_a_child(check, module, namespace, parser, args) for args in commands
  ]
  print(json.dumps(verdicts))


if __name__ == '__main__':
  main()
