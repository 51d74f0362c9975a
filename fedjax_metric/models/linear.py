"""Models for vector inputs: multinomial logistic regression and an MLP.

For the Synthetic(alpha, beta) federation (`fedjax_metric.data.synthetic`;
inputs [B, 60], 10 classes). Li et al., 'Federated Optimization in
Heterogeneous Networks' (FedProx), MLSys 2020, Sec. 5.1, train "a
multinomial logistic regression" on it; the authors' code
(github.com/litian96/FedProx, flearn/models/synthetic/mclr.py) is one
``tf.layers.dense(features, num_classes)`` with an L2 regulariser of 0.001
on the kernel (a regulariser is a loss term here, not part of the model).
LEAF's synthetic baseline (github.com/TalwalkarLab/leaf,
models/synthetic/log_reg.py) is also one dense layer. Neither uses an MLP
on Synthetic; `MLP` is this package's nonlinear alternative, not a
reproduction.

Both follow the package's output contract (models/__init__.py):
``__call__(inputs, *, train, mask=None)`` returns ``{'logits' [B, K],
'embedding' [B, D], 'features': [[B, d_l], ...]}``. Inputs [B, ...] are
flattened to [B, prod(...)]. Neither model has BatchNorm, so ``train`` and
``mask`` change nothing.
"""

from typing import Optional, Sequence

import flax.linen as nn
import jax.numpy as jnp


def _flatten(inputs):
  return jnp.reshape(inputs, (inputs.shape[0], -1))


class LogisticRegression(nn.Module):
  """logits = x W + b: FedProx's model for Synthetic.

  'embedding' is the (flattened) input, the representation the classifier
  sees; 'features' is empty (no hidden level).

  Attributes:
    num_classes: K.
  """

  num_classes: int

  @nn.compact
  def __call__(
    self, inputs, *, train: bool, mask: Optional[jnp.ndarray] = None
  ):
    """inputs [B, ...] float -> {'logits' [B, K], 'embedding' [B, d], ...}."""
    del train, mask  # no batch statistics
    x = _flatten(inputs)
    return {
      'logits': nn.Dense(self.num_classes)(x),
      'embedding': x,
      'features': [],
    }


class MLP(nn.Module):
  """dense(h_1) -> ReLU -> ... -> dense(h_L) -> ReLU -> dense(K).

  'embedding' is the last hidden layer after ReLU [B, h_L]; 'features' are
  the hidden layers' pre-ReLU outputs [[B, h_1], ..., [B, h_L]] (the taps
  of the CNNs are pre-ReLU too, models/small_cnn.py).

  Attributes:
    num_classes: K.
    hidden: hidden widths, at least one. (200,): one hidden layer, the
      width of McMahan et al.'s MNIST 2NN ('Communication-Efficient
      Learning of Deep Networks from Decentralized Data', AISTATS 2017),
      which has two.
  """

  num_classes: int
  hidden: Sequence[int] = (200,)

  @nn.compact
  def __call__(
    self, inputs, *, train: bool, mask: Optional[jnp.ndarray] = None
  ):
    """inputs [B, ...] float -> {'logits' [B, K], 'embedding' [B, h_L], ...}."""
    del train, mask  # no batch statistics
    if not self.hidden:
      raise ValueError('MLP needs at least one hidden width.')
    x = _flatten(inputs)
    features = []
    for width in self.hidden:
      x = nn.Dense(width)(x)
      features.append(x)
      x = nn.relu(x)
    return {
      'logits': nn.Dense(self.num_classes)(x),
      'embedding': x,
      'features': features,
    }
