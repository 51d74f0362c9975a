"""Weights & Biases logging, optional (``pip install 'fedjax_metric[wandb]'``).

``--config.logging.wandb=<project>`` sends what metrics.jsonl and TensorBoard
get to a W&B run of that project: the flattened config once, then every
evaluation row at its round. W&B's own settings apply (``WANDB_MODE=offline``
keeps the run in ``./wandb`` for a later ``wandb sync``; ``WANDB_DIR`` moves
it). The run's id is the workdir's, so a resumed run continues the same W&B
run. Without the extra installed a run asking for W&B stops before training
with the install line; a run not asking never imports it.
"""

import hashlib
import os


def missing(project):
  """Why ``--config.logging.wandb=project`` cannot run here, or None: the
  wandb package is not installed."""
  if not project:
    return None
  try:
    import wandb  # noqa: F401  pylint: disable=g-import-not-at-top,unused-import
  except ImportError:
    return (
      f'--config.logging.wandb={project!r} needs Weights & Biases: '
      "pip install 'fedjax_metric[wandb]' (or leave logging.wandb empty)."
    )
  return None


def run_id(workdir):
  """A W&B run id that is the same for every session of a workdir."""
  path = os.path.abspath(workdir)
  return hashlib.sha1(path.encode()).hexdigest()[:16]


class WandbWriter:
  """One W&B run per workdir: the config at the start, then each evaluation
  row (`log_row`) at its round; `close` finishes the run (safe twice)."""

  def __init__(self, project, workdir, config_items):
    import wandb  # pylint: disable=g-import-not-at-top

    self._run = wandb.init(
      project=project,
      id=run_id(workdir),
      name=os.path.basename(os.path.abspath(workdir)),
      resume='allow',
      config=dict(config_items),
      dir=workdir,
    )

  def log_row(self, row):
    step = row['round']
    self._run.log({k: v for k, v in row.items() if k != 'round'}, step=step)

  def close(self):
    if self._run is not None:
      self._run.finish()
      self._run = None
