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
ends with the same model as an uninterrupted one (tests/test_train.py).

Faults (tests/test_faults.py): the config is validated before anything is
written; a workdir holding checkpoints or a finished run refuses another
config; no checkpoint is saved with non-finite values; an unreadable newest
checkpoint is moved aside and the run resumes from the newest readable one;
SIGTERM / SIGINT save a checkpoint after the round in progress and stop.
"""

import concurrent.futures
import contextlib
import inspect
import json
import math
import os
import time
from typing import Any, Dict, Optional

from absl import logging
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import orbax.checkpoint as ocp
import tqdm

from fedjax_metric import (
  algorithms,
  engine,
  executors,
  faults,
  memory,
  models,
  optimizers,
  sharding,
  validation,
)
from fedjax_metric.data import augment, participation, partition, sources
from fedjax_metric.data import cohort as cohort_lib
from fedjax_metric.evaluation import protocols

# Keys whose change between a run and its resumption is harmless.
RESUMABLE_CHANGES = ('num_rounds', 'eval_every', 'checkpoint_every', 'progress')


# ---------------------------------------------------------------------------
# Set-up pieces (each a small function a notebook can call on its own).
# ---------------------------------------------------------------------------


def make_partition(config, labels):
  """The per-client index arrays the config asks for."""
  p = config.partition
  n = config.num_clients
  if p.method == 'iid':
    return partition.iid(labels, n, seed=config.seed)
  if p.method == 'dirichlet':
    return partition.dirichlet(
      labels,
      n,
      p.alpha,
      seed=config.seed,
      variant=p.variant,
      min_size=p.min_size,
    )
  if p.method == 'shards':
    return partition.shards(labels, n, p.classes_per_client, seed=config.seed)
  if p.method == 'one_class':
    return one_class_partition(config, labels)
  if p.method == 'quantity':
    return partition.quantity(
      labels,
      n,
      seed=config.seed,
      distribution=p.size_distribution,
      alpha=p.alpha,
      exponent=p.power_law_exponent,
      min_size=max(p.min_size, 1),
    )
  raise ValueError(
    f'Unknown partition.method {p.method!r}; use iid, dirichlet, '
    'shards, one_class or quantity.'
  )


def one_class_partition(config, labels):
  """One class per client, ``partition.clients_per_class`` clients per class.

  Raises:
    ValueError: num_clients is not classes x clients_per_class, or a client
      would get no data.
  """
  k = config.partition.clients_per_class
  num_classes = len(np.unique(labels))
  if k < 1 or config.num_clients != k * num_classes:
    raise ValueError(
      f'partition.method=one_class gives each of the {num_classes} classes '
      f'to clients_per_class={k} clients, i.e. {k * num_classes} clients, '
      f'but num_clients={config.num_clients}. Set --config.num_clients='
      f'{max(k, 1) * num_classes} (and clients_per_round), or '
      '--config.partition.clients_per_class to num_clients / '
      f'{num_classes}.'
    )
  clients = partition.one_class(labels, clients_per_class=k, seed=config.seed)
  empty = [j for j, idx in enumerate(clients) if len(idx) == 0]
  if empty:
    raise ValueError(
      f'Clients {empty[:10]} have no data; lower '
      '--config.partition.clients_per_class.'
    )
  return clients


def partition_label(p):
  if p.method == 'dirichlet':
    return f'dirichlet {p.variant}, alpha={p.alpha}'
  if p.method == 'shards':
    return f'shards, {p.classes_per_client} classes per client'
  if p.method == 'quantity':
    if p.size_distribution == 'power_law':
      return f'quantity, power law exponent={p.power_law_exponent}'
    return f'quantity, dirichlet alpha={p.alpha}'
  return p.method


def build_model(
  model_config,
  num_classes,
  input_shape=None,
  precision='default',
  *,
  one_program=False,
):
  """``config.model`` is ``name`` plus that model's constructor fields.

  ``conv_impl='auto'`` becomes 'patches' when ``one_program`` (the model
  trains inside a single-program round: vmap, chunked, sequential) and
  'xla' otherwise (`executors.resolve_conv_impl`); both forms have the same
  parameters.
  """
  kwargs = {k: v for k, v in model_config.items() if k != 'name'}
  if 'conv_impl' in kwargs:
    kwargs['conv_impl'] = executors.resolve_conv_impl(
      kwargs['conv_impl'], one_program
    )
    if kwargs['conv_impl'] == 'implicit' and jax.default_backend() != 'gpu':
      logging.warning(
        "conv_impl='implicit' compiles Triton kernels for NVIDIA GPUs; on "
        "%s they run in Pallas' interpreter: correct, but many times slower "
        "than 'patches' (--config.model.conv_impl=auto).",
        jax.default_backend(),
      )
  compute_dtype = jnp.bfloat16 if precision == 'bf16' else None
  try:
    return models.build(
      model_config.name,
      num_classes,
      input_shape,
      compute_dtype=compute_dtype,
      **kwargs,
    )
  except TypeError as e:
    raise ValueError(
      f'config.model fields {sorted(kwargs)} do not fit model '
      f'{model_config.name!r} ({e}). Set the model block to the '
      'fields that model declares (see its module).'
    ) from e


# Facts of the run (not knobs) that an algorithm factory may declare as
# keyword parameters: PMFL's psi schedule needs T, FedAU's known_prob
# aggregation the true participation probabilities.
RUN_FACTS = ('num_rounds', 'participation_probabilities')


def build_algorithm(config, model, participation_probabilities=None):
  """The config's `engine.Algorithm`, with its server optimizer inside.

  A factory that declares a keyword in `RUN_FACTS` receives it from the run:
  ``num_rounds`` = config.num_rounds and ``participation_probabilities``
  ([N] true p_n, or None). Setting one in algorithm_kwargs is an error.
  """
  if config.algorithm not in algorithms.REGISTRY:
    raise ValueError(
      f'Unknown algorithm {config.algorithm!r}; registered: '
      f'{sorted(algorithms.REGISTRY)}.'
    )
  s = config.server
  server_optimizer = optimizers.make_server_optimizer(
    s.optimizer,
    learning_rate=s.learning_rate,
    momentum=s.momentum,
    b1=s.b1,
    b2=s.b2,
    eps=s.eps,
  )
  kwargs = dict(config.algorithm_kwargs)
  factory = algorithms.REGISTRY[config.algorithm]
  declared = inspect.signature(factory).parameters
  facts = {
    'num_rounds': config.num_rounds,
    'participation_probabilities': participation_probabilities,
  }
  for name, value in facts.items():
    if name in kwargs:
      raise ValueError(
        f'algorithm_kwargs.{name} is set by the run '
        f'({RUN_FACTS} come from the config); remove it.'
      )
    if name in declared:
      kwargs[name] = value
  try:
    return factory(
      model, server_optimizer=server_optimizer, weighting=s.weighting, **kwargs
    )
  except TypeError as e:
    raise ValueError(
      f'algorithm_kwargs {sorted(kwargs)} do not fit algorithm '
      f'{config.algorithm!r}: {e}'
    ) from e


def build_round_spec(config, algorithm, preprocess):
  lc = config.local
  client_optimizer = optimizers.make_client_optimizer(
    lc.optimizer,
    momentum=lc.momentum,
    nesterov=lc.nesterov,
    weight_decay=lc.weight_decay,
    grad_clip_norm=lc.grad_clip_norm,
  )
  schedule = optimizers.make_round_schedule(
    lc.learning_rate,
    kind=lc.schedule,
    decay_rate=lc.decay_rate,
    num_rounds=config.num_rounds,
    warmup_rounds=lc.warmup_rounds,
  )
  return engine.RoundSpec(
    algorithm,
    client_optimizer,
    schedule,
    preprocess,
    config.seed,
    local_epoch_decay=lc.epoch_decay,
    batch_size=lc.batch_size,
  )


def participation_mask(config, class_counts):
  """``(probabilities [N], mask [T, N])`` of the config's pattern, or None.

  With ``participation.pattern = 'uniform'`` (the default) every round draws
  ``clients_per_round`` clients uniformly (`cohort.sample_clients`) and no
  mask exists. Other patterns give each client its own probability, tied to
  its label histogram, and a fixed availability mask; both are functions of
  the seed, so a resumed run rebuilds the same mask.
  """
  p = config.participation
  if p.pattern == 'uniform':
    return None
  probs = participation.probabilities(
    class_counts,
    mean=p.mean,
    floor=p.floor,
    beta=p.beta,
    seed=config.seed,
    normalize=p.normalize,
  )
  mask = participation.sample(
    probs,
    config.num_rounds,
    p.pattern,
    seed=config.seed,
    markov_rate=p.markov_rate,
    cycle=p.cycle,
  )
  return probs, mask


def prefetch(fn, keys):
  """Yields ``fn(k)`` for each k of ``keys``, computing the next in a thread.

  The host builds the next call's cohorts (NumPy) while the device runs the
  current call, so cohort building leaves the critical path.
  """
  keys = list(keys)
  with concurrent.futures.ThreadPoolExecutor(max_workers=1) as pool:
    pending = pool.submit(fn, keys[0]) if keys else None
    for following in keys[1:] + [None]:
      current = pending
      pending = pool.submit(fn, following) if following is not None else None
      yield current.result()


def num_cohort_slots(config, num_devices: int, mask=None) -> int:
  """C: clients per round (the most active in any round under a
  participation pattern), padded up to a multiple of the device count."""
  most = (
    config.clients_per_round if mask is None else participation.max_active(mask)
  )
  return num_devices * math.ceil(most / num_devices)


# ---------------------------------------------------------------------------
# Workdir I/O.
# ---------------------------------------------------------------------------


def say(message):
  """User-facing progress lines (stdout, above the progress bar)."""
  if not _QUIET and jax.process_index() == 0:
    tqdm.tqdm.write(message)


_QUIET = False


def _write_json(path, obj):
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
    old = dict(validation.flatten(json.load(f)))
  new = dict(validation.flatten(json.loads(config.to_json_best_effort())))
  # Fields a newer version added are not in an older run's config.json: the
  # run continues with their values (said once) instead of being refused.
  added = sorted(set(new) - set(old))
  if added:
    say(
      f'{workdir}/config.json predates the field(s) {", ".join(added[:5])}'
      f'{" and more" if len(added) > 5 else ""}; resuming with their values '
      'from this config.'
    )
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
    return
  shown = ', '.join(
    f'{k} ({old.get(k, "absent")} -> {new.get(k, "absent")})'
    for k in changed[:5]
  )
  more = f' and {len(changed) - 5} more' if len(changed) > 5 else ''
  raise validation.ConfigError(
    f'{workdir} holds a run with a different config: {shown}{more}. Use a '
    'new --workdir, or delete this one to start over.'
  )


def check_rounds(workdir, config):
  """The finished run's summary when there is nothing left to do, else None.

  Refuses a num_rounds below the rounds a workdir has already done: its
  results would be of another length than asked for. A larger num_rounds
  continues the run.
  """
  summary_path = os.path.join(workdir, 'summary.json')
  if os.path.exists(summary_path):
    with open(summary_path) as f:
      summary = json.load(f)
    done = summary.get('rounds_completed')
    if done == config.num_rounds:
      say(f'{workdir} already holds a finished run; nothing to do.')
      return summary
    if done is not None and done > config.num_rounds:
      raise validation.ConfigError(
        f'{workdir} holds a run finished after {done} rounds; '
        f'--config.num_rounds={config.num_rounds} asks for fewer. Its '
        'metrics.jsonl has every evaluated round; for a shorter run, use a '
        'new --workdir.'
      )
  rounds = saved_rounds(workdir)
  if rounds and rounds[-1] > config.num_rounds:
    raise validation.ConfigError(
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
    custom = checkpoints.metadata(start_round).custom_metadata or {}
    if 'total_wall_time' in custom:
      return float(custom['total_wall_time'])
  except Exception:  # pylint: disable=broad-except
    pass  # No step metadata: an older checkpoint.
  if not os.path.exists(metrics_path):
    return 0.0
  with open(metrics_path) as f:
    rows = [json.loads(line) for line in f if line.strip()]
  rows = [r for r in rows if r['round'] <= start_round]
  return float(
    rows[-1].get('total_wall_time', rows[-1]['wall_time']) if rows else 0.0
  )


def truncate_metrics(path, last_round):
  """Drops metric lines past the restored checkpoint (they will be redone)."""
  if not os.path.exists(path):
    return
  with open(path) as f:
    lines = [line for line in f if line.strip()]
  kept = [line for line in lines if json.loads(line)['round'] <= last_round]
  with open(path, 'w') as f:
    f.writelines(kept)


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


# ---------------------------------------------------------------------------
# The experiment.
# ---------------------------------------------------------------------------


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
      as a preempted job would; a later call resumes.

  Returns:
    The summary; after a SIGTERM / SIGINT (a checkpoint saved, the run
    stopped early) it has ``stopped_by`` (the signal's name) and no
    summary.json is written.
  """
  with (
    executors.matmul_precision(config.precision),
    faults.StopSignals() as stop,
    contextlib.ExitStack() as cleanup,
  ):
    return _run(config, workdir, stop_after_round, stop, cleanup)


