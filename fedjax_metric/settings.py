"""The config schema and shared blocks; every config parses its ``:arg`` with
`parse_arg` (fedjax_metric/overrides.py, the one override parser).

Every field the library reads is declared here, so a locked config turns a
mistyped override (``--config.num_round=5``) into an error instead of a silent
no-op. Method configs change values, never add fields, except inside
``algorithm_kwargs``. The papers' experimental settings built on it are
paper_settings.py.
"""

import difflib

import ml_collections

# The :arg parser (the one override parser of fedjax_metric/overrides.py);
# configs call it as settings.parse_arg.
from fedjax_metric.overrides import parse_arg as parse_arg
from fedjax_metric.overrides import peek_arg as peek_arg


def base_config():
  """The full set of fields, with FedAvg-on-digits defaults."""
  c = ml_collections.ConfigDict()
  c.seed = 0
  c.algorithm = 'fedavg'
  c.algorithm_kwargs = ml_collections.ConfigDict()  # Per-algorithm knobs.
  c.num_rounds = 20
  c.num_clients = 10
  c.clients_per_round = 10

  c.dataset = ml_collections.ConfigDict(
    dict(
      name='digits',  # digits | fashion_mnist | mnist | cifar10 | cifar100 | <tfds name>
      data_dir='',  # '' = the dataset's default location
      augmentation='none',  # none | flip | crop_flip
      # > 0: hold this fraction of each class of the training set out of
      # the clients' data (a fixed draw, the same for every seed) and log
      # every evaluation metric on it too, as val_*: tune on val_*, never
      # on test_*.
      validation_fraction=0.0,
      # synthetic (Synthetic(alpha, beta), data/synthetic.py): the stds of
      # the clients' model and input means; each client's size is capped at
      # max_client_examples; test_clients held-out clients make the test set.
      alpha=1.0,
      beta=1.0,
      max_client_examples=1000,
      test_clients=100,
    )
  )
  c.partition = ml_collections.ConfigDict(
    dict(
      method='dirichlet',  # iid | dirichlet | shards | one_class | quantity
      alpha=0.5,  # dirichlet; also quantity with size_distribution=dirichlet
      variant='niid_bench',  # niid_bench | balanced | per_client | per_class
      min_size=10,
      classes_per_client=2,  # shards only
      clients_per_class=1,  # one_class only: num_clients = this x classes
      size_distribution='dirichlet',  # quantity only: dirichlet | power_law
      power_law_exponent=1.0,  # quantity with power_law: n_r ~ r^-exponent
    )
  )
  # `name` plus that model's own constructor fields (method configs replace
  # the whole block for their model; a field the model lacks is an error).
  c.model = ml_collections.ConfigDict(
    dict(
      name='small_cnn',
      width=32,
      embedding_dim=128,
      pool='stride',  # stride | avg | max
      norm='none',  # none | batch | group
      # auto: patches (im2col + matmul) in the single-program executors
      # (vmap, chunked, sequential), xla (nn.Conv) in the host loop
      # | xla | patches | implicit (Pallas implicit-GEMM kernels, NVIDIA GPUs)
      conv_impl='auto',
    )
  )
  c.local = ml_collections.ConfigDict(
    dict(
      epochs=1,  # used when steps == 0
      steps=0,  # > 0: exactly this many steps per round
      batch_size=32,
      optimizer='sgd',  # sgd | adam | adamw
      learning_rate=0.05,
      momentum=0.0,
      nesterov=False,
      weight_decay=0.0,
      grad_clip_norm=0.0,  # 0 = no clipping
      schedule='constant',  # constant | exponential | cosine | warmup_cosine (over rounds)
      decay_rate=1.0,
      warmup_rounds=0,
      epoch_decay=1.0,  # lr x epoch_decay**e in local epoch e of a round
    )
  )
  c.server = ml_collections.ConfigDict(
    dict(
      # sgd (FedAvg / FedAvgM) | adam (FedAdam) | yogi (FedYogi) | fedagm
      # (FedAGM: SGD with momentum, clients start from the lookahead model
      # and add fedagm_beta/2 ||w - lookahead||^2 to their loss) | fedhyper
      # (FedHyper-G: learning_rate adapted each round by hypergradient).
      optimizer='sgd',
      learning_rate=1.0,
      momentum=0.0,
      fedagm_beta=0.002,
      # FedHyper-CL: each client's local rate adapted by hypergradient
      # (needs optimizer=fedhyper; algorithms/fedhyper.py).
      fedhyper_local=False,
      b1=0.9,
      b2=0.99,
      eps=1e-3,
      # adam / yogi: optax (optax.adam / optax.yogi) | fedopt (the authors'
      # released FedAdam / FedYogi: Keras' placement of eps, their server's
      # step count, Yogi from m = 0, v = initial_accumulator);
      # optimizers.make_server_optimizer says how they differ.
      form='optax',
      initial_accumulator=0.0,  # yogi with form=fedopt: v_0 (their runs: 0)
      weighting='num_examples',  # num_examples | uniform
    )
  )
  # Which clients take part in a round: 'uniform' draws clients_per_round of
  # them uniformly; 'bernoulli' | 'markov' | 'cyclic' | 'cyclic_offset' give
  # each client its own probability (mean E[p], floored, tied to its label
  # histogram by a Dirichlet(beta) vector) and a pattern over rounds
  # (fedjax_metric/data/participation.py); clients_per_round is then unused.
  c.participation = ml_collections.ConfigDict(
    dict(
      pattern='uniform',
      mean=0.1,
      floor=0.02,
      beta=0.1,
      normalize='expected',  # expected (FedAU's code) | empirical (PMFL's text)
      markov_rate=0.05,
      cycle=100,
    )
  )
  # Matmul / convolution precision of the run's programs: default (the
  # platform's float32 path; TF32 on recent NVIDIA GPUs) | highest (full
  # float32) | bf16 (bfloat16 compute, float32 parameters).
  c.precision = 'default'
  # How the host draws each round's batches: 'per_client' (a NumPy generator
  # per client, the order of every published result here) | 'vectorized'
  # (the whole cohort at once from counter-based draws: same distribution,
  # different draws, far less host time with thousands of clients).
  c.cohort_sampler = 'per_client'
  c.executor = 'auto'  # auto | host | vmap | chunked | sequential
  c.chunk_size = 0  # chunked executor: slots per chunk
  c.steps_per_call = 10  # host executor: unrolled steps per jitted call
  # vmap / chunked / sequential: rounds per jitted call (a scan over rounds;
  # the host returns only to evaluate, log and checkpoint). 0 = the largest
  # that divides eval_every and checkpoint_every; 1 = a call per round.
  c.rounds_per_call = 0
  c.unroll = 1  # vmap / chunked: lax.scan unroll over local steps
  c.num_devices = 0  # vmap / chunked: devices on the clients axis (0 = all)
  # Bytes per device the run may use (0 = 80% of accelerator memory, or half
  # the RAM on CPU): the client table is checked against it before it is
  # allocated, and chunked with chunk_size=0 picks its chunk size from it.
  c.memory_budget_gb = 0.0
  # Where the per-client state table lives (fedjax_metric/client_table.py,
  # docs/scale.md): auto (the device while it fits memory_budget_gb, else
  # host memory within host_budget_gb, else a file in the workdir) | device
  # | host | disk. prefetch: read the next call's rows while the current
  # call runs.
  c.client_table = ml_collections.ConfigDict(
    dict(placement='auto', host_budget_gb=0.0, prefetch=True)
  )
  c.eval_every = 1
  # classification | one_class (per-class AUROC) | ssl (kNN monitor; linear
  # probe and fine-tuning at the end) | embedding_knn (a supervised model's
  # embeddings: kNN, and a linear probe at the end):
  # fedjax_metric/evaluation/protocols.py.
  c.eval_protocol = 'classification'
  c.eval_batch_size = 1000
  # Federated evaluation (evaluation/federated.py): every `every` rounds
  # (0: at every evaluation), the global model on `clients` held-out
  # clients drawn afresh from (seed, round): mean and 10th / 50th / 90th
  # percentiles of per-client accuracy. 0 clients: off.
  c.federated_eval = ml_collections.ConfigDict(dict(clients=0, every=0))
  # Every evaluation row also logs <headline>_ema, the debiased exponential
  # moving average of the headline metric over the evaluations so far (the
  # statistic of FedRCL's tables at weight 0.9), and <headline>_top<k>_mean,
  # the mean of its k best evaluations (PMFL's tables: k = 5).
  c.eval_ema_weight = 0.9
  c.eval_top_k = 5
  # one_class: training examples per class behind each class center of the
  # 'center' score (a fixed random subset; 0 = all of them).
  c.one_class_center_examples = 0
  # > 0: also log effective rank, VCI, within/between-class traces and
  # uniformity of the global model's embeddings on this many test examples.
  c.representation_examples = 0
  # > 0: 'classification' also reports the global model's accuracy on this
  # many training examples (all when >= the training set): train_accuracy.
  c.eval_train_examples = 0
  # eval_protocol='ssl' (fedjax_metric/evaluation/ssl.py): kNN monitor every
  # evaluation; linear probe, fine-tuning on stratified label fractions,
  # uniformity and effective rank of the test features at the end. The
  # defaults are the SSD authors' released protocol; 0 examples = all.
  c.ssl_eval = ml_collections.ConfigDict(
    dict(
      knn_k=200,
      knn_temperature=0.1,
      knn_bank_examples=0,
      knn_test_examples=0,
      linear_epochs=200,
      linear_learning_rate=3e-3,
      linear_batch_size=512,
      finetune_fractions=(0.01, 0.1),
      finetune_epochs=200,
      finetune_batch_size=128,
      finetune_encoder_lr=1e-3,
      finetune_head_lr=0.3,
      finetune_evals=4,
      finetune_seed=17,
      quality_examples=0,
      erank_matrix='features',  # features (SSD App. A.2) | covariance
      # Out-of-distribution evaluation: '' evaluates on the run's dataset;
      # a dataset name puts every SSL metric on that dataset's splits,
      # resized to the training images' shape (evaluation/ssl.py).
      target_dataset='',
      target_data_dir='',
    )
  )
  c.checkpoint_every = 5
  c.keep_checkpoints = 2
  c.plot_partition = True
  c.progress = True
  # What a run records beyond metrics.jsonl. per_client: each cohort
  # client's loss, examples and update norm every round, to per_client.csv
  # (round, client_id, examples, loss, update_norm; pandas.read_csv reads it).
  # wandb: a Weights & Biases project to log the config and every evaluation
  # row to (the 'wandb' extra; '' = none).
  c.logging = ml_collections.ConfigDict(dict(per_client=False, wandb=''))
  return c


