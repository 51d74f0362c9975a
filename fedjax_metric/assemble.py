"""A run's pieces built from its config, without writing anything.

`build` loads the data, partitions it over the clients, draws the
participation pattern and builds the model and the algorithm: everything
`experiment.run` trains and `restore.restore` reloads, made by the same code so a
restored run is the run that was trained. Each piece is also a small
function a notebook can call on its own (`make_partition`, `build_model`,
`build_algorithm`, ...).
"""

import json
import math
import os
import threading
from typing import Any, NamedTuple, Optional

from absl import logging
import jax
import jax.numpy as jnp
import numpy as np

from fedjax_metric import (
  algorithms,
  client_table,
  config_io,
  contract,
  engine,
  executors,
  memory,
  metrics_log,
  models,
  optimizers,
)
from fedjax_metric.algorithms import fedagm, fedhyper
from fedjax_metric.data import (
  augment,
  on_demand,
  participation,
  partition,
  quantity,
  sources,
  synthetic,
)
from fedjax_metric.data import cohort as cohort_lib
from fedjax_metric.evaluation import protocols
from fedjax_metric.evaluation import ssl as ssl_eval


def make_partition(config, labels, client_ids=None):
  """The per-client index arrays the config asks for (``client_ids``: the
  training set's writer of each example, for ``method='natural'``)."""
  p = config.partition
  n = config.num_clients
  if p.method == 'natural':
    if client_ids is None:
      raise ValueError(
        f'partition.method=natural needs a dataset whose examples carry a '
        f'client id ({", ".join(sources.NATURAL_DATASETS)}); '
        f'{config.dataset.name!r} has none. Use another partition.method.'
      )
    return partition.natural(client_ids, n, seed=config.seed)
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
    'shards, one_class, quantity or natural.'
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
    form=s.form,
    initial_accumulator=s.initial_accumulator,
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
  # Options were checked by validation.validate; the spec checks them
  # again for a caller that skipped it (ValueError, one line).
  algorithm = algorithms.REGISTRY[config.algorithm](
    model,
    server_optimizer=server_optimizer,
    run=run,
    weighting=s.weighting,
    **kwargs,
  )
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


# Populations up to this many client-rounds keep their whole [T, N] mask
# (participation.json and .png are drawn from it); larger ones stream it.
MASK_LIMIT = 20_000_000


class ParticipationPlan:
  """Who is available in each round under a participation pattern.

  Rows come from `participation.ParticipationStream` (bit for bit the rows
  of `participation.sample`), so 10^6 clients need O(N) memory; a small
  population also keeps the whole mask (``mask``, for its picture).

  Attributes:
    probabilities: float64 [N] each client's participation probability.
    most_active: the largest number of participants in any round (C).
    mask: bool [T, N] or None (over `MASK_LIMIT` client-rounds).
  """

  def __init__(self, config, probabilities):
    p = config.participation
    self.pattern = p.pattern
    self.probabilities = probabilities
    self._kwargs = dict(
      seed=config.seed, markov_rate=p.markov_rate, cycle=p.cycle
    )
    self._num_rounds = config.num_rounds
    self.mask = None
    if config.num_rounds * len(probabilities) <= MASK_LIMIT:
      self.mask = participation.sample(
        probabilities, config.num_rounds, p.pattern, **self._kwargs
      ).astype(bool)
      self.most_active = participation.max_active(self.mask)
    else:
      self.most_active = participation.max_active_streamed(
        probabilities, config.num_rounds, p.pattern, **self._kwargs
      )
    self._stream = None
    self._last = (None, None)  # (round, its ids): the latest answer.
    self._lock = threading.Lock()

  def clients_at(self, round_idx: int) -> np.ndarray:
    """int64 ids of the clients available in round ``round_idx``."""
    if self.mask is not None:
      return np.flatnonzero(self.mask[round_idx])
    with self._lock:  # The cohort thread and the main thread both ask.
      # A run asks for its first round several times (memory model, cohort
      # size, read-ahead); a second ask would seek back, which replays a
      # 'markov' chain from round 0.
      if self._last[0] == round_idx:
        return self._last[1].copy()
      if self._stream is None:
        self._stream = participation.ParticipationStream(
          self.probabilities,
          self._num_rounds,
          self.pattern,
          start=round_idx,
          **self._kwargs,
        )
      if self._stream.next_round != round_idx:
        self._stream.seek(round_idx)
      ids = np.flatnonzero(next(self._stream))
      self._last = (round_idx, ids)
      return ids.copy()

  def mean_active(self) -> float:
    """Participants per round: counted where the mask is kept, else the
    sum of the probabilities (the expectation under 'bernoulli' and
    'markov'; the cyclic patterns' long-run rate per client is their active
    fraction of a cycle, which rounds p * cycle, so it differs a little)."""
    if self.mask is not None:
      return float(self.mask.sum(1).mean())
    return float(np.sum(self.probabilities))