def _run(config, workdir, stop_after_round, stop, cleanup):
  """`run`'s body, inside the config's matmul precision; ``cleanup`` closes
  what it opens, on errors too."""
  # Before anything is written: a failed start must leave nothing behind.
  validation.validate(config)
  check_resume_config(workdir, config)
  finished = check_rounds(workdir, config)
  if finished is not None:
    return finished
  os.makedirs(workdir, exist_ok=True)
  summary_path = os.path.join(workdir, 'summary.json')
  # With several processes (one workdir on a shared file system) process 0
  # writes every file but the checkpoints, which all processes save together.
  chief = jax.process_index() == 0

  # ----- Data and partition (host, NumPy). -----
  ds = config.dataset
  data_dir = ds.data_dir or None
  train = sources.load(ds.name, 'train', data_dir)
  test = sources.load(ds.name, 'test', data_dir)
  train, validation_split = sources.hold_out(train, ds.validation_fraction)
  clients = make_partition(config, train.labels)
  counts = partition.class_counts(train.labels, clients, train.num_classes)
  if chief:
    _write_json(
      os.path.join(workdir, 'partition.json'),
      {
        **partition.summarize(clients, train.labels),
        'class_counts': counts.tolist(),
      },
    )
  if chief and config.plot_partition:
    partition.plot_class_counts(
      counts,
      os.path.join(workdir, 'partition.png'),
      title=f'{ds.name}: {partition_label(config.partition)}',
    )

  active = participation_mask(config, counts)
  # The true p_n (FedAU's known_prob): K / N under the uniform sampler.
  probs = np.full(
    config.num_clients, config.clients_per_round / config.num_clients
  )
  if active is not None:
    probs, active = active
    if chief:
      _write_json(
        os.path.join(workdir, 'participation.json'),
        {
          'pattern': config.participation.pattern,
          'probabilities': probs.tolist(),
          'participation_rate': active.mean(0).tolist(),
          'active_per_round': active.sum(1).tolist(),
        },
      )
      participation.plot(
        active,
        os.path.join(workdir, 'participation.png'),
        title=f'{config.participation.pattern} participation',
      )
    active = active.astype(bool)

  # ----- Model, algorithm, executor. -----
  mean, std = augment.channel_stats(train.images)
  train_preprocess = augment.make_preprocess(mean, std, ds.augmentation)
  eval_preprocess = augment.make_preprocess(mean, std, 'none')
  choice = executors.choose_executor(
    config.executor, chunk_size=config.chunk_size
  )
  # The clients' program and the evaluation (one model, large batches) may
  # want different convolution forms; the parameters are the same.
  model, eval_model = (
    build_model(
      config.model,
      train.num_classes,
      train.images.shape[1:],
      config.precision,
      one_program=one_program,
    )
    for one_program in (executors.round_is_one_program(choice), False)
  )
  conv_impl = getattr(model.module, 'conv_impl', None)  # for the log
  variables = model.init(
    jax.random.key(config.seed),
    eval_preprocess(jnp.asarray(train.images[:1]), None),
  )
  algorithm = build_algorithm(config, model, probs)
  spec = build_round_spec(config, algorithm, train_preprocess)
  mesh = None
  num_devices = 1
  if choice.name != 'host':
    mesh = sharding.make_mesh(config.num_devices or None)
    num_devices = mesh.size
  put = (lambda x: sharding.replicate(x, mesh)) if mesh else jax.device_put
  data = put(engine.DeviceData(train.images, train.labels.astype(np.int32)))
  evaluator = protocols.make_evaluator(
    config,
    model=eval_model,
    preprocess=eval_preprocess,
    train=train,
    test=test,
    clients=clients,
    validation=validation_split,
  )
  lc = config.local
  client_sizes = [len(c) for c in clients]
  num_steps = cohort_lib.num_local_steps(
    client_sizes,
    batch_size=lc.batch_size,
    local_epochs=lc.epochs,
    local_steps=lc.steps,
  )
  num_slots = num_cohort_slots(config, num_devices, active)
  per_round = (
    config.clients_per_round
    if active is None
    else f'{config.participation.pattern} participation, '
    f'{active.sum(1).mean():.1f}'
  )
  say(
    f'{config.algorithm} on {ds.name}: {config.num_clients} clients, '
    f'{per_round} per round in {num_slots} slots, {num_steps} '
    f'local steps of {lc.batch_size}; executor={choice.name} on '
    f'{num_devices} {jax.default_backend()} device(s)'
    + (f', convolutions: {conv_impl}' if conv_impl else '')
    + f'; {models.count_params(variables["params"]):,} params.'
  )

  # ----- State: fresh or restored. -----
  memory_budget = (
    int(config.memory_budget_gb * 1024**3) or memory.default_memory_budget()
  )
  memory.check_client_table_fits(
    memory.client_table_bytes(algorithm, variables, config.num_clients),
    config.num_clients,
    memory_budget,
  )
  server_state, client_table = engine.init_state(
    algorithm,
    variables,
    config.num_clients,
    key=jax.random.key(config.seed + 1),
  )
  if chief:  # Only now: every check that can fail before training is done.
    _write_json(
      os.path.join(workdir, 'config.json'),
      json.loads(config.to_json_best_effort()),
    )
  checkpoint_dir = os.path.abspath(os.path.join(workdir, 'checkpoints'))
  if mesh:
    # Before restoring: orbax then reads straight into the mesh's layout.
    server_state, client_table = put((server_state, client_table))
  start_round = 0
  restored_round, restored = faults.restore_newest_readable(
    checkpoint_dir,
    {'server_state': server_state, 'client_table': client_table},
    workdir=workdir,
    chief=chief,
    report=say,
  )
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
    start_round = restored_round
    server_state = engine.ServerState(*restored['server_state'])
    client_table = restored['client_table']
    say(f'Resuming {workdir} from round {start_round}.')

  def cohort_for(round_idx):
    if active is None:
      ids = cohort_lib.sample_clients(
        config.seed, round_idx, config.num_clients, config.clients_per_round
      )
    else:
      ids = np.flatnonzero(active[round_idx])
    return cohort_lib.make_cohort(
      ids,
      clients,
      num_slots=num_slots,
      num_steps=num_steps,
      batch_size=lc.batch_size,
      local_epochs=lc.epochs,
      local_steps=lc.steps,
      seed=config.seed,
      round_idx=round_idx,
      labels=train.labels,
      batches_fn=algorithm.client_batches,
      cohort_batches_fn=algorithm.cohort_batches,
      sampler=config.cohort_sampler,
    )

  def memory_model():
    example_shape = cohort_for(start_round).example_idx.shape[1:]
    return memory.chunk_memory_model(
      spec,
      data,
      server_state,
      client_table,
      example_shape,
      unroll=config.unroll,
    )

  if choice.fit_to_memory:
    choice = executors.fit_to_memory(
      choice,
      memory_model,
      memory_budget=memory_budget,
      num_slots=num_slots,
      num_devices=num_devices,
    )
    say(f'Memory: executor={choice.name}; {choice.reason}.')
  end_round = config.num_rounds
  if stop_after_round is not None:
    end_round = min(end_round, stop_after_round)
  rounds_per_call, why = executors.choose_rounds_per_call(
    config.rounds_per_call,
    choice,
    boundaries=(
      config.eval_every,
      config.checkpoint_every,
      start_round,
      end_round,
    ),
    round_bytes=(
      executors.cohort_bytes(cohort_for(start_round))
      if start_round < end_round
      else 0
    ),
  )
  if rounds_per_call > 1:
    say(f'{rounds_per_call} rounds per call: {why}.')
  rounds_fn = executors.make_rounds_fn(
    spec,
    data,
    executor=choice,
    rounds_per_call=rounds_per_call,
    steps_per_call=config.steps_per_call,
    unroll=config.unroll,
    mesh=mesh,
  )
  metrics_path = os.path.join(workdir, 'metrics.jsonl')
  writer = None
  if chief:
    truncate_metrics(metrics_path, start_round)
    writer = make_summary_writer(workdir, start_round)
    if writer:
      cleanup.callback(writer.close)
  # Seconds spent in the round loop by earlier sessions of this run.
  time_before = previous_wall_time(checkpoints, start_round, metrics_path)
  last_saved = restored_round  # The newest checkpoint on disk, if any.

  def diverged(what, done):
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
    return FloatingPointError(
      f'{what} at round {done}. Lower --config.local.learning_rate or set '
      f'--config.local.grad_clip_norm; {kept}.'
    )

  def save(round_idx):
    nonlocal last_saved
    if not faults.all_finite((server_state, client_table)):
      raise diverged('The model holds NaN or infinite values', round_idx)
    checkpoints.save(
      round_idx,
      args=ocp.args.StandardSave(
        {'server_state': server_state, 'client_table': client_table}
      ),
      custom_metadata={'total_wall_time': total_time()},
    )
    last_saved = round_idx

  def total_time():
    return time_before + time.time() - start_time

  # ----- Rounds: R per call (one program), the host acts between calls. -----
  start_time = time.time()
  interval_start = None  # When the last evaluation ended.
  train_sums = []  # Dicts of device arrays [R]; read only at evaluation.
  last = {}
  bar = tqdm.tqdm(
    initial=start_round,
    total=config.num_rounds,
    desc=config.algorithm,
    disable=not (config.progress and chief),
    dynamic_ncols=True,
  )
  cleanup.callback(bar.close)
  done = start_round
  calls = range(start_round, end_round, rounds_per_call)
  call_cohorts = prefetch(
    lambda first: [
      cohort_for(r) for r in range(first, first + rounds_per_call)
    ],
    calls,
  )
  for first in calls:
    if stop.agreed():
      break
    server_state, client_table, round_metrics = rounds_fn(
      server_state, client_table, next(call_cohorts)
    )
    train_sums.append(sharding.local_copy(round_metrics))
    done = first + rounds_per_call
    bar.update(rounds_per_call)
    if done % config.eval_every == 0 or done == end_round:
      sums = {
        name: np.concatenate([np.ravel(s[name]) for s in train_sums])
        for name in train_sums[0]
      }
      loss_sums, counts = sums['train_loss_sum'], sums['train_examples']
      bad = np.flatnonzero(~np.isfinite(loss_sums))
      if bad.size:
        first_bad = done - len(loss_sums) + int(bad[0]) + 1
        raise diverged(f'Training loss is {loss_sums[bad[0]]}', first_bad)
      train_sums = []
      # The loss and each of its named terms, per real training example
      # since the last evaluation: train_loss, train_ce, train_metric, ...
      examples = max(float(counts.sum()), 1.0)
      train_terms = {
        name[: -len('_sum')]: float(total.sum() / examples)
        for name, total in sums.items()
        if name.endswith('_sum') and name != 'train_loss_sum'
      }
      train_loss = float(loss_sums.sum() / examples)
      interval = time.time() - (interval_start or start_time)
      # Stamped after the evaluation, so that a row's wall_time covers its
      # own evaluation (the first one compiles the evaluation programs) and
      # the next row's difference is that row's training and evaluation.
      eval_start = time.time()
      evaluation = evaluator.every(
        *sharding.local_copy((server_state, client_table))
      )
      last = {
        'round': done,
        'wall_time': time.time() - start_time,
        'total_wall_time': total_time(),
        'eval_seconds': time.time() - eval_start,
        'train_loss': train_loss,
        **train_terms,
        # Training throughput since the last evaluation (evaluation and
        # the first call's compilation included in the first interval).
        'examples_per_second': float(counts.sum()) / max(interval, 1e-9),
        'rounds_per_second': len(counts) / max(interval, 1e-9),
        **evaluation,
      }
      interval_start = time.time()
      if chief:
        with open(metrics_path, 'a') as f:
          f.write(json.dumps(last) + '\n')
      if writer:
        for name, value in last.items():
          if name != 'round':
            writer.add_scalar(name, value, done)
        writer.flush()  # A run killed later keeps this evaluation.
      bar.set_postfix({evaluator.headline: f'{last[evaluator.headline]:.4f}'})
    if done % config.checkpoint_every == 0 or done == end_round:
      save(done)
    faults.pause_if_asked(workdir, done, stop, checkpoints)
  stopped_by = stop.agreed() if done < end_round else None
  stopped = stopped_by is not None
  if stopped:
    if last_saved != done and done > start_round:
      save(done)
    say(
      f'Stopped by {stopped_by} after round {done}; the checkpoint of '
      f'round {last_saved} is in {workdir}/checkpoints. Run the same '
      'command again to resume.'
      if last_saved
      else f'Stopped by {stopped_by} before any round; nothing to save.'
    )
  checkpoints.wait_until_finished()
  checkpoints.close()
  if writer:
    writer.close()

  rounds_completed = done if stopped else max(end_round, start_round)
  summary = {
    'rounds_completed': rounds_completed,
    'workdir': workdir,
    'executor': choice.name,
    'chunk_size': choice.chunk_size,
    'rounds_per_call': rounds_per_call,
    'conv_impl': conv_impl,
    'backend': jax.default_backend(),
    'num_steps': num_steps,
    'num_slots': num_slots,
    'wall_time': time.time() - start_time,
    'total_wall_time': total_time(),
    'headline': evaluator.headline,
    **last,
  }
  if stopped:
    summary['stopped_by'] = stopped_by
  if rounds_completed == config.num_rounds:
    state = sharding.local_copy((server_state, client_table))
    if evaluator.headline not in summary:  # Resumed at the very end.
      summary.update(evaluator.every(*state))
    summary.update(evaluator.final(*state))
    if chief:
      _write_json(summary_path, summary)
  return summary
