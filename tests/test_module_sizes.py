"""Every long module of fedjax_metric/ and launch/ is given its reason.

The layout guide asks for no file over ~400 lines without a reason. A module
past `LIMIT` lines must have a row in docs/concepts.md's table "Modules over
500 lines, and why" (a row is ``| `path` | ... |``), and every row must
name a module that is still that long, so the table cannot go stale in
either direction. ``python tests/test_module_sizes.py`` prints each module
over 400 lines with its lines of code (without blank lines, comments and
docstrings), the figures the table quotes.
"""

import ast
import os
import re
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PACKAGES = ('fedjax_metric', 'launch')
# ~400 lines is the guide's figure; 500 leaves it its "~".
LIMIT = 500
TABLE_HEADING = '### Modules over 500 lines, and why'
ROW = re.compile(r'^\| `([\w/]+\.py)` \|')


def module_paths(root=REPO, packages=PACKAGES):
  """Repository-relative paths of every .py file under the packages."""
  paths = []
  for package in packages:
    for directory, subdirs, files in os.walk(os.path.join(root, package)):
      subdirs[:] = sorted(d for d in subdirs if d != '__pycache__')
      for name in sorted(f for f in files if f.endswith('.py')):
        paths.append(os.path.relpath(os.path.join(directory, name), root))
  return paths


def sizes(source: str):
  """``(lines, lines of code)`` of a module's source; code excludes blank
  lines, comment lines and docstrings (of the module, classes, functions)."""
  docstring_lines = set()
  for node in ast.walk(ast.parse(source)):
    if isinstance(
      node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)
    ):
      first = node.body[0] if node.body else None
      if (
        isinstance(first, ast.Expr)
        and isinstance(first.value, ast.Constant)
        and isinstance(first.value.value, str)
      ):
        docstring_lines.update(range(first.lineno, first.end_lineno + 1))
  lines = source.splitlines()
  code = sum(
    1
    for number, line in enumerate(lines, 1)
    if line.strip()
    and not line.strip().startswith('#')
    and number not in docstring_lines
  )
  return len(lines), code


def long_modules(limit=LIMIT, root=REPO):
  """``{path: (lines, code lines)}`` of the modules over ``limit`` lines."""
  out = {}
  for path in module_paths(root):
    with open(os.path.join(root, path)) as f:
      lines, code = sizes(f.read())
    if lines > limit:
      out[path] = (lines, code)
  return out


def table_rows(markdown: str):
  """The paths named by the rows of the table under `TABLE_HEADING`."""
  if TABLE_HEADING not in markdown:
    return None
  section = markdown.split(TABLE_HEADING, 1)[1]
  section = re.split(r'^#', section, maxsplit=1, flags=re.M)[0]
  return [m.group(1) for m in map(ROW.match, section.splitlines()) if m]


def test_sizes_leave_out_docstrings_comments_and_blank_lines():
  source = (
    '"""Module.\n\nDoc."""\n\n# why\nimport os\n\n\n'
    'def f(x):\n  """One line."""\n  return x  # because\n'
  )
  assert sizes(source) == (11, 3)


def test_every_long_module_has_its_reason_and_no_row_is_stale():
  with open(os.path.join(REPO, 'docs', 'concepts.md')) as f:
    rows = table_rows(f.read())
  assert rows is not None, f'docs/concepts.md lacks {TABLE_HEADING!r}'
  long = long_modules()
  missing = sorted(set(long) - set(rows))
  stale = sorted(set(rows) - set(long))
  assert not missing, (
    f'modules over {LIMIT} lines without a row in docs/concepts.md '
    f'"{TABLE_HEADING[4:]}": {missing}; split them or give the reason'
  )
  assert not stale, (
    f'rows of docs/concepts.md "{TABLE_HEADING[4:]}" for modules no '
    f'longer over {LIMIT} lines: {stale}; drop the rows'
  )


def test_the_check_finds_a_long_module(tmp_path):
  package = tmp_path / 'fedjax_metric'
  package.mkdir()
  (package / 'short.py').write_text('x = 1\n')
  (package / 'long.py').write_text('x = 1\n' * (LIMIT + 1))
  assert long_modules(root=str(tmp_path)) == {
    os.path.join('fedjax_metric', 'long.py'): (LIMIT + 1, LIMIT + 1)
  }
  markdown = f'{TABLE_HEADING}\n\n| `a/b.py` | x |\n|---|---|\n\n## Next\n| `c.py` | y |\n'
  assert table_rows(markdown) == ['a/b.py']


if __name__ == '__main__':
  for path, (lines, code) in sorted(
    long_modules(limit=400).items(), key=lambda item: -item[1][0]
  ):
    print(f'{lines:5d} lines, {code:4d} of code  {path}')
  sys.exit(0)
