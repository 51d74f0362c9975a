"""FedUV building blocks: the clients' +-1 codewords.

Hosseini, Park, Yun, Louizos, Soriaga and Welling, 'Federated Learning of
User Verification Models Without Sharing Embeddings', ICML 2021. Every
client (user) owns a secret codeword v in {-1, +1}^c; the embedding
network's c-dimensional output is trained with the positive-only loss
`fedjax_metric.losses.feduv_loss` to correlate with v. Because the codewords
are far apart (large minimum Hamming distance), no negative loss and no
sharing of embeddings is needed. The paper draws codewords from an
error-correcting code (BCH); here they are rows of a Hadamard matrix when
that fits, random otherwise (the paper's analysis also covers random codes).
"""

import dataclasses
import functools
from typing import Literal, Optional

import jax.numpy as jnp
import numpy as np

from fedjax_metric.algorithms import fedavg
from fedjax_metric.algorithms import oneclass_common as common
from fedjax_metric.algorithms.spec import AlgorithmSpec
from fedjax_metric.losses.oneclass import feduv_loss

CODEWORD_KINDS = ('auto', 'hadamard', 'random')


def _is_power_of_two(n):
  return n >= 1 and n & (n - 1) == 0


def _sylvester_hadamard(dim):
  """[dim, dim] Sylvester Hadamard matrix H_{2n} = [[H, H], [H, -H]]
  (`scipy.linalg.hadamard`; dim a power of 2)."""
  import scipy.linalg  # Lazy: only FedUV needs it.

  return scipy.linalg.hadamard(dim, dtype=np.int64)


def min_hamming_distance(codes):
  """Smallest Hamming distance between two distinct rows of a +-1 matrix.

  For +-1 vectors, Hamming(u, v) = (c - u . v) / 2.

  Args:
    codes: [C, c] entries +-1.

  Returns:
    int; c (the length) when there is a single row, i.e. no pair.
  """
  codes = np.asarray(codes, np.int64)
  num, length = codes.shape
  if num < 2:
    return int(length)
  dist = (length - codes @ codes.T) // 2
  return int(dist[~np.eye(num, dtype=bool)].min())


def codewords(num_classes, dim, *, seed=0, kind='auto', max_tries=100):
  """One +-1 codeword per class, and the code's minimum Hamming distance.

  Hosseini et al., 'Federated Learning of User Verification Models Without
  Sharing Embeddings', ICML 2021 (codeword assignment).

  kind='hadamard' (the default 'auto' picks it when dim is a power of 2 and
  num_classes <= dim): rows of the Sylvester Hadamard matrix, pairwise
  orthogonal, so every pair is at Hamming distance dim / 2, close to the
  Plotkin bound dim C / (2 (C - 1)) on the minimum distance. When
  num_classes < dim the all-ones first row is skipped (rows 1..C are
  used): every remaining codeword is balanced (as many +1 as -1), and the
  all-ones direction is the one that non-negative (post-ReLU) features lean
  towards anyway, which would give that class a head start.

  kind='random': i.i.d. uniform +-1 entries from ``np.random.default_rng(
  seed)``, redrawn (up to max_tries times) until all rows are distinct.

  Args:
    num_classes: C >= 1.
    dim: c >= 1, the codeword length (= the embedding dimension).
    seed: seed of the random code (the Hadamard code does not use it).
    kind: 'auto', 'hadamard' or 'random'.
    max_tries: draws of the random code before giving up.

  Returns:
    (V [C, dim] float32 of +-1, min_distance int). min_distance is dim when
    C = 1 (no pair).

  Raises:
    ValueError: bad sizes, kind='hadamard' where it does not fit, or no
      random code with distinct rows was found.
  """
  if kind not in CODEWORD_KINDS:
    raise ValueError(f'kind must be one of {CODEWORD_KINDS}, got {kind!r}')
  if int(num_classes) != num_classes or num_classes < 1:
    raise ValueError(
      f'num_classes must be a positive integer, got {num_classes}.'
    )
  if int(dim) != dim or dim < 1:
    raise ValueError(f'dim must be a positive integer, got {dim}.')
  fits = _is_power_of_two(dim) and num_classes <= dim
  if kind == 'hadamard' and not fits:
    raise ValueError(
      f'A Hadamard code needs dim a power of 2 and '
      f'num_classes <= dim; got num_classes={num_classes}, '
      f'dim={dim}.'
    )
  if kind != 'random' and fits:
    first = 1 if num_classes < dim else 0
    codes = _sylvester_hadamard(dim)[first : first + num_classes]
  else:
    if num_classes > 2 ** min(dim, 62):
      raise ValueError(
        f'{num_classes} distinct codewords do not exist in dimension {dim}.'
      )
    rng = np.random.default_rng(seed)
    for _ in range(max_tries):
      codes = rng.choice(np.array([-1, 1]), size=(num_classes, dim))
      if len(np.unique(codes, axis=0)) == num_classes:
        break
    else:
      raise ValueError(
        f'No {num_classes} distinct random codewords of '
        f'length {dim} in {max_tries} draws.'
      )
  return codes.astype(np.float32), min_hamming_distance(codes)