# Label histograms of a population made on demand are estimated from each
# client's first examples (participation probabilities tied to labels,
# FedLC's calibration): all of its examples would be 10^8 at 10^6 clients.
LABEL_COUNT_EXAMPLES = 32


def participation_plan(config, class_counts):
  """The `ParticipationPlan` of the config's pattern, or None.

  With ``participation.pattern = 'uniform'`` (the default) every round draws
  ``clients_per_round`` clients uniformly (`cohort.sample_clients`) and no
  plan exists. Other patterns give each client its own probability, tied to
  its label histogram, and a fixed availability pattern; both are functions
  of the seed, so a resumed run rebuilds the same.
  """
  p = config.participation
  if p.pattern == 'uniform':
    return None
  empty = np.flatnonzero(np.asarray(class_counts).sum(axis=1) == 0)
  if empty.size:
    raise ValueError(
      f"participation.pattern={p.pattern!r} ties each client's probability "
      f'to its labels, but the partition left {empty.size} of '
      f'{len(class_counts)} clients without examples (first: '
      f'{empty[:5].tolist()}). Give every client data (a larger '
      'partition.alpha or fewer clients; partition.variant=niid_bench with '
      "partition.min_size >= 1) or use participation.pattern='uniform'."
    )
  probs = participation.probabilities(
    class_counts,
    mean=p.mean,
    floor=p.floor,
    beta=p.beta,
    seed=config.seed,
    normalize=p.normalize,
  )
  return ParticipationPlan(config, probs)


def participation_mask(config, class_counts):
  """``(probabilities [N], mask [T, N])`` of the config's pattern, or None
  (the whole mask at once: for a look at a small population; a run streams
  it, `participation_plan`)."""
  plan = participation_plan(config, class_counts)
  if plan is None:
    return None
  p = config.participation
  mask = plan.mask
  if mask is None:
    mask = participation.sample(
      plan.probabilities,
      config.num_rounds,
      p.pattern,
      seed=config.seed,
      markov_rate=p.markov_rate,
      cycle=p.cycle,
    )
  return plan.probabilities, mask


def num_cohort_slots(config, num_devices: int, plan=None) -> int:
  """C: clients per round (the most active in any round under a
  participation pattern), padded up to a multiple of the device count."""
  most = config.clients_per_round if plan is None else plan.most_active
  return num_devices * math.ceil(most / num_devices)


class Experiment(NamedTuple):
  """What a config builds before any round runs.

  Attributes:
    train, test: `sources.ArrayDataset`s (train without its validation
      part); train is None for a population made on demand (synthetic).
    validation: the held-out part of train, or None.
    clients: [N] int index arrays into train, or the
      `on_demand.GeneratedClients` (positions in each client's examples).
    class_counts: [N, classes] examples of each class per client (for a
      generated population, of its first `LABEL_COUNT_EXAMPLES`, and only
      where a participation pattern or FedLC needs them), or None.
    probabilities: [N] each client's true participation probability (K / N
      under the uniform sampler).
    availability: the `ParticipationPlan`, or None (uniform sampling).
    train_preprocess, eval_preprocess: ``(inputs, key) -> float``.
    model: the model the clients train (its convolution form fits the
      executor); eval_model: the same parameters in the evaluation's form.
    variables: the initial global model.
    algorithm: the `engine.Algorithm`.
  """

  train: Any
  test: Any
  validation: Optional[Any]
  clients: Any
  class_counts: Optional[np.ndarray]
  probabilities: np.ndarray
  availability: Optional[ParticipationPlan]
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
  if ds.name in sources.GENERATED_DATASETS:
    data = _generated_data(config)
  else:
    data = _stored_data(config)
  train, test, validation_split, clients, counts, preprocess = data
  # The true p_n (FedAU's known_prob): K / N under the uniform sampler.
  probs = np.full(
    config.num_clients, config.clients_per_round / config.num_clients
  )
  plan = participation_plan(config, counts)
  if plan is not None:
    probs = plan.probabilities
  train_preprocess, eval_preprocess = preprocess
  model_config = model_for_dataset(config)
  # The clients' program and the evaluation (one model, large batches) may
  # want different convolution forms; the parameters are the same.
  model, eval_model = (
    build_model(
      model_config,
      test.num_classes,
      test.images.shape[1:],
      config.precision,
      one_program=program,
    )
    for program in (one_program, False)
  )
  variables = model.init(
    jax.random.key(config.seed),
    eval_preprocess(jnp.asarray(test.images[:1]), None),
  )
  algorithm = build_algorithm(
    config,
    model,
    probs,
    counts,
    validation=None
    if validation_split is None
    else contract.HeldOut(
      validation_split.images, validation_split.labels, eval_preprocess
    ),
  )
  if train is None and algorithm.client_batches is not None:
    raise ValueError(
      f"{config.algorithm}'s batches are drawn from the labels of every "
      f"example (anchors, positives, negatives); {ds.name} makes a client's "
      'examples only when it trains. Use an algorithm with plain batches '
      '(fedavg, scaffold, fedau, ...).'
    )
  return Experiment(
    train=train,
    test=test,
    validation=validation_split,
    clients=clients,
    class_counts=counts,
    probabilities=probs,
    availability=plan,
    train_preprocess=train_preprocess,
    eval_preprocess=eval_preprocess,
    model=model,
    eval_model=eval_model,
    variables=variables,
    algorithm=algorithm,
  )


