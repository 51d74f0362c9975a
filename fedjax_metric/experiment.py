"""run(config, workdir): one whole federated experiment, read top to bottom.

Workdir contract (README.md, "The workdir"):
  config.json      the resolved config
  partition.json   per-client sizes and class counts; partition.png heatmap
  metrics.jsonl    one JSON object per evaluation: round, wall_time,
                   total_wall_time, eval_seconds, train_loss, test_*
  events.*         TensorBoard scalars, flushed at every evaluation
  checkpoints/     orbax checkpoints of (server_state, client_table)
  summary.json     written at the end; its presence means the run finished

Running again on the same workdir resumes from the last checkpoint. Cohorts,
batches and PRNG keys are functions of (seed, round, client), so a resumed run
ends with the same model as an uninterrupted one (tests/test_experiment.py).

The pieces it calls: assemble.py builds the data, partition, model and
algorithm, and the typed settings of everything below it (the evaluator's,
the metrics log's, the calls'); executors.plan decides how rounds are
called; engine.py is the round; workdir.py reads and writes the workdir's
files. This module is the order they run in. A FedAvg round reads in four
files: this loop (`_Rounds.train`), executors.py (the call: one jitted
program, or the host loop over slots), engine.py (the round: client updates,
weighted sum, server step) and algorithms/fedavg.py (the hooks).

Faults (tests/test_faults.py, tests/test_validation.py, tests/test_workdir.py):
the config is validated before anything is written; a workdir holding
checkpoints or a finished run refuses another config; only good states are
checkpointed (finite, below 2^64 in magnitude, at a round whose evaluation
losses are finite: faults.state_problem, faults.nonfinite_losses); an
unreadable or unverifiable newest checkpoint is moved aside and the run resumes
from the newest readable one; SIGTERM / SIGINT save a checkpoint after the
round in progress and stop.
"""

import contextlib
import json
import os
import time
from typing import Any, Dict, NamedTuple, Optional

import jax
import ml_collections
import numpy as np
import orbax.checkpoint as ocp
import tqdm

from fedjax_metric import (
  assemble,
  engine,
  executors,
  faults,
  memory,
  metrics_log,
  sharding,
  validation,
)
from fedjax_metric import client_table as client_table_lib
from fedjax_metric import workdir as workdir_lib
from fedjax_metric.data import cohort as cohort_lib
from fedjax_metric.data import on_demand

say = workdir_lib.say


class Trained(NamedTuple):
  """What `train` returns.

  Attributes:
    summary: as `run` returns it.
    variables: the final global model's variables (this process's copy);
      None when
      the run did not end here (stopped early, or finished by an earlier
      call), so that a caller reads them from the checkpoint instead.
  """

  summary: Dict[str, Any]
  variables: Any


def run(
  config: ml_collections.ConfigDict,
  workdir: str,
  *,
  stop_after_round: Optional[int] = None,
) -> Dict[str, Any]:
  """Trains ``config`` into ``workdir`` and returns the summary dict.

  Args:
    config: a config from configs/ (see fedjax_metric/settings.py for every field).
    workdir: output directory; an existing one is resumed.
    stop_after_round: stop (with a checkpoint) once this many rounds are done,
      as a preempted job would (evaluating only on the run's schedule); a
      later call resumes.

  Returns:
    The summary; after a SIGTERM / SIGINT (a checkpoint saved, the run
    stopped early) it has ``stopped_by`` (the signal's name) and no
    summary.json is written.
  """
  return train(config, workdir, stop_after_round=stop_after_round).summary


def train(
  config: ml_collections.ConfigDict,
  workdir: str,
  *,
  stop_after_round: Optional[int] = None,
) -> Trained:
  """`run`, also returning the final variables it holds (`Trained`): the
  Python API's result needs them, and rebuilding the run from its
  checkpoint to read them would build data, model and client table twice."""
  with (
    executors.matmul_precision(config.precision),
    faults.StopSignals() as stop,
    contextlib.ExitStack() as cleanup,
  ):
    return _run(config, workdir, stop_after_round, stop, cleanup)


