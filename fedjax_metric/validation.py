"""validate(config): every check a run can make before it writes anything.

Fast (no data read, no model initialised, nothing compiled), so a mistyped
name, a value out of range or a missing dataset is refused in about a second
instead of after the set-up, and a failed start leaves nothing behind that
could block the corrected command on the same workdir.

Field rules are keyed by dotted path (``local.learning_rate``). A field with
no rule (a new one, or a model's own constructor field) is not range-checked:
the locked config still checks its type, and the code that reads it its value.
"""

import difflib
import math
from typing import Any, Callable, Dict, Optional

from fedjax_metric import (
  algorithms,
  client_table,
  config_io,
  executors,
  models,
  optimizers,
  wandb_log,
)
from fedjax_metric.algorithms import fedavg
from fedjax_metric.config_io import ConfigError  # re-exported
from fedjax_metric.data import (
  augment,
  cohort,
  participation,
  partition,
  quantity,
  sources,
)
from fedjax_metric.evaluation import protocols

# Training-split sizes of the built-in datasets, for the cheap partition
# check (the partition itself needs the labels, i.e. the data).
TRAIN_SIZES = {
  'digits': 1438,
  'mnist': 60000,
  'fashion_mnist': 60000,
  'cifar10': 50000,
  'cifar100': 50000,
}

Check = Callable[[Any], Optional[str]]


def _integer(minimum: int = 0) -> Check:
  def check(value):
    if isinstance(value, bool) or not isinstance(value, int):
      return f'must be an integer, got {value!r}'
    if value < minimum:
      return f'must be >= {minimum}, got {value}'
    return None

  return check


def _number(
  low: float = -math.inf,
  high: float = math.inf,
  *,
  low_open: bool = False,
  high_open: bool = False,
) -> Check:
  """A finite real in [low, high], either end open on request."""

  def check(value):
    if isinstance(value, bool) or not isinstance(value, (int, float)):
      return f'must be a number, got {value!r}'
    if not math.isfinite(value):
      return f'must be finite, got {value}'
    if value < low or (low_open and value == low):
      return f'must be {">" if low_open else ">="} {low}, got {value}'
    if value > high or (high_open and value == high):
      return f'must be {"<" if high_open else "<="} {high}, got {value}'
    return None

  return check


def _boolean(value) -> Optional[str]:
  if isinstance(value, bool):
    return None
  return f'must be True or False, got {value!r}'


def _text(value) -> Optional[str]:
  if isinstance(value, str):
    return None
  return f'must be a string, got {value!r}'


def _one_of(choices, suggest: bool = False) -> Check:
  """``choices``: a tuple, or a function returning one (read at check time,
  so a registry that grows needs no change here). ``suggest``: name the
  closest choice to a mistyped value (difflib)."""

  def check(value):
    allowed = tuple(choices() if callable(choices) else choices)
    if value not in allowed:
      problem = f'must be one of {", ".join(map(repr, allowed))}; got {value!r}'
      close = (
        difflib.get_close_matches(value, [str(a) for a in allowed], n=1)
        if suggest and isinstance(value, str)
        else []
      )
      return problem + (f'; did you mean {close[0]!r}?' if close else '')
    return None

  return check


def _sizes(value) -> Optional[str]:
  if (
    not isinstance(value, (tuple, list))
    or not value
    or any(
      isinstance(v, bool) or not isinstance(v, int) or v < 1 for v in value
    )
  ):
    return f'must be a non-empty tuple of positive integers, got {value!r}'
  return None


def _made_by(factory: Callable[[Any], Any]) -> Check:
  """A name the library's own constructor accepts (its error lists them)."""

  def check(value):
    try:
      factory(value)
    except ValueError as e:
      return f'is not usable: {e}'
    return None

  return check


