"""A run's evaluation rows: metrics.jsonl, TensorBoard, and what each row says.

``metrics.jsonl`` holds one JSON object per evaluation (README.md, "The
workdir"): the round, times, the training columns (`train_row`), the
throughput since the previous evaluation (`Throughput`), the evaluation's
metrics and the headline's statistics the papers report (its debiased EMA and
the mean of its best evaluations, `evaluation.statistics`). `MetricsLog`
writes them, and with ``logging.per_client`` one row per cohort client and
round to ``per_client.csv``; a resumed run first drops the rows past its
checkpoint, so every row is written by the session that computed it.
"""

import csv
import io
import json
import os
import time
from typing import Any, Dict, NamedTuple, Optional

from absl import logging
import numpy as np

from fedjax_metric import wandb_log
from fedjax_metric.evaluation import statistics as eval_statistics


def _rows(path):
  """``[(line, row)]`` of metrics.jsonl at ``path``.

  A last line cut off by a kill or a full disk (no newline, not JSON) is
  left out with a warning: that evaluation is redone on resume. Any other
  line that is not JSON is damage, refused in one line naming it.
  """
  with open(path) as f:
    lines = [line for line in f if line.strip()]
  out = []
  for number, line in enumerate(lines, 1):
    try:
      out.append((line, json.loads(line)))
    except ValueError:
      if number == len(lines) and not line.endswith('\n'):
        logging.warning('%s: leaving out a cut-off last line.', path)
        continue
      raise ValueError(
        f'{path}, line {number}, is not a JSON row; the file is damaged. '
        'Delete that line (its round is evaluated again on resume).'
      ) from None
  return out


def read_metrics(metrics_path):
  """metrics.jsonl's rows (dicts), [] when it does not exist."""
  if not os.path.exists(metrics_path):
    return []
  return [row for _, row in _rows(metrics_path)]


def _replace_lines(path, lines):
  """Writes ``lines`` as the whole of ``path`` atomically: a kill or a full
  disk leaves the old file, never a shortened one."""
  tmp = path + '.tmp'
  with open(tmp, 'w', newline='') as f:
    f.writelines(lines)
  os.replace(tmp, path)


def evaluations_of(metrics_path, name, up_to_round):
  """``name``'s value in every metrics.jsonl row of a round <= ``up_to_round``
  (a resumed run's history), in order."""
  return [
    row[name]
    for row in read_metrics(metrics_path)
    if row.get('round', 0) <= up_to_round and name in row
  ]


def metrics_row(metrics_path, round_):
  """The metrics.jsonl row of ``round_``, or {} if it has none."""
  rows = read_metrics(metrics_path)
  return next((r for r in rows if r.get('round') == round_), {})


def truncate_metrics(path, last_round):
  """Drops metric lines past the restored checkpoint (they will be redone)."""
  if not os.path.exists(path):
    return
  kept = [line for line, row in _rows(path) if row['round'] <= last_round]
  _replace_lines(path, kept)


def make_summary_writer(workdir, start_round=0):
  """TensorBoard scalars from ``start_round`` on (earlier events are kept,
  later ones of a previous session dropped), or None without tensorboardX."""
  try:
    from fedjax_metric import event_log  # pylint: disable=g-import-not-at-top
  except ImportError:
    logging.warning('tensorboardX not installed: no TensorBoard events.')
    return None
  event_log.prune(workdir, start_round)
  return event_log.ScalarWriter(workdir, f'.{os.getpid()}.{start_round}')


def append_metrics(metrics_path, writer, row):
  """One evaluation row: a line of metrics.jsonl and, with a TensorBoard
  ``writer``, its scalars at step ``row['round']``, flushed so that a run
  killed later keeps this evaluation."""
  with open(metrics_path, 'a') as f:
    f.write(json.dumps(row) + '\n')
  if writer:
    for name, value in row.items():
      if name != 'round':
        writer.add_scalar(name, value, row['round'])
    writer.flush()


def train_row(train_sums, done, diverged):
  """The training columns of an evaluation row from the rounds' sums.

  ``train_sums``: dicts of per-round arrays since the last evaluation. The
  loss and each named term are per real training example (train_loss,
  train_ce, train_metric, ...). A non-finite loss raises ``diverged``.

  Returns:
    ``(columns, examples trained, rounds)`` since the last evaluation.
  """
  sums = {
    name: np.concatenate([np.ravel(s[name]) for s in train_sums])
    for name in train_sums[0]
  }
  loss_sums, counts = sums['train_loss_sum'], sums['train_examples']
  bad = np.flatnonzero(~np.isfinite(loss_sums))
  if bad.size:
    first_bad = done - len(loss_sums) + int(bad[0]) + 1
    raise diverged(f'Training loss is {loss_sums[bad[0]]}', first_bad)
  examples = max(float(counts.sum()), 1.0)
  row = {
    name[: -len('_sum')]: float(total.sum() / examples)
    for name, total in sums.items()
    if name.endswith('_sum') and name != 'train_loss_sum'
  }
  row['train_loss'] = float(loss_sums.sum() / examples)
  return row, float(counts.sum()), len(counts)


