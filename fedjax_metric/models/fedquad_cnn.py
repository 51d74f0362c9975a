"""FedQuad's three-block CNN encoder (Section IV-A).

Goksu & Pugeault, 'FedQuad: Federated Stochastic Quadruplet Learning to
Mitigate Data Heterogeneity', arXiv:2509.04107, 2025.

The paper: three blocks of 3x3 conv (stride 1, padding 1) -> BatchNorm -> ReLU,
a 2x2 max-pool after the first two blocks, adaptive average pooling to 1x1
after the third, flatten (256) -> Linear to a 128-d embedding, plus "a softmax
layer ... solely for cross-entropy loss measurement". The quadruplet loss acts
on that embedding *un-normalised* (Eq. 5 uses the raw embedding f(x)).

Choices the paper leaves open, and why:
  * Channel widths are not given; 64/128/256 (our choice): the last must be
    256 to match the stated flatten size.
  * No ReLU between the embedding and the classifier: the forward pass "applies
    the linear layer to obtain the final embeddings" and the classifier is only
    an add-on for CE, so the classifier is a Linear on the raw embedding and
    'embedding' is exactly what the metric loss sees (a ReLU there would make
    the metric loss see a different vector than the one the paper describes).
  * Convolutions keep their bias (PyTorch's ``nn.Conv2d`` default; the paper
    does not say ``bias=False``), even though BatchNorm makes it redundant.
"""

from typing import Optional, Sequence

import flax.linen as nn
import jax.numpy as jnp

from fedjax_metric.models.layers import make_conv, make_norm, pool_2x2
from fedjax_metric.models.projection import head_and_classifier


class FedQuadCNN(nn.Module):
  """3 x [conv3x3 -> norm -> ReLU] (max-pool, max-pool, GAP) -> Dense(D) -> Dense(K).

  Attributes:
    num_classes: K, outputs of the CE classifier.
    widths: channels of the three conv blocks; the last one is the flatten size
      (256 in the paper).
    embedding_dim: D, the embedding the metric loss uses (128 in the paper).
    norm: 'batch' (paper), 'group' or 'none' after each conv.
    conv_impl: 'xla' (nn.Conv) or 'patches' (`layers.PatchConv`: batched
      matrix multiplies when vmapped over clients; same parameters);
      'implicit' (stride-1 convolutions as one implicit-GEMM Pallas kernel,
      `models.implicit_conv`; others as patches).
    projection_dim: > 0 adds MOON's projection head (models/projection.py)
      on the embedding: 'embedding' is then its output z and the classifier
      sits on z (for MOON in FedQuad's comparison; FedQuad itself uses 0).
  """

  num_classes: int
  widths: Sequence[int] = (64, 128, 256)
  embedding_dim: int = 128
  norm: str = 'batch'
  conv_impl: str = 'xla'
  projection_dim: int = 0

  @nn.compact
  def __call__(
    self, images, *, train: bool, mask: Optional[jnp.ndarray] = None
  ):
    """Forward pass.

    Args:
      images: [B, H, W, C] float.
      train: BatchNorm uses (and updates) batch statistics when True.
      mask: optional [B] bool; False rows are padding, kept out of BatchNorm's
        batch statistics.

    Returns:
      {'logits': [B, K], 'embedding': [B, D] (not normalised, no ReLU),
       'features': [[B, widths[0]], [B, widths[1]], [B, widths[2]]]}, each block's
      pooled output, spatially averaged (the last is the flattened 1x1 GAP).
    """
    if len(self.widths) != 3:
      raise ValueError(
        f'FedQuadCNN has 3 conv blocks; got widths={self.widths}'
      )
    norm = make_norm(self.norm)
    x = images
    features = []
    for block, channels in enumerate(self.widths):
      # 3x3, stride 1, SAME == PyTorch padding=1.
      x = make_conv(self.conv_impl)(
        channels, (3, 3), strides=1, padding='SAME'
      )(x)
      x = nn.relu(norm(x, train, mask))
      if block < 2:
        x = pool_2x2(x, 'max')
        features.append(jnp.mean(x, axis=(1, 2)))
      else:
        # AdaptiveAvgPool2d(1) + flatten.
        x = jnp.mean(x, axis=(1, 2))
        features.append(x)
    embedding = nn.Dense(self.embedding_dim)(x)
    embedding, logits = head_and_classifier(
      embedding,
      projection_dim=self.projection_dim,
      num_classes=self.num_classes,
    )
    return {'logits': logits, 'embedding': embedding, 'features': features}
