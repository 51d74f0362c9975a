"""Quantity skew: clients that differ in how much data they hold.

`quantity` draws every client's size (a Dirichlet share or a power law) and
deals the examples out IID, so only the amount of data differs between
clients, not the class mix (the other partitions are in partition.py).
"""

import numpy as np

from fedjax_metric.data.partition import (
  _as_int64,
  _check_inputs,
  _largest_remainder,
)

SIZE_DISTRIBUTIONS = ('dirichlet', 'power_law')


def power_law_sizes(num_examples, num_clients, exponent):
  """Client sizes of a Zipf (rank-size power-law) profile, largest first.

  The client of rank r = 1..J gets the share
  s_r = r^(-exponent) / sum_{q=1}^{J} q^(-exponent) of the N examples, the
  power-law client sizes of FedProx (Li, Sahu, Zaheer, Sanjabi, Talwalkar and
  Smith, 'Federated Optimization in Heterogeneous Networks', MLSys 2020,
  whose MNIST devices hold power-law distributed numbers of samples), here
  in its rank-size form so that the profile is exact and a seed only decides
  which client gets which size. Counts are floor(N s_r) with the leftover
  examples going one each to the largest remainders, so they sum to N.

  Args:
    num_examples: N >= 1.
    num_clients: J >= 1.
    exponent: power-law exponent >= 0 (0: equal sizes up to one example).

  Returns:
    [J] np.int64 sizes, non-increasing, summing to N.
  """
  if not (np.isfinite(exponent) and exponent >= 0):
    raise ValueError(
      f'power-law exponent must be finite and >= 0, got {exponent}.'
    )
  ranks = np.arange(1, num_clients + 1, dtype=np.float64)
  sizes = _largest_remainder(num_examples, ranks**-exponent)
  # Ties in the remainders can leave a later rank one example larger.
  return np.sort(sizes)[::-1]


def _dirichlet_sizes(n_total, num_clients, alpha, rng, min_size, max_tries):
  """Client sizes of NIID-Bench 'iid-diff-quantity', resampled until valid.

  p ~ Dir(alpha 1_J) and cut points floor(cumsum(p) N)[:-1], as in the
  released github.com/Xtra-Computing/NIID-Bench utils.py `partition_data`.
  The reference redraws p while min_j p_j N < 10; here the realised
  (floored) sizes are checked, so every client really gets >= min_size.
  """
  for _ in range(max_tries):
    p = rng.dirichlet(np.full(num_clients, alpha))
    cuts = (np.cumsum(p) * n_total).astype(np.int64)[:-1]
    sizes = np.diff(np.concatenate([[0], cuts, [n_total]]))
    if sizes.min() >= min_size:
      return sizes
  raise ValueError(
    f'quantity skew (dirichlet): no draw with every client >= '
    f'min_size={min_size} examples in max_tries={max_tries} attempts '
    f'(alpha={alpha}, {num_clients} clients, N={n_total}). Use a larger '
    'alpha, fewer clients or a smaller min_size.'
  )


def quantity(
  labels,
  num_clients,
  *,
  seed,
  distribution='dirichlet',
  alpha=0.5,
  exponent=1.0,
  min_size=1,
  max_tries=1000,
):
  """Quantity skew: unequal client sizes, labels IID within every client.

  The N indices are shuffled once and cut into consecutive pieces of the
  drawn sizes n_1..n_J, so each client holds a uniformly random subset of
  its size and its label histogram matches the global one up to sampling
  noise (hypergeometric). Every example is assigned exactly once.

  Sizes (Li, Diao, Chen and He, 'Federated Learning on Non-IID Data Silos:
  An Experimental Study', ICDE 2022, 'quantity skew'):
    'dirichlet'  (n_1..n_J) / N ~ Dir(alpha 1_J), NIID-Bench's
                 'iid-diff-quantity' (see `_dirichlet_sizes`); the whole
                 draw is repeated until every client has >= min_size.
    'power_law'  the Zipf profile n_r proportional to r^(-exponent) of
                 `power_law_sizes`, assigned to clients in random order.

  Args:
    labels: [N] labels (only N is used; labels stay IID).
    num_clients: J, number of clients.
    seed: seed of `np.random.default_rng`.
    distribution: 'dirichlet' or 'power_law'.
    alpha: 'dirichlet' concentration (> 0, finite); smaller is more skewed.
    exponent: 'power_law' exponent (>= 0); larger is more skewed.
    min_size: minimum examples per client, >= 1.
    max_tries: 'dirichlet' only; draws before giving up with a ValueError.

  Returns:
    J np.int64 index arrays.

  Raises:
    ValueError: unknown distribution, alpha <= 0, exponent < 0,
      min_size < 1, J * min_size > N, a power-law profile whose smallest
      client is below min_size, or no valid Dirichlet draw in max_tries.
  """
  labels = _check_inputs(labels, num_clients)
  n_total = labels.size
  if distribution not in SIZE_DISTRIBUTIONS:
    raise ValueError(
      f'Unknown quantity-skew size distribution {distribution!r}; valid: '
      f'{", ".join(SIZE_DISTRIBUTIONS)}.'
    )
  if int(min_size) != min_size or min_size < 1 or max_tries < 1:
    raise ValueError(
      f'Need an integer min_size >= 1 (every client needs data) and '
      f'max_tries >= 1, got min_size={min_size}, max_tries={max_tries}.'
    )
  if num_clients * min_size > n_total:
    raise ValueError(
      f'min_size={min_size} cannot be reached: {num_clients} clients x '
      f'{min_size} > N={n_total}. Use fewer clients or a smaller min_size.'
    )
  rng = np.random.default_rng(seed)
  if distribution == 'power_law':
    sizes = power_law_sizes(n_total, num_clients, exponent)
    if sizes[-1] < min_size:
      raise ValueError(
        f'A power law with exponent={exponent} over {num_clients} clients '
        f'gives the smallest client {sizes[-1]} of N={n_total} examples, '
        f'below min_size={min_size}. Use a smaller exponent, fewer clients '
        'or a smaller min_size.'
      )
    sizes = rng.permutation(sizes)
  else:
    if not (np.isfinite(alpha) and alpha > 0):
      raise ValueError(
        f'alpha must be a finite positive number, got alpha={alpha}.'
      )
    sizes = _dirichlet_sizes(
      n_total, num_clients, alpha, rng, min_size, max_tries
    )
  perm = rng.permutation(n_total)
  return _as_int64(np.split(perm, np.cumsum(sizes)[:-1]))
