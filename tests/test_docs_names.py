"""The library names the docs cite exist.

Every backticked ``module.name`` in README.md and docs/*.md whose module is
one of the package's modules (by its short name: `sharding.put_global`,
`losses.calibrated_cross_entropy`) must name an attribute of that module, so
that a rename shows up here instead of in a reader's failed lookup.
"""

import importlib
import os
import pkgutil
import re

import fedjax_metric
from fedjax_metric import settings

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CITED = re.compile(r'`([a-z_][a-z0-9_]*)\.([A-Za-z_][A-Za-z0-9_]*)')
# `pmfl.py`, `partition.png`: file names, not attributes.
EXTENSIONS = {'py', 'md', 'json', 'jsonl', 'png', 'yaml', 'npz', 'msgpack'}


def package_modules():
  """{short name: module} of every fedjax_metric module whose short name is
  unique in the package."""
  found = {}
  for info in pkgutil.walk_packages(
    fedjax_metric.__path__, fedjax_metric.__name__ + '.'
  ):
    if '.configs' in info.name or '.launch' in info.name:
      continue
    short = info.name.rsplit('.', 1)[-1]
    found.setdefault(short, []).append(info.name)
  return {
    short: importlib.import_module(names[0])
    for short, names in found.items()
    if len(names) == 1
  }


def doc_files():
  docs = os.path.join(REPO, 'docs')
  paths = [os.path.join(REPO, 'README.md')]
  for directory, _, files in os.walk(docs):
    paths += [os.path.join(directory, f) for f in files if f.endswith('.md')]
  return paths


def test_every_cited_module_attribute_exists():
  modules = package_modules()
  assert {'sharding', 'engine', 'losses', 'fedagm'} <= set(modules)
  # `partition.method` is a config field: a block named like a module.
  for block in settings.base_config():
    modules.pop(block, None)
  missing = []
  for path in doc_files():
    with open(path) as f:
      text = f.read()
    for module, name in CITED.findall(text):
      if name in EXTENSIONS or module not in modules:
        continue
      if not hasattr(modules[module], name):
        missing.append(f'{os.path.relpath(path, REPO)}: {module}.{name}')
  assert not missing, 'docs cite names that do not exist:\n' + '\n'.join(
    sorted(set(missing))
  )


def crosscheck_names():
  """The backticked names in the 'name in this library' column of
  docs/results/crosscheck.md's table of methods."""
  path = os.path.join(REPO, 'docs', 'results', 'crosscheck.md')
  with open(path) as f:
    lines = f.read().split('\n')
  header = next(
    i for i, line in enumerate(lines) if '| name in this library |' in line
  )
  column = lines[header].split(' | ').index('name in this library')
  names = set()
  for line in lines[header + 2 :]:
    if not line.startswith('| '):
      break
    names |= set(re.findall(r'`([a-z0-9_]+)`', line.split(' | ')[column]))
  return names


def test_crosscheck_lists_every_algorithm():
  """Every registered algorithm has a row in crosscheck.md: compared with
  its authors' code, or said to have none."""
  from fedjax_metric import algorithms

  missing = sorted(set(algorithms.REGISTRY) - crosscheck_names())
  assert not missing, f'no crosscheck.md row names {missing}'
  # The check reads the column it means to: a known row is found.
  assert {'fedavg', 'fitnet', 'quadrupletfl'} <= crosscheck_names()


def test_the_layout_tree_names_every_module():
  """docs/concepts.md's tree is the one file-by-file map (the README keeps
  a short one): every top-level module of the package and of launch/ is
  named in it, so that a new module shows up here instead of missing."""
  with open(os.path.join(REPO, 'docs', 'concepts.md')) as f:
    text = f.read()
  start = text.index('```\nfedjax_metric/')
  tree = text[start : text.index('```\n', start + 4)]
  named = set(re.findall(r'[a-z_][a-z0-9_]*', tree))
  missing = []
  for folder in ('fedjax_metric', 'launch'):
    for name in sorted(os.listdir(os.path.join(REPO, folder))):
      module = name[:-3]
      if name.endswith('.py') and module != '__init__' and module not in named:
        missing.append(f'{folder}/{name}')
  assert not missing, (
    f"docs/concepts.md's tree does not name {missing}: add a line for each."
  )
