"""A run's workdir: the files `experiment.run` writes there, and reads back.

`write_json` (atomic), the resume checks (`check_resume_config`,
`check_rounds`), checkpoints with fallback (`open_checkpoints`), the
partition / participation files. The evaluation rows (metrics.jsonl,
TensorBoard) are `metrics_log`'s. Rebuilding a saved run (data, model and
a checkpoint) is restore.py's: this module reads and writes files only.
"""

import json
import os
import shutil

from absl import logging
import jax
import numpy as np
import orbax.checkpoint as ocp
import tqdm

from fedjax_metric import (
  client_table,
  config_io,
  engine,
  faults,
  metrics_log,
  workdir_lock,
)
from fedjax_metric.data import on_demand, participation, partition

# Keys whose change between a run and its resumption is harmless.
RESUMABLE_CHANGES = (
  'num_rounds',
  'eval_every',
  'checkpoint_every',
  'progress',
  'logging',
  # Where the table lives changes no number (a resumed run keeps its
  # placement: client_table.choose_placement); nor does what is evaluated.
  'client_table',
  'federated_eval',
)


# ---------------------------------------------------------------------------
# Writing: what experiment.run keeps in the workdir.
# ---------------------------------------------------------------------------


def say(message):
  """User-facing progress lines (stdout, above the progress bar)."""
  if jax.process_index() == 0:
    tqdm.tqdm.write(message)


def write_json(path, obj):
  tmp = path + '.tmp'
  with open(tmp, 'w') as f:
    json.dump(obj, f, indent=2, sort_keys=True)
  os.replace(tmp, path)  # Atomic: a crash never leaves half a file.


def saved_rounds(workdir):
  """Rounds with a checkpoint directory in the workdir (read or not)."""
  directory = os.path.join(workdir, 'checkpoints')
  if not os.path.isdir(directory):
    return []
  return sorted(int(n) for n in os.listdir(directory) if n.isdigit())


def check_resume_config(workdir, config):
  """Refuses to resume a workdir written by a different experiment.

  Differences are named by dotted path (``local.learning_rate``). A workdir
  with neither a checkpoint nor a summary holds nothing a different config
  could spoil (a start that failed, e.g. on a bad data_dir): it is started
  over instead, without the previous attempt's outputs.
  """
  path = os.path.join(workdir, 'config.json')
  if not os.path.exists(path):
    return
  with open(path) as f:
    old = config_io.flatten(json.load(f))
  new = config_io.flatten(json.loads(config.to_json_best_effort()))
  # Fields a newer version added are not in an older run's config.json: the
  # run continues with their values (said once) instead of being refused.
  added = sorted(set(new) - set(old))
  if added:
    say(
      f'{workdir}/config.json predates the field(s) {", ".join(added[:5])}'
      f'{" and more" if len(added) > 5 else ""}; resuming with their values '
      'from this config.'
    )
  _check_extension(workdir, old, new)
  changed = sorted(
    k
    for k in old
    if old[k] != new.get(k, '(absent)')
    and k.split('.')[0] not in RESUMABLE_CHANGES
  )
  if not changed:
    return
  if not saved_rounds(workdir) and not os.path.exists(
    os.path.join(workdir, 'summary.json')
  ):
    say(
      f'{workdir}: an earlier attempt with another config left no '
      'checkpoint; starting over.'
    )
    for name in ('partition.png', 'participation.json', 'participation.png'):
      if os.path.exists(os.path.join(workdir, name)):
        os.remove(os.path.join(workdir, name))
    # A client table without a checkpoint holds nothing to resume, and its
    # placement would bind the new config's run (client_table.stored_placement).
    shutil.rmtree(
      os.path.join(workdir, client_table.TABLE_DIR), ignore_errors=True
    )
    return
  shown = ', '.join(
    f'{k} ({old.get(k, "absent")} -> {new.get(k, "absent")})'
    for k in changed[:5]
  )
  more = f' and {len(changed) - 5} more' if len(changed) > 5 else ''
  raise config_io.ConfigError(
    f'{workdir} holds a run with a different config: {shown}{more}. Use a '
    'new --workdir, or delete this one to start over.'
  )


def rounds_dependence(flat_config):
  """Why a run's result up to any round depends on ``num_rounds``, or None.

  A longer run is the shorter one continued only when nothing it computed
  read T: a cosine learning-rate schedule decays over T, and PMFL's history
  mixing psi (Eq. 11) is a function of T. The participation masks are drawn
  so that a longer mask starts with the shorter one (tests/test_faults.py),
  and cohorts, batches and keys depend on (seed, round, client) only.
  """
  schedule = flat_config.get('local.schedule')
  if schedule in ('cosine', 'warmup_cosine'):
    return f'local.schedule={schedule} decays the learning rate over num_rounds'
  if flat_config.get('algorithm') == 'pmfl':
    return "PMFL's history mixing psi (Eq. 11) is a function of num_rounds"
  if flat_config.get('algorithm') == 'fedproc':
    return "FedProc's loss weight alpha_t = t / T is a function of num_rounds"
  return None


