"""fedjax_metric: federated learning for metric-learning and contrastive
methods, with a round's local training as one XLA program.

The front door (fedjax_metric/api.py):

  import fedjax_metric as fm
  fm.algorithms()                          # name -> one-line description
  fm.datasets()
  config = fm.get_config('fedquad', 'runlocal')
  result = fm.run(config, 'runs/x')        # history, final, variables, workdir
  fm.load_run('runs/x')
"""

from fedjax_metric import algorithms
from fedjax_metric.api import (
  RunResult,
  datasets,
  get_config,
  load_run,
  run,
)

__version__ = '0.1.0'
__all__ = [
  'RunResult',
  'algorithms',
  'datasets',
  'get_config',
  'load_run',
  'run',
]
