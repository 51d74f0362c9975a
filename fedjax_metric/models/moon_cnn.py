"""MOON's SimpleCNN with projection head.

Li, He and Song, 'Model-Contrastive Federated Learning', CVPR 2021.

Port of ``ModelFedCon(SimpleCNN_header, out_dim, n_classes)`` from
the authors' released code (github.com/QinbinLi/MOON, ``model.py``)::

  h = features(x)            # conv(6,5x5) relu pool conv(16,5x5) relu pool
                             # flatten fc(120) relu fc(84) relu
  z = l2(relu(l1(h)))        # l1: 84 -> 84, l2: 84 -> out_dim (256)
  logits = l3(z)             # l3: out_dim -> n_classes

The classifier sits on the projection z, not on h: MOON's contrastive loss and
its CE share z, and putting l3 on h (the usual SimCLR layout) changes both the
parameter count and what the contrastive term regularises. No normalisation
layers, as in the reference.

Small inputs: the reference is for 32x32 (flatten 16*5*5 = 400) and runs on
28x28 as is (flatten 16*4*4 = 256). Two VALID 5x5 convs with 2x2 pools need
at least 16 px, and leave a 1x1 map at 16-19 px, so for inputs under 20 px
(e.g. 8x8 digits) the convs switch to SAME padding automatically (flatten
16*2*2 = 64 at 8x8); this is a simulator extension, not in MOON.
"""

from typing import Optional, Sequence

import flax.linen as nn
import jax.numpy as jnp

from fedjax_metric.models.layers import pool_2x2

# Below this height/width the VALID convs would (nearly) collapse the map.
_MIN_VALID_SIZE = 20


class MoonCNN(nn.Module):
  """SimpleCNN_header -> projection head (l1, ReLU, l2) -> classifier on z.

  Attributes:
    num_classes: K, classifier outputs.
    out_dim: width of the projection z ('embedding'); 256 in MOON's main.py.
    conv_widths: channels of the two 5x5 convs.
    hidden: widths of the two dense layers of the header; the last is d_h, also
      the width of the projection's hidden layer l1.
  """

  num_classes: int
  out_dim: int = 256
  conv_widths: Sequence[int] = (6, 16)
  hidden: Sequence[int] = (120, 84)

  @nn.compact
  def __call__(
    self, images, *, train: bool, mask: Optional[jnp.ndarray] = None
  ):
    """Forward pass; ``train`` and ``mask`` are unused (no normalisation layers).

    Args:
      images: [B, H, W, C] float.
      train: unused; kept for the shared model signature.
      mask: unused; kept for the shared model signature.

    Returns:
      {'logits': [B, K], 'embedding': z [B, out_dim], 'features': [h [B, d_h]]}.
    """
    del train, mask
    small = min(images.shape[1], images.shape[2]) < _MIN_VALID_SIZE
    padding = 'SAME' if small else 'VALID'
    x = images
    for channels in self.conv_widths:
      x = nn.relu(nn.Conv(channels, (5, 5), padding=padding)(x))
      x = pool_2x2(x, 'max')
    x = x.reshape(x.shape[0], -1)
    for width in self.hidden:
      x = nn.relu(nn.Dense(width)(x))
    h = x
    # Projection head: l1 keeps the width of h (Linear(d_h, d_h)).
    z = nn.Dense(h.shape[-1], name='l1')(h)
    z = nn.Dense(self.out_dim, name='l2')(nn.relu(z))
    logits = nn.Dense(self.num_classes, name='l3')(z)
    return {'logits': logits, 'embedding': z, 'features': [h]}
