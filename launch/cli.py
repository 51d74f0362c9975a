"""What every command in launch/ does with a user's mistake.

A bad value, a missing file, a field the config lacks or a refused workdir is
one line on stderr (``error: ...``) and exit status 1, never a traceback;
``--verbose`` keeps the traceback. Anything else is a bug and keeps its
traceback. launch.main, launch.evaluate and launch.sweep share this.
"""

import functools
import sys

from absl import app, flags


def user_errors() -> tuple:
  """Errors that come from the command (values, files, the workdir, config
  fields), reported as one line. (Imports the library lazily: launch.sweep's
  table and plot commands do not need JAX.)"""
  from fedjax_metric import faults  # pylint: disable=g-import-not-at-top

  return (
    ValueError,
    KeyError,
    OSError,
    ArithmeticError,
    MemoryError,
    ImportError,
    faults.CheckpointError,
  )


def define_verbose():
  """--verbose, for commands that define their flags when they run."""
  flags.DEFINE_bool(
    'verbose', False, 'On an error, print the full traceback too.'
  )


def one_line(message) -> str:
  """``message`` on one line, without the traceback ml_collections puts in
  a config file's error (its last line is the error itself) and without the
  quotes ``str(KeyError)`` adds."""
  if isinstance(message, KeyError) and message.args:
    message = message.args[0]
  text = str(message)
  marker = ': Error whilst parsing config file'
  if marker in text:
    head = text.split(marker, 1)[0].replace('flag ', '', 1)
    error = [line.strip() for line in text.splitlines() if line.strip()][-1]
    text = f'{head}: {error.split(": ", 1)[-1]}'
  return ' '.join(text.split())


def verbose() -> bool:
  return 'verbose' in flags.FLAGS and bool(flags.FLAGS.verbose)


def one_line_errors(main):
  """Wraps an absl ``main``: user errors and usage errors become one line."""

  @functools.wraps(main)
  def wrapped(argv):
    try:
      return main(argv)
    except app.UsageError as e:
      if verbose():
        raise
      sys.exit(f'error: {one_line(e)} (--helpfull lists the flags)')
    except Exception as e:  # pylint: disable=broad-except
      if verbose() or not isinstance(e, user_errors()):
        raise
      sys.exit(f'error: {one_line(e)}')

  return wrapped
