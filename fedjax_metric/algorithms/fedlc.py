"""FedLC: cross-entropy on logits calibrated by the client's label counts.

Zhang, Li, Li, Zhang, Wang and Wu, 'Federated Learning with Label
Distribution Skew via Logits Calibration', ICML 2022. Each client replaces
its cross-entropy by the calibrated one (`losses.calibrated_cross_entropy`):

  z~_k = z_k - tau n_{i,k}^(-1/4),    L_i = CE(z~, y),

with n_{i,k} client i's examples of class k, so that the client's rare
classes get a larger margin and its local optimum drifts less towards its
frequent ones. Aggregation is FedAvg's; evaluation uses the plain logits.

The counts are a fact of the run (``run.class_counts``, [N, K], from the
partition); they ride in the server extra, so each client reads its own row
by ``ctx.client_id`` inside the round program. tau = 1 is the value of the
authors' framework reimplementations (github.com/geehokim/FedACG,
configs/client/LC.yaml, and FL-bench); there the calibrated loss replaces
the cross-entropy, as here. docs/methods.md, FedLC.
"""

import dataclasses
import functools

import jax.numpy as jnp
import numpy as np

from fedjax_metric import losses
from fedjax_metric.algorithms import fedavg
from fedjax_metric.algorithms.spec import AlgorithmSpec
from fedjax_metric.contract import NO_RUN_FACTS, RunFacts


@dataclasses.dataclass(frozen=True)
class Options:
  """FedLC's options.

  Attributes:
    tau: tau, the calibration strength (> 0; 1 in the authors' framework
      reimplementations).
  """

  tau: float = 1.0

  def __post_init__(self):
    if not self.tau > 0:
      raise ValueError(
        f'FedLC tau must be > 0, got {self.tau} '
        '(--config.algorithm_kwargs.tau).'
      )


def init_extra(counts, variables, num_clients, key):
  """The server extra: every client's class counts [N, K], a fresh device
  array from the NumPy ``counts`` (the round programs donate the server
  state they are given)."""
  del variables, key
  if counts.shape[0] != num_clients:
    raise ValueError(
      f'FedLC was given class counts of {counts.shape[0]} clients for a '
      f'run of {num_clients}.'
    )
  return jnp.asarray(counts)


def client_loss(options, model, params, model_state, batch, ctx):
  """The masked mean calibrated CE, ``z~_k = z_k - tau n_{i,k}^(-1/4)``, with
  n_i the row ``ctx.client_id`` of the counts in the server extra."""
  outputs, model_state = model.apply(
    params, model_state, batch.images, train=True, mask=batch.mask
  )
  own_counts = ctx.server_state.extra[ctx.client_id]
  loss = losses.masked_mean(
    losses.calibrated_cross_entropy(
      outputs['logits'], batch.labels, own_counts, options.tau
    ),
    batch.mask,
  )
  return loss, (model_state, {})


def build(
  model,
  options,
  *,
  server_optimizer,
  weighting='num_examples',
  run: RunFacts = NO_RUN_FACTS,
):
  """FedLC as an `engine.Algorithm`.

  Args:
    model: `ModelFns` with 'logits'.
    options: `Options`.
    server_optimizer: optax transformation of the pseudo-gradient.
    weighting: 'num_examples' or 'uniform'.
    run: must carry ``class_counts`` [N, K] (assemble.build_algorithm
      passes the partition's).

  Raises:
    ValueError: no class counts in ``run``.
  """
  if run.class_counts is None:
    raise ValueError(
      "FedLC calibrates by each client's class counts: build it with "
      'run=RunFacts(class_counts=<[N, K] array>) (a run from a config '
      "passes the partition's)."
    )
  # NumPy: init_extra makes a fresh device array each call.
  counts = np.asarray(run.class_counts, np.float32)
  return fedavg.build(
    model, server_optimizer=server_optimizer, weighting=weighting
  )._replace(
    init_server=fedavg.make_init_server(
      server_optimizer, functools.partial(init_extra, counts)
    ),
    client_loss=functools.partial(client_loss, options, model),
  )


SPEC = AlgorithmSpec(
  'fedlc',
  build,
  Options,
  reads=frozenset({'server_optimizer', 'weighting', 'run'}),
  description='FedLC (Zhang et al., 2022): cross-entropy on logits calibrated '
  "by the client's label counts.",
)
SPECS = (SPEC,)
