"""The five papers' experimental settings, as config builders.

Each ``*_setting(arg)`` returns `settings.base_config` changed to one
paper's protocol (data, partition, model, local training, evaluation) and
each ``*_ARGS`` lists the ``:arg`` keys its configs accept; the docstrings
cite the paper and section each value comes from. `setting_config` picks a
setting by name for the baselines that run in several (FedAvg, FedProx).
"""

import ml_collections

from fedjax_metric.data import sources
from fedjax_metric.settings import (
  BASE_ARGS,
  base_config,
  base_setting,
  central,
  finalize,
  model_block,
  parse_arg,
  peek_arg,
  shrink_for_runlocal,
)


def setting_config(arg):
  """``(config, parsed arg)`` of the setting an arg string names.

  ``setting=fedquad`` / ``setting=fedrcl``: those papers' settings with their
  arguments; no setting: `base_setting` (``central``, ``model``, ``dataset``,
  ``runlocal``). For the baselines that run in every setting (FedAvg, FedProx).
  """
  setting = peek_arg(arg, 'setting')
  if setting == 'fedquad':
    arg = parse_arg(arg, setting='', **FEDQUAD_ARGS)
    return fedquad_setting(arg), arg
  if setting == 'fedrcl':
    arg = parse_arg(arg, setting='', **FEDRCL_ARGS)
    return fedrcl_setting(arg), arg
  if setting == '':
    arg = parse_arg(arg, setting='', **BASE_ARGS)
    return base_setting(arg), arg
  raise ValueError(f"setting must be 'fedquad' or 'fedrcl', got {setting!r}.")


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
  c.local.update(
    dict(
      epochs=5,
      batch_size=128,
      optimizer='adam',
      learning_rate=1e-3,
      weight_decay=1e-5,
    )
  )
  c.eval_every = 1
  c.representation_examples = 2000
  if arg.central:
    central(c)
  return c


FEDQUAD_ARGS = dict(
  runlocal=False,
  dataset='',
  clients=10,
  alpha=0.5,
  iid=False,
  central=False,
  model='fedquad_cnn',
  server='',
)


