"""Runs notebook cells in a Jupyter kernel, as Colab or JupyterLab would.

`execute` builds a notebook from code cells and runs it with nbclient in a
fresh IPython kernel (the 'python3' kernel of this environment, so the
package under test is the installed one), in a given directory and with
extra environment variables. It returns what a finished process would:
``returncode`` (0, or 1 when a cell raised), ``stdout`` (the cells' printed
and displayed output) and ``stderr`` (their stderr streams and the failing cell's
traceback).
"""

import os
import types

import pytest


def _text(output):
  """What a reader sees of one output: a stream's text, or a displayed
  value's Markdown or plain-text form."""
  if output.get('output_type') == 'stream':
    return output.get('text', '')
  data = output.get('data', {})
  return data.get('text/markdown', data.get('text/plain', ''))


def _streams(notebook, name):
  """stdout: the printed and displayed output; stderr: the stderr stream."""
  return ''.join(
    _text(output)
    for cell in notebook.cells
    for output in cell.get('outputs', [])
    if (output.get('name') == name)
    or (name == 'stdout' and output.get('output_type') != 'stream')
  )


def execute(cells, *, cwd, env=None, timeout=300):
  """Runs ``cells`` (code strings) in order in one kernel started in ``cwd``
  with ``os.environ`` plus ``env``; stops at the first failing cell.

  Skips the calling test where nbclient is not installed (the test extra
  installs it): imported here, not at the top, so modules that also hold
  tests without notebooks still run there."""
  reason = 'the test extra installs it (pip install -e .[test])'
  nbclient = pytest.importorskip('nbclient', reason=reason)
  nbformat = pytest.importorskip('nbformat', reason=reason)
  from nbclient import exceptions as nb_exceptions  # pylint: disable=g-import-not-at-top

  notebook = nbformat.v4.new_notebook(
    cells=[nbformat.v4.new_code_cell(source) for source in cells]
  )
  saved = dict(os.environ)
  os.environ.update(env or {})  # The kernel inherits this environment.
  try:
    client = nbclient.NotebookClient(
      notebook,
      timeout=timeout,
      kernel_name='python3',
      resources={'metadata': {'path': str(cwd)}},
    )
    client.execute()
    returncode, error = 0, ''
  except nb_exceptions.CellExecutionError as e:
    returncode, error = 1, str(e)
  finally:
    os.environ.clear()
    os.environ.update(saved)
  return types.SimpleNamespace(
    returncode=returncode,
    stdout=_streams(notebook, 'stdout'),
    stderr=_streams(notebook, 'stderr') + error,
  )