def _run(config, workdir, stop_after_round, stop, cleanup):
  """`run`'s body, inside the config's matmul precision; ``cleanup`` closes
  what it opens, on errors too. The order: checks, set-up, the workdir
  written, the rounds with their periodic actions, the summary."""
  # With several processes (one workdir on a shared file system) process 0
  # writes every file but the checkpoints, which all processes save together.
  chief = jax.process_index() == 0
  # First the workdir, in a few milliseconds: a path that is not a directory,
  # and a workdir another live run holds, are refused before the data and
  # model are built (seconds) and before the run prints anything. Read only:
  # the lock is taken where the first file is written; a run that takes it
  # in between is refused there.
  workdir_lib.check_workdir(workdir, chief)
  validation.validate(config)
  workdir_lib.check_resume_config(workdir, config)
  finished = workdir_lib.check_rounds(workdir, config)
  if finished is not None:
    return Trained(finished, None)
  # Nothing is written until every check that can fail before training has
  # passed (data, partition, model, algorithm, devices, memory): a failed
  # start leaves nothing behind.
  setup = _set_up(config, workdir)
  loop = _Rounds(config, workdir, setup, chief, cleanup)
  end_round = config.num_rounds
  if stop_after_round is not None:
    end_round = min(end_round, stop_after_round)
  calls = loop.plan(end_round)
  for first in calls:
    if stop.agreed():
      break
    loop.train(first)
    # On the run's schedule, not the stop's: a run stopped off it (as a
    # preempted one is) logs the rows an uninterrupted run logs, so the
    # headline's EMA and top-k agree after the resume.
    if _due(loop.done, config.eval_every, config.num_rounds):
      loop.evaluate()
    if _due(loop.done, config.checkpoint_every, end_round):
      loop.checkpoint()
    faults.pause_if_asked(workdir, loop.done, stop, loop.checkpoints)
  stopped_by = stop.agreed() if loop.done < end_round else None
  if stopped_by is not None:
    with stop.finishing_save():
      if loop.last_saved != loop.done and loop.done > loop.start_round:
        loop.checkpoint()
      # Said once the save is on disk, not while it is still being written.
      loop.checkpoints.wait_until_finished()
    say(
      workdir_lib.stopped_note(stopped_by, loop.done, loop.last_saved, workdir)
    )
  return loop.finish(end_round, stopped_by)


def _due(done, every, end_round):
  """A periodic action's round: every ``every`` rounds and the last one."""
  return done % every == 0 or done == end_round


class _SetUp(NamedTuple):
  """What is built before anything is written: the data, model and
  algorithm (`assemble.build`), the executor's choice and mesh, the
  evaluator, the cohort's shape and the initial state."""

  choice: Any
  experiment: Any
  spec: Any
  mesh: Any
  put: Any
  evaluator: Any
  num_steps: int
  num_slots: int
  data: Any
  memory_budget: Any
  placement: Any
  layout: Any
  state: Any


def _set_up(config, workdir) -> _SetUp:
  """Data, partition, model, algorithm, executor, evaluator and the initial
  state; the first client traced. Raises on any problem, writing nothing."""
  choice = executors.choose_executor(
    config.executor, chunk_size=config.chunk_size
  )
  experiment = assemble.build(
    config, one_program=executors.round_is_one_program(choice)
  )
  spec = assemble.build_round_spec(
    config, experiment.algorithm, experiment.train_preprocess
  )
  mesh = None  # The host executor places nothing on a mesh.
  if choice.name != 'host':
    mesh = sharding.make_mesh(config.num_devices or None)
  num_devices = mesh.size if mesh else 1
  put = (lambda x: sharding.replicate(x, mesh)) if mesh else jax.device_put
  train = experiment.train
  evaluator = assemble.make_evaluator(config, experiment)
  num_steps = assemble.num_local_steps(config, experiment.clients)
  num_slots = assemble.num_cohort_slots(
    config, num_devices, experiment.availability
  )
  if train is None:  # Clients made on demand (data/on_demand.py).
    # Each call brings the examples made for it; this is one round's
    # shape, for planning.
    data = put(
      assemble.round_data_template(experiment, num_slots, num_steps, config)
    )
  else:
    data = put(engine.DeviceData(train.images, train.labels.astype(np.int32)))
  say(
    assemble.describe(
      config, experiment, choice, num_devices, num_slots, num_steps
    )
  )
  # Fresh state; where the client table lives.
  memory_budget = memory.device_budget(config.memory_budget_gb)
  placement, layout = assemble.table_placement(config, experiment, workdir)
  if placement.name == 'device':
    state = assemble.initial_state(config, experiment)
  else:
    say(f'Client table: {placement.reason}.')
    # The checkpoint holds the server state and which rows were written;
    # the rows themselves are in the workdir's rows file.
    state = (
      assemble.initial_server_state(config, experiment),
      client_table_lib.checkpoint_template(config.num_clients),
    )
  # An error a hook raises while tracing (a model without the outputs an
  # algorithm reads) appears here, before the workdir is written.
  assemble.trace_one_client(
    config, experiment, spec, data, state[0], num_slots, num_steps
  )
  return _SetUp(
    choice,
    experiment,
    spec,
    mesh,
    put,
    evaluator,
    num_steps,
    num_slots,
    data,
    memory_budget,
    placement,
    layout,
    state,
  )


