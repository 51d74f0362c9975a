"""The commands' command lines as a newcomer meets them: ``--help`` shows the
command's usage and its own flags (exit 0), a flag given twice is refused in
one line, and the README's and the Makefile's first commands do what they
say."""

import os
import re
import shutil
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run(*args, timeout=300):
  return subprocess.run(
    [sys.executable, *args],
    cwd=ROOT,
    capture_output=True,
    text=True,
    timeout=timeout,
  )


# (command, a line of its docstring's usage, flags of its own)
COMMANDS = [
  (
    ['-m', 'launch.console'],  # fedjax-metric
    'fedjax-metric --config=fedquad:runlocal',
    ['--config', '--workdir', '--[no]distributed', '--[no]verbose'],
  ),
  (
    ['-m', 'launch.console', 'reproduce'],
    'fedjax-metric reproduce fedrcl table1',
    ['--seeds', '--scale', '--[no]table_only', '--[no]verbose'],
  ),
  (
    ['-m', 'launch.console', 'scale'],
    'fedjax-metric scale --out=runs/scale',
    ['--out', '--populations', '--cohorts', '--[no]dry_run'],
  ),
  (
    ['-m', 'launch.main'],
    'python -m launch.main --config=configs/fedavg.py',
    ['--config', '--workdir', '--[no]verbose'],
  ),
  (
    ['-m', 'launch.sweep'],
    'python -m launch.sweep run --root=runs/sweeps/demo',
    ['--grid', '--set', '--root', '--[no]verbose'],
  ),
  (
    ['-m', 'launch.evaluate'],
    'python -m launch.evaluate --workdir=runs/ssl/ssd_silo',
    ['--workdir', '--round', '--out_dir', '--[no]verbose'],
  ),
]
# Flags of absl and orbax that --helpfull lists and --help must not.
NOT_OURS = [
  '--[no]logtostderr',
  '--[no]only_check_args',
  'experimental_orbax',
  'absl.app:',
  '--flagfile',
]


@pytest.mark.parametrize('command, usage, own', COMMANDS)
@pytest.mark.parametrize('ask', ['--help', '-h'])
def test_help_shows_the_commands_usage_and_own_flags(command, usage, own, ask):
  result = run(*command, ask)
  assert result.returncode == 0, result.stdout + result.stderr
  assert usage in result.stdout
  for flag in own:
    assert f'  {flag}' in result.stdout, (flag, result.stdout)
  for other in NOT_OURS:
    assert other not in result.stdout, (other, result.stdout)
  assert result.stderr == ''


def test_the_console_help_names_the_subcommands():
  result = run('-m', 'launch.console', '--help')
  assert 'fedjax-metric reproduce --help' in result.stdout
  assert 'fedjax-metric scale --help' in result.stdout


@pytest.mark.parametrize(
  'args, flag',
  [
    (['-m', 'launch.main', '--workdir=a', '--workdir=b'], '--workdir'),
    (
      [
        '-m',
        'launch.main',
        '--config=configs/fedavg.py:runlocal',
        '--config.seed=1',
        '--workdir=a',
        '--config.seed=2',
      ],
      '--config.seed',
    ),
    (['-m', 'launch.console', '--workdir=a', '--workdir', 'b'], '--workdir'),
    (
      ['-m', 'launch.sweep', 'run', '--grid=seed=0', '--grid=seed=1'],
      '--grid',
    ),
    (['-m', 'launch.sweep', 'table', '--at=best', '-at=final'], '--at'),
    (['-m', 'launch.evaluate', '--workdir=a', '--workdir=b'], '--workdir'),
    (
      ['-m', 'launch.evaluate', '--workdir=a', '--evaluate', '--noevaluate'],
      '--evaluate',
    ),
    (
      [
        '-m',
        'launch.console',
        'reproduce',
        'fedrcl',
        'table1',
        '--seeds=1',
        '--seeds=2',
      ],
      '--seeds',
    ),
    (['-m', 'launch.reproduce', '--list', '--list'], '--list'),
    (['-m', 'launch.console', 'scale', '--out=a', '--out=b'], '--out'),
  ],
)
def test_a_flag_given_twice_is_one_line_naming_it(args, flag):
  result = run(*args)
  assert result.returncode == 1, result.stdout + result.stderr
  lines = result.stderr.strip().splitlines()
  assert len(lines) == 1 and lines[0].startswith('error: '), result.stderr
  assert f'{flag} is given twice' in lines[0]


def test_repeatable_flags_may_repeat():
  """--config of launch.sweep and --set of launch.evaluate are lists."""
  result = run(
    '-m',
    'launch.sweep',
    'run',
    '--root=/nonexistent/r',
    '--config=configs/fedavg.py:runlocal',
    '--config=configs/fedprox.py:runlocal',
    '--dry_run',
  )
  assert result.returncode == 0, result.stderr
  assert len(result.stdout.strip().splitlines()) == 2


def test_the_readme_config_file_example_fits_a_copy_of_fedavg(tmp_path):
  """README: `fedjax-metric --config=my_config.py:<arg>`, my_config.py a
  copy of configs/fedavg.py (the config a newcomer copies)."""
  from fedjax_metric import api

  with open(os.path.join(ROOT, 'README.md')) as f:
    readme = f.read()
  [arg] = re.findall(r'--config=my_config\.py:(\S+)', readme)
  assert 'copy of configs/fedavg.py' in readme
  copy = tmp_path / 'my_config.py'
  shutil.copy(os.path.join(ROOT, 'configs', 'fedavg.py'), copy)
  config = api.get_config(str(copy), arg)
  assert config.algorithm == 'fedavg'


def test_make_demo_installs_the_package_alone():
  """`make demo` installs no test stack, and not in editable mode (whose
  install makes setuptools print a 10-line note: configs/ and launch/ map
  into the package, so it installs an import hook)."""
  if shutil.which('make') is None:
    pytest.skip('no make')
  result = subprocess.run(
    ['make', '-n', '-B', 'demo'],
    cwd=ROOT,
    capture_output=True,
    text=True,
    check=True,
  )
  installs = [
    line for line in result.stdout.splitlines() if 'pip install' in line
  ]
  package = [line for line in installs if 'upgrade pip' not in line]
  assert package, result.stdout
  for line in package:
    assert '[test]' not in line and ' -e ' not in line, line
  assert 'launch.main --config=configs/fedavg.py' in result.stdout
