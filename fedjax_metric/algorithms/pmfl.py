"""PMFL: model-contrastive local training with historical models, adaptive
aggregation weights and historical global-model mixing.

Zhang et al., 'Towards Performance-Enhanced Model-Contrastive Federated
Learning using Historical Information in Heterogeneous Scenarios',
preprint, 2025, Algorithms 1 and 2, Eqs. 4-11.

Client (Algorithm 1, Section IV-C). Every node keeps a sliding buffer S_l of
its N most recent local models (N = 5), kept across rounds. At local
iteration e of round t the loss is CE + lambda * l_con (Eq. 5), with l_con
(Eq. 4, `losses.pmfl_contrastive_loss`) contrasting the current
representation z with the global one Z^t (always positive) and with those of
the buffered models, split into positives and negatives by a threshold mu.
The buffer at iteration e is {w^{tE+e-N}, ..., w^{tE+e-1}}: it never holds
the model being trained. After every real local step the model that step
started from is pushed (oldest evicted), so the last N iterates of a node's
latest rounds are kept; the end-of-round model w^{(t+1)E} itself is never an
entry (line 4 replaces it by W^{t+1} before the next iteration).

Server (Algorithm 2, Section IV-D). x_k^t from `adaptive_step` (cutoff C =
50); unlike FedAU the interval that ends in round t already counts in x_k^t.
Then (Eqs. 9-11)

  W' = W^t + eta_g (1 / N) sum_k x_k^t Delta_k^t
  W^{t+1} = (1 - psi) W' + psi / (H - 1) sum_{h=1}^{H-1} W^{t-h},
  psi = 1/2 - t / (2 (T - 1)).

The sign of Delta and the 1 / N depart from the printed Eqs. 9-10
(pmfl_history.py says why; docs/methods.md, Heterogeneous participation).

The weight bookkeeping (`adaptive_step`, pure JAX, usable inside a jitted
round; `adaptive_weights` over a whole participation mask on the host) and
psi (`history_mixing_weight`, `mixing_step_factor`) are pmfl_server.py,
re-exported here; the client's buffer and the server's past global models
are pmfl_history.py; this module holds the options and the hooks (`build`).
"""

import dataclasses
import functools
import typing
from typing import Literal, Optional

import jax
import jax.numpy as jnp

from fedjax_metric import losses
from fedjax_metric.algorithms import fedavg, pmfl_history, pmfl_server
from fedjax_metric.algorithms.spec import AlgorithmSpec
from fedjax_metric.contract import NO_RUN_FACTS
from fedjax_metric.losses.metric import _cosine
from fedjax_metric.models import split_variables

# Re-exported: Algorithm 2's arithmetic lives in pmfl_server.py.
AdaptiveState = pmfl_server.AdaptiveState
adaptive_step = pmfl_server.adaptive_step
adaptive_weight = pmfl_server.adaptive_weight
adaptive_weights = pmfl_server.adaptive_weights
history_mixing_weight = pmfl_server.history_mixing_weight
init_adaptive_state = pmfl_server.init_adaptive_state
mixing_step_factor = pmfl_server.mixing_step_factor
participant_weight = pmfl_server.participant_weight

Threshold = Literal['previous', 'current', 'start']
Normalization = Literal['num_clients', 'none']
THRESHOLDS = typing.get_args(Threshold)
NORMALIZATIONS = typing.get_args(Normalization)


def _check_positive_int(name, value, minimum=1):
  if int(value) != value or value < minimum:
    raise ValueError(
      f'{name} must be an integer >= {minimum}, got {value} '
      f'(algorithm_kwargs.{name}).'
    )
  return int(value)


