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

import functools

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


def received(server_optimizer, ctx):
  """The client context with the lookahead as the received global model."""
  return ctx._replace(
    server_state=lookahead(server_optimizer, ctx.server_state)
  )


def client_begin(server_optimizer, inner_begin, ctx):
  """The wrapped method's client_begin from the lookahead."""
  return inner_begin(received(server_optimizer, ctx))


def client_loss(
  server_optimizer, beta, inner_loss, params, model_state, batch, ctx
):
  """The wrapped method's loss + beta/2 ||theta - theta~||^2 (the client
  equation), its terms logged with the proximal one as 'prox'."""
  ctx = received(server_optimizer, ctx)
  loss, (model_state, terms) = inner_loss(params, model_state, batch, ctx)
  prox = fedprox.proximal_term(params, ctx.server_state.variables['params'])
  return loss + beta * prox, (model_state, {**terms, 'prox': prox})


def client_step_end(server_optimizer, inner_step_end, params, model_state, ctx):
  """The wrapped method's client_step_end, seeing the lookahead."""
  return inner_step_end(params, model_state, received(server_optimizer, ctx))


def client_final(server_optimizer, inner_final, end_variables, ctx):
  """The wrapped method's client_final: its update is measured from the
  lookahead."""
  return inner_final(end_variables, received(server_optimizer, ctx))


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
  bind = functools.partial
  return algorithm._replace(
    client_begin=bind(client_begin, server_optimizer, algorithm.client_begin),
    client_loss=bind(
      client_loss, server_optimizer, beta, algorithm.client_loss
    ),
    client_step_end=bind(
      client_step_end, server_optimizer, algorithm.client_step_end
    ),
    client_final=bind(client_final, server_optimizer, algorithm.client_final),
  )