def fedrcl_setting(arg):
  """FedRCL's setting (Seo et al., 'Relaxed Contrastive Learning for Federated
  Learning', CVPR 2024, Sec. 5, and the authors' released configs,
  github.com/skynbe/FedRCL; docs/methods.md, FedRCL): CIFAR-10, ResNet-18 with
  GroupNorm(2), 100 clients, 5% (5) per round, the balanced Dirichlet
  partition, SGD lr 0.1 decayed 0.998 per round, weight decay 1e-3, gradient
  clipping 10, batch 50, 5 local epochs, 1000 rounds, unweighted averaging,
  random crop + flip, and inside a round a further 0.998 per local epoch (the
  authors' LambdaLR); evaluation every round (the paper reports the moving
  average 0.9 of these: launch/sweep.py, metric test_accuracy_ema). Not
  reproduced: the 10-degree random rotation, mixed precision.

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
  c.local.update(
    dict(
      epochs=5,
      batch_size=50,
      optimizer='sgd',
      learning_rate=0.1,
      weight_decay=1e-3,
      grad_clip_norm=10.0,
      schedule='exponential',
      decay_rate=0.998,
      epoch_decay=0.998,
    )
  )
  c.server.weighting = 'uniform'
  # Every round, as the released trainer (eval freq 1): the paper reports an
  # exponential moving average (0.9) of these per-round accuracies
  # (launch/sweep.py table --metric=test_accuracy_ema).
  c.eval_every = 1
  c.representation_examples = 2000  # FedRCL's effective-rank analysis
  if arg.central:
    central(c)
  return c


FEDRCL_ARGS = dict(
  runlocal=False,
  dataset='',
  alpha=0.3,
  central=False,
  model='resnet18',
  server='',
)


def one_class_model_block(name):
  """The one-class embedding networks (no classifier) at the paper's sizes:
  'lenet' (Ruff et al.'s MNIST LeNet, 32-d) or 'resnet32' (64-d), both with
  GroupNorm."""
  blocks = {
    'lenet': dict(
      name='lenet',
      embedding_dim=32,
      widths=(8, 4),
      norm='group',
      groups=2,
      norm_affine=False,
      use_bias=False,
      conv_impl='auto',
      l2_normalize=False,
    ),
    'resnet32': dict(
      name='resnet32', embedding_dim=64, width=16, norm='group', groups=2
    ),
  }
  if name not in blocks:
    raise ValueError(
      f'Unknown one-class model {name!r}; use one of {sorted(blocks)}.'
    )
  return ml_collections.ConfigDict(blocks[name])


def one_class_setting(arg):
  """The one-class-per-client setting of Park, Hosseini and Yun, 'Federated
  Learning with Metric Loss', FL-ICML workshop 2021, Sec. 4.1, shared by
  FedMetric and its baselines (DeepSVDD, FedAwS, FedUV).

  One class per client (10 clients = 10 classes; ``clients_per_class=k``
  gives 10 k clients), every client in every round, local SGD lr 0.1 with
  batch 16, uniform model averaging, the LeNet of Ruff et al. (32-d) on
  28x28 data or ResNet-32 (64-d) on CIFAR, both with GroupNorm, evaluated
  by per-class one-vs-rest AUROC. The paper trains "1 local iteration" per
  round for 10,000 (MNIST) / 100,000 (CIFAR-10) rounds; a round here is one
  local epoch by default, or ``steps=S`` local steps (``steps=1`` is the
  one-batch reading of "1 local iteration"). The paper's data is MNIST;
  the default here is Fashion-MNIST, the 28x28 set available offline.

  ``arg`` fields: dataset, clients_per_class, steps, rounds, eval_every,
  model ('' = lenet, or resnet32 for CIFAR), center_examples (training
  examples per class behind each evaluation center; 0 = all).
  """
  c = base_config()
  c.dataset.name = arg.dataset or 'fashion_mnist'
  c.num_rounds = arg.rounds
  # tfds:cifar10 is CIFAR-10 too.
  name = sources.tfds_name(c.dataset.name) or c.dataset.name
  num_classes = 100 if name == 'cifar100' else 10
  c.num_clients = arg.clients_per_class * num_classes
  c.clients_per_round = c.num_clients
  c.partition.method = 'one_class'
  c.partition.clients_per_class = arg.clients_per_class
  model = arg.model or ('resnet32' if name.startswith('cifar') else 'lenet')
  c.model = one_class_model_block(model)
  c.local.update(
    dict(
      epochs=1,
      steps=arg.steps,
      batch_size=16,
      optimizer='sgd',
      learning_rate=0.1,
    )
  )
  c.server.weighting = 'uniform'
  # All clients every round, a fixed number of steps: no padding, so the
  # clients can run in one program, R rounds per call. Measured on the
  # 2-core CPU (benchmarks/cpu_rounds.md), one-step rounds: 40 ms with
  # 'sequential' vs 79 ms with 'host' (one call per client and round).
  c.executor = 'sequential'
  c.eval_protocol = 'one_class'
  c.eval_every = arg.eval_every
  c.checkpoint_every = arg.eval_every
  c.one_class_center_examples = arg.center_examples
  return c


ONE_CLASS_ARGS = dict(
  runlocal=False,
  dataset='',
  clients_per_class=1,
  steps=0,
  rounds=30,
  eval_every=5,
  model='',
  center_examples=1000,
)


def participation_setting(arg):
  """PMFL's heterogeneous setting (Zhang et al., 'Towards Performance-Enhanced
  Model-Contrastive Federated Learning using Historical Information in
  Heterogeneous Scenarios', preprint, 2025, Section V), shared by PMFL and
  its baselines FedAU, FedVarp, MIFA and FedAvg: 250 clients, FedAU's
  per-client Dirichlet(0.1) label partition, participation probabilities
  tied to the label histograms by a Dirichlet(beta = 0.1) vector with
  E[p] = 0.1 and floor 0.02, 5 local SGD steps (not epochs) of batch 16 at
  lr 0.1 without momentum, eta_g = 1, every client counting equally.

  Datasets and model differ from the paper (SVHN / CIFAR with a 2-conv CNN):
  Fashion-MNIST (offline) and the small CNN at width 16 with a 64-d
  ReLU embedding under the classifier (the paper's encoder -> projection ->
  classifier), which keeps PMFL's 250 x 5 buffered models small on a CPU.
  Training accuracy is measured on the whole training set.

  ``arg`` fields: dataset, pattern (bernoulli | markov | cyclic |
  cyclic_offset; PMFL's text writes the cyclic rule of 'cyclic_offset',
  FedAU's code 'cyclic'), normalize (empirical: PMFL's Eq. 12 sets the mean
  of this draw to E[p]; expected: FedAU's code), rounds, eval_every, width.
  """
  c = base_config()
  c.dataset.name = arg.dataset or 'fashion_mnist'
  c.num_rounds = arg.rounds
  c.num_clients = 250
  c.clients_per_round = 25  # Unused under a participation pattern.
  c.partition.method = 'dirichlet'
  c.partition.variant = 'per_client'
  c.partition.alpha = 0.1
  c.participation.update(
    dict(
      pattern=arg.pattern,
      mean=0.1,
      floor=0.02,
      beta=0.1,
      normalize=arg.normalize,
      markov_rate=0.05,
      cycle=100,
    )
  )
  c.model = ml_collections.ConfigDict(
    dict(
      name='small_cnn',
      width=arg.width,
      embedding_dim=4 * arg.width,
      pool='stride',
      norm='none',
      conv_impl='auto',
    )
  )
  c.local.update(
    dict(
      epochs=1,
      steps=5,
      batch_size=16,
      optimizer='sgd',
      learning_rate=0.1,
      momentum=0.0,
    )
  )
  c.server.update(
    dict(optimizer='sgd', learning_rate=1.0, momentum=0.0, weighting='uniform')
  )
  c.eval_every = arg.eval_every
  c.eval_train_examples = 60000
  c.checkpoint_every = min(250, arg.rounds)
  c.keep_checkpoints = 1
  return c


PARTICIPATION_ARGS = dict(
  runlocal=False,
  dataset='',
  pattern='bernoulli',
  normalize='empirical',
  rounds=1000,
  eval_every=50,
  width=16,
)


def ssl_setting(arg):
  """The federated unsupervised setting of SSD (Fang et al., 'Soft
  Separation and Distillation: Toward Global Uniformity in Federated
  Unsupervised Learning', ICCV 2025, Sec. 4 and App. A.1, and the authors'
  released code, github.com/hc-fang/ssd), shared by FedAlignUniform, SSD,
  FedDecorr, FedU2, FedX and L-DAWA.

  Dirichlet(0.1) label skew with the fedbox per-class split
  (partition variant 'per_class'); cross-silo (``clients=10``, every client
  every round) or cross-device (``clients=50, join=0.2``: 10 sampled per
  round); SGD lr 0.1 constant, momentum 0.9, weight decay 1e-4, batch 128,
  5 local epochs, 100 rounds; the server averages with weights = local
  batches; evaluation protocol 'ssl' (kNN monitor; linear probe,
  fine-tuning on 1% / 10% of the labels, uniformity and effective rank at
  the end). The paper's encoder is a CIFAR ResNet-18 ('ssl_resnet18'); the
  default here is the small CNN ('ssl_cnn', 128-d encoder and projector)
  so that runs fit a CPU. All methods see the same two views (``views``:
  'ssd' = SSD's released augmentation, 'fedu2' = FedU2's).

  ``arg`` fields: dataset ('' = fashion_mnist), clients, join, alpha,
  model ('ssl_cnn' | 'ssl_resnet18'), epochs, rounds, views, eval_every.
  """
  c = base_config()
  c.dataset.name = arg.dataset or 'fashion_mnist'
  c.num_rounds = arg.rounds
  c.num_clients = arg.clients
  c.clients_per_round = max(1, int(round(arg.clients * arg.join)))
  c.partition.method = 'dirichlet'
  c.partition.variant = 'per_class'
  c.partition.alpha = arg.alpha
  if arg.model == 'ssl_resnet18':
    c.model = ml_collections.ConfigDict(
      dict(
        name='ssl_resnet18',
        projector_hidden=2048,
        projection_dim=512,
        norm='batch',
        width=64,
      )
    )
  elif arg.model == 'ssl_cnn':
    c.model = ml_collections.ConfigDict(
      dict(
        name='ssl_cnn',
        width=32,
        embedding_dim=128,
        projector_hidden=512,
        projection_dim=128,
        norm='batch',
      )
    )
  else:
    raise ValueError(
      f"model must be 'ssl_cnn' or 'ssl_resnet18', got {arg.model!r}."
    )
  c.local.update(
    dict(
      epochs=arg.epochs,
      batch_size=128,
      optimizer='sgd',
      learning_rate=0.1,
      momentum=0.9,
      weight_decay=1e-4,
      schedule='constant',
    )
  )
  c.server.update(
    dict(
      optimizer='sgd', learning_rate=1.0, momentum=0.0, weighting='num_batches'
    )
  )
  c.algorithm_kwargs = ml_collections.ConfigDict(dict(view_order=arg.views))
  c.eval_protocol = 'ssl'
  c.eval_every = arg.eval_every
  c.checkpoint_every = arg.eval_every
  return c


SSL_ARGS = dict(
  runlocal=False,
  dataset='',
  clients=10,
  join=1.0,
  alpha=0.1,
  model='ssl_cnn',
  epochs=5,
  rounds=100,
  views='ssd',
  eval_every=5,
)


def ssl_runlocal(c):
  """`shrink_for_runlocal` for the 'ssl' configs: encoder and projector of
  equal width (projector distillation needs it) and seconds-long
  evaluation."""
  shrink_for_runlocal(c)
  if c.model.name == 'ssl_resnet18':
    c.model.projection_dim = 8 * c.model.width
  else:
    c.model.projection_dim = c.model.embedding_dim
  c.model.projector_hidden = 2 * c.model.projection_dim
  c.ssl_eval.update(
    dict(
      linear_epochs=2,
      finetune_epochs=1,
      finetune_evals=1,
      finetune_fractions=(0.1,),
      finetune_batch_size=16,
    )
  )
  return c


def ssl_config(
  arg, algorithm, *, drop_last_cross_silo=False, **algorithm_kwargs
):
  """The full config of one method of the 'ssl' family from its ``arg``.

  ``drop_last_cross_silo``: drop partial batches when there are at most 10
  clients, as SSD's released training script does.
  """
  arg = parse_arg(arg, **SSL_ARGS)
  c = ssl_setting(arg)
  c.algorithm = algorithm
  c.algorithm_kwargs.update(algorithm_kwargs)
  if drop_last_cross_silo:
    c.algorithm_kwargs.drop_last = arg.clients <= 10
  if arg.runlocal:
    ssl_runlocal(c)
    # Shrunk already: `finalize` must not shrink again, which would put the
    # projector back to 16 wide under a wider encoder (ssl_resnet18).
    arg = ml_collections.ConfigDict({**arg.to_dict(), 'runlocal': False})
  return finalize(c, arg)