class _Rounds:
  """The round loop's state and its periodic actions: `train` (one call of
  R rounds), `evaluate` (and log), `checkpoint`, `finish` (the summary).

  Created once the set-up has passed every check: it writes the workdir
  (lock, partition files, config), restores the newest checkpoint and opens
  the client table off the device, the metrics log and the progress bar.
  """

  def __init__(self, config, workdir, setup: _SetUp, chief, cleanup):
    self.config, self.workdir, self.setup = config, workdir, setup
    self.chief, self.cleanup = chief, cleanup
    os.makedirs(workdir, exist_ok=True)
    if chief:
      # One run per workdir, from here until `_run` returns.
      cleanup.enter_context(workdir_lib.lock(workdir))
      # Checked again under the lock: a run that held the workdir between
      # `_run`'s checks and here may have finished it or written another
      # config, which this run must not overwrite.
      workdir_lib.check_resume_config(workdir, config)
      if workdir_lib.check_rounds(workdir, config) is not None:
        raise validation.ConfigError(
          f'{workdir} was finished by another run while this one started; '
          'run the command again to read its result.'
        )
      workdir_lib.write_partition_files(workdir, config, setup.experiment)
      workdir_lib.write_json(
        os.path.join(workdir, 'config.json'),
        json.loads(config.to_json_best_effort()),
      )
    state = setup.state
    if setup.mesh:
      # Before restoring: orbax then reads straight into the mesh's layout.
      state = setup.put(state)
    self.checkpoints, restored_round, (self.server_state, self.client_table) = (
      workdir_lib.open_checkpoints(config, workdir, state, chief, cleanup)
    )
    self.table = None  # The client table when it lives off the device.
    if setup.placement.name != 'device':
      self.table = assemble.open_table(
        config,
        setup.experiment,
        setup.placement,
        setup.layout,
        workdir,
        setup.num_slots,
      )
      cleanup.callback(self.table.close)
      self.table.open(restored_round, self.client_table['written'])
      self.client_table = ()
    self.start_round = self.done = restored_round or 0
    self.last_saved = restored_round  # The newest checkpoint on disk.
    self.cohort_for = assemble.cohort_fn(
      config, setup.experiment, setup.num_slots, setup.num_steps
    )
    self.driver = None  # Runs the calls when the table is off the device.
    self.train_sums = []  # Dicts of device arrays [R]; read at evaluation.
    self.last = {}  # The newest evaluation row.

  def plan(self, end_round):
    """Decides how rounds are called (`executors.plan`: R rounds a call),
    opens the metrics log and starts the clock, then the inputs' read-ahead.
    Returns the calls' first rounds."""
    self._choose_executor(end_round)
    self._open_log_and_clock()
    calls = range(self.start_round, end_round, self.rounds_per_call)
    self._start_read_ahead(calls)
    return calls

  def _choose_executor(self, end_round):
    """Sets `choice`, `rounds_per_call` and `rounds_fn` (`executors.plan`),
    within the memory budget left by the table's rows and generated data."""
    config, setup, table = self.config, self.setup, self.table
    generated = setup.experiment.train is None
    self.choice, self.rounds_per_call, self.rounds_fn = executors.plan(
      assemble.call_settings(config),
      setup.choice,
      setup.spec,
      setup.data,
      (
        self.server_state,
        self.client_table
        if table is None
        else client_table_lib.rows_template(setup.layout, setup.num_slots),
      ),
      self.cohort_for,
      round_range=(self.start_round, end_round),
      memory_budget=setup.memory_budget,
      num_slots=setup.num_slots,
      mesh=setup.mesh,
      report=say,
      extra_bytes_per_round=(
        0 if table is None else setup.num_slots * setup.layout.row_bytes
      )
      + (memory.tree_bytes(setup.data) if generated else 0),
    )

  def _open_log_and_clock(self):
    """The metrics log, the wall clock (with earlier sessions' seconds), the
    throughput counters and the progress bar."""
    config = self.config
    self.log = metrics_log.MetricsLog(
      self.workdir,
      self.start_round,
      self.setup.evaluator.headline,
      assemble.log_settings(config),
      self.chief,
    )
    self.cleanup.callback(self.log.close)
    # Seconds spent in the round loop by earlier sessions of this run.
    self.time_before = workdir_lib.previous_wall_time(
      self.checkpoints, self.start_round, self.log.path
    )
    self.start_time = time.time()
    self.throughput = metrics_log.Throughput(table=self.table is not None)
    self.bar = tqdm.tqdm(
      initial=self.start_round,
      total=config.num_rounds,
      desc=config.algorithm,
      disable=not (config.progress and self.chief),
      dynamic_ncols=True,
    )
    self.cleanup.callback(self.bar.close)

  def _start_read_ahead(self, calls):
    """Builds the calls' inputs ahead of the device: a prefetch thread, or,
    with the table off the device, the driver that also moves its rows."""
    setup = self.setup
    if self.table is None:
      self.call_inputs = cohort_lib.prefetch(self._inputs_for_call, calls)
    else:
      self.driver = client_table_lib.OffDeviceRounds(
        self.rounds_fn,
        self.table,
        self._inputs_for_call,
        calls,
        rounds_per_call=self.rounds_per_call,
        num_slots=setup.num_slots,
        put=setup.put,
        overlap=self.config.client_table.prefetch,
      )
      self.cleanup.callback(self.driver.close)

  def _inputs_for_call(self, first):
    """A call's cohorts, and for clients made on demand their examples."""
    rounds = range(first, first + self.rounds_per_call)
    cohorts = [self.cohort_for(r) for r in rounds]
    if self.setup.experiment.train is not None:
      return on_demand.CallData(cohorts, None)
    call = on_demand.call_data(cohorts, self.setup.experiment.clients)
    return call._replace(data=self.setup.put(call.data))

  def train(self, first):
    """One call: R rounds from round ``first``; their metrics stay on the
    device until the next evaluation."""
    table, driver = self.table, self.driver
    wait_start = time.perf_counter()
    if table is None:
      cohorts, call_data = next(self.call_inputs)
      call_start = time.perf_counter()
      self.server_state, self.client_table, round_metrics = self.rounds_fn(
        self.server_state, self.client_table, cohorts, call_data
      )
    else:
      before = (driver.wait_seconds, driver.table_seconds, table.io_seconds)
      self.server_state, round_metrics, cohorts = driver.run(
        self.server_state, first
      )
      waited, handled, io = (
        driver.wait_seconds - before[0],
        driver.table_seconds - before[1],
        table.io_seconds - before[2],
      )
      call_start = wait_start + waited
    round_metrics = jax.block_until_ready(round_metrics)
    self.throughput.add_call(
      call_start - wait_start,
      time.perf_counter() - call_start,
      sum(int(np.count_nonzero(c.slot_mask)) for c in cohorts),
      0.0 if table is None else handled,
      0.0 if table is None else io,
    )
    self.train_sums.append(
      self.log.round_metrics(first, sharding.local_copy(round_metrics))
    )
    self.done = first + self.rounds_per_call
    self.bar.update(self.rounds_per_call)

  def _diverged(self):
    """The error class a diverged run raises (names its checkpoints)."""
    return workdir_lib.diverged_error(
      self.workdir, self.last_saved, self.config
    )

  def evaluate(self):
    """Evaluates the global model and appends the metrics row (training
    metrics since the last row, speed, evaluation); stops the run if an
    evaluation loss is not finite."""
    evaluator, done = self.setup.evaluator, self.done
    train_row, examples, rounds = metrics_log.train_row(
      self.train_sums, done, self._diverged()
    )
    self.train_sums = []
    # Since the last evaluation (the first interval includes compiling).
    speed = self.throughput.columns(examples, rounds)
    # Stamped after the evaluation, so that a row's wall_time covers its
    # own evaluation (the first one compiles the evaluation programs) and
    # the next row's difference is that row's training and evaluation.
    eval_start = time.time()
    evaluation = evaluator.every(
      *sharding.local_copy((self.server_state, self.table_for_evaluation()))
    )
    self.last = self.log.append(
      {
        'round': done,
        'wall_time': time.time() - self.start_time,
        'total_wall_time': self.total_time(),
        'eval_seconds': time.time() - eval_start,
        **train_row,
        **speed,
        **evaluation,
      }
    )
    # Written, to show why; not a good round to checkpoint or go on from.
    nonfinite = faults.nonfinite_losses(evaluation)
    if nonfinite:
      raise self._diverged()(f"The evaluation's {', '.join(nonfinite)}", done)
    self.throughput.restart()
    headline = evaluator.headline
    self.bar.set_postfix({headline: f'{self.last[headline]:.4f}'})

  def checkpoint(self):
    """Saves a good state (faults.state_problem: finite, every value below
    2^64 in magnitude); any other stops the run, keeping the last good
    checkpoint. (A round whose evaluation loss is not finite stopped it at
    its evaluation, before this.)"""
    round_idx, table = self.done, self.table
    if self.driver is not None:
      self.driver.settle()
    problem = faults.state_problem((self.server_state, self.client_table))
    if problem is None and table is not None:
      if table.nonfinite_round is not None:  # Rows off the device.
        problem = 'NaN, infinite or 2^64-sized values in client rows'
    if problem is not None:
      raise self._diverged()(f'The model holds {problem}', round_idx)
    saved_table = self.client_table
    if table is not None:
      saved_table = {'written': table.before_checkpoint(round_idx)}
    item = {'server_state': self.server_state, 'client_table': saved_table}
    self.checkpoints.save(
      round_idx,
      args=ocp.args.StandardSave(item),
      custom_metadata={
        'total_wall_time': self.total_time(),
        # Of the item as saved (restore_newest_readable checks it).
        'sha256': faults.state_digest(item),
      },
    )
    if table is not None:
      table.after_checkpoint(round_idx, self.checkpoints.all_steps())
    self.last_saved = round_idx

  def table_for_evaluation(self):
    """The table an evaluator is given: off the device, only to one that
    reads it (every row then comes to host memory)."""
    if self.table is None:
      return self.client_table
    if not self.setup.evaluator.reads_client_table:
      return ()
    self.driver.settle()
    return self.table.arrays()

  def total_time(self):
    return self.time_before + time.time() - self.start_time

  def finish(self, end_round, stopped_by) -> Trained:
    """Closes the checkpoints and the log; returns the summary (written as
    summary.json, with the final evaluation, once every round is done)."""
    self.checkpoints.wait_until_finished()
    self.checkpoints.close()
    self.log.close()
    setup, evaluator = self.setup, self.setup.evaluator
    rounds_completed = (
      self.done if stopped_by is not None else max(end_round, self.start_round)
    )
    last = self.last
    if not last and self.start_round == rounds_completed:
      # Resumed at the very end (killed after the last checkpoint, before
      # summary.json): that round's evaluation row is already written.
      last = metrics_log.metrics_row(self.log.path, rounds_completed)
    summary = {
      'rounds_completed': rounds_completed,
      'workdir': self.workdir,
      'executor': self.choice.name,
      'chunk_size': self.choice.chunk_size,
      'rounds_per_call': self.rounds_per_call,
      'conv_impl': getattr(setup.experiment.model.module, 'conv_impl', None),
      'backend': jax.default_backend(),
      'num_steps': setup.num_steps,
      'num_slots': setup.num_slots,
      'wall_time': time.time() - self.start_time,
      'total_wall_time': self.total_time(),
      'headline': evaluator.headline,
      **last,
    }
    if stopped_by is not None:
      summary['stopped_by'] = stopped_by
    variables = None
    if rounds_completed == self.config.num_rounds:
      state = sharding.local_copy(
        (self.server_state, self.table_for_evaluation())
      )
      if evaluator.headline not in summary:  # Resumed at the very end.
        summary.update(evaluator.every(*state))
      summary.update(evaluator.final(*state))
      if self.chief:
        workdir_lib.write_json(
          os.path.join(self.workdir, 'summary.json'), summary
        )
      variables = state[0].variables
    return Trained(summary, variables)
