"""A run's pieces built from its config, without writing anything.

`build` loads the data, partitions it over the clients, draws the
participation pattern and builds the model and the algorithm: everything
`train.run` trains and `workdir.restore` reloads, made by the same code so a
restored run is the run that was trained. Each piece is also a small
function a notebook can call on its own (`make_partition`, `build_model`,
`build_algorithm`, ...).
"""

import math
import os
from typing import Any, NamedTuple, Optional

from absl import logging
import jax
import jax.numpy as jnp
import numpy as np

from fedjax_metric import (
  algorithms,
  client_table,
  contract,
  engine,
  executors,
  memory,
  models,
  optimizers,
)
from fedjax_metric.algorithms import fedagm, fedhyper
from fedjax_metric.data import (
  augment,
  participation,
  partition,
  quantity,
  sources,
)
from fedjax_metric.data import cohort as cohort_lib


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
    return quantity.quantity(
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


def build_algorithm(
  config,
  model,
  participation_probabilities=None,
  class_counts=None,
  validation=None,
):
  """The config's `engine.Algorithm`, with its server optimizer inside.

  Every factory receives the run's facts as ``run`` (`contract.RunFacts`:
  T, N, the [N] true participation probabilities or None, the [N, K]
  clients' class counts or None, the `contract.HeldOut` validation split or
  None) and the
  config's ``algorithm_kwargs`` as keywords; a fact set in algorithm_kwargs
  is an error.
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
  if s.optimizer == 'fedagm' and not s.momentum > 0:
    raise ValueError(
      'server.optimizer=fedagm needs --config.server.momentum > 0 (its '
      'lambda; the authors use 0.85).'
    )
  kwargs = dict(config.algorithm_kwargs)
  for name in ('run',) + contract.RunFacts._fields:
    if name in kwargs:
      raise ValueError(
        f'algorithm_kwargs.{name} is a fact of the run, set from the config '
        f'(num_rounds, num_clients, participation); remove it.'
      )
  run = contract.RunFacts(
    num_rounds=config.num_rounds,
    num_clients=config.num_clients,
    participation_probabilities=participation_probabilities,
    class_counts=class_counts,
    validation=validation,
  )
  try:
    algorithm = algorithms.REGISTRY[config.algorithm](
      model,
      server_optimizer=server_optimizer,
      run=run,
      weighting=s.weighting,
      **kwargs,
    )
  except TypeError as e:
    raise ValueError(
      f'algorithm_kwargs {sorted(kwargs)} do not fit algorithm '
      f'{config.algorithm!r}: {e}'
    ) from e
  if s.optimizer == 'fedagm':
    algorithm = fedagm.accelerate(
      algorithm, server_optimizer, beta=s.fedagm_beta
    )
  if s.fedhyper_local:
    if s.optimizer != 'fedhyper':
      raise ValueError(
        'server.fedhyper_local (FedHyper-CL) needs '
        '--config.server.optimizer=fedhyper (it reads the global update '
        "from FedHyper-G's state)."
      )
    expected = (
      float(np.sum(participation_probabilities))
      if participation_probabilities is not None
      else config.clients_per_round
    )
    algorithm = fedhyper.schedule_local(algorithm, expected_clients=expected)
  return algorithm


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
    per_client=config.logging.per_client,
    num_clients=config.num_clients,
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


def num_cohort_slots(config, num_devices: int, mask=None) -> int:
  """C: clients per round (the most active in any round under a
  participation pattern), padded up to a multiple of the device count."""
  most = (
    config.clients_per_round if mask is None else participation.max_active(mask)
  )
  return num_devices * math.ceil(most / num_devices)


class Experiment(NamedTuple):
  """What a config builds before any round runs.

  Attributes:
    train, test: `sources.Dataset`s (train without its validation part).
    validation: the held-out part of train, or None.
    clients: [N] int index arrays into train.
    class_counts: [N, classes] examples of each class per client.
    probabilities: [N] each client's true participation probability (K / N
      under the uniform sampler).
    active: [T, N] bool participation mask, or None (uniform sampling).
    train_preprocess, eval_preprocess: ``(uint8 images, key) -> float``.
    model: the model the clients train (its convolution form fits the
      executor); eval_model: the same parameters in the evaluation's form.
    variables: the initial global model.
    algorithm: the `engine.Algorithm`.
  """

  train: Any
  test: Any
  validation: Optional[Any]
  clients: list
  class_counts: np.ndarray
  probabilities: np.ndarray
  active: Optional[np.ndarray]
  train_preprocess: Any
  eval_preprocess: Any
  model: Any
  eval_model: Any
  variables: Any
  algorithm: engine.Algorithm


def build(config, *, one_program=False) -> Experiment:
  """Builds ``config``'s `Experiment` (data, partition, participation, model,
  algorithm). ``one_program``: the clients train inside a single-program
  round (`executors.round_is_one_program`), which picks their convolution
  form."""
  ds = config.dataset
  data_dir = ds.data_dir or None
  train = sources.load(ds.name, 'train', data_dir)
  test = sources.load(ds.name, 'test', data_dir)
  train, validation_split = sources.hold_out(
    train, ds.get('validation_fraction', 0.0)
  )
  clients = make_partition(config, train.labels)
  counts = partition.class_counts(train.labels, clients, train.num_classes)
  # The true p_n (FedAU's known_prob): K / N under the uniform sampler.
  probs = np.full(
    config.num_clients, config.clients_per_round / config.num_clients
  )
  active = participation_mask(config, counts)
  if active is not None:
    probs, active = active
    active = active.astype(bool)
  mean, std = augment.channel_stats(train.images)
  eval_preprocess = augment.make_preprocess(mean, std, 'none')
  # The clients' program and the evaluation (one model, large batches) may
  # want different convolution forms; the parameters are the same.
  model, eval_model = (
    build_model(
      config.model,
      train.num_classes,
      train.images.shape[1:],
      config.precision,
      one_program=program,
    )
    for program in (one_program, False)
  )
  variables = model.init(
    jax.random.key(config.seed),
    eval_preprocess(jnp.asarray(train.images[:1]), None),
  )
  return Experiment(
    train=train,
    test=test,
    validation=validation_split,
    clients=clients,
    class_counts=counts,
    probabilities=probs,
    active=active,
    train_preprocess=augment.make_preprocess(mean, std, ds.augmentation),
    eval_preprocess=eval_preprocess,
    model=model,
    eval_model=eval_model,
    variables=variables,
    algorithm=build_algorithm(
      config,
      model,
      probs,
      counts,
      validation=None
      if validation_split is None
      else contract.HeldOut(
        validation_split.images, validation_split.labels, eval_preprocess
      ),
    ),
  )


def _state_key(config):
  return jax.random.key(config.seed + 1)


def initial_state(config, experiment: Experiment):
  """``(server_state, client_table)`` at round 0, the whole table built."""
  return engine.init_state(
    experiment.algorithm,
    experiment.variables,
    config.num_clients,
    key=_state_key(config),
  )


def initial_server_state(config, experiment: Experiment):
  """The server half of `initial_state` (for a table kept off the device)."""
  return engine.init_server_state(
    experiment.algorithm,
    experiment.variables,
    config.num_clients,
    _state_key(config),
  )


def row_layout(experiment: Experiment) -> client_table.RowLayout:
  """The byte layout of one client's row (abstract evaluation only)."""
  row = jax.eval_shape(
    experiment.algorithm.init_client,
    experiment.variables,
    jax.random.key(0),
  )
  return client_table.RowLayout.of(row)


