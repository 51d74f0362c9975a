"""SCAFFOLD (Karimireddy et al., "SCAFFOLD: Stochastic Controlled Averaging
for Federated Learning", ICML 2020), Algorithm 1 with option II.

Each client keeps a control variate c_i (its row of the client table), the
server a global one c (server extra). Local steps follow the corrected
gradient ``y <- y - lr (g_i(y) - c_i + c)`` (Alg. 1 line 10); afterwards

  c_i+ = c_i - c + (x - y_i) / (K lr)        (line 12, option II)

and the client sends ``(y_i - x, c_i+ - c_i)``. The server moves
``x <- x + eta_g mean_S(y_i - x)`` (through the server optimizer; sgd(1.0) is
the paper's eta_g = 1) and ``c <- c + (1 / N) sum_S (c_i+ - c_i)`` (line 17,
|S| / N times the cohort mean).

Slots replaced relative to FedAvg:
  * ``init_client`` / ``init_server``: zero control variates, shaped like the
    params (the table costs N x model size: the memory budget check applies);
  * ``client_loss``: CE + <c - c_i, w>, whose gradient is exactly the
    correction ``c - c_i`` (with plain SGD the step is Alg. 1's; with
    momentum or Adam the correction passes through the optimizer like the
    gradient, as in common implementations);
  * ``client_final``: the new c_i from ctx.learning_rate and ctx.num_steps
    (K, the client's real local steps), and an update carrying both deltas;
  * ``server_update``: the two moves above.
"""

import functools

import jax
import jax.numpy as jnp

from fedjax_metric.algorithms import fedavg
from fedjax_metric.algorithms.spec import NO_OPTIONS, AlgorithmSpec
from fedjax_metric.models import split_variables


def _zeros_like_params(variables):
  params, _ = split_variables(variables)
  return jax.tree.map(jnp.zeros_like, params)


def init_client(variables, key):
  """init_client: c_i = 0, shaped like the params."""
  del key
  return _zeros_like_params(variables)


def init_extra(variables, num_clients, key):
  """The server extra: c = 0, shaped like the params."""
  del num_clients, key
  return {'control': _zeros_like_params(variables)}


def _dot(a, b):
  return sum(
    jnp.vdot(x, y) for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b))
  )


def control_variate_update(
  client_control,
  server_control,
  global_params,
  local_params,
  *,
  num_steps,
  learning_rate,
):
  """Option II of Alg. 1 line 12: ``c_i - c + (x - y_i) / (K lr)``.

  Args:
    client_control, server_control: c_i and c (pytrees like the params).
    global_params, local_params: x and the client's final y_i.
    num_steps: K, the client's local steps (>= 1; 0 is treated as 1).
    learning_rate: the local learning rate lr.
  """
  scale = 1.0 / (jnp.maximum(num_steps, 1.0) * learning_rate)
  return jax.tree.map(
    lambda ci, c, x, y: ci - c + (x - y) * scale,
    client_control,
    server_control,
    global_params,
    local_params,
  )


def client_loss(model, params, model_state, batch, ctx):
  """CE + <c - c_i, w>: its gradient adds the correction ``c - c_i`` of
  Alg. 1 line 10 (held constant)."""
  loss, aux = fedavg.cross_entropy_loss(model, params, model_state, batch, ctx)
  correction = jax.tree.map(
    jnp.subtract, ctx.server_state.extra['control'], ctx.client_row
  )
  return loss + _dot(jax.lax.stop_gradient(correction), params), aux


def client_final(weighting, end_variables, ctx):
  """The update ``{'model': y_i - x, 'control': c_i+ - c_i}``, the model
  delta's weight, and the new c_i as the row."""
  delta, weight, _ = fedavg.delta_final(weighting, end_variables, ctx)
  global_params, _ = split_variables(ctx.server_state.variables)
  local_params, _ = split_variables(end_variables)
  new_control = control_variate_update(
    ctx.client_row,
    ctx.server_state.extra['control'],
    global_params,
    local_params,
    num_steps=ctx.num_steps,
    learning_rate=ctx.learning_rate,
  )
  # A client with no local step (no examples) learned nothing: its c_i
  # stays, so it sends no control delta (option II would give c_i - c).
  new_control = jax.tree.map(
    lambda new, old: jnp.where(ctx.num_steps > 0, new, old),
    new_control,
    ctx.client_row,
  )
  # Divided by the weight, so the engine's weighted sum is the plain sum
  # (0 for a zero weight: a padding slot under example-count weighting).
  control_delta = fedavg.plain_sum_share(
    jax.tree.map(jnp.subtract, new_control, ctx.client_row), weight
  )
  return {'model': delta, 'control': control_delta}, weight, new_control


def server_update(server_optimizer, server_state, aggregate, cohort_rows):
  """x moves by FedAvg's server step on the model deltas; c by
  ``(1 / N) sum_S (c_i+ - c_i)`` (Alg. 1 line 17)."""
  num_clients = aggregate.num_clients
  model_sum = aggregate.update_sum['model']
  state = fedavg.server_update(
    server_optimizer,
    server_state,
    aggregate._replace(update_sum=model_sum),
    cohort_rows,
  )
  control = jax.tree.map(
    lambda c, d: c + d / num_clients,
    server_state.extra['control'],
    aggregate.update_sum['control'],
  )
  return state._replace(extra={'control': control})


def build(model, options=NO_OPTIONS, *, server_optimizer, weighting='uniform'):
  """SCAFFOLD; ``weighting`` applies to the model deltas ('uniform' is the
  paper's 1/|S|); the control variates always move by the plain sum / N."""
  del options
  base = fedavg.build(
    model, server_optimizer=server_optimizer, weighting=weighting
  )
  return base._replace(
    init_server=fedavg.make_init_server(server_optimizer, init_extra),
    init_client=init_client,
    client_loss=functools.partial(client_loss, model),
    client_final=functools.partial(client_final, weighting),
    server_update=functools.partial(server_update, server_optimizer),
  )


SPEC = AlgorithmSpec(
  'scaffold',
  build,
  description='SCAFFOLD (Karimireddy et al., 2020): control variates.',
)
SPECS = (SPEC,)