class Throughput:
  """Training throughput between two evaluations.

  The interval runs from the end of one evaluation to the start of the next,
  so the first one includes the first call's compilation. ``cohort_wait`` is
  the time spent waiting for the host's cohorts (what the prefetch thread
  did not hide), ``in_rounds`` the time in the round calls until their
  results were ready (the programs; the host executor's loop is inside).
  With a client table off the device (``table=True``; client_table.py),
  ``cohort_wait`` also holds the wait for rows the read ahead did not have
  ready, ``table_seconds`` is the time the loop spent on the rows itself
  (patching, placing, packing, queueing the writes) and ``table_io_seconds``
  the time spent reading and writing them, in whichever thread (hidden
  behind the rounds where it ran in the read-ahead thread).
  """

  def __init__(self, table: bool = False):
    self.table = table
    self.restart()

  def restart(self):
    self.start = time.time()
    self.cohort_wait, self.in_rounds, self.clients = 0.0, 0.0, 0
    self.table_seconds = 0.0
    self.table_io_seconds = 0.0

  def add_call(
    self,
    cohort_wait,
    in_rounds,
    clients,
    table_seconds=0.0,
    table_io_seconds=0.0,
  ):
    self.cohort_wait += cohort_wait
    self.in_rounds += in_rounds
    self.clients += clients
    self.table_seconds += table_seconds
    self.table_io_seconds += table_io_seconds

  def columns(self, examples, rounds):
    interval = max(time.time() - self.start, 1e-9)
    columns = {
      'examples_per_second': examples / interval,
      'rounds_per_second': rounds / interval,
      'clients_per_second': self.clients / interval,
      'round_seconds': self.in_rounds,
      'cohort_wait_seconds': self.cohort_wait,
    }
    if self.table:
      columns['table_seconds'] = self.table_seconds
      columns['table_io_seconds'] = self.table_io_seconds
    return columns


PER_CLIENT_COLUMNS = ('round', 'client_id', 'examples', 'loss', 'update_norm')


def per_client_rows(first_round, clients):
  """CSV rows of the real slots of a call's rounds.

  ``clients``: the round metrics' ``clients`` dict (`engine.finish_round`),
  each leaf [C] for one round or [R, C] for R rounds of one call; round r
  of the call is round ``first_round + r + 1`` (rounds completed).
  """
  arrays = {k: np.asarray(v) for k, v in clients.items()}
  if arrays['slot_mask'].ndim == 1:
    arrays = {k: v[None] for k, v in arrays.items()}
  rows = []
  for r, real in enumerate(arrays['slot_mask']):
    for slot in np.flatnonzero(real):
      rows.append(
        (
          first_round + r + 1,
          int(arrays['client_id'][r, slot]),
          int(arrays['examples'][r, slot]),
          float(arrays['loss'][r, slot]),
          float(arrays['update_norm'][r, slot]),
        )
      )
  return rows


def _keep_rounds(path, last_round, header):
  """Rewrites the CSV ``path`` without rows past ``last_round`` (redone on
  resume); starts it with ``header`` if it does not exist."""
  kept = []
  if os.path.exists(path):
    with open(path, newline='') as f:
      kept = list(csv.reader(f))[1:]
    kept = [r for r in kept if int(r[0]) <= last_round]
  text = io.StringIO(newline='')
  csv.writer(text).writerows([header, *kept])
  _replace_lines(path, [text.getvalue()])


class LogSettings(NamedTuple):
  """What a run records beside metrics.jsonl (built from the config by
  `assemble.log_settings`).

  Attributes:
    ema_weight, top_k: the headline's statistics in each row (its EMA and
      the mean of its top k values so far).
    hparams: the flattened config, shown beside the headline in
      TensorBoard's HParams dashboard and sent to W&B (None: nothing).
    per_client: write each cohort client's training metrics to
      per_client.csv.
    wandb: a Weights & Biases project ('' = none).
  """

  ema_weight: float = 0.9
  top_k: int = 5
  hparams: Optional[Dict[str, Any]] = None
  per_client: bool = False
  wandb: str = ''


class MetricsLog:
  """The evaluation rows of one session of a run, from ``start_round`` on.

  Rows past ``start_round`` left by an earlier session are dropped (they will
  be computed again); the headline's history of the earlier sessions is kept
  for its statistics. Only the chief process (``chief``) writes.
  """

  def __init__(
    self, workdir, start_round, headline, settings: LogSettings, chief
  ):
    self.path = os.path.join(workdir, 'metrics.jsonl')
    self.headline = headline
    self._history = evaluations_of(self.path, headline, start_round)
    self._statistics = dict(
      ema_weight=settings.ema_weight, top_k=settings.top_k
    )
    self._chief = chief
    self.writer = None
    self.wandb = None
    self.per_client_path = None
    if chief:
      truncate_metrics(self.path, start_round)
      self.writer = make_summary_writer(workdir, start_round)
      if self.writer and start_round == 0:
        # TensorBoard's HParams dashboard: the config beside the headline.
        self.writer.add_hparams(
          settings.hparams or {}, [headline, f'{headline}_ema', 'train_loss']
        )
      if settings.per_client:
        self.per_client_path = os.path.join(workdir, 'per_client.csv')
        _keep_rounds(self.per_client_path, start_round, PER_CLIENT_COLUMNS)
      if settings.wandb:
        self.wandb = wandb_log.WandbWriter(
          settings.wandb, workdir, settings.hparams or {}
        )

  def round_metrics(self, first_round, metrics):
    """The training sums of a call's rounds; their per-client part, if any,
    goes to per_client.csv (by the chief)."""
    metrics = dict(metrics)
    clients = metrics.pop('clients', None)
    if clients is not None and self.per_client_path:
      with open(self.per_client_path, 'a', newline='') as f:
        csv.writer(f).writerows(per_client_rows(first_round, clients))
    return metrics

  def append(self, row):
    """Adds the headline's statistics to ``row``, writes it, returns it."""
    self._history.append(row[self.headline])
    row = {
      **row,
      **eval_statistics.headline_statistics(
        self._history, self.headline, **self._statistics
      ),
    }
    if self._chief:
      append_metrics(self.path, self.writer, row)
      if self.wandb:
        self.wandb.log_row(row)
    return row

  def close(self):
    if self.writer:
      self.writer.close()
    if self.wandb:
      self.wandb.close()