def _check_extension(workdir, old, new):
  """Refuses a changed num_rounds on a workdir with progress when the
  rounds already run depend on it (`rounds_dependence`)."""
  if old.get('num_rounds') == new.get('num_rounds'):
    return
  if not saved_rounds(workdir) and not os.path.exists(
    os.path.join(workdir, 'summary.json')
  ):
    return
  why = rounds_dependence(new)
  if why:
    raise config_io.ConfigError(
      f'{workdir} holds a run of num_rounds={old.get("num_rounds")}; it '
      f'cannot become num_rounds={new.get("num_rounds")}: {why}, so the '
      "rounds already run differ from that run's. Use a new --workdir."
    )


def check_rounds(workdir, config):
  """The finished run's summary when there is nothing left to do, else None.

  Refuses a num_rounds below the rounds a workdir has already done: its
  results would be of another length than asked for. A larger num_rounds
  continues the run.
  """
  rounds = saved_rounds(workdir)
  summary_path = os.path.join(workdir, 'summary.json')
  if os.path.exists(summary_path):
    with open(summary_path) as f:
      summary = json.load(f)
    done = summary.get('rounds_completed')
    if (
      done is not None and rounds and rounds[-1] > max(done, config.num_rounds)
    ):
      # An extension of the finished run was started: its newest model is
      # not the summary's, which the extension's checkpoints may have pruned.
      raise config_io.ConfigError(
        f'{workdir} holds a run finished after {done} rounds and extended '
        f'to a checkpoint of round {rounds[-1]}. Ask for at least '
        f'{rounds[-1]} rounds to finish the extension, or use a new --workdir.'
      )
    if done == config.num_rounds:
      say(f'{workdir} already holds a finished run; nothing to do.')
      return summary
    if done is not None and done > config.num_rounds:
      raise config_io.ConfigError(
        f'{workdir} holds a run finished after {done} rounds; '
        f'--config.num_rounds={config.num_rounds} asks for fewer. Its '
        'metrics.jsonl has every evaluated round; for a shorter run, use a '
        'new --workdir.'
      )
  if rounds and rounds[-1] > config.num_rounds:
    raise config_io.ConfigError(
      f'{workdir} holds a checkpoint of round {rounds[-1]}, past '
      f'--config.num_rounds={config.num_rounds}. Ask for at least '
      f'{rounds[-1]} rounds, or use a new --workdir.'
    )
  return None


def close_checkpoints(checkpoints):
  """Waits for a save in flight and closes the manager; never raises, since
  it runs while another error may be on its way to the user."""
  try:
    checkpoints.wait_until_finished()
    checkpoints.close()
  except Exception as e:  # pylint: disable=broad-except
    logging.warning('Closing the checkpoint manager failed: %s', e)


def previous_wall_time(checkpoints, start_round, metrics_path):
  """Seconds the round loop ran in earlier sessions, up to ``start_round``.

  Saved with each checkpoint; a checkpoint from before that was recorded
  falls back on the last metrics row at or before it (which misses the
  rounds between that evaluation and the checkpoint).
  """
  if not start_round:
    return 0.0
  try:
    with faults.quiet_orbax_notes():
      custom = checkpoints.metadata(start_round).custom_metadata or {}
    if 'total_wall_time' in custom:
      return float(custom['total_wall_time'])
  except Exception:  # pylint: disable=broad-except
    pass  # No step metadata: an older checkpoint.
  rows = [
    r
    for r in metrics_log.read_metrics(metrics_path)
    if r['round'] <= start_round
  ]
  return float(
    rows[-1].get('total_wall_time', rows[-1]['wall_time']) if rows else 0.0
  )


# Populations over this many clients get a summary of their sizes in
# partition.json, not every client's class counts (nor the pictures).
PER_CLIENT_FILE_LIMIT = 10_000


def write_partition_files(workdir, config, experiment):
  """partition.json (+ .png) and, under a participation pattern,
  participation.json (+ .png): what the clients hold and when they train.
  A population over `PER_CLIENT_FILE_LIMIT` clients (or made on demand)
  gets a summary of its sizes only."""
  train, clients, counts = (
    experiment.train,
    experiment.clients,
    experiment.class_counts,
  )
  sizes = on_demand.client_sizes(clients)
  small = len(sizes) <= PER_CLIENT_FILE_LIMIT and train is not None
  if small:
    summary = {
      **partition.summarize(clients, train.labels),
      'class_counts': counts.tolist(),
    }
  else:
    summary = {
      'num_clients': len(sizes),
      'num_examples': int(sizes.sum()),
      'min_size': int(sizes.min()),
      'median_size': float(np.median(sizes)),
      'max_size': int(sizes.max()),
      'size_percentiles': {
        str(q): float(np.percentile(sizes, q)) for q in (10, 50, 90, 99)
      },
    }
  write_json(os.path.join(workdir, 'partition.json'), summary)
  if config.plot_partition and small:
    partition.plot_class_counts(
      counts,
      os.path.join(workdir, 'partition.png'),
      title=f'{config.dataset.name}: {partition.label(config.partition)}',
    )
  plan = experiment.availability
  if plan is None:
    return
  record = {
    'pattern': config.participation.pattern,
    'mean_probability': float(np.mean(plan.probabilities)),
  }
  if small:
    record['probabilities'] = plan.probabilities.tolist()
  if plan.mask is not None:
    record['active_per_round'] = plan.mask.sum(1).tolist()
    if small:
      record['participation_rate'] = plan.mask.mean(0).tolist()
  write_json(os.path.join(workdir, 'participation.json'), record)
  if plan.mask is not None and small:
    participation.plot(
      plan.mask,
      os.path.join(workdir, 'participation.png'),
      title=f'{config.participation.pattern} participation',
    )


