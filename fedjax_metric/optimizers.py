"""Client and server optimizers: thin, explicit constructors over optax.

Client optimizers are built from the round's learning rate, so a schedule over
rounds is just ``schedule(round)`` inside the jitted round. Their state is
re-created at the start of every round, as in every PyTorch reference
(MOON, FedRCL, FedAU, SSD create a new optimizer per round).
"""

from typing import Callable, NamedTuple

import jax
import jax.numpy as jnp
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
  the client method; momentum > 0 is required there). 'fedhyper' is
  FedHyper's global scheduler (`fedhyper_global`; learning_rate is its
  initial rate).
  """
  if name in ('sgd', 'fedagm'):
    return optax.sgd(learning_rate, momentum=momentum or None)
  if name == 'fedhyper':
    if momentum:
      raise ValueError(
        'server.optimizer=fedhyper adapts a plain SGD step; set '
        f'--config.server.momentum=0 (got {momentum}).'
      )
    return fedhyper_global(learning_rate)
  if name == 'adam':
    return optax.adam(learning_rate, b1=b1, b2=b2, eps=eps)
  if name == 'yogi':
    return optax.yogi(learning_rate, b1=b1, b2=b2, eps=eps)
  raise ValueError(
    f"Unknown server optimizer {name!r}; use 'sgd' (FedAvg, "
    "FedAvgM), 'adam' (FedAdam), 'yogi' (FedYogi), 'fedagm' (FedAGM) or "
    "'fedhyper' (FedHyper-G)."
  )


# FedHyper-G's bounds on the global learning rate: the authors' code clips
# its accumulator to [-0.8, 4] around the initial rate 1.
FEDHYPER_BOUNDS = (0.2, 5.0)


class FedHyperState(NamedTuple):
  learning_rate: jax.Array  # float32 scalar: the rate of the last step
  previous: optax.Updates  # the last non-empty round's pseudo-gradient


def fedhyper_global(
  initial_rate: float = 1.0, bounds=FEDHYPER_BOUNDS
) -> optax.GradientTransformation:
  """FedHyper-G: the global learning rate by hypergradient descent.

  Wang, Wang and Li, 'FedHyper: A Universal and Robust Learning Rate
  Scheduler for Federated Learning with Hypergradient Descent', ICLR 2024.
  The hypergradient of the loss after round t with respect to the global
  rate alpha is -<Delta_t, Delta_{t-1}>, Delta the round's averaged model
  update, so one hypergradient step (step size 1, as in the authors' code,
  github.com/ATP-1010/FedHyper) is

    alpha_t = clip(alpha_{t-1} + <g_t, g_{t-1}>, *bounds),
    x_{t+1} = x_t - alpha_t g_t,

  with g = -Delta the pseudo-gradient (the product is the same either way).
  The first round, with no previous update, steps with the initial rate.
  A round without participants (a zero pseudo-gradient) leaves the rate and
  the remembered update as they were.

  Args:
    initial_rate: alpha_0 (the config's server.learning_rate; 1 in the
      code).
    bounds: (low, high) of alpha; the code's [0.2, 5] by default.
  """
  low, high = bounds

  def init(params):
    return FedHyperState(
      jnp.asarray(initial_rate, jnp.float32),
      jax.tree.map(jnp.zeros_like, params),
    )

  def update(updates, state, params=None):
    del params
    product = optax.tree_utils.tree_vdot(updates, state.previous)
    nonempty = jnp.any(
      jnp.stack([jnp.any(g != 0) for g in jax.tree.leaves(updates)])
    )
    rate = jnp.where(
      nonempty,
      jnp.clip(state.learning_rate + product, low, high),
      state.learning_rate,
    )
    previous = jax.tree.map(
      lambda g, p: jnp.where(nonempty, g, p), updates, state.previous
    )
    steps = jax.tree.map(lambda g: (-rate * g).astype(g.dtype), updates)
    return steps, FedHyperState(rate, previous)

  return optax.GradientTransformation(init, update)
