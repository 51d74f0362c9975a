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

from fedjax_metric import losses
from fedjax_metric.algorithms import fedavg
from fedjax_metric.contract import NO_RUN_FACTS, RunFacts


def hint_loss(student, teacher):
  """``1/2 ||teacher - student||^2`` per example: [B, D] x2 -> [B]."""
  return 0.5 * ((teacher - student) ** 2).sum(axis=-1)


def make(
  model,
  *,
  server_optimizer,
  run: RunFacts = NO_RUN_FACTS,
  weighting='num_examples',
  beta=1.0,
  level=-1,
):
  """FedAvg + FitNet as an `engine.Algorithm`.

  Args:
    model: `ModelFns` with 'logits' and 'features'.
    server_optimizer: optax transformation of the pseudo-gradient.
    weighting: 'num_examples' or 'uniform'.
    beta: weight of the hint term (>= 0; 0 is FedAvg).
    level: index into ``outputs['features']``; -1 (default) means the
      middle tap, ``len(features) // 2``.

  Raises:
    ValueError: beta < 0.
  """
  del run
  if not beta >= 0:
    raise ValueError(
      f'FitNet beta must be >= 0, got {beta} (--config.algorithm_kwargs.beta).'
    )

  def tap(features):
    if not features:
      raise ValueError(
        "FitNet needs a model with feature taps (outputs['features']); "
        'this one has none.'
      )
    return features[len(features) // 2 if level == -1 else level]

  def client_loss(params, model_state, batch, ctx):
    outputs, ce, model_state = fedavg.forward_and_cross_entropy(
      model, params, model_state, batch
    )
    teacher = fedavg.frozen_outputs(
      model, ctx.server_state.variables, batch.images
    )
    hint = losses.masked_mean(
      hint_loss(tap(outputs['features']), tap(teacher['features'])),
      batch.mask,
    )
    return ce + beta * hint, (model_state, {'ce': ce, 'hint': hint})

  return fedavg.build(
    model, server_optimizer=server_optimizer, weighting=weighting
  )._replace(client_loss=client_loss)
