"""FedAvg + FitNet: cross-entropy plus a hint from the global model's features.

Romero, Ballas, Kahou, Chassang, Gatta and Bengio, 'FitNets: Hints for Thin
Deep Nets', ICLR 2015, as a federated baseline (the 'FedAvg + FitNet' row of
FedRCL's Table 1, Seo et al., CVPR 2024): the teacher is the received global
model, frozen, and the student the client's model. With u the teacher's hint
layer and v the student's guided layer (Eq. 3 of FitNets),

  L = CE(f_l(x), y) + beta * 1/2 ||u_g(x) - v_l(x)||^2.

Teacher and student have the same architecture here, so FitNets' regressor
r is the identity and the guided layer is the hint layer itself. The layer
is one of the model's feature taps (``outputs['features']``, the
globally average-pooled stage outputs), the middle one by default (FitNets
takes the teacher's middle layer as the hint); pooled rather than spatial
maps, because that is what every model here exposes. No public code of this
baseline was found (docs/methods.md, FitNet): the layer and beta = 1 are
this library's choices, to be tuned on a validation split.
"""

import dataclasses
import functools

from fedjax_metric import losses
from fedjax_metric.algorithms import fedavg
from fedjax_metric.algorithms.spec import AlgorithmSpec


@dataclasses.dataclass(frozen=True)
class Options:
  """FedAvg + FitNet's options (this library's choices, see above).

  Attributes:
    beta: beta, the weight of the hint term (>= 0; 0 is FedAvg).
    level: index into ``outputs['features']`` of the hint / guided layer;
      -1 (default) means the middle tap, ``len(features) // 2``.
  """

  beta: float = 1.0
  level: int = -1

  def __post_init__(self):
    if not self.beta >= 0:
      raise ValueError(
        f'FitNet beta must be >= 0, got {self.beta} '
        '(--config.algorithm_kwargs.beta).'
      )


def hint_loss(student, teacher):
  """``1/2 ||teacher - student||^2`` per example: [B, D] x2 -> [B]."""
  return 0.5 * ((teacher - student) ** 2).sum(axis=-1)


def tap(level, features):
  """The hint layer among the feature taps: [B, D]."""
  if not features:
    raise ValueError(
      "FitNet needs a model with feature taps (outputs['features']); "
      'this one has none.'
    )
  return features[len(features) // 2 if level == -1 else level]


def client_loss(options, model, params, model_state, batch, ctx):
  """CE + beta * 1/2 ||u_g(x) - v_l(x)||^2, u_g from the frozen global
  model (evaluation mode), masked mean over the batch."""
  outputs, ce, model_state = fedavg.forward_and_cross_entropy(
    model, params, model_state, batch
  )
  teacher = fedavg.frozen_outputs(
    model, ctx.server_state.variables, batch.images
  )
  hint = losses.masked_mean(
    hint_loss(
      tap(options.level, outputs['features']),
      tap(options.level, teacher['features']),
    ),
    batch.mask,
  )
  return ce + options.beta * hint, (model_state, {'ce': ce, 'hint': hint})


def build(model, options, *, server_optimizer, weighting='num_examples'):
  """FedAvg + FitNet. ``model``: `ModelFns` with 'logits' and 'features'."""
  return fedavg.build(
    model, server_optimizer=server_optimizer, weighting=weighting
  )._replace(client_loss=functools.partial(client_loss, options, model))


SPEC = AlgorithmSpec(
  'fitnet',
  build,
  Options,
  description='FedAvg + FitNet (Romero et al., 2015): a hint loss to the '
  "global model's intermediate features.",
)
SPECS = (SPEC,)
