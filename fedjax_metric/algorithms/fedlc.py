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

import jax.numpy as jnp
import numpy as np

from fedjax_metric import losses
from fedjax_metric.algorithms import fedavg
from fedjax_metric.contract import NO_RUN_FACTS, RunFacts


def make(
  model,
  *,
  server_optimizer,
  run: RunFacts = NO_RUN_FACTS,
  weighting='num_examples',
  tau=1.0,
):
  """FedLC as an `engine.Algorithm`.

  Args:
    model: `ModelFns` with 'logits'.
    server_optimizer: optax transformation of the pseudo-gradient.
    run: must carry ``class_counts`` [N, K] (assemble.build_algorithm
      passes the partition's).
    weighting: 'num_examples' or 'uniform'.
    tau: calibration strength (> 0).

  Raises:
    ValueError: no class counts in ``run``, or tau <= 0.
  """
  if run.class_counts is None:
    raise ValueError(
      "FedLC calibrates by each client's class counts: build it with "
      'run=RunFacts(class_counts=<[N, K] array>) (a run from a config '
      "passes the partition's)."
    )
  if not tau > 0:
    raise ValueError(
      f'FedLC tau must be > 0, got {tau} (--config.algorithm_kwargs.tau).'
    )
  # NumPy: init_extra makes a fresh device array each call (the round
  # programs donate the server state they are given).
  counts = np.asarray(run.class_counts, np.float32)

  def init_extra(variables, num_clients, key):
    del variables, key
    if counts.shape[0] != num_clients:
      raise ValueError(
        f'FedLC was given class counts of {counts.shape[0]} clients for a '
        f'run of {num_clients}.'
      )
    return jnp.asarray(counts)

  def client_loss(params, model_state, batch, ctx):
    outputs, model_state = model.apply(
      params, model_state, batch.images, train=True, mask=batch.mask
    )
    own_counts = ctx.server_state.extra[ctx.client_id]
    loss = losses.masked_mean(
      losses.calibrated_cross_entropy(
        outputs['logits'], batch.labels, own_counts, tau
      ),
      batch.mask,
    )
    return loss, (model_state, {})

  return fedavg.build(
    model, server_optimizer=server_optimizer, weighting=weighting
  )._replace(
    init_server=fedavg.make_init_server(server_optimizer, init_extra),
    client_loss=client_loss,
  )