def open_checkpoints(config, workdir, state, chief, cleanup):
  """``(manager, restored round or None, state)``: the newest readable
  checkpoint restored into ``state``'s layout (an unreadable one is moved
  aside), and the manager that saves the next ones."""
  checkpoint_dir = os.path.abspath(os.path.join(workdir, 'checkpoints'))
  server_state, client_table = state
  restored_round, restored = faults.restore_newest_readable(
    checkpoint_dir,
    {'server_state': server_state, 'client_table': client_table},
    workdir=workdir,
    chief=chief,
    report=say,
  )
  # An older step without its metadata file (restore_newest_readable did
  # not need it) would get orbax's absl warning, which tells a user nothing.
  with faults.quiet_orbax_notes():
    checkpoints = ocp.CheckpointManager(
      checkpoint_dir,
      options=ocp.CheckpointManagerOptions(
        max_to_keep=config.keep_checkpoints,
        create=True,
        cleanup_tmp_directories=True,
      ),
      item_handlers=ocp.StandardCheckpointHandler(),
    )
  # On an error too: a save still in flight ends cleanly before the error
  # is reported (no orbax traceback after it, no temporary directory).
  cleanup.callback(close_checkpoints, checkpoints)
  if restored_round is not None:
    state = (
      engine.ServerState(*restored['server_state']),
      restored['client_table'],
    )
    say(f'Resuming {workdir} from round {restored_round}.')
    # orbax prunes old checkpoints after a save; a run killed just after one
    # can leave more than keep_checkpoints, and a resume with no round left
    # saves nothing: prune here too.
    if chief:
      for step in sorted(checkpoints.all_steps())[: -config.keep_checkpoints]:
        checkpoints.delete(step)
  return checkpoints, restored_round, state


def diverged_error(workdir, last_saved, config):
  """``(what, round) -> FloatingPointError`` naming the settings that can
  have caused it and what was kept.

  The clients' step can always diverge; the server's only when it is more
  than FedAvg's plain average (an optimizer other than SGD at learning rate
  1 without momentum), and then it is named too.
  """
  if last_saved is None:
    kept = (
      'no checkpoint was saved, so the same --workdir may be rerun '
      'with the change'
    )
  else:
    kept = (
      f'the last good checkpoint (round {last_saved}) in '
      f'{workdir}/checkpoints is kept; rerun the change in a new '
      '--workdir'
    )
  causes = (
    'lower --config.local.learning_rate (now '
    f'{config.local.learning_rate}) or set --config.local.grad_clip_norm'
  )
  server = config.server
  if (server.optimizer, server.learning_rate, server.momentum) != (
    'sgd',
    1.0,
    0.0,
  ):
    causes += (
      '; the server step can too: lower --config.server.learning_rate (now '
      f'{server.learning_rate}, optimizer {server.optimizer})'
    )

  causes = causes[0].upper() + causes[1:]

  def error(what, done):
    return FloatingPointError(f'{what} at round {done}. {causes}; {kept}.')

  return error


def stopped_note(stopped_by, done, last_saved, workdir):
  """What a run stopped by a signal tells the user."""
  if not last_saved:
    return f'Stopped by {stopped_by} before any round; nothing to save.'
  return (
    f'Stopped by {stopped_by} after round {done}; the checkpoint of round '
    f'{last_saved} is in {workdir}/checkpoints. Run the same command again '
    'to resume.'
  )


def check_workdir(workdir, chief):
  """Refuses, before anything is built or written, a workdir no run can use
  now: a path that exists and is not a directory (or lies under one), and,
  on the chief process, a workdir a live run holds
  (`workdir_lock.check_free`). Reads only: the lock itself is taken (`lock`)
  where the first file is written, once every check has passed."""
  path = os.path.abspath(workdir)
  existing = path  # The path's deepest part that exists.
  while not os.path.lexists(existing) and os.path.dirname(existing) != existing:
    existing = os.path.dirname(existing)
  if not os.path.isdir(existing):
    where = '' if existing == path else f': {existing}'
    raise NotADirectoryError(
      f'--workdir={workdir}{where} exists and is not a directory; use '
      'another --workdir.'
    )
  if chief and existing == path:
    workdir_lock.check_free(workdir)


def lock(workdir):
  """The workdir's exclusive lock (`workdir_lock.WorkdirLock`): one run
  writes a workdir at a time; a stale lock is taken over with a note."""
  return workdir_lock.WorkdirLock(workdir, report=say)