@dataclasses.dataclass(frozen=True)
class Options:
  """PMFL's options (Section V-C's values).

  Threshold mu (Section IV-C2 defines mu = Sim(z_k^{tE}, Z^t), per sample,
  for the node's model w_k^{tE} at the start of the round; but Algorithm 1
  line 4 sets w_k^{tE} = W^t, which makes mu = 1 and Z+ empty, against the
  text's 'this threshold varies across nodes'), ``threshold``:
    'previous' (default): z_k^{tE} from the node's previous local model, the
      end of its last round (what MOON calls the previous model); the global
      model while the node has none. Varies across nodes and rounds, fixed
      within a round, as the text says (docs/methods.md, Heterogeneous
      participation, has the measurements behind the default).
    'current': mu = Sim(z, Z^t) with the current z at every iteration.
    'start': the literal reading, mu = Sim(Z^t, Z^t) (1 for a non-zero
      representation): every buffered model is a negative and l_con is MOON's
      loss with the buffer as negatives.

  Attributes:
    contrastive_weight: lambda of Eq. 5 (0.5; >= 0, 0 is 'w/o MCT').
    temperature: tau of Eq. 4 (0.5; > 0).
    buffer_size: N, the local buffer's length (5; >= 1).
    threshold: how mu is taken: 'previous', 'current' or 'start' (above).
    cutoff: C of Algorithm 2, a positive int (50), or None for no cutoff.
    history_size: H of Eq. 10, the global buffer's length (3; >= 1); 1
      turns the history mixing off (H - 1 = 0 past models).
    normalize: 'num_clients' (the weighted sum of Eq. 9 divided by N, as
      FedAU's released code does) or 'none' (Eqs. 9-10 as printed).
    mixing_compensation: an ablation, not in the paper: multiply the
      round's update by `mixing_step_factor`'s inverse, so that Eq. 10's
      mixing keeps its smoothing but no longer shortens the step.
  """

  contrastive_weight: float = 0.5
  temperature: float = 0.5
  buffer_size: int = 5
  threshold: Threshold = 'previous'
  cutoff: Optional[int] = 50
  history_size: int = 3
  normalize: Normalization = 'num_clients'
  mixing_compensation: bool = False

  def __post_init__(self):
    if self.threshold not in THRESHOLDS:
      raise ValueError(
        f'Unknown threshold {self.threshold!r}; use one of '
        f'{THRESHOLDS} (algorithm_kwargs.threshold).'
      )
    if self.normalize not in NORMALIZATIONS:
      raise ValueError(
        f'Unknown normalize {self.normalize!r}; use one of '
        f'{NORMALIZATIONS} (algorithm_kwargs.normalize).'
      )
    if not self.contrastive_weight >= 0:
      raise ValueError(
        'contrastive_weight (lambda) must be >= 0, got '
        f'{self.contrastive_weight}.'
      )
    if not self.temperature > 0:
      raise ValueError(f'temperature must be > 0, got {self.temperature}.')
    _check_positive_int('buffer_size', self.buffer_size)
    _check_positive_int('history_size', self.history_size)
    if self.cutoff is not None:
      _check_positive_int('cutoff', self.cutoff)


def representation(model, variables, images):
  """z of a frozen model (evaluation mode): its 'projection', or its
  'embedding' when it has none."""
  params, model_state = split_variables(variables)
  outputs, _ = model.apply(params, model_state, images, train=False)
  return jax.lax.stop_gradient(outputs.get('projection', outputs['embedding']))


def client_loss(options, model, params, model_state, batch, ctx):
  """Eq. 5: CE + lambda l_con, l_con of Eq. 4 over the buffered models."""
  local = ctx.local_state
  outputs, ce, model_state = fedavg.forward_and_cross_entropy(
    model, params, model_state, batch
  )
  if options.contrastive_weight == 0:  # 'w/o MCT' (Table V): no forwards.
    return ce, (model_state, {'ce': ce, 'metric': jnp.zeros_like(ce)})
  z = outputs.get('projection', outputs['embedding'])
  z_global = representation(model, ctx.server_state.variables, batch.images)
  # One forward per slot: on CPU, XLA runs convolutions over a mapped
  # axis much slower than N separate ones.
  z_buffer = jnp.stack(
    [representation(model, slot, batch.images) for slot in local['buffer']]
  )
  filled = jnp.arange(options.buffer_size) < local['fill']
  if options.threshold == 'previous':
    z_previous = representation(model, local['previous'], batch.images)
    mu = _cosine(z_previous, z_global)
  elif options.threshold == 'current':
    mu = _cosine(jax.lax.stop_gradient(z), z_global)
  else:
    mu = _cosine(z_global, z_global)
  contrastive = losses.masked_mean(
    losses.pmfl_contrastive_loss(
      z,
      z_global,
      z_buffer,
      filled,
      mu,
      temperature=options.temperature,
      mask=batch.mask,
    ),
    batch.mask,
  )
  loss = ce + options.contrastive_weight * contrastive
  return loss, (model_state, {'ce': ce, 'metric': contrastive})