def shrink_for_runlocal(c):
  """A smoke version of any config (``:runlocal``): 2 rounds of 2 steps of
  at most 4 clients on digits (``:runlocal,dataset=...`` keeps the named
  dataset). It takes 15-40 s on 2 CPU cores (README.md), nearly all JAX
  start-up and compilation."""
  c.dataset.name = 'digits'
  c.dataset.data_dir = ''
  c.num_rounds = 2
  if c.partition.method != 'one_class':  # There: one client per class.
    c.num_clients = min(c.num_clients, 4)
  c.clients_per_round = min(c.clients_per_round, c.num_clients)
  c.partition.min_size = min(c.partition.min_size, 5)
  c.local.epochs = 1
  c.local.steps = 2
  c.local.batch_size = min(c.local.batch_size, 16)
  for field, tiny in (
    ('width', 8),
    ('embedding_dim', 16),
    ('out_dim', 16),
    ('widths', (8, 16, 32)),
  ):
    if field in c.model:
      c.model[field] = tiny
  if c.model.get('projection_dim'):  # 0 means no head: keep it off.
    c.model.projection_dim = 16
  c.eval_every = 1
  c.checkpoint_every = 1
  return c


# ``:server=<name>`` of the supervised settings: the server methods of
# FedRCL's Table 5 at the values of the authors' framework
# (github.com/geehokim/FedACG, configs/server/*.yaml), over any client method.
SERVER_METHODS = {
  'fedavg': dict(optimizer='sgd', learning_rate=1.0, momentum=0.0),
  'fedavgm': dict(optimizer='sgd', learning_rate=1.0, momentum=0.4),
  'fedagm': dict(
    optimizer='fedagm', learning_rate=1.0, momentum=0.85, fedagm_beta=0.002
  ),
  # FedHyper (Wang, Wang and Li, ICLR 2024): the global scheduler G from
  # its initial rate 1 and the client-side local scheduler CL.
  'fedhyper': dict(
    optimizer='fedhyper', learning_rate=1.0, momentum=0.0, fedhyper_local=True
  ),
}


