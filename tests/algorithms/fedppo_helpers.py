"""NumPy softmax and tanh MLP, for FedPPO's agent, server and round tests."""

import numpy as np


def _np_softmax(x):
  e = np.exp(x - x.max())
  return e / e.sum()


def _np_mlp(layers, x):
  for layer in layers[:-1]:
    x = np.tanh(x @ np.asarray(layer['w'], np.float64) + np.asarray(layer['b']))
  return x @ np.asarray(layers[-1]['w'], np.float64) + np.asarray(
    layers[-1]['b']
  )
