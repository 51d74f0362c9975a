"""Every command docs/ and the GPU runbook show, parsed (``make docs-check``).

The results pages (docs/results/) keep the commands that produced their
tables, and benchmarks/gpu_pending.md and benchmarks/*.sh the commands a
GPU session will run with little device time to spare: a module renamed or a flag dropped since
must fail here, not there. README.md's commands are run for real by
test_readme_commands.py; these are too long to run, so each is parsed:

* the code blocks (fenced, or indented four spaces) that call
  ``python -m``, and the shell scripts, are run by bash with a PATH that
  holds only a stand-in ``python`` and ``python3`` (and ``nice``,
  ``timeout``), which
  records its arguments: shell variables
  and loops expand as they would, and nothing else can run;
* each recorded ``python -m MODULE ...`` is parsed by the module's own flag
  parser, and the configs of ``launch.main`` and ``launch.sweep run`` are
  validated (tests/docs/command_check.py); ``python -m pytest`` and ``pip``
  are not checked, a ``python path/to/script.py`` must name a file.
"""

import collections
import glob
import importlib.util
import json
import os
import re
import subprocess
import sys
import tempfile

import pytest

from benchmarks import machine

ROOT = os.path.dirname(
  os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
)
DOCUMENTS = sorted(
  glob.glob(os.path.join(ROOT, 'docs', '**', '*.md'), recursive=True)
) + [os.path.join(ROOT, 'benchmarks', 'gpu_pending.md')]
SHELL_SCRIPTS = sorted(glob.glob(os.path.join(ROOT, 'benchmarks', '*.sh')))
NOT_CHECKED = ('pytest', 'pip')  # Modules whose arguments are not ours.
RECORDER = r"""#!/bin/sh
for a in "$@"; do printf '%s\037' "$a"; done >> "$RECORD"
printf '\036' >> "$RECORD"
"""
# `nice -n 5 python ...`: drop nice's options, run the rest.
NICE = r"""#!/bin/sh
while [ "$#" -gt 0 ]; do
  case "$1" in -n) shift 2 ;; -*) shift ;; *) break ;; esac
done
exec "$@"
"""
# `timeout 300 python ...`: drop the options and the duration, run the rest.
TIMEOUT = r"""#!/bin/sh
while [ "$#" -gt 0 ]; do
  case "$1" in -k|-s) shift 2 ;; -*) shift ;; *) break ;; esac
done
shift
exec "$@"
"""


def shell_blocks(text):
  """The markdown's code blocks that call ``python -m``: fenced ones, then
  indented ones (four spaces, after a blank line) outside the fences."""
  fence = re.compile(r'^```[\w-]*\n(.*?)^```', re.S | re.M)
  blocks = fence.findall(text)
  lines, current, after_blank = fence.sub('', text).splitlines(), [], True
  for line in lines + ['']:
    if line.startswith('    ') and (current or after_blank):
      current.append(line[4:])
    elif current:
      blocks.append('\n'.join(current) + '\n')
      current = []
    after_blank = not line.strip()
  return [b for b in blocks if 'python -m' in b]


def write_stand_ins(bin_dir):
  """The only programs the documents' shell code finds on its PATH."""
  os.makedirs(bin_dir)
  for name, text in (
    ('python', RECORDER),
    # The GPU scripts call the device image's python3 ($PY).
    ('python3', RECORDER),
    ('nice', NICE),
    ('timeout', TIMEOUT),
  ):
    path = os.path.join(bin_dir, name)
    with open(path, 'w') as f:
      f.write(text)
    os.chmod(path, 0o755)


def record(block, scratch):
  """The argument lists ``python`` receives when bash runs ``block``, with
  `write_stand_ins` in ``scratch``/bin."""
  bin_dir = os.path.join(scratch, 'bin')
  log = os.path.join(scratch, 'record')
  if os.path.exists(log):
    os.remove(log)
  subprocess.run(
    ['/bin/bash', '--norc', '--noprofile', '-c', block],
    cwd=scratch,
    env={'PATH': bin_dir, 'RECORD': log, 'OUT': os.path.join(scratch, 'out')},
    capture_output=True,
    check=False,
  )
  if not os.path.exists(log):
    return []
  with open(log) as f:
    calls = f.read().split('\x1e')[:-1]
  return [call.split('\x1f')[:-1] for call in calls]


def documented_commands():
  """{module: [(document, argument list), ...]} and the script calls, from
  the documents' code blocks and from the shell scripts (whole)."""
  modules, scripts = collections.defaultdict(list), []
  with tempfile.TemporaryDirectory() as scratch:
    write_stand_ins(os.path.join(scratch, 'bin'))
    for path in DOCUMENTS + SHELL_SCRIPTS:
      with open(path) as f:
        text = f.read()
      name = os.path.relpath(path, ROOT)
      for block in [text] if path in SHELL_SCRIPTS else shell_blocks(text):
        for args in record(block, scratch):
          if args[:1] == ['-m'] and len(args) > 1:
            modules[args[1]].append((name, args[2:]))
          elif args and args[0].endswith('.py'):
            scripts.append((name, args[0]))
  return modules, scripts


