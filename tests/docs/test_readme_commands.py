"""Every command README.md shows, run (``make docs-check``; CI runs it).

The README's code blocks are read from the file itself, so a command edited
there is the command tested here. Each runs as the README writes it, with
the workdir moved into a temporary directory and the number of rounds cut
(``--config.num_rounds=2`` appended to a launch command; the Python block
already sets 5). What is not run, and why, is listed in NOT_RUN; a command
that is neither run nor listed fails the test, so a new README command needs
one or the other.
"""

import os
import re
import shlex
import shutil
import subprocess
import sys

import pytest

ROOT = os.path.dirname(
  os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
)
README = os.path.join(ROOT, 'README.md')
FASHION_MNIST = '/usr/share/datasets/fashion-mnist'

# Commands not run here, each with the test or target that covers it.
NOT_RUN = {
  'make demo': 'launch.main on configs/fedavg.py, as the commands below',
  'make test': 'the test suite itself (its quick tier)',
  'make test-all': 'the test suite itself; CI runs it (.ci/run)',
  'make lint': 'CI runs it (.ci/run)',
  'make crosscheck': 'its golden tests are in the suite (tests/test_golden_*.py), '
  'and so is its listing (tests/test_golden_index.py)',
  'pip install': 'tests/test_package.py installs the built wheel',
  'reproduce': 'whole paper tables; tests/test_reproduce.py plans every '
  'table, trains a tiny one end to end and runs --list and --dry_run',
  'my_config.py': "a user's own config file (tests/test_package.py runs a "
  'file config through the console command)',
}


def blocks(kind):
  """The README's ```<kind> code blocks, in order."""
  with open(README) as f:
    text = f.read()
  return re.findall(rf'^```{kind}\n(.*?)^```', text, re.S | re.M)


def shell_commands():
  """Each sh command of the README (continuation lines joined, comments cut)."""
  commands = []
  for block in blocks('sh'):
    joined = re.sub(r'\\\n\s*', ' ', block)
    for line in joined.splitlines():
      line = line.split('  #')[0].strip()
      if line:
        commands.append(line)
  return commands


def not_run_reason(command):
  return next((why for key, why in NOT_RUN.items() if key in command), None)


def runnable():
  return [c for c in shell_commands() if not_run_reason(c) is None]


def test_every_readme_command_is_run_or_accounted_for():
  commands = shell_commands()
  assert len(commands) >= 6, commands  # The parser found the README's blocks.
  for command in commands:
    if not_run_reason(command) is None:
      assert re.search(r'launch\.main|fedjax-metric', command), (
        f'README command {command!r} is neither run by this module nor '
        'listed in NOT_RUN.'
      )


@pytest.mark.parametrize('command', runnable())
def test_readme_shell_command_runs(command, tmp_path):
  argv = shlex.split(command)
  if argv[0] == '.venv/bin/python':
    argv[0] = sys.executable
  elif argv[0] == 'fedjax-metric':
    console = shutil.which('fedjax-metric') or os.path.join(
      os.path.dirname(sys.executable), 'fedjax-metric'
    )
    if not os.path.exists(console):
      pytest.skip('the console command is not installed in this environment')
    argv[0] = console
  if any('fashion_mnist' in a for a in argv) and not os.path.isdir(
    FASHION_MNIST
  ):
    pytest.skip("Debian's dataset-fashion-mnist is not installed")
  argv = [
    f'--workdir={tmp_path / "run"}' if a.startswith('--workdir=') else a
    for a in argv
  ]
  argv.append('--config.num_rounds=2')
  done = subprocess.run(
    argv, cwd=ROOT, capture_output=True, text=True, timeout=600
  )
  assert done.returncode == 0, done.stderr[-3000:]
  assert os.path.exists(tmp_path / 'run' / 'summary.json')


def test_readme_python_block_runs(tmp_path):
  (code,) = [b for b in blocks('python') if 'import fedjax_metric' in b]
  script = tmp_path / 'readme.py'
  # Its last lines are bare expressions (what a notebook would show): they
  # are still evaluated, so a wrong attribute or key fails the script.
  script.write_text(code)
  done = subprocess.run(
    [sys.executable, str(script)],
    cwd=tmp_path,
    capture_output=True,
    text=True,
    timeout=600,
  )
  assert done.returncode == 0, done.stderr[-3000:]
