"""Federated evaluation: the global model on a sample of clients' own data.

A population of 10^6 clients is judged, as FedJAX and pfl-research judge
it, by the distribution of per-client accuracy over a sample of clients,
not by one pooled test set: every ``federated_eval.every`` rounds,
``federated_eval.clients`` clients are drawn afresh from (seed, round) (so
a resumed run draws the same), each is scored on its own held-out examples,
and the mean and the 10th / 50th / 90th percentiles of their accuracies are
logged (``fed_accuracy_mean``, ``fed_accuracy_p10`` ...; a client counts
once whatever its size).

Where a client's held-out examples come from:

  * a population made on demand (synthetic): the examples after its
    training data (the FedProx code's per-client 90 / 10 split,
    `synthetic.client_test_set`);
  * a naturally partitioned dataset (FEMNIST, FedJAX's EMNIST): the test
    split's examples of the same writer.
"""

from typing import Callable, Dict

import jax
import jax.numpy as jnp
import numpy as np

from fedjax_metric.models import split_variables

_SAMPLE_TAG = 0xFEDE


def sample_clients(pool: np.ndarray, count: int, seed: int, round_idx: int):
  """``count`` distinct clients of ``pool`` (int [P]), sorted: a pure
  function of (seed, round)."""
  rng = np.random.default_rng([seed, round_idx, _SAMPLE_TAG])
  count = min(count, len(pool))
  return np.sort(pool[rng.choice(len(pool), count, replace=False)])


def summarize(accuracies: np.ndarray) -> Dict[str, float]:
  """Mean and 10th / 50th / 90th percentiles (linear interpolation, NumPy's
  default) of per-client accuracies [K]; ``fed_clients`` is K."""
  acc = np.asarray(accuracies, np.float64)
  return {
    'fed_accuracy_mean': float(acc.mean()),
    'fed_accuracy_p10': float(np.percentile(acc, 10)),
    'fed_accuracy_p50': float(np.percentile(acc, 50)),
    'fed_accuracy_p90': float(np.percentile(acc, 90)),
    'fed_clients': int(acc.size),
  }


def make_correct_fn(model, preprocess, batch_size: int):
  """``(variables, x [T, ...], y [T]) -> bool [T]``: which examples the
  model's argmax gets right, in fixed batches (one compile)."""

  @jax.jit
  def one_batch(variables, x, y):
    params, model_state = split_variables(variables)
    outputs, _ = model.apply(
      params, model_state, preprocess(x, jax.random.key(0)), train=False
    )
    return jnp.argmax(outputs['logits'], -1) == y

  def correct(variables, x, y):
    n = len(y)
    size = min(batch_size, max(n, 1))
    pad = -n % size
    x = np.concatenate([x, np.zeros((pad,) + x.shape[1:], x.dtype)])
    y = np.concatenate([y, np.zeros(pad, y.dtype)])
    out = [
      np.asarray(one_batch(variables, x[i : i + size], y[i : i + size]))
      for i in range(0, n + pad, size)
    ]
    return np.concatenate(out)[:n] if out else np.zeros(0, bool)

  return correct


def per_client_accuracy(correct: np.ndarray, owner: np.ndarray, clients):
  """Accuracy of each client of ``clients`` [K] from its examples' results
  (``owner`` [T] the client of each)."""
  position = np.searchsorted(clients, owner)
  right = np.bincount(position, weights=correct, minlength=len(clients))
  total = np.bincount(position, minlength=len(clients))
  return right / np.maximum(total, 1)


def make_federated_eval(
  *,
  model,
  preprocess,
  pool: np.ndarray,
  client_examples: Callable,
  num_clients: int,
  every: int,
  seed: int,
  batch_size: int,
):
  """``(server_state) -> {name: float}``: the federated evaluation at the
  state's round, or ``{}`` at a round that is not a multiple of ``every``
  (0: every evaluation).

  Args:
    model, preprocess: the evaluation model and its preprocessing.
    pool: int [P] the clients that can be drawn (those with held-out data).
    client_examples: ``ids [K] -> (x [T, ...], y [T], owner [T])``, the
      held-out examples of clients ``ids`` (each id in ``owner``).
    num_clients: K, clients drawn per evaluation.
    every: evaluate at rounds divisible by this (0: always).
    seed: the run's seed.
    batch_size: examples per jitted forward pass.
  """
  correct_fn = make_correct_fn(model, preprocess, batch_size)

  def evaluate(server_state):
    round_idx = int(server_state.round)
    if every and round_idx % every:
      return {}
    clients = sample_clients(pool, num_clients, seed, round_idx)
    x, y, owner = client_examples(clients)
    correct = correct_fn(server_state.variables, np.asarray(x), np.asarray(y))
    return summarize(per_client_accuracy(correct, np.asarray(owner), clients))

  return evaluate
