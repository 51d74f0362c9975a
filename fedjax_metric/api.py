"""The library's front door: packaged configs by name, a run, a finished run.

  import fedjax_metric as fm

  config = fm.get_config('fedquad', 'runlocal')
  result = fm.run(config)               # a temporary workdir
  result.final['test_accuracy']         # the last evaluation
  result.history                        # every evaluated round (metrics.jsonl)
  result.variables                      # the final global model
  fm.load_run(result.workdir)           # the same, read back from disk

Config names are the files of the repository's ``configs/`` directory, which
also ships inside the installed package (``fedjax_metric.configs``); a path
to a file of one's own (``my_config.py``) works wherever a name does
(fedjax_metric/config_io.py loads both, and a run's workdir).
"""

import json
import os
import re
import shutil
import tempfile
from typing import Any, Dict, List, NamedTuple, Optional

import ml_collections

from fedjax_metric import config_io, experiment, metrics_log
from fedjax_metric import restore as restore_lib
from fedjax_metric.data import sources


class RunResult(NamedTuple):
  """What a run leaves: its metrics, its final model and where it is.

  Attributes:
    history: one dict per evaluated round, as ``metrics.jsonl`` holds them
      (``round``, ``train_loss``, the protocol's metrics, timings).
    final: the last of them (the final evaluation); {} before any.
    variables: the final global model's variables (``params`` and, with
      BatchNorm, ``batch_stats``), from the latest checkpoint.
    workdir: the run's directory.
    summary: ``summary.json`` (or what `experiment.run` returned after a stop).
  """

  history: List[Dict[str, Any]]
  final: Dict[str, Any]
  variables: Any
  workdir: str
  summary: Dict[str, Any]


def get_config(
  name: str, arg: Optional[str] = None
) -> ml_collections.ConfigDict:
  """Config ``name`` (a packaged name or a file path) with its ``:arg``
  string (``'runlocal'``, ``'alpha=0.3,rounds=50'``), as
  ``--config=name:arg`` builds it on the command line
  (`config_io.load_config`)."""
  return config_io.load_config(f'{name}:{arg}' if arg else name)


def load_run(workdir: str) -> RunResult:
  """A finished (or stopped) run read back from ``workdir``."""
  config = config_io.load_config(workdir=workdir)
  history = metrics_log.read_metrics(os.path.join(workdir, 'metrics.jsonl'))
  summary_path = os.path.join(workdir, 'summary.json')
  summary = {}
  if os.path.exists(summary_path):
    with open(summary_path) as f:
      summary = json.load(f)
  restored = restore_lib.restore(config, workdir)
  return RunResult(
    history=history,
    final=history[-1] if history else {},
    variables=restored['server_state'].variables,
    workdir=workdir,
    summary=summary,
  )


# The command line's names in the library's messages, and Python's.
_FLAG_NAMES = (
  (re.compile(r'--config\.'), 'config.'),
  (re.compile(r'(?<!launch\.main )--workdir'), 'workdir'),
)


def _python_names(error: BaseException) -> None:
  """Rewrites ``error``'s message in place to name fields as Python does:
  the library's messages are written for the command line (``--config.x``,
  ``--workdir``); from `run` they read ``config.x``, ``workdir``. Only a
  message that is one string is changed (an OSError's errno form is not)."""
  if len(error.args) != 1 or not isinstance(error.args[0], str):
    return
  text = error.args[0]
  for pattern, name in _FLAG_NAMES:
    text = pattern.sub(name, text)
  error.args = (text,)


def run(
  config: ml_collections.ConfigDict, workdir: Optional[str] = None
) -> RunResult:
  """Trains ``config`` into ``workdir`` (resumed if it holds this run) and
  returns the run's `RunResult`.

  Without a ``workdir`` the run gets a new temporary directory,
  ``fedjax_metric_*`` in `tempfile.gettempdir()`. It is the result's
  ``workdir`` and is kept: `load_run` reads it again, and deleting it
  (``shutil.rmtree(result.workdir)``) is the caller's. A run that fails
  before writing anything there (a config error, a busy or missing
  resource) removes it; one that fails later keeps it (a diverged run's
  error names its checkpoints), and the error's note names it.

  Errors name config fields as Python spells them (``config.num_rounds``,
  ``workdir``), where the command line's say ``--config.num_rounds``.
  """
  temporary = workdir is None
  if temporary:
    workdir = tempfile.mkdtemp(prefix='fedjax_metric_')
  try:
    trained = experiment.train(config, workdir)
  except BaseException as e:
    if temporary:
      if os.path.isdir(workdir) and not os.listdir(workdir):
        shutil.rmtree(workdir, ignore_errors=True)
      elif hasattr(e, 'add_note'):  # Python >= 3.11.
        e.add_note(f'The run wrote its files to {workdir}.')
    if isinstance(e, Exception):
      _python_names(e)
    raise
  if trained.variables is None:  # Not finished here: from the checkpoint.
    return load_run(workdir)._replace(summary=trained.summary)
  history = metrics_log.read_metrics(os.path.join(workdir, 'metrics.jsonl'))
  return RunResult(
    history=history,
    final=history[-1] if history else {},
    variables=trained.variables,
    workdir=workdir,
    summary=trained.summary,
  )


def datasets() -> Dict[str, str]:
  """Every dataset name `--config.dataset.name` takes, with where it comes
  from."""
  return dict(sources.DESCRIPTIONS)