def apply_server_method(c, name):
  """Sets ``c.server`` to the server method ``name`` (`SERVER_METHODS`)."""
  if name not in SERVER_METHODS:
    raise ValueError(
      f'Unknown server method {name!r} (:server=...); use one of '
      f'{sorted(SERVER_METHODS)}, or set --config.server.* directly.'
    )
  c.server.update(SERVER_METHODS[name])


class _MissingFieldMessage:
  """A locked block's message for a field it lacks, in one short line.

  ml_collections builds the error of ``config.num_round = 5`` on a locked
  config with the block's ``_generate_did_you_mean_message``, from a text
  that holds every field of the block with its value: for the whole config
  one line of 2,400 characters, the suggestion at its end. `finalize` sets
  one of these as that method of each block (an instance attribute: plain
  ConfigDicts elsewhere are untouched), so the same KeyError /
  AttributeError reads ``config.num_round: the config has no field
  'num_round'; did you mean 'num_rounds'?``. It keeps the block's dotted
  path and field names (fixed while the block is locked). A copy or an
  unpickled config drops it (ConfigDict's ``__setstate__`` keeps only its
  fields) and has ml_collections' own message again.
  """

  def __init__(self, path, keys):
    self.path = path
    self.keys = tuple(keys)

  def __call__(self, request, message=''):
    if isinstance(request, (int, float)):
      return message
    if 'cannot be added since the config is locked' in message:
      # The command line's cutoff (launch/main.py, override_error).
      close = difflib.get_close_matches(str(request), self.keys, 1)
      where = 'the config' if self.path == 'config' else self.path
      hint = f'; did you mean {close[0]!r}?' if close else '.'
      return f'{self.path}.{request}: {where} has no field {request!r}{hint}'
    # Any other message (a missing field read): ml_collections' own form.
    close = difflib.get_close_matches(str(request), self.keys, 1, 0.75)
    if close:
      message += ('\n' if message else '') + (
        f'Did you mean "{close[0]}" instead of "{request}"?'
      )
    return message