# ---------------------------------------------------------------------------
# The algorithm.
# ---------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Options:
  """FedUV's options.

  Attributes:
    num_classes: C codewords; None reads the model's ``num_classes``
      (assemble.py sets it from the dataset), which takes precedence.
    codeword_kind: 'auto', 'hadamard' or 'random' (see `codewords`).
    codeword_seed: seed of a random code.
    squared: p = 2, the squared hinge of Eq. 3 of Park et al. (False: p = 1,
      the reproduction's).
    reduction: 'mean' or 'sum' over the batch.
  """

  num_classes: Optional[int] = None
  codeword_kind: Literal['auto', 'hadamard', 'random'] = 'auto'
  codeword_seed: int = 0
  squared: bool = False
  reduction: Literal['sum', 'mean'] = 'mean'

  def __post_init__(self):
    common.check_choice('reduction', self.reduction, common.REDUCTIONS)
    common.check_choice('codeword_kind', self.codeword_kind, CODEWORD_KINDS)


def init_extra(code, min_distance, variables, num_clients, key):
  """The code V [C, D] and its minimum Hamming distance, for evaluation
  only (the server step never reads them)."""
  del variables, num_clients, key
  return {
    'codewords': jnp.asarray(code),
    'min_distance': jnp.asarray(min_distance, jnp.int32),
  }


def client_begin(ctx):
  """client_begin: from the global model; local_state holds the class."""
  return ctx.server_state.variables, {'class': common.client_class(ctx)}


def client_loss(options, model, code, params, model_state, batch, ctx):
  """max(0, 1 - cos(f(x_i), v_u))^p, reduced over the batch; v_u is read
  from ``code`` (a constant of the program) by the client's class."""
  outputs, model_state = model.apply(
    params, model_state, batch.images, train=True, mask=batch.mask
  )
  codeword = jnp.asarray(code)[ctx.local_state['class']]
  per_example = feduv_loss(
    outputs['embedding'], codeword, squared=options.squared, mask=batch.mask
  )
  return (
    common.reduce_batch(per_example, batch.mask, options.reduction),
    (model_state, {}),
  )


def build(model, options, *, server_optimizer, weighting='uniform'):
  """FedUV as an `engine.Algorithm`: FedAvg with a codeword loss.

  Hosseini et al., 'Federated Learning of User Verification Models Without
  Sharing Embeddings', ICML 2021. Class (user) u owns the codeword v_u
  (`codewords`: Hadamard rows where they fit, random +-1 otherwise); the
  model's D-dimensional embedding is the linear output W g(x), rescaled to
  f(x) = sqrt(D) W g(x) / ||W g(x)||, and the client minimises the
  positive-only loss max(0, 1 - cos(f(x), v_u))^p (`feduv_loss`; p = 1, the
  reproduction github.com/eggry/FedUV, feduv/trainer.py; ``squared=True``
  gives p = 2, Eq. 3 of Park, Hosseini and Yun, 'Federated Learning with
  Metric Loss', FL-ICML workshop 2021). The server only averages models.

  Clients read their own codeword (by the class of their labels) from a
  constant of the program; the server extra holds the code and its minimum
  Hamming distance for evaluation only (the server step never reads them,
  and in a deployment each user keeps its codeword secret).

  Args:
    model: `ModelFns` with an 'embedding' output; the codeword length is its
      width D.
    options: `Options`.
    server_optimizer: optax transformation of the pseudo-gradient.
    weighting: 'uniform' or 'num_examples'.

  Raises:
    ValueError: neither the model nor the options give num_classes, or no
      code of that size exists.
  """
  num_classes = common.num_model_classes(model, options.num_classes or 0)
  if num_classes < 1:
    raise ValueError(
      'FedUV needs num_classes >= 1 (the model has none; '
      'pass --config.algorithm_kwargs.num_classes).'
    )
  dim = common.embedding_dim(model)
  code, min_distance = codewords(
    num_classes, dim, seed=options.codeword_seed, kind=options.codeword_kind
  )
  base = fedavg.build(
    model, server_optimizer=server_optimizer, weighting=weighting
  )
  return base._replace(
    init_server=fedavg.make_init_server(
      server_optimizer, functools.partial(init_extra, code, min_distance)
    ),
    client_begin=client_begin,
    client_loss=functools.partial(client_loss, options, model, code),
  )


SPEC = AlgorithmSpec(
  'feduv',
  build,
  Options,
  description='FedUV (Hosseini et al., 2021): fixed error-correcting '
  'codewords.',
)
SPECS = (SPEC,)