def table_placement(config, experiment: Experiment, workdir: str):
  """``(client_table.Placement, RowLayout)``: where this run's client table
  lives (`client_table.choose_placement`), decided before anything is
  written; a table that fits nowhere is refused here."""
  layout = row_layout(experiment)
  row_bytes = memory.tree_bytes(
    jax.eval_shape(
      experiment.algorithm.init_client,
      experiment.variables,
      jax.random.key(0),
    )
  )
  checkpoint_dir = os.path.join(workdir, 'checkpoints')
  has_checkpoints = os.path.isdir(checkpoint_dir) and any(
    name.isdigit() for name in os.listdir(checkpoint_dir)
  )
  host_budget = (
    int(config.client_table.host_budget_gb * 1024**3)
    or client_table.host_memory_budget()
  )
  placement = client_table.choose_placement(
    config.client_table.placement,
    row_bytes=row_bytes,
    num_clients=config.num_clients,
    device_budget=memory.device_budget(config),
    host_budget=host_budget,
    free_disk=client_table.disk_free(workdir),
    workdir=workdir,
    has_checkpoints=has_checkpoints,
    stored=client_table.stored_placement(workdir),
    process_count=jax.process_count(),
  )
  return placement, layout


def open_table(config, experiment, placement, layout, workdir, num_slots):
  """The `client_table.OffDeviceTable` of a 'host' or 'disk' placement, its
  files in ``workdir/client_table`` (not yet opened at a round)."""
  client_table.write_meta(workdir, placement.name, layout, config.num_clients)
  algorithm, variables = experiment.algorithm, experiment.variables
  key = _state_key(config)

  def init_rows(ids):
    return engine.init_rows(algorithm, variables, key, jnp.asarray(ids))

  return client_table.OffDeviceTable(
    placement.name,
    os.path.join(workdir, client_table.TABLE_DIR),
    layout,
    config.num_clients,
    init_rows,
    init_batch=max(num_slots, 1024),
  )


