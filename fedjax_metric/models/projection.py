"""MOON's projection head, for any backbone.

Li, He and Song, 'Model-Contrastive Federated Learning', CVPR 2021, Sec. 3.2
("the network has three components: a base encoder, a projection head, and
an output layer"), as ``ModelFedCon`` of the authors' released code
(github.com/QinbinLi/MOON, model.py) builds it for every backbone::

  h = backbone(x)            # the representation before the classifier
  z = l2(relu(l1(h)))        # l1: d_h -> d_h, l2: d_h -> out_dim
  logits = l3(z)             # the output layer sits on z, not on h

A backbone with ``projection_dim > 0`` (small CNN, FedQuad's CNN, ResNet-18)
applies `ProjectionHead` to its pre-classifier vector h, returns z as its
'embedding' and puts its classifier on z. ``models/moon_cnn.py`` is the same
layout for MOON's own simple CNN.
"""

import flax.linen as nn
import jax.numpy as jnp


class ProjectionHead(nn.Module):
  """``z = Dense(out_dim)(relu(Dense(d_h)(h)))`` (MOON's l1 and l2).

  Attributes:
    out_dim: width of z (256 in the released MOON code's main.py).
  """

  out_dim: int

  @nn.compact
  def __call__(self, h: jnp.ndarray) -> jnp.ndarray:
    """h [B, d_h] -> z [B, out_dim]; l1 keeps the width of h."""
    z = nn.relu(nn.Dense(h.shape[-1], name='l1')(h))
    return nn.Dense(self.out_dim, name='l2')(z)


def head_and_classifier(
  h, *, projection_dim: int, num_classes: int, classifier_name=None
):
  """(embedding, logits) of a backbone's pre-classifier vector ``h`` [B, d_h].

  ``projection_dim == 0``: embedding h, logits Dense(K)(h) (the backbone as
  it was). ``> 0``: embedding z = `ProjectionHead`(h) [B, projection_dim] and
  logits Dense(K)(z) (MOON's layout). Call inside the backbone's compact
  ``__call__``; ``classifier_name`` keeps the backbone's parameter name.
  """
  if projection_dim < 0:
    raise ValueError(f'projection_dim must be >= 0, got {projection_dim}.')
  if projection_dim:
    h = ProjectionHead(projection_dim, name='projection_head')(h)
  return h, nn.Dense(num_classes, name=classifier_name)(h)
