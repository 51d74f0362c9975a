"""Clients whose examples are made when they are sampled.

A population of 10^6-10^7 clients cannot have its examples made up front.
`GeneratedClients` stands where a partition (a list of index arrays) stands:
client k's "indices" are its example positions 0 .. n_k - 1, so cohorts and
batch schedules are drawn exactly as for stored data (data/cohort.py), and
`call_data` then makes the examples a call's cohorts point to, in the
order they point to them: a call's training data is an [R * C * S * B, ...]
array and each batch index is a position in it. The round programs do not
change (they index ``DeviceData`` as always) and compile once: the array's
shape is fixed by the run's R, C, S and B.

The Synthetic(alpha, beta) federation (data/synthetic.py) is the first such
population.
"""

from typing import Callable, NamedTuple, Optional, Sequence

import numpy as np

from fedjax_metric.data.cohort import Cohort, DeviceData


class GeneratedClients(Sequence):
  """A population made on demand, used where a partition is expected.

  Attributes:
    sizes: int64 [N] each client's number of examples.
    examples: ``(client_ids int [M], positions int [M]) -> (x [M, ...], y
      int32 [M])``, a pure function of (client, position).
    num_classes: K.
    feature_shape: the shape of one example, e.g. (60,).
    label_counts: optional ``(client_ids [n], m) -> int [n, K]``: label
      histograms of each client's first m examples (participation
      probabilities tied to labels), or None.
    test_examples: optional ``client_ids [K] -> (x [T, ...], y [T], owner
      [T])``: the clients' held-out examples (federated evaluation).
  """

  def __init__(
    self,
    sizes: np.ndarray,
    examples: Callable,
    num_classes: int,
    feature_shape: tuple,
    label_counts: Optional[Callable] = None,
    test_examples: Optional[Callable] = None,
  ):
    self.sizes = np.asarray(sizes, np.int64)
    self.examples = examples
    self.num_classes = num_classes
    self.feature_shape = tuple(feature_shape)
    self.label_counts = label_counts
    self.test_examples = test_examples

  def __len__(self):
    return len(self.sizes)

  def __getitem__(self, k):
    """Client k's example "indices": its positions 0 .. n_k - 1."""
    if isinstance(k, slice):
      raise TypeError('GeneratedClients are indexed one client at a time.')
    return np.arange(self.sizes[k], dtype=np.int64)


def client_sizes(clients) -> np.ndarray:
  """int64 [N] examples per client, of a partition or `GeneratedClients`
  (without a Python loop over a generated population)."""
  if isinstance(clients, GeneratedClients):
    return clients.sizes
  return np.array([len(c) for c in clients], np.int64)


class CallData(NamedTuple):
  """A call's cohorts, re-pointed at the examples made for them."""

  cohorts: list
  data: DeviceData


def call_data(cohorts: Sequence[Cohort], clients: GeneratedClients):
  """Makes the examples R cohorts' batches point to.

  Every slot's [S, B] batch positions (``example_idx``, positions in its
  client) become indices into one [R * C * S * B] array of those examples,
  made by ``clients.examples`` in that order; padding slots and padded
  examples point to an example that no mask lets through.

  Returns:
    `CallData`: the cohorts with new ``example_idx``, and the
    ``DeviceData(images [R*C*S*B, ...], labels [R*C*S*B])``.
  """
  ids, positions = [], []
  for cohort in cohorts:
    example_idx = np.asarray(cohort.example_idx)
    owner = np.where(np.asarray(cohort.slot_mask), cohort.client_ids, 0)
    ids.append(np.broadcast_to(owner[:, None, None], example_idx.shape))
    positions.append(np.where(np.asarray(cohort.example_mask), example_idx, 0))
  ids = np.stack(ids).reshape(-1)
  positions = np.stack(positions).reshape(-1)
  x, y = clients.examples(ids, positions)
  per_round = np.asarray(cohorts[0].example_idx).size
  shape = np.asarray(cohorts[0].example_idx).shape
  moved = [
    c._replace(
      example_idx=(
        r * per_round + np.arange(per_round, dtype=np.int32)
      ).reshape(shape)
    )
    for r, c in enumerate(cohorts)
  ]
  return CallData(moved, DeviceData(x, y))
