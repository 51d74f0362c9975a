"""Shared config blocks and the ``:arg`` parser every config file uses.

Every field the library reads is declared here, so a locked config turns a
mistyped override (``--config.num_round=5``) into an error instead of a silent
no-op. Method configs change values, never add fields, except inside
``algorithm_kwargs``.
"""

import ml_collections


def parse_arg(arg, **defaults):
  """Parses ``'runlocal,dataset=fashion_mnist'`` into a ConfigDict.

  A bare name is a boolean flag; ``key=value`` is converted to the type of the
  default. Unknown names are an error.
  """
  parsed = ml_collections.ConfigDict(defaults)
  for item in filter(None, (arg or '').split(',')):
    key, _, value = item.partition('=')
    if key not in defaults:
      raise ValueError(f'Unknown config argument {key!r}; known: '
                       f'{sorted(defaults)}.')
    kind = type(defaults[key])
    if not value:
      parsed[key] = True
    elif kind is bool:
      parsed[key] = value.lower() in ('1', 'true', 'yes')
    else:
      parsed[key] = kind(value)
  return parsed


def base_config():
  """The full set of fields, with FedAvg-on-digits defaults."""
  c = ml_collections.ConfigDict()
  c.seed = 0
  c.algorithm = 'fedavg'
  c.algorithm_kwargs = ml_collections.ConfigDict()  # Per-algorithm knobs.
  c.num_rounds = 20
  c.num_clients = 10
  c.clients_per_round = 10

  c.dataset = ml_collections.ConfigDict(dict(
      name='digits',        # digits | fashion_mnist | mnist | cifar10 | cifar100 | <tfds name>
      data_dir='',          # '' = the dataset's default location
      augmentation='none',  # none | flip | crop_flip
  ))
  c.partition = ml_collections.ConfigDict(dict(
      method='dirichlet',   # iid | dirichlet | shards | one_class
      alpha=0.5,
      variant='niid_bench',  # niid_bench | balanced | per_client | per_class
      min_size=10,
      classes_per_client=2,  # shards only
  ))
  # `name` plus that model's own constructor fields (method configs replace
  # the whole block for their model; a field the model lacks is an error).
  c.model = ml_collections.ConfigDict(dict(
      name='small_cnn', width=32, embedding_dim=128,
      pool='stride',        # stride | avg | max
      norm='none',          # none | batch | group
  ))
  c.local = ml_collections.ConfigDict(dict(
      epochs=1,             # used when steps == 0
      steps=0,              # > 0: exactly this many steps per round
      batch_size=32,
      optimizer='sgd',      # sgd | adam | adamw
      learning_rate=0.05,
      momentum=0.0, nesterov=False, weight_decay=0.0,
      grad_clip_norm=0.0,   # 0 = no clipping
      schedule='constant',  # constant | exponential | cosine | warmup_cosine (over rounds)
      decay_rate=1.0, warmup_rounds=0,
  ))
  c.server = ml_collections.ConfigDict(dict(
      optimizer='sgd',      # sgd (FedAvg / FedAvgM) | adam (FedAdam) | yogi (FedYogi)
      learning_rate=1.0, momentum=0.0, b1=0.9, b2=0.99, eps=1e-3,
      weighting='num_examples',  # num_examples | uniform
  ))
  c.executor = 'auto'       # auto | host | vmap | chunked | sequential
  c.chunk_size = 0          # chunked executor: slots per chunk
  c.steps_per_call = 10     # host executor: unrolled steps per jitted call
  c.unroll = 1              # vmap / chunked: lax.scan unroll over local steps
  c.num_devices = 0         # vmap / chunked: devices on the clients axis (0 = all)
  c.eval_every = 1
  c.eval_batch_size = 1000
  c.checkpoint_every = 5
  c.keep_checkpoints = 2
  c.plot_partition = True
  c.progress = True
  return c


def shrink_for_runlocal(c):
  """A seconds-long smoke version of any config (``:runlocal``)."""
  c.dataset.name = 'digits'
  c.dataset.data_dir = ''
  c.num_rounds = 2
  c.num_clients = min(c.num_clients, 4)
  c.clients_per_round = min(c.clients_per_round, c.num_clients)
  c.partition.min_size = min(c.partition.min_size, 5)
  c.local.epochs = 1
  c.local.steps = 2
  c.local.batch_size = min(c.local.batch_size, 16)
  for field, tiny in (('width', 8), ('embedding_dim', 16)):
    if field in c.model:
      c.model[field] = tiny
  c.eval_every = 1
  c.checkpoint_every = 1
  return c


def finalize(c, arg):
  """Applies the shared ``:arg`` options and locks the config."""
  if arg.dataset:
    c.dataset.name = arg.dataset
  if arg.runlocal:
    shrink_for_runlocal(c)
  c.lock()
  return c