def cohort_fn(config, experiment, num_slots, num_steps):
  """``round -> Cohort``: who trains in a round and on which batches, a
  function of (seed, round) alone, so a resumed run draws the same."""
  lc, active = config.local, experiment.active

  def cohort_for(round_idx):
    if active is None:
      ids = cohort_lib.sample_clients(
        config.seed, round_idx, config.num_clients, config.clients_per_round
      )
    else:
      ids = np.flatnonzero(active[round_idx])
    return cohort_lib.make_cohort(
      ids,
      experiment.clients,
      num_slots=num_slots,
      num_steps=num_steps,
      batch_size=lc.batch_size,
      local_epochs=lc.epochs,
      local_steps=lc.steps,
      seed=config.seed,
      round_idx=round_idx,
      labels=experiment.train.labels,
      batches_fn=experiment.algorithm.client_batches,
      cohort_batches_fn=experiment.algorithm.cohort_batches,
      sampler=config.cohort_sampler,
    )

  return cohort_for


# Device files the NVIDIA driver creates: a GPU the system can use.
NVIDIA_DEVICE_FILES = ('/dev/nvidiactl', '/dev/nvidia0')


def unused_gpu_note(backend, *, exists=os.path.exists, environ=os.environ):
  """A sentence for the start line when the machine has an NVIDIA GPU that
  JAX does not use (a CPU-only jaxlib), else ''. Nothing when the user
  chose the platform (JAX_PLATFORMS set)."""
  if backend != 'cpu' or environ.get('JAX_PLATFORMS', '').strip():
    return ''
  if not any(exists(path) for path in NVIDIA_DEVICE_FILES):
    return ''
  return (
    ' Note: an NVIDIA GPU is visible to the system but JAX runs on the '
    "CPU; install the CUDA build (pip install 'fedjax_metric[cuda]') to use "
    'it, or set JAX_PLATFORMS=cpu to run on the CPU without this note.'
  )


def num_local_steps(config, clients) -> int:
  """Local steps a round runs on every client (`cohort.num_local_steps`)."""
  return cohort_lib.num_local_steps(
    [len(c) for c in clients],
    batch_size=config.local.batch_size,
    local_epochs=config.local.epochs,
    local_steps=config.local.steps,
  )


def describe(config, experiment, choice, num_devices, num_slots, num_steps):
  """The line a run starts with: what trains, where and how (and a note
  when no client holds a whole batch)."""
  lc = config.local
  per_round = (
    config.clients_per_round
    if experiment.active is None
    else f'{config.participation.pattern} participation, '
    f'{experiment.active.sum(1).mean():.1f}'
  )
  conv_impl = getattr(experiment.model.module, 'conv_impl', None)
  return (
    f'{config.algorithm} on {config.dataset.name}: {config.num_clients} '
    f'clients, {per_round} per round in {num_slots} slots, {num_steps} '
    f'local steps of {lc.batch_size}; executor={choice.name} on '
    f'{num_devices} {jax.default_backend()} device(s)'
    + (f', convolutions: {conv_impl}' if conv_impl else '')
    + f'; {models.count_params(experiment.variables["params"]):,} params.'
    + unused_gpu_note(jax.default_backend())
    + _full_batch_note(lc.batch_size, experiment.clients)
  )


def _full_batch_note(batch_size, clients):
  """A second start line when no client holds a whole batch, else ''."""
  largest = max(len(c) for c in clients)
  if batch_size <= largest:
    return ''
  return (
    f"\nNote: batch_size={batch_size} is larger than any client's data "
    f'(the largest holds {largest}): every local step uses all of a '
    "client's examples (full-batch steps)."
  )