def _short_missing_field_messages(block, path='config'):
  """Sets `_MissingFieldMessage` on ``block`` and every block inside it."""
  object.__setattr__(
    block,
    '_generate_did_you_mean_message',
    _MissingFieldMessage(path, (str(k) for k in block.keys())),
  )
  for key, value in block.items():
    if isinstance(value, ml_collections.ConfigDict):
      _short_missing_field_messages(value, f'{path}.{key}')


def finalize(c, arg):
  """Applies the shared ``:arg`` options and locks the config (a mistyped
  field set from Python is then a one-line error naming the closest field,
  as ``--config.num_round=5`` is on the command line)."""
  if arg.get('server'):
    apply_server_method(c, arg.server)
  if arg.runlocal:
    shrink_for_runlocal(c)
  if arg.dataset:  # After runlocal: a dataset named explicitly wins.
    c.dataset.name = arg.dataset
  c.lock()
  _short_missing_field_messages(c)
  return c


def model_block(name, *, norm):
  """The paper models at their sizes, or the small CNN for CPU-sized runs."""
  blocks = {
    'fedquad_cnn': dict(
      name='fedquad_cnn',
      widths=(64, 128, 256),
      embedding_dim=128,
      norm=norm,
      conv_impl='auto',
    ),
    'resnet18': dict(name='resnet18', norm=norm, groups=2, width=64),
    'moon_cnn': dict(name='moon_cnn', out_dim=256),
    'small_cnn': dict(
      name='small_cnn',
      width=32,
      embedding_dim=128,
      pool='stride',
      norm=norm,
      conv_impl='auto',
    ),
  }
  if name not in blocks:
    raise ValueError(
      f'Unknown model argument {name!r}; use one of {sorted(blocks)}.'
    )
  return ml_collections.ConfigDict(blocks[name])


# ``:arg`` fields of the configs built on base_config (FedAvg's own setting,
# FedProx, SCAFFOLD): the same central / model / dataset / runlocal as the
# paper settings below.
BASE_ARGS = dict(
  runlocal=False, dataset='', central=False, model='small_cnn', server=''
)
# Each model's normalisation where base_config's model block is replaced:
# the one its paper uses (FedQuad's CNN: BatchNorm; FedRCL's ResNet-18:
# GroupNorm); the small CNN keeps base_config's none.
BASE_NORMS = {
  'small_cnn': 'none',
  'fedquad_cnn': 'batch',
  'resnet18': 'group',
  'moon_cnn': 'none',
}


def base_setting(arg):
  """base_config() with the ``:central`` and ``:model=`` of ``arg``."""
  c = base_config()
  if arg.model != 'small_cnn':
    c.model = model_block(arg.model, norm=BASE_NORMS.get(arg.model, 'none'))
  if arg.central:
    central(c)
  return c


def central(c):
  """The "Supervised (Non-FL)" rows: one client holding all data, IID."""
  c.num_clients = 1
  c.clients_per_round = 1
  c.partition.method = 'iid'
  return c
