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


def peek_arg(arg, key, default=''):
  """The value of one ``key=value`` item of an arg string, before parsing."""
  for item in filter(None, (arg or '').split(',')):
    name, _, value = item.partition('=')
    if name == key:
      return value
  return default


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
      epoch_decay=1.0,      # lr x epoch_decay**e in local epoch e of a round
  ))
  c.server = ml_collections.ConfigDict(dict(
      optimizer='sgd',      # sgd (FedAvg / FedAvgM) | adam (FedAdam) | yogi (FedYogi)
      learning_rate=1.0, momentum=0.0, b1=0.9, b2=0.99, eps=1e-3,
      weighting='num_examples',  # num_examples | uniform
  ))
  # Which clients take part in a round: 'uniform' draws clients_per_round of
  # them uniformly; 'bernoulli' | 'markov' | 'cyclic' | 'cyclic_offset' give
  # each client its own probability (mean E[p], floored, tied to its label
  # histogram by a Dirichlet(beta) vector) and a pattern over rounds
  # (fedjax_metric/data/participation.py); clients_per_round is then unused.
  c.participation = ml_collections.ConfigDict(dict(
      pattern='uniform', mean=0.1, floor=0.02, beta=0.1,
      normalize='expected',  # expected (FedAU's code) | empirical (PMFL's text)
      markov_rate=0.05, cycle=100,
  ))
  # Matmul / convolution precision of the run's programs: default (the
  # platform's float32 path; TF32 on recent NVIDIA GPUs) | highest (full
  # float32) | bf16 (bfloat16 compute, float32 parameters).
  c.precision = 'default'
  c.executor = 'auto'       # auto | host | vmap | chunked | sequential
  c.chunk_size = 0          # chunked executor: slots per chunk
  c.steps_per_call = 10     # host executor: unrolled steps per jitted call
  c.unroll = 1              # vmap / chunked: lax.scan unroll over local steps
  c.num_devices = 0         # vmap / chunked: devices on the clients axis (0 = all)
  # Bytes per device the run may use (0 = 80% of accelerator memory, or half
  # the RAM on CPU): the client table is checked against it before it is
  # allocated, and chunked with chunk_size=0 picks its chunk size from it.
  c.memory_budget_gb = 0.0
  c.eval_every = 1
  # classification | one_class (per-class AUROC) | ssl (kNN monitor; linear
  # probe and fine-tuning at the end): fedjax_metric/evaluation/protocols.py.
  c.eval_protocol = 'classification'
  c.eval_batch_size = 1000
  # > 0: also log effective rank, VCI, within/between-class traces and
  # uniformity of the global model's embeddings on this many test examples.
  c.representation_examples = 0
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
  for field, tiny in (('width', 8), ('embedding_dim', 16), ('out_dim', 16),
                      ('widths', (8, 16, 32))):
    if field in c.model:
      c.model[field] = tiny
  if c.model.get('projection_dim'):  # 0 means no head: keep it off.
    c.model.projection_dim = 16
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


def model_block(name, *, norm):
  """The paper models at their sizes, or the small CNN for CPU-sized runs."""
  blocks = {
      'fedquad_cnn': dict(name='fedquad_cnn', widths=(64, 128, 256),
                          embedding_dim=128, norm=norm),
      'resnet18': dict(name='resnet18', norm=norm, groups=2, width=64),
      'moon_cnn': dict(name='moon_cnn', out_dim=256),
      'small_cnn': dict(name='small_cnn', width=32, embedding_dim=128,
                        pool='stride', norm=norm),
  }
  if name not in blocks:
    raise ValueError(f'Unknown model argument {name!r}; use one of {sorted(blocks)}.')
  return ml_collections.ConfigDict(blocks[name])


def central(c):
  """The "Supervised (Non-FL)" rows: one client holding all data, IID."""
  c.num_clients = 1
  c.clients_per_round = 1
  c.partition.method = 'iid'
  return c


def fedquad_setting(arg):
  """FedQuad's experimental setting (Goksu & Pugeault, 'FedQuad: Federated
  Stochastic Quadruplet Learning to Mitigate Data Heterogeneity',
  arXiv:2509.04107, 2025, Section IV-A), shared by FedQuad and the baselines
  of its Tables I-IV: CIFAR-10, the 3-block CNN with a 128-d
  embedding, all clients every round, Adam 1e-3 (weight decay 1e-5), batch
  128, 5 local epochs, 20 rounds, NIID-Bench Dirichlet (alpha 0.3 / 0.5) or
  IID, aggregation weighted by |D_i|. The paper names no augmentation; none
  is used.

  ``arg`` fields: clients (10 / 50 / 200), alpha, iid, central, model
  ('fedquad_cnn', or 'small_cnn' with BatchNorm for CPU-sized runs).
  """
  c = base_config()
  c.dataset.name = 'cifar10'
  c.num_rounds = 20
  c.num_clients = arg.clients
  c.clients_per_round = arg.clients
  c.partition.method = 'iid' if arg.iid else 'dirichlet'
  c.partition.alpha = arg.alpha
  c.model = model_block(arg.model, norm='batch')
  c.local.update(dict(epochs=5, batch_size=128, optimizer='adam',
                      learning_rate=1e-3, weight_decay=1e-5))
  c.eval_every = 1
  c.representation_examples = 2000
  if arg.central:
    central(c)
  return c


FEDQUAD_ARGS = dict(runlocal=False, dataset='', clients=10, alpha=0.5,
                    iid=False, central=False, model='fedquad_cnn')


def fedrcl_setting(arg):
  """FedRCL's setting (Seo et al., 'Relaxed Contrastive Learning for Federated
  Learning', CVPR 2024, Sec. 5, and the authors' released configs,
  github.com/skynbe/FedRCL; docs/methods.md, FedRCL): CIFAR-10, ResNet-18 with
  GroupNorm(2), 100 clients, 5% (5) per round, the balanced Dirichlet
  partition, SGD lr 0.1 decayed 0.998 per round, weight decay 1e-3, gradient
  clipping 10, batch 50, 5 local epochs, 1000 rounds, unweighted averaging,
  random crop + flip, and inside a round a further 0.998 per local epoch (the
  authors' LambdaLR). Not reproduced: the 10-degree random rotation, mixed
  precision.

  ``arg`` fields: alpha (0.05 / 0.1 / 0.3 / 0.6), central, model ('resnet18',
  or 'small_cnn' with GroupNorm(2) for CPU-sized runs).
  """
  c = base_config()
  c.dataset.name = 'cifar10'
  c.dataset.augmentation = 'crop_flip'
  c.num_rounds = 1000
  c.num_clients = 100
  c.clients_per_round = 5
  c.partition.method = 'dirichlet'
  c.partition.variant = 'balanced'
  c.partition.alpha = arg.alpha
  c.model = model_block(arg.model, norm='group')
  c.local.update(dict(epochs=5, batch_size=50, optimizer='sgd',
                      learning_rate=0.1, weight_decay=1e-3, grad_clip_norm=10.0,
                      schedule='exponential', decay_rate=0.998,
                      epoch_decay=0.998))
  c.server.weighting = 'uniform'
  # Every round, as the released trainer (eval freq 1): the paper reports an
  # exponential moving average (0.9) of these per-round accuracies
  # (launch/sweep.py table --metric=test_accuracy_ema).
  c.eval_every = 1
  c.representation_examples = 2000  # FedRCL's effective-rank analysis
  if arg.central:
    central(c)
  return c


FEDRCL_ARGS = dict(runlocal=False, dataset='', alpha=0.3, central=False,
                   model='resnet18')
