"""Client and server optimizers: thin, explicit constructors over optax.

Client optimizers are built from the round's learning rate, so a schedule over
rounds is just ``schedule(round)`` inside the jitted round. Their state is
re-created at the start of every round, as in every PyTorch reference
(MOON, FedRCL, FedAU, SSD create a new optimizer per round).
"""

from typing import Callable

import optax


def make_client_optimizer(
  name: str,
  *,
  momentum: float = 0.0,
  nesterov: bool = False,
  weight_decay: float = 0.0,
  grad_clip_norm: float = 0.0,
  b1: float = 0.9,
  b2: float = 0.999,
  eps: float = 1e-8,
) -> Callable[..., optax.GradientTransformation]:
  """Returns ``learning_rate -> GradientTransformation``.

  'sgd' adds ``weight_decay * params`` to the gradient before momentum, like
  torch.optim.SGD; 'adam' likewise (torch.optim.Adam's L2 form); 'adamw' decays
  decoupled from the adaptive step. ``grad_clip_norm > 0`` clips the global
  gradient norm first (torch.nn.utils.clip_grad_norm_).
  """
  if name not in ('sgd', 'adam', 'adamw'):
    raise ValueError(
      f"Unknown client optimizer {name!r}; use 'sgd', 'adam' or 'adamw'."
    )

  def make(learning_rate):
    parts = []
    if grad_clip_norm > 0:
      parts.append(optax.clip_by_global_norm(grad_clip_norm))
    if name == 'adamw':
      parts.append(
        optax.adamw(
          learning_rate, b1=b1, b2=b2, eps=eps, weight_decay=weight_decay
        )
      )
      return optax.chain(*parts)
    if weight_decay > 0:
      parts.append(optax.add_decayed_weights(weight_decay))
    if name == 'sgd':
      parts.append(
        optax.sgd(learning_rate, momentum=momentum or None, nesterov=nesterov)
      )
    else:
      parts.append(optax.adam(learning_rate, b1=b1, b2=b2, eps=eps))
    return optax.chain(*parts)

  return make


def make_round_schedule(
  learning_rate: float,
  *,
  kind: str = 'constant',
  decay_rate: float = 1.0,
  num_rounds: int = 1,
  warmup_rounds: int = 0,
):
  """The local learning rate as a function of the round index.

  kinds: 'constant'; 'exponential' (``lr * decay_rate ** round``, FedRCL's
  0.998); 'cosine' (to 0 over ``num_rounds``); 'warmup_cosine'.
  """
  if kind == 'constant':
    return optax.constant_schedule(learning_rate)
  if kind == 'exponential':
    return optax.exponential_decay(
      learning_rate, transition_steps=1, decay_rate=decay_rate
    )
  if kind == 'cosine':
    return optax.cosine_decay_schedule(learning_rate, max(num_rounds, 1))
  if kind == 'warmup_cosine':
    return optax.warmup_cosine_decay_schedule(
      0.0, learning_rate, max(warmup_rounds, 1), max(num_rounds, 2)
    )
  raise ValueError(
    f"Unknown schedule {kind!r}; use 'constant', 'exponential', "
    "'cosine' or 'warmup_cosine'."
  )


def make_server_optimizer(
  name: str,
  *,
  learning_rate: float = 1.0,
  momentum: float = 0.0,
  b1: float = 0.9,
  b2: float = 0.99,
  eps: float = 1e-3,
) -> optax.GradientTransformation:
  """The server step on the pseudo-gradient ``-mean(client deltas)``.

  Reddi et al. 2021, "Adaptive Federated Optimization", Alg. 2:
  'sgd' with lr 1 is FedAvg; with momentum it is FedAvgM (Hsu et al. 2019);
  'adam' is FedAdam and 'yogi' FedYogi (tau = eps, default 1e-3 as in the
  paper). optax's adam/yogi apply bias correction, which the paper omits; the
  difference vanishes after the first rounds. 'fedagm' is SGD with momentum
  whose clients start from the lookahead model (algorithms/fedagm.py wraps
  the client method; momentum > 0 is required there).
  """
  if name in ('sgd', 'fedagm'):
    return optax.sgd(learning_rate, momentum=momentum or None)
  if name == 'adam':
    return optax.adam(learning_rate, b1=b1, b2=b2, eps=eps)
  if name == 'yogi':
    return optax.yogi(learning_rate, b1=b1, b2=b2, eps=eps)
  raise ValueError(
    f"Unknown server optimizer {name!r}; use 'sgd' (FedAvg, "
    "FedAvgM), 'adam' (FedAdam), 'yogi' (FedYogi) or 'fedagm' (FedAGM)."
  )
