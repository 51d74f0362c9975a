"""Client and server optimizers: thin, explicit constructors over optax.

Client optimizers are built from the round's learning rate, so a schedule over
rounds is just ``schedule(round)`` inside the jitted round. Their state is
re-created at the start of every round, as in every PyTorch reference
(MOON, FedRCL, FedAU, SSD create a new optimizer per round).
"""

import math
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


# The forms of FedAdam and FedYogi (`make_server_optimizer`'s ``form``).
SERVER_FORMS = ('optax', 'fedopt')


def _check_server_options(name, form, momentum, initial_accumulator):
  """Refuses, in one line naming the config field, a server form or option
  that `make_server_optimizer`'s optimizer would not read (so never silently
  ignores one). The name itself is checked there, after the known ones."""
  if form not in SERVER_FORMS:
    raise ValueError(
      f'Unknown server.form {form!r}; use --config.server.form=optax '
      "(optax's adam/yogi, the default) or fedopt (the authors' released "
      'FedAdam/FedYogi).'
    )
  adaptive = name in ('adam', 'yogi')
  if form == 'fedopt' and not adaptive:
    raise ValueError(
      f"server.form='fedopt' is a form of FedAdam and FedYogi, not of "
      f'server.optimizer={name!r}; set --config.server.optimizer=adam or '
      'yogi, or --config.server.form=optax.'
    )
  if isinstance(initial_accumulator, bool) or not (
    isinstance(initial_accumulator, (int, float))
    and math.isfinite(initial_accumulator)
    and initial_accumulator >= 0
  ):
    raise ValueError(
      "server.initial_accumulator is Yogi's initial second moment; set "
      f'--config.server.initial_accumulator to a number >= 0 (got '
      f'{initial_accumulator!r}).'
    )
  if initial_accumulator and (name != 'yogi' or form != 'fedopt'):
    # optax.yogi starts v at 1e-6 whatever is asked: refuse a value that
    # would be silently ignored.
    raise ValueError(
      f'server.initial_accumulator={initial_accumulator} is read only by '
      "FedYogi in form 'fedopt' (got server.optimizer="
      f'{name!r}, server.form={form!r}); set --config.server.optimizer=yogi '
      'and --config.server.form=fedopt, or '
      '--config.server.initial_accumulator=0.'
    )
  if name == 'fedhyper' and momentum:
    raise ValueError(
      'server.optimizer=fedhyper adapts a plain SGD step; set '
      f'--config.server.momentum=0 (got {momentum}).'
    )


def make_server_optimizer(
  name: str,
  *,
  learning_rate: optax.ScalarOrSchedule = 1.0,
  momentum: float = 0.0,
  b1: float = 0.9,
  b2: float = 0.99,
  eps: float = 1e-3,
  form: str = 'optax',
  initial_accumulator: float = 0.0,
) -> optax.GradientTransformation:
  """The server step on the pseudo-gradient ``-mean(client deltas)``.

  Reddi et al. 2021, "Adaptive Federated Optimization", Alg. 2:
  'sgd' with lr 1 is FedAvg; with momentum it is FedAvgM (Hsu et al. 2019);
  'adam' is FedAdam and 'yogi' FedYogi (tau = eps, default 1e-3 as in the
  paper). 'fedagm' is SGD with momentum whose clients start from the
  lookahead model (algorithms/fedagm.py wraps the client method; momentum >
  0 is required there). 'fedhyper' is FedHyper's global scheduler
  (`fedhyper_global`; learning_rate is its initial rate).

  With Delta_t the round's mean delta, Algorithm 2 steps

    m_t = b1 m_{t-1} + (1 - b1) Delta_t
    v_t = b2 v_{t-1} + (1 - b2) Delta_t^2                       (Adam)
    v_t = v_{t-1} - (1 - b2) Delta_t^2 sign(v_{t-1} - Delta_t^2)  (Yogi)
    x_{t+1} = x_t + lr m_t / (sqrt(v_t) + tau)

  without bias correction. Neither form below is that literally:

  * ``form='optax'`` (the default): optax.adam / optax.yogi, bias-corrected
    from the first round, tau added to the corrected root,
    ``lr m_hat / (sqrt(v_hat) + tau)`` with ``m_hat = m_t / (1 - b1^t)``,
    ``v_hat = v_t / (1 - b2^t)``; optax.yogi starts m and v at 1e-6.
  * ``form='fedopt'``: the authors' released code
    (google-research/federated, `scale_by_fedopt`): Keras' placement of
    tau, ``lr sqrt(1 - b2^t) / (1 - b1^t) m_t / (sqrt(v_t) + tau)``, the
    count t including the zero-gradient step their server takes to create
    the optimizer's variables (round r is step r + 1), m_0 = 0 and v_0 = 0
    (Adam) or ``initial_accumulator`` (Yogi; their runs used 0).

  The two differ for long: in optax's terms the fedopt form's tau is
  ``tau / sqrt(1 - b2^t)``: 7.1 tau (b2 = 0.99) or 22 tau (b2 = 0.999)
  in the first round (t = 2), and still over 1.1 tau for the first ~175
  (b2 = 0.99) or ~1750 (b2 = 0.999) rounds; where sqrt(v_hat) is not large against tau
  (small or sparse updates) the steps differ by up to that factor.
  tests/test_golden_fedopt.py measures both forms against the authors'
  code (docs/results/crosscheck.md).

  Args:
    name: 'sgd', 'adam', 'yogi', 'fedagm' or 'fedhyper'.
    learning_rate: the server rate (a schedule over rounds for 'sgd',
      'fedagm', 'adam' and 'yogi'; a number for 'fedhyper').
    momentum: heavy-ball momentum ('sgd', 'fedagm').
    b1, b2, eps: Adam's and Yogi's decays and tau.
    form: 'optax' or 'fedopt' (for 'adam' and 'yogi' only), above.
    initial_accumulator: Yogi's v_0 in form 'fedopt' (their flag
      ``--server_yogi_initial_accumulator_value``; their class default is
      1, their runs set 0); must stay 0 elsewhere, where nothing reads it.

  Raises:
    ValueError: an unknown name or form, or an option the chosen optimizer
      does not read (one line, naming the config field to change).
  """
  _check_server_options(name, form, momentum, initial_accumulator)
  adaptive = name in ('adam', 'yogi')
  if name in ('sgd', 'fedagm'):
    return optax.sgd(learning_rate, momentum=momentum or None)
  if name == 'fedhyper':
    return fedhyper_global(learning_rate)
  if adaptive and form == 'fedopt':
    return optax.chain(
      scale_by_fedopt(
        b1=b1,
        b2=b2,
        eps=eps,
        yogi=name == 'yogi',
        initial_accumulator=initial_accumulator,
      ),
      optax.scale_by_learning_rate(learning_rate),
    )
  if name == 'adam':
    return optax.adam(learning_rate, b1=b1, b2=b2, eps=eps)
  if name == 'yogi':
    return optax.yogi(learning_rate, b1=b1, b2=b2, eps=eps)
  raise ValueError(
    f"Unknown server optimizer {name!r}; use 'sgd' (FedAvg, "
    "FedAvgM), 'adam' (FedAdam), 'yogi' (FedYogi), 'fedagm' (FedAGM) or "
    "'fedhyper' (FedHyper-G)."
  )