RULES: Dict[str, Check] = {
  'seed': _integer(0),
  'algorithm': _one_of(lambda: sorted(algorithms.REGISTRY), suggest=True),
  'num_rounds': _integer(1),
  'num_clients': _integer(1),
  'clients_per_round': _integer(1),
  'dataset.augmentation': _one_of(augment.AUGMENTATIONS),
  'dataset.validation_fraction': _number(0.0, 1.0, high_open=True),
  'dataset.alpha': _number(0.0),
  'dataset.beta': _number(0.0),
  'dataset.max_client_examples': _integer(1),
  'dataset.test_clients': _integer(1),
  'partition.method': _one_of(
    ('iid', 'dirichlet', 'shards', 'one_class', 'quantity', 'natural')
  ),
  'federated_eval.clients': _integer(0),
  'federated_eval.every': _integer(0),
  'partition.size_distribution': _one_of(quantity.SIZE_DISTRIBUTIONS),
  'partition.power_law_exponent': _number(0.0),
  'partition.alpha': _number(0.0, low_open=True),
  'partition.variant': _one_of(partition.VARIANTS),
  'partition.min_size': _integer(0),
  'partition.classes_per_client': _integer(1),
  'model.name': _one_of(lambda: sorted(models.REGISTRY)),
  'model.width': _integer(1),
  'model.embedding_dim': _integer(1),
  'model.out_dim': _integer(1),
  'model.widths': _sizes,
  'model.groups': _integer(1),
  'model.norm': _one_of(('none', 'batch', 'group')),
  'model.pool': _one_of(('stride', 'avg', 'max')),
  'model.conv_impl': _one_of(executors.CONV_IMPLS),
  'local.epochs': _integer(0),
  'local.steps': _integer(0),
  'local.batch_size': _integer(1),
  'local.optimizer': _made_by(optimizers.make_client_optimizer),
  'local.learning_rate': _number(0.0, low_open=True),
  'local.momentum': _number(0.0, 1.0, high_open=True),
  'local.nesterov': _boolean,
  'local.weight_decay': _number(0.0),
  'local.grad_clip_norm': _number(0.0),
  'local.schedule': _made_by(
    lambda kind: optimizers.make_round_schedule(1.0, kind=kind)
  ),
  'local.decay_rate': _number(0.0, low_open=True),
  'local.warmup_rounds': _integer(0),
  'local.epoch_decay': _number(0.0, low_open=True),
  'server.optimizer': _made_by(optimizers.make_server_optimizer),
  'server.learning_rate': _number(0.0, low_open=True),
  'server.momentum': _number(0.0, 1.0, high_open=True),
  'server.b1': _number(0.0, 1.0, high_open=True),
  'server.b2': _number(0.0, 1.0, high_open=True),
  'server.eps': _number(0.0),
  'server.form': _one_of(optimizers.SERVER_FORMS),
  'server.initial_accumulator': _number(0.0),
  'server.fedagm_beta': _number(0.0),
  'server.fedhyper_local': _boolean,
  # 'num_batches' is SSD's; each algorithm checks the ones it takes.
  'server.weighting': _one_of(fedavg.WEIGHTINGS + ('num_batches',)),
  'participation.pattern': _one_of(participation.PATTERNS),
  'participation.mean': _number(0.0, 1.0, low_open=True),
  'participation.floor': _number(0.0, 1.0, low_open=True),
  'participation.beta': _number(0.0, low_open=True),
  'participation.normalize': _one_of(participation.NORMALIZATIONS),
  'participation.markov_rate': _number(0.0, 1.0, low_open=True),
  'participation.cycle': _integer(1),
  'precision': _one_of(executors.PRECISIONS),
  'cohort_sampler': _one_of(cohort.SAMPLERS),
  'executor': _one_of(executors.EXECUTORS),
  'chunk_size': _integer(0),
  'steps_per_call': _integer(1),
  'rounds_per_call': _integer(0),
  'unroll': _integer(1),
  'num_devices': _integer(0),
  'memory_budget_gb': _number(0.0),
  'client_table.placement': _one_of(client_table.PLACEMENTS),
  'client_table.host_budget_gb': _number(0.0),
  'client_table.prefetch': _boolean,
  'eval_every': _integer(1),
  'eval_protocol': _one_of(protocols.PROTOCOLS),
  'eval_batch_size': _integer(1),
  'eval_ema_weight': _number(0.0, 1.0, high_open=True),
  'eval_top_k': _integer(1),
  'representation_examples': _integer(0),
  'checkpoint_every': _integer(1),
  'keep_checkpoints': _integer(1),
  'plot_partition': _boolean,
  'progress': _boolean,
  'logging.per_client': _boolean,
  'logging.wandb': _text,
}


