"""FedAGM: the server's momentum sent ahead, any client method behind it.

Kim, Kim and Han, 'Communication-Efficient Federated Learning with
Accelerated Client Gradient' (FedAGM, arXiv:2201.03172; FedACG at CVPR
2024). The server keeps a momentum m of its global steps and broadcasts the
lookahead model

  theta~_t = theta_{t-1} + lambda m_{t-1}                       (lookahead)

from which every client trains, with a proximal term to it:

  L_i(theta) = L_client(theta) + beta/2 ||theta - theta~_t||^2   (client)

The server averages the clients' deltas from theta~_t and moves by momentum:

  m_t = lambda m_{t-1} + tau mean_i(theta_i - theta~_t),
  theta_t = theta_{t-1} + m_t                                    (server)

which is heavy-ball SGD on the pseudo-gradient (optax.sgd with learning rate
tau and momentum lambda: ``server.learning_rate`` and ``server.momentum``),
measured from the lookahead. So FedAGM is a server method that wraps any
client method (`accelerate`): the client hooks see the lookahead as the
received global model, the server hook the true one, and the lookahead is
the server optimizer's step on a zero pseudo-gradient (for SGD with momentum
exactly lambda m_{t-1}). Evaluation uses theta_t, as the authors' code does.

Defaults are the authors' FedACG configs (github.com/geehokim/FedACG,
configs/server/FedACG.yaml: lambda 0.85; configs/client/ACG.yaml: a
proximal weight 1e-3 on the unhalved squared norm, i.e. beta = 2e-3), with
tau = 1 (their server takes the plain mean). docs/methods.md, FedAGM.
"""

import jax
import jax.numpy as jnp

from fedjax_metric.algorithms import fedprox
from fedjax_metric.models import split_variables


def lookahead(server_optimizer, server_state):
  """The model the server broadcasts: its variables moved by the step the
  server optimizer takes on a zero pseudo-gradient (lambda m_{t-1} for SGD
  with momentum; nothing for plain SGD). Non-trainable state (BatchNorm
  statistics) is sent as it is."""
  params, model_state = split_variables(server_state.variables)
  zeros = jax.tree.map(jnp.zeros_like, params)
  step, _ = server_optimizer.update(zeros, server_state.opt_state, params)
  params = jax.tree.map(jnp.add, params, step)
  return server_state._replace(variables={'params': params, **model_state})


def accelerate(algorithm, server_optimizer, *, beta):
  """``algorithm`` whose clients train from the lookahead model, with the
  proximal term ``beta/2 ||theta - theta~||^2`` added to its client loss
  (logged as the 'prox' term). Its server update is unchanged: with
  ``server_optimizer`` = SGD with momentum it is FedAGM's.

  Raises:
    ValueError: beta < 0.
  """
  if not beta >= 0:
    raise ValueError(
      f'FedAGM beta must be >= 0, got {beta} (--config.server.fedagm_beta).'
    )

  def received(ctx):
    return ctx._replace(
      server_state=lookahead(server_optimizer, ctx.server_state)
    )

  def client_begin(ctx):
    return algorithm.client_begin(received(ctx))

  def client_loss(params, model_state, batch, ctx):
    ctx = received(ctx)
    loss, (model_state, terms) = algorithm.client_loss(
      params, model_state, batch, ctx
    )
    prox = fedprox.proximal_term(params, ctx.server_state.variables['params'])
    return loss + beta * prox, (model_state, {**terms, 'prox': prox})

  def client_step_end(params, model_state, ctx):
    return algorithm.client_step_end(params, model_state, received(ctx))

  def client_final(end_variables, ctx):
    return algorithm.client_final(end_variables, received(ctx))

  return algorithm._replace(
    client_begin=client_begin,
    client_loss=client_loss,
    client_step_end=client_step_end,
    client_final=client_final,
  )