class FedOptState(NamedTuple):
  # int32: the steps taken, counting the authors' zero-gradient step that
  # creates the variables (1 before the first round).
  count: jax.Array
  mu: optax.Updates  # m
  nu: optax.Updates  # v


def scale_by_fedopt(
  b1: float = 0.9,
  b2: float = 0.99,
  eps: float = 1e-3,
  *,
  yogi: bool = False,
  initial_accumulator: float = 0.0,
) -> optax.GradientTransformation:
  """FedAdam's or FedYogi's direction as the authors' released code takes it.

  google-research/federated (the code of Reddi et al., ICLR 2021, at
  a5af8c4): the server optimizer is Keras' Adam or their
  utils/optimizers/yogi.py ``Yogi``, and its server
  (fed_avg_schedule.py) applies ``-mean(delta)`` as the gradient. With g_t
  that gradient and t the optimizer's step count,

    m_t = b1 m_{t-1} + (1 - b1) g_t                                  (m_0 = 0)
    v_t = b2 v_{t-1} + (1 - b2) g_t^2                        (Adam, v_0 = 0)
    v_t = v_{t-1} - (1 - b2) g_t^2 sign(v_{t-1} - g_t^2)
                                         (Yogi, v_0 = initial_accumulator)
    step_t = sqrt(1 - b2^t) / (1 - b1^t) * m_t / (sqrt(v_t) + eps)

  (chain with ``optax.scale_by_learning_rate`` for ``-lr step_t``). Where
  it differs from the paper's Algorithm 2 and from optax:

  * Bias correction, which Algorithm 2 does not have, as Keras applies it:
    on the learning rate, with eps added to the uncorrected sqrt(v_t), i.e.
    optax's ``m_hat / (sqrt(v_hat) + eps / sqrt(1 - b2^t))`` (Kingma and
    Ba's "epsilon hat"); optax.adam/yogi add eps to sqrt(v_hat).
  * The count starts at 1: their server creates the optimizer's variables
    by applying a zero gradient once (``_initialize_optimizer_vars``) and
    keeps them, so round r is bias-corrected as step r + 1. That step moves
    neither m nor v (nor, with m = 0, the model), so starting the count at
    1 is the same as taking it.
  * Yogi's m starts at 0 and v at ``initial_accumulator`` (their flag; the
    paper's runs set 0, their class default is 1); optax.yogi starts both
    at 1e-6. Their Yogi borrows Adam's bias correction above unchanged.

  Args:
    b1, b2: the moments' decays.
    eps: tau.
    yogi: Yogi's second moment instead of Adam's.
    initial_accumulator: v_0 of Yogi (must be 0 for Adam: Keras' is 0).
  """
  if not yogi and initial_accumulator:
    raise ValueError(
      f"Keras' Adam starts v at 0; initial_accumulator={initial_accumulator}"
      ' is for Yogi (yogi=True).'
    )

  def init(params):
    return FedOptState(
      # 1, not 0: the authors' zero-gradient step that creates the slots.
      count=jnp.ones([], jnp.int32),
      mu=jax.tree.map(jnp.zeros_like, params),
      nu=jax.tree.map(lambda p: jnp.full_like(p, initial_accumulator), params),
    )

  def update(updates, state, params=None):
    del params
    mu = jax.tree.map(lambda g, m: b1 * m + (1 - b1) * g, updates, state.mu)
    if yogi:
      nu = jax.tree.map(
        lambda g, v: v - (1 - b2) * jnp.sign(v - g * g) * (g * g),
        updates,
        state.nu,
      )
    else:
      nu = jax.tree.map(
        lambda g, v: b2 * v + (1 - b2) * g * g, updates, state.nu
      )
    count = optax.safe_int32_increment(state.count)

    def step(m, v):
      t = count.astype(m.dtype)
      # Keras: the correction scales the rate; eps is added to sqrt(v_t),
      # not to the corrected root as in optax.
      correction = jnp.sqrt(1 - b2**t) / (1 - b1**t)
      return (correction * m / (jnp.sqrt(v) + eps)).astype(m.dtype)

    return jax.tree.map(step, mu, nu), FedOptState(count, mu, nu)

  return optax.GradientTransformation(init, update)


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
