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

import numpy as np

CODEWORD_KINDS = ('auto', 'hadamard', 'random')


def _is_power_of_two(n):
  return n >= 1 and n & (n - 1) == 0


def _sylvester_hadamard(dim):
  """[dim, dim] Sylvester Hadamard matrix H_{2n} = [[H, H], [H, -H]]."""
  h = np.ones((1, 1), np.int64)
  while h.shape[0] < dim:
    h = np.block([[h, h], [h, -h]])
  return h


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
    raise ValueError(f'num_classes must be a positive integer, got '
                     f'{num_classes}.')
  if int(dim) != dim or dim < 1:
    raise ValueError(f'dim must be a positive integer, got {dim}.')
  fits = _is_power_of_two(dim) and num_classes <= dim
  if kind == 'hadamard' and not fits:
    raise ValueError(f'A Hadamard code needs dim a power of 2 and '
                     f'num_classes <= dim; got num_classes={num_classes}, '
                     f'dim={dim}.')
  if kind != 'random' and fits:
    first = 1 if num_classes < dim else 0
    codes = _sylvester_hadamard(dim)[first:first + num_classes]
  else:
    if num_classes > 2**min(dim, 62):
      raise ValueError(f'{num_classes} distinct codewords do not exist in '
                       f'dimension {dim}.')
    rng = np.random.default_rng(seed)
    for _ in range(max_tries):
      codes = rng.choice(np.array([-1, 1]), size=(num_classes, dim))
      if len(np.unique(codes, axis=0)) == num_classes:
        break
    else:
      raise ValueError(f'No {num_classes} distinct random codewords of '
                       f'length {dim} in {max_tries} draws.')
  return codes.astype(np.float32), min_hamming_distance(codes)