def _stored_data(config):
  """``(train, test, validation, clients, class_counts, (train_preprocess,
  eval_preprocess))`` of a dataset read from files."""
  ds = config.dataset
  data_dir = ds.data_dir or None
  train = sources.load(ds.name, 'train', data_dir)
  test = sources.load(ds.name, 'test', data_dir)
  train, validation_split = sources.hold_out(
    train, ds.get('validation_fraction', 0.0)
  )
  clients = make_partition(config, train.labels, train.client_ids)
  counts = partition.class_counts(train.labels, clients, train.num_classes)
  mean, std = augment.channel_stats(train.images)
  preprocess = (
    augment.make_preprocess(mean, std, ds.augmentation),
    augment.make_preprocess(mean, std, 'none'),
  )
  return train, test, validation_split, clients, counts, preprocess


def synthetic_spec(config) -> synthetic.SyntheticSpec:
  ds = config.dataset
  return synthetic.SyntheticSpec(
    alpha=ds.alpha, beta=ds.beta, max_examples=ds.max_client_examples
  )


TEST_CLIENTS_TAG = 0x7E57


def _generated_data(config):
  """`_stored_data` of a population made on demand (data/on_demand.py):
  no training set exists; the clients' examples are made when sampled."""
  spec, seed, n = synthetic_spec(config), config.seed, config.num_clients
  clients = on_demand.GeneratedClients(
    synthetic.client_sizes(spec, seed, np.arange(n)),
    lambda ids, positions: synthetic.client_examples(
      spec, seed, ids, positions
    ),
    spec.num_classes,
    (spec.num_features,),
    lambda ids, m: synthetic.client_label_counts(spec, seed, ids, m),
    lambda ids: synthetic.client_test_set(spec, seed, ids),
  )
  # The test set: test_clients training clients (a fixed draw) with their
  # held-out examples, the FedProx code's per-client 90 / 10 split.
  tested = np.sort(
    np.random.default_rng([seed, TEST_CLIENTS_TAG]).choice(
      n, min(config.dataset.test_clients, n), replace=False
    )
  )
  x, y, owner = synthetic.client_test_set(spec, seed, tested)
  test = sources.ArrayDataset(x, y, spec.num_classes, client_ids=owner)
  counts = None
  if config.participation.pattern != 'uniform' or config.algorithm == 'fedlc':
    counts = clients.label_counts(np.arange(n), LABEL_COUNT_EXAMPLES)
  # The features are already standardised floats: nothing to scale.
  preprocess = (features_preprocess, features_preprocess)
  return None, test, None, clients, counts, preprocess


def round_data_template(experiment, num_slots, num_steps, config):
  """Zeros shaped like one round's examples of a population made on demand
  ([C * S * B', ...]; B' the algorithm's batch width), for planning and
  compiling; each call then brings its own (`on_demand.call_data`)."""
  probe = cohort_lib.make_cohort(
    np.zeros(0, np.int64),
    experiment.clients,
    num_slots=num_slots,
    num_steps=num_steps,
    batch_size=config.local.batch_size,
    local_epochs=config.local.epochs,
    local_steps=config.local.steps,
    seed=config.seed,
    round_idx=0,
    batches_fn=experiment.algorithm.client_batches,
    cohort_batches_fn=experiment.algorithm.cohort_batches,
    sampler=config.cohort_sampler,
  )
  size = probe.example_idx.size
  clients = experiment.clients
  return engine.DeviceData(
    jnp.zeros((size,) + clients.feature_shape, jnp.float32),
    jnp.zeros((size,), jnp.int32),
  )


