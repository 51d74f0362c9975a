"""No import cycle among the modules of fedjax_metric/ and launch/; at most
seven layers of rooms; no module below assemble takes the config.

Every import counts, a function's lazy one too: a cycle hidden in a function
still ties two modules together (each needs the other to be understood,
moved or tested). The graph is read from the source (`ast`), nothing is
imported. ``python tests/test_imports.py`` prints the graph's size, its
cycles (strongly connected components) and, without one, its layers: the
longest import chain, of modules and of rooms (folders).
"""

import ast
import os
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PACKAGES = ('fedjax_metric', 'launch')


def modules(root=REPO, packages=PACKAGES):
  """``{dotted name: (path, is_package)}`` of every module under the
  packages (a package by its ``__init__.py``)."""
  found = {}
  for package in packages:
    for directory, subdirs, files in os.walk(os.path.join(root, package)):
      subdirs[:] = sorted(d for d in subdirs if d != '__pycache__')
      for name in sorted(f for f in files if f.endswith('.py')):
        path = os.path.join(directory, name)
        parts = os.path.relpath(path, root)[: -len('.py')].split(os.sep)
        is_package = parts[-1] == '__init__'
        found['.'.join(parts[:-1] if is_package else parts)] = (
          path,
          is_package,
        )
  return found


def _known(name, found):
  """``name`` or its closest enclosing module in ``found``; None outside."""
  while name and name not in found:
    name = name.rpartition('.')[0]
  return name or None


def import_graph(found):
  """``{module: modules it imports}``, within ``found``. ``from a import b``
  is an edge to module ``a.b`` when it is one, else to ``a``."""
  graph = {name: set() for name in found}
  for name, (path, is_package) in found.items():
    with open(path) as f:
      tree = ast.parse(f.read(), path)
    package = name if is_package else name.rpartition('.')[0]
    for node in ast.walk(tree):
      if isinstance(node, ast.Import):
        targets = [alias.name for alias in node.names]
      elif isinstance(node, ast.ImportFrom):
        base = node.module or ''
        if node.level:
          up = package.split('.')
          up = up[: len(up) - (node.level - 1)]
          base = '.'.join(up + ([node.module] if node.module else []))
        targets = [
          f'{base}.{a.name}' if f'{base}.{a.name}' in found else base
          for a in node.names
        ]
      else:
        continue
      graph[name] |= {_known(t, found) for t in targets} - {None, name}
  return graph


def cycles(graph):
  """The strongly connected components of more than one module (Tarjan's
  algorithm, iterative), each sorted."""
  index, low, on_stack, stack, out = {}, {}, set(), [], []
  for start in sorted(graph):
    if start in index:
      continue
    work = [(start, iter(sorted(graph[start])))]
    index[start] = low[start] = len(index)
    stack.append(start)
    on_stack.add(start)
    while work:
      node, edges = work[-1]
      child = next(edges, None)
      if child is None:
        work.pop()
        if work:
          low[work[-1][0]] = min(low[work[-1][0]], low[node])
        if low[node] == index[node]:
          component = []
          while True:
            member = stack.pop()
            on_stack.discard(member)
            component.append(member)
            if member == node:
              break
          if len(component) > 1:
            out.append(sorted(component))
      elif child not in index:
        index[child] = low[child] = len(index)
        stack.append(child)
        on_stack.add(child)
        work.append((child, iter(sorted(graph[child]))))
      elif child in on_stack:
        low[node] = min(low[node], index[child])
  return sorted(out)


def rooms(graph, depth=2):
  """The graph with each module folded into its package at ``depth``
  dotted parts (``fedjax_metric.data.sources`` -> ``fedjax_metric.data``;
  ``launch.sweep`` -> ``launch`` at depth 1 for launch/): a folder is one
  room, as a reader sees the layout. Self-edges dropped."""

  def room(name):
    parts = name.split('.')
    keep = 1 if parts[0] == 'launch' else depth
    return '.'.join(parts[:keep])

  out = {}
  for name, targets in graph.items():
    out.setdefault(room(name), set()).update(room(t) for t in targets)
  for name, targets in out.items():
    targets.discard(name)
  return out


def layers(graph):
  """The longest import chain, counted in modules (a module importing
  nothing is layer 1): how many floors the layout stands on. Needs an
  acyclic graph."""
  depth = {}

  def floor(name, seen=()):
    if name not in depth:
      if name in seen:
        raise ValueError(f'cycle through {name}')
      depth[name] = 1 + max(
        (floor(t, seen + (name,)) for t in graph[name]), default=0
      )
    return depth[name]

  return max(map(floor, graph), default=0)