def _fix(path: str, problem: str) -> str:
  return f'--config.{path} {problem}' + ('' if problem.endswith('?') else '.')


def validate(config) -> None:
  """Refuses a config that cannot run, before anything is written.

  Checks every field that has a rule in `RULES` (type and range, or a known
  name), then what relates fields: clients_per_round <= num_clients, local
  steps or epochs, the model block's fields against the model, the
  algorithm's keyword arguments against its factory, the dataset's files,
  and whether the partition can give every client data.

  Args:
    config: a run's `ml_collections.ConfigDict` (fedjax_metric/settings.py).

  Raises:
    ConfigError: the first problem found, naming the field and the fix.
    sources.DatasetNotFoundError: the dataset's files are not on disk.
  """
  values = config_io.flatten(config.to_dict())
  for path, check in RULES.items():
    if path in values:
      problem = check(values[path])
      if problem:
        raise ConfigError(_fix(path, problem))
  _check_relations(config)
  _check_server(config.server)
  _check_model(models.model_for_dataset(config.model, config.dataset.name))
  _check_algorithm(config)
  _check_dataset(config)
  why = wandb_log.missing(config.logging.wandb)
  if why:
    raise ConfigError(why)


def _check_relations(config) -> None:
  pattern = config.get('participation', {}).get('pattern', 'uniform')
  if pattern == 'uniform' and config.clients_per_round > config.num_clients:
    raise ConfigError(
      f'--config.clients_per_round={config.clients_per_round} is more than '
      f'--config.num_clients={config.num_clients}; lower the first or raise '
      'the second.'
    )
  fed = config.get('federated_eval')
  if fed and fed.clients and fed.every % config.eval_every:
    raise ConfigError(
      f'--config.federated_eval.every={fed.every} is not a multiple of '
      f'--config.eval_every={config.eval_every}: it would never run. Use a '
      'multiple of eval_every (0: at every evaluation).'
    )
  lc = config.local
  if lc.steps == 0 and lc.epochs < 1:
    raise ConfigError(
      '--config.local.epochs=0 with --config.local.steps=0 '
      'trains nothing; set one of them >= 1.'
    )


def _check_server(server) -> None:
  """The server block as a whole: the server optimizer is built (cheap: no
  state), so an option its optimizer does not take (server.form='fedopt'
  with sgd, server.initial_accumulator outside FedYogi's fedopt form,
  momentum with fedhyper) is refused here, before anything is written."""
  try:
    optimizers.make_server_optimizer(
      server.optimizer,
      learning_rate=server.learning_rate,
      momentum=server.momentum,
      b1=server.b1,
      b2=server.b2,
      eps=server.eps,
      form=server.form,
      initial_accumulator=server.initial_accumulator,
    )
  except ValueError as e:
    raise ConfigError(str(e)) from e


def _check_model(model_config) -> None:
  """The model block's fields against the model's constructor (no init)."""
  kwargs = {k: v for k, v in model_config.items() if k != 'name'}
  try:
    models.build(model_config.name, 10, None, **kwargs)
  except (TypeError, ValueError) as e:
    raise ConfigError(
      f'--config.model does not fit model '
      f'{model_config.name!r}: {e}. Set the model block to the '
      'fields that model declares.'
    ) from e


# A server that only averages: what an algorithm that does not read the
# server optimizer runs with (settings.py's defaults).
_PLAIN_SERVER = {'optimizer': 'sgd', 'learning_rate': 1.0, 'momentum': 0.0}


def _check_algorithm(config) -> None:
  """``algorithm_kwargs`` against the algorithm's declared options (names,
  types, ranges: `spec.AlgorithmSpec.make_options`), and a server optimizer
  set for an algorithm that declares it does not read one."""
  spec = algorithms.REGISTRY[config.algorithm]
  try:
    spec.make_options(**config.algorithm_kwargs)
  except ValueError as e:
    raise ConfigError(str(e)) from e
  if 'server_optimizer' not in spec.reads:
    changed = sorted(
      k for k, v in _PLAIN_SERVER.items() if config.server.get(k, v) != v
    )
    if changed or config.server.get('fedhyper_local', False):
      raise ConfigError(
        f'--config.server.{(changed or ["fedhyper_local"])[0]} is set, but '
        f'{config.algorithm!r} has no server optimizer (nothing is averaged '
        'into a global model); leave the server block at its defaults.'
      )


