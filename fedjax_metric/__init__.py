"""fedjax_metric: federated learning for metric-learning and contrastive
methods, with a round's local training as one XLA program.

The front door (fedjax_metric/api.py):

  import fedjax_metric as fm
  fm.algorithms()                          # name -> one-line description
  fm.datasets()
  config = fm.get_config('fedquad', 'runlocal')
  result = fm.run(config, 'runs/x')        # history, final, variables, workdir
  fm.load_run('runs/x')

These names load the library (and JAX) when first used, not when the package
is imported: a module that needs none of it (``fedjax_metric.config_io``,
which launch.sweep's tables and plots read configs with) imports without JAX.
"""

import importlib

__version__ = '0.1.0'
__all__ = [
  'RunResult',
  'algorithms',
  'datasets',
  'get_config',
  'load_run',
  'run',
]
_API = ('RunResult', 'datasets', 'get_config', 'load_run', 'run')


def __getattr__(name):
  """The front door's names (`api`), and any submodule, on first use."""
  if name in _API:
    return getattr(importlib.import_module(f'{__name__}.api'), name)
  try:
    return importlib.import_module(f'{__name__}.{name}')
  except ModuleNotFoundError as e:
    if e.name != f'{__name__}.{name}':
      raise
  raise AttributeError(f'module {__name__!r} has no attribute {name!r}')


def __dir__():
  return sorted(set(globals()) | set(__all__))