def client_final(keep_previous, end_variables, ctx):
  """Delta_k with weight x_k^t; the buffer (and previous model) written
  back to the row."""
  delta, _, _ = fedavg.delta_final('uniform', end_variables, ctx)
  local = ctx.local_state
  row = {name: local[name] for name in ('buffer', 'fill', 'head')}
  if keep_previous:
    row['previous'] = end_variables
  weight = participant_weight(ctx.server_state.extra, ctx.client_id)
  return delta, weight, row


def build(
  model, options, *, server_optimizer, weighting='uniform', run=NO_RUN_FACTS
):
  """PMFL (Zhang et al., 2025, Algorithms 1 and 2) as an `engine.Algorithm`.

  The representation z is the model's 'projection' output, or its
  'embedding' when it has none: the small CNN's embedding is
  ReLU(Dense(conv features)) with the classifier on top, which is the
  paper's encoder -> projection (MLP + activation) -> classifier (Section
  IV-C1). Frozen models (global, buffered, previous) run in eval mode.

  Slots replaced relative to FedAvg: ``init_client``, ``client_begin``,
  ``client_step_end`` (the buffer) and ``init_server``, ``server_update``
  (Eqs. 9-11, Algorithm 2) from pmfl_history.py; ``client_loss`` (Eqs. 4-5)
  and ``client_final`` (Delta_k with weight x_k^t, the row written back).

  Args:
    model: `ModelFns`.
    options: `Options`.
    server_optimizer: optax transformation of the pseudo-gradient; sgd(eta_g)
      with eta_g = 1 (Section V-C).
    weighting: 'uniform' only (anything else is refused): a node's weight is
      x_k^t alone.
    run: the run's facts; ``run.num_rounds`` is T of Eq. 11 (1000, SVHN's
      T in Section V-C, when not given).
  """
  fedavg.refuse_weighting(
    'pmfl', weighting, "a client's weight is its participation weight x_k alone"
  )
  # T of Eq. 11: the run's (assemble.build_algorithm fills run), else the
  # paper's T = 1000 (SVHN, Section V-C) for a spec called directly.
  num_rounds = _check_positive_int(
    'num_rounds', 1000 if run.num_rounds is None else run.num_rounds
  )
  base = fedavg.build(
    model, server_optimizer=server_optimizer, weighting='uniform'
  )
  keep_previous = options.threshold == 'previous'
  init_extra = functools.partial(
    pmfl_history.init_extra, options.history_size - 1
  )
  return base._replace(
    init_server=fedavg.make_init_server(server_optimizer, init_extra),
    init_client=functools.partial(
      pmfl_history.init_client, options.buffer_size, keep_previous
    ),
    client_begin=functools.partial(pmfl_history.client_begin, keep_previous),
    client_loss=functools.partial(client_loss, options, model),
    client_step_end=pmfl_history.client_step_end,
    client_final=functools.partial(client_final, keep_previous),
    server_update=functools.partial(
      pmfl_history.server_update, options, server_optimizer, num_rounds
    ),
  )


SPEC = AlgorithmSpec(
  'pmfl',
  build,
  Options,
  reads=frozenset({'server_optimizer', 'weighting', 'run'}),
  description='PMFL (Zhang et al., 2025): historical models in a contrastive '
  'term and the server.',
)
SPECS = (SPEC,)