def model_for_dataset(config):
  """``config.model``, or the dataset's own model block where the config's
  model cannot take the dataset's inputs (`models.model_for_dataset`)."""
  return models.model_for_dataset(config.model, config.dataset.name)


def trace_one_client(
  config, experiment, spec, data, server_state, num_slots, num_steps
):
  """Traces one client's local training abstractly (no compile, no
  arithmetic: `jax.eval_shape`), so that an error a hook raises at trace
  time is reported before anything is written."""
  cohort = cohort_fn(config, experiment, num_slots, num_steps)(0)
  key = _state_key(config)
  row = jax.eval_shape(
    experiment.algorithm.init_client, experiment.variables, key
  )
  jax.eval_shape(
    lambda data, state, row: engine.client_update(
      spec,
      data,
      state,
      row,
      jnp.int32(0),
      jnp.int32(0),
      cohort.example_idx[0],
      cohort.example_mask[0],
      cohort.num_examples[0],
      unroll=1,
    ),
    data,
    server_state,
    row,
  )


def features_preprocess(features, key):
  """The preprocessing of vector datasets (synthetic): float32, as is."""
  del key
  return features.astype(jnp.float32)


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
    device_budget=memory.device_budget(config.memory_budget_gb),
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
  lc, plan = config.local, experiment.availability
  labels = None if experiment.train is None else experiment.train.labels

  def cohort_for(round_idx):
    if plan is None:
      ids = cohort_lib.sample_clients(
        config.seed, round_idx, config.num_clients, config.clients_per_round
      )
    else:
      ids = plan.clients_at(round_idx)
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
      labels=labels,
      batches_fn=experiment.algorithm.client_batches,
      cohort_batches_fn=experiment.algorithm.cohort_batches,
      sampler=config.cohort_sampler,
    )

  return cohort_for


# The typed settings of the pieces below this module, which never read the
# config: each is made here, once, from the config's fields.


def eval_settings(config) -> protocols.EvalSettings:
  """The evaluation's settings (`protocols.make_evaluator`)."""
  federated = config.get('federated_eval') or {}
  return protocols.EvalSettings(
    protocol=config.eval_protocol,
    algorithm=config.algorithm,
    model_name=config.model.get('name', '?'),
    dataset_name=config.dataset.name,
    batch_size=config.eval_batch_size,
    seed=config.seed,
    train_examples=config.eval_train_examples,
    representation_examples=config.representation_examples,
    one_class_center_examples=config.one_class_center_examples,
    federated_clients=federated.get('clients', 0),
    federated_every=federated.get('every', 0),
    ssl=ssl_eval.SslEvalSettings(**config.ssl_eval),
  )


def make_evaluator(config, experiment: Experiment) -> protocols.Evaluator:
  """The run's `protocols.Evaluator`, on ``experiment``'s model and data."""
  return protocols.make_evaluator(
    eval_settings(config),
    model=experiment.eval_model,
    preprocess=experiment.eval_preprocess,
    train=experiment.train,
    test=experiment.test,
    clients=experiment.clients,
    validation=experiment.validation,
  )


def log_settings(config) -> metrics_log.LogSettings:
  """What the run records beside metrics.jsonl (`metrics_log.MetricsLog`)."""
  return metrics_log.LogSettings(
    ema_weight=config.eval_ema_weight,
    top_k=config.eval_top_k,
    hparams=config_io.flatten(json.loads(config.to_json_best_effort())),
    per_client=config.logging.per_client,
    wandb=config.logging.wandb,
  )


def call_settings(config) -> executors.CallSettings:
  """How rounds are called (`executors.plan`)."""
  return executors.CallSettings(
    cadence=(config.eval_every, config.checkpoint_every),
    rounds_per_call=config.rounds_per_call,
    steps_per_call=config.steps_per_call,
    unroll=config.unroll,
  )


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
    on_demand.client_sizes(clients),
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
    if experiment.availability is None
    else f'{config.participation.pattern} participation, '
    f'{experiment.availability.mean_active():.1f}'
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
  largest = int(on_demand.client_sizes(clients).max())
  if batch_size <= largest:
    return ''
  return (
    f"\nNote: batch_size={batch_size} is larger than any client's data "
    f'(the largest holds {largest}): every local step uses all of a '
    "client's examples (full-batch steps)."
  )
