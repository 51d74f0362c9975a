"""What every command in launch/ does with a user's mistake, and its --help.

A bad value, a missing file, a field the config lacks or a refused workdir is
one line on stderr (``error: ...``) and exit status 1, never a traceback;
``--verbose`` keeps the traceback. Anything else is a bug and keeps its
traceback. launch.main, launch.evaluate and launch.sweep share this.

Before absl parses a command line (`check_command_line`, in every command's
flags parser): ``--help`` (``-h``, ``-?``, ``--helpshort``) prints the
command's module docstring and its own flags, not absl's or orbax's
(``--helpfull`` still lists every flag), and exits 0; a flag given twice
(``--workdir=a --workdir=b``, ``--config.seed=1 --config.seed=2``) is refused
instead of absl's silent last-one-wins, except flags that are lists by
design (absl's multi flags: launch.sweep's --config, launch.evaluate's --set).
"""

import functools
import re
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
      sys.exit(f'error: {one_line(e)} (--help lists the flags)')
    except Exception as e:  # pylint: disable=broad-except
      if verbose() or not isinstance(e, user_errors()):
        raise
      sys.exit(f'error: {one_line(e)}')

  return wrapped


HELP_ARGS = ('--help', '-help', '--helpshort', '-helpshort', '-h', '-?')
# absl's own flags that may repeat (each --flagfile adds its file's flags).
_REPEATABLE = ('flagfile',)
_NAME = re.compile(r'[A-Za-z_][\w.-]*$')


def _flag_help(flag) -> str:
  """One flag as absl's --helpfull shows it: name, help, default."""
  name = f'--[no]{flag.name}' if flag.boolean else f'--{flag.name}'
  text = flags.text_wrap(
    f'{name}: {flag.help or ""}'.rstrip(), indent='    ', firstline_indent='  '
  )
  if flag.default_as_str:
    text += '\n' + flags.text_wrap(
      f'(default: {flag.default_as_str})', indent='    '
    )
  syntax = getattr(flag.parser, 'syntactic_help', '')
  if syntax:
    text += '\n' + flags.text_wrap(f'({syntax})', indent='    ')
  return text


def help_text(module, epilog: str = '') -> str:
  """``module``'s docstring (the command's usage) and the flags that module
  defines (with --verbose), sorted by name; ``epilog`` after them."""
  own = {
    flag.name: flag
    for source in (module, sys.modules[__name__])
    for flag in flags.FLAGS.get_flags_for_module(source)
  }
  lines = [(module.__doc__ or '').strip(), '', 'flags:']
  lines += [_flag_help(own[name]) for name in sorted(own)]
  lines += [
    '',
    '--helpfull lists every flag, also those of absl and of the libraries.',
  ]
  if epilog:
    lines += ['', epilog.strip()]
  return '\n'.join(lines).lstrip('\n')


def _flag_name(arg: str):
  """The flag an argument sets (``--noevaluate`` -> 'evaluate'), or None
  for a positional argument or a value."""
  if not arg.startswith('-') or arg in ('-', '--'):
    return None
  name = arg.lstrip('-').split('=', 1)[0]
  if not _NAME.match(name):
    return None  # A negative number: a value.
  if name not in flags.FLAGS and name.startswith('no'):
    plain = name[2:]
    if plain in flags.FLAGS and flags.FLAGS[plain].boolean:
      return plain
    if plain.startswith('config.'):  # --noconfig.progress, ml_collections.
      return plain
  return name


def repeated_flag(argv):
  """The first flag that ``argv`` sets twice, ``(name, [its arguments])``,
  or None. absl's multi flags (lists) may repeat."""
  seen = {}
  for arg in argv[1:]:
    if arg == '--':
      break
    name = _flag_name(arg)
    if name is None or name in _REPEATABLE:
      continue
    if name in flags.FLAGS and isinstance(flags.FLAGS[name], flags.MultiFlag):
      continue
    seen.setdefault(name, []).append(arg)
    if len(seen[name]) > 1:
      return name, seen[name]
  return None


def check_command_line(argv, module, epilog: str = ''):
  """Before absl parses ``argv``: --help prints `help_text` and exits 0; a
  flag given twice exits 1 with one line naming it."""
  args = list(argv[1:])
  if '--' in args:
    args = args[: args.index('--')]
  if any(a in HELP_ARGS for a in args):
    print(help_text(module, epilog))
    sys.exit(0)
  twice = repeated_flag(argv)
  if twice is not None:
    name, given = twice
    sys.exit(
      f'error: --{name} is given twice ({" ".join(given)}); give it once.'
    )


def flag_error(error) -> str:
  """absl's parse error as one line: a required flag left out names the flag
  and what to pass; others keep absl's message."""
  text = one_line(error)
  missing = re.search(
    r'Flag --([\w.]+) must have a value other than None', text
  )
  if missing:
    name = missing.group(1)
    what = ''
    if name in flags.FLAGS and flags.FLAGS[name].help:
      what = f': {flags.FLAGS[name].help.rstrip(".")}'
    return (
      f'--{name} is required{what} (pass --{name}=...; --help lists the flags).'
    )
  return text


def flags_parser(module, epilog: str = ''):
  """absl's ``flags_parser`` for ``app.run``: `check_command_line`, then
  absl's parsing with its errors as one line (exit status 1) instead of its
  two-line FATAL."""

  def parse(argv):
    check_command_line(argv, module, epilog)
    try:
      return flags.FLAGS(argv)
    except flags.Error as e:
      if '--verbose' in argv:
        raise
      sys.exit(f'error: {flag_error(e)}')

  return parse