def _check_generated(config) -> None:
  """What a population made on demand (synthetic) cannot do: it has no
  stored training set to hold out, embed or augment (data/on_demand.py)."""
  name = config.dataset.name
  if config.eval_protocol != 'classification':
    raise ConfigError(
      f'--config.eval_protocol={config.eval_protocol!r} reads a stored '
      f'training set (images to embed or augment); {name} makes its '
      "clients' examples only when they are sampled and is evaluated by "
      "'classification'. Use a supervised algorithm's config (fedavg, "
      'scaffold, fedau, ...) or an image dataset.'
    )
  if config.dataset.validation_fraction:
    raise ConfigError(
      f'--config.dataset.validation_fraction holds out part of a stored '
      f'training set; {name} has none. Set it to 0.'
    )


def _check_dataset(config) -> None:
  """Files present, and enough training examples for the partition."""
  ds = config.dataset
  if not isinstance(ds.name, str) or not ds.name:
    raise ConfigError(
      _fix(
        'dataset.name',
        'must name a dataset, one of '
        f'{", ".join(sources.DATASETS)} or a TFDS name (tfds:<name> for '
        "TFDS's own where a built-in has the name)",
      )
    )
  sources.check_available(ds.name, ds.data_dir or None)
  if ds.name in sources.GENERATED_DATASETS:
    _check_generated(config)
  target = config.ssl_eval.target_dataset
  if target and config.eval_protocol != 'ssl':
    raise ConfigError(
      _fix(
        'ssl_eval.target_dataset',
        "is read by eval_protocol='ssl' only; leave it empty",
      )
    )
  if target and ds.get('validation_fraction', 0.0):
    # The probe of an out-of-distribution run reads the target's splits, so
    # its val_* metrics would be read on the target's test split.
    raise ConfigError(
      '--config.dataset.validation_fraction holds out part of the training '
      'set, but with --config.ssl_eval.target_dataset the evaluation reads '
      "the target's splits, and its val_* metrics would be test metrics. "
      'Set one of them to 0 (or empty).'
    )
  if target in sources.GENERATED_DATASETS:
    raise ConfigError(
      _fix(
        'ssl_eval.target_dataset',
        f'is {target!r}, which has no stored splits to probe; name an image '
        'dataset',
      )
    )
  if target:
    sources.check_available(target, config.ssl_eval.target_data_dir or None)
  size = TRAIN_SIZES.get(ds.name)
  if size is None:
    return
  # The partition splits what the validation split leaves (about: the
  # hold-out rounds per class).
  fraction = ds.get('validation_fraction', 0.0) or 0.0
  held = int(round(fraction * size))
  size -= held
  left = (
    f' left after holding out {held} (--config.dataset.validation_fraction='
    f'{fraction})'
    if held
    else ''
  )
  p = config.partition
  need, why = config.num_clients, 'one example per client'
  if p.method == 'dirichlet' and p.variant == 'niid_bench':
    need, why = (
      config.num_clients * p.min_size,
      (f'--config.partition.min_size={p.min_size} per client'),
    )
  elif p.method == 'shards':
    need, why = (
      config.num_clients * p.classes_per_client,
      (f'{p.classes_per_client} shards per client'),
    )
  elif p.method == 'quantity':
    need, why = (
      config.num_clients * max(p.min_size, 1),
      (f'--config.partition.min_size={p.min_size} per client'),
    )
    if p.size_distribution == 'power_law' and need <= size:
      smallest = quantity.power_law_sizes(
        size, config.num_clients, p.power_law_exponent
      )[-1]
      if smallest < max(p.min_size, 1):
        raise ConfigError(
          f'--config.partition.power_law_exponent={p.power_law_exponent} '
          f'over {config.num_clients} clients leaves the smallest client '
          f'{smallest} of the {size} {ds.name} examples, below '
          f'--config.partition.min_size={p.min_size}. Lower the exponent, '
          'num_clients or min_size.'
        )
  if need > size:
    raise ConfigError(
      f'{ds.name} has {size} training examples{left}: too few for '
      f'--config.num_clients={config.num_clients} with {why}. Lower '
      '--config.num_clients (or the per-client requirement).'
    )