def test_no_import_cycle():
  graph = import_graph(modules())
  assert {'launch.sweep', 'fedjax_metric.data.sources'} <= set(graph)
  assert 'launch.sweep_slurm' in graph['launch.sweep']  # Edges are read.
  found = cycles(graph)
  assert not found, (
    f'import cycles (each a set of modules that import each other): {found}'
  )


def test_cycles_are_found():
  """The check itself: a cycle through three modules, and one through a
  lazy (function-level) relative import, are reported."""
  assert cycles({'a': {'b'}, 'b': {'c'}, 'c': {'a'}, 'd': {'a'}}) == [
    ['a', 'b', 'c']
  ]
  assert cycles({'a': {'b'}, 'b': set()}) == []


def test_layers_count_the_longest_chain_of_rooms():
  assert layers({'a': {'b'}, 'b': {'c'}, 'c': set(), 'd': {'c'}}) == 3
  folded = rooms({'p.x.a': {'p.x.b', 'p.y'}, 'p.x.b': set(), 'p.y': set()})
  assert folded == {'p.x': {'p.y'}, 'p.y': set()}
  assert layers(folded) == 2


def test_lazy_relative_imports_are_edges(tmp_path):
  package = tmp_path / 'pkg'
  package.mkdir()
  (package / '__init__.py').write_text('')
  (package / 'a.py').write_text('from . import b\n')
  (package / 'b.py').write_text('def f():\n  from .a import x\n')
  found = modules(str(tmp_path), ('pkg',))
  assert cycles(import_graph(found)) == [['pkg.a', 'pkg.b']]


# The layout's floors (docs/concepts.md, "The structure in numbers"):
# entry (launch/, api) -> experiment -> assemble / validation / workdir ->
# executors -> engine / algorithms -> data, models, losses, contract.
MAX_LAYERS_OF_ROOMS = 7


def test_the_package_stands_on_at_most_seven_layers_of_rooms():
  graph = import_graph(modules())
  assert layers(rooms(graph)) <= MAX_LAYERS_OF_ROOMS


# The modules that read a run's config: the entry points, the experiment
# loop, assemble and its siblings (validation, workdir, restore) and the
# config's own modules. Everything below them gets typed pieces.
READS_CONFIG = {
  'fedjax_metric.api',
  'fedjax_metric.experiment',
  'fedjax_metric.assemble',
  'fedjax_metric.validation',
  'fedjax_metric.workdir',
  'fedjax_metric.restore',
  'fedjax_metric.config_io',
  'fedjax_metric.overrides',
  'fedjax_metric.settings',
  'fedjax_metric.paper_settings',
}
CONFIG_NAMES = ('config', 'cfg', 'flat_config')


def config_parameters(found, allowed=()):
  """``[(module, function)]``: functions outside ``allowed`` with a
  parameter named like a config (`CONFIG_NAMES`)."""
  out = []
  for name, (path, _) in sorted(found.items()):
    if name in allowed:
      continue
    with open(path) as f:
      tree = ast.parse(f.read(), path)
    for node in ast.walk(tree):
      if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
        a = node.args
        params = a.posonlyargs + a.args + a.kwonlyargs
        if any(p.arg in CONFIG_NAMES for p in params):
          out.append((name, node.name))
  return out


def test_nothing_below_assemble_takes_a_config():
  found = modules(packages=('fedjax_metric',))
  assert not config_parameters(found, READS_CONFIG), (
    'functions below assemble that take the config (give them typed '
    'settings made in assemble.py instead)'
  )
  # The check itself: assemble's own functions are found without the
  # allowance.
  assert ('fedjax_metric.assemble', 'build') in config_parameters(found)


if __name__ == '__main__':
  graph = import_graph(modules())
  print(
    f'{len(graph)} modules, {sum(map(len, graph.values()))} imports among '
    f'them, under {", ".join(PACKAGES)}/'
  )
  found = cycles(graph)
  for component in found:
    print('cycle:', ' <-> '.join(component))
  print(f'{len(found)} cycle(s)')
  if not found:
    folded = rooms(graph)
    print(
      f'{layers(graph)} layers of modules; {layers(folded)} layers of '
      f'{len(folded)} rooms (a subpackage, launch/ and each top-level '
      'module one room)'
    )
  takers = config_parameters(modules(packages=('fedjax_metric',)))
  by_module = {}
  for module, function in takers:
    by_module.setdefault(module, []).append(function)
  print(
    f'functions taking the config: {len(takers)} in {len(by_module)} modules'
  )
  for module, functions in by_module.items():
    below = '' if module in READS_CONFIG else '  <- below assemble'
    print(f'  {module}: {len(functions)}{below}')
  sys.exit(1 if found else 0)