MODULES, SCRIPT_CALLS = documented_commands()


def test_the_documents_show_commands_of_each_kind():
  """The extraction itself: the documents hold runs, sweeps and benchmarks
  (if a change to the markdown or this parser found none, nothing below
  would be checked)."""
  assert {'launch.main', 'launch.sweep', 'benchmarks.bench'} <= set(MODULES)
  assert sum(len(v) for v in MODULES.values()) >= 50
  # The prepared GPU calls (python3 there) are among them.
  sources = {
    module: {document for document, _ in calls}
    for module, calls in MODULES.items()
  }
  assert 'benchmarks/gpu_next.sh' in sources['benchmarks.bench']
  assert 'benchmarks/gpu_fedrcl_resnet.sh' in sources['launch.reproduce']
  assert 'benchmarks/gpu_scale.sh' in sources['launch.scale']


def test_a_wrong_flag_config_key_case_or_module_fails():
  """command_check reports what a real run would stop at."""
  cases = {
    'launch.main': [
      ['--config=configs/fedavg.py', '--workdir=w'],
      ['--config=configs/fedavg.py', '--config.no_such_key=1', '--workdir=w'],
      ['--config=configs/fedavg.py', '--config.algorithm=nope', '--workdir=w'],
    ],
    'launch.sweep': [
      ['run', '--root=r', '--config=configs/fedavg.py', '--set=seed=1'],
      ['run', '--root=r', '--config=configs/fedavg.py', '--set=no_key=1'],
      ['table', '--root=r', '--no_such_flag=1'],
    ],
    'benchmarks.rounds_bench': [['--cases=fedmetric_protocol,no_such_case']],
  }
  results = {m: check_module(m, a) for m, a in cases.items()}
  assert results['launch.main'][0] is None, results
  assert 'no_such_key' in results['launch.main'][1], results
  assert results['launch.main'][2] is not None, results
  assert results['launch.sweep'][0] is None, results
  assert 'no_key' in results['launch.sweep'][1], results
  assert 'no_such_flag' in results['launch.sweep'][2], results
  assert 'no_such_case' in results['benchmarks.rounds_bench'][0], results
  with pytest.raises(AssertionError, match='launch.no_such_module'):
    check_module('launch.no_such_module', [[]])


def check_module(module, argument_lists):
  """command_check's verdicts for ``module``, one per argument list."""
  process = subprocess.run(
    [sys.executable, os.path.join(ROOT, 'tests', 'docs', 'command_check.py')]
    + [module],
    input=json.dumps(argument_lists),
    capture_output=True,
    text=True,
    cwd=ROOT,
    env=machine.child_env(JAX_PLATFORMS='cpu'),
    check=False,
  )
  assert process.returncode == 0, (module, process.stderr[-2000:])
  return json.loads(process.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize(
  'module', sorted(m for m in MODULES if m not in NOT_CHECKED)
)
def test_documented_commands_parse(module):
  calls = MODULES[module]
  verdicts = check_module(module, [args for _, args in calls])
  wrong = [
    f'{document}: python -m {module} {" ".join(args)}\n  -> {verdict}'
    for (document, args), verdict in zip(calls, verdicts)
    if verdict is not None
  ]
  assert not wrong, '\n'.join(wrong)


def test_documented_scripts_exist():
  missing = [
    (d, s) for d, s in SCRIPT_CALLS if not os.path.exists(os.path.join(ROOT, s))
  ]
  assert not missing, missing


def test_every_module_a_document_names_exists():
  """Inline mentions too (``python -m launch.evaluate --workdir=...`` in a
  sentence): the module must exist, even where the command is not whole.
  The benchmark tables (benchmarks/*.md but the runbook) are records of what
  ran, under the names of the day, and are not read."""
  paths = (
    [os.path.join(ROOT, 'README.md')]
    + DOCUMENTS
    + SHELL_SCRIPTS
    + sorted(glob.glob(os.path.join(ROOT, 'notebooks', '*.ipynb')))
  )
  named = collections.defaultdict(set)
  for path in paths:
    with open(path) as f:
      for module in re.findall(r'python -m ([A-Za-z_][\w.]*\w)', f.read()):
        named[module].add(os.path.relpath(path, ROOT))
  assert 'launch.main' in named and 'benchmarks.bench' in named
  missing = {
    module: sorted(where)
    for module, where in named.items()
    if importlib.util.find_spec(module) is None
  }
  assert not missing, missing
