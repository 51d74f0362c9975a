"""A small CNN for 8x8 / 28x28 grayscale and 32x32 colour images.

Two 3x3 convolutions and two dense layers. Downsampling defaults to stride-2
convolutions because that is the form XLA runs fastest on CPU: the backward
pass of pooling costs time there even in the reshape form of
`layers.pool_2x2` (benchmarks/cpu.md). ``pool='max'`` gives the textbook form.
"""

from typing import Optional

import flax.linen as nn
import jax.numpy as jnp

from fedjax_metric.models.layers import (
  check_graft_level,
  graft_at,
  make_conv,
  make_norm,
  pool_2x2,
)
from fedjax_metric.models.projection import head_and_classifier


class SmallCNN(nn.Module):
  """conv3x3(w) -> down -> conv3x3(2w) -> down -> dense(D) -> dense(classes).

  Attributes:
    num_classes: output classes.
    width: channels of the first conv (second has 2 * width).
    embedding_dim: D, the width of the penultimate layer ('embedding').
    pool: 'stride' (stride-2 convs), 'avg' or 'max' (2x2 pooling).
    norm: 'none', 'batch' or 'group' after each conv.
    conv_impl: 'xla' (nn.Conv) or 'patches' (`layers.PatchConv`: batched
      matrix multiplies when vmapped over clients; same parameters);
      'implicit' (stride-1 convolutions as one implicit-GEMM Pallas kernel,
      `models.implicit_conv`; others as patches).
    projection_dim: > 0 adds MOON's projection head (models/projection.py)
      on the dense layer: 'embedding' is then its output z [B,
      projection_dim] and the classifier sits on z.
  """

  num_classes: int
  width: int = 32
  embedding_dim: int = 128
  pool: str = 'stride'
  norm: str = 'none'
  conv_impl: str = 'xla'
  projection_dim: int = 0

  @nn.compact
  def __call__(
    self,
    images,
    *,
    train: bool,
    mask: Optional[jnp.ndarray] = None,
    graft=None,
  ):
    """images [B,H,W,C] float -> {'logits' [B,K], 'embedding' [B,D], 'features'}.

    'features' are the two conv stages' pre-ReLU outputs, average-pooled:
    [B, width] and [B, 2 * width]; 'embedding' the post-ReLU dense layer.
    'stages' are FedMLB's three branch points: each conv stage's output
    after ReLU (and pooling) and the post-ReLU dense layer; ``graft =
    (level, activation)`` replaces ``stages[level]`` (`layers.graft_at`).
    """
    check_graft_level(graft, 3)
    if self.pool not in ('stride', 'avg', 'max'):
      raise ValueError(
        f"pool must be 'stride', 'avg' or 'max', got {self.pool!r}"
      )
    norm = make_norm(self.norm)
    x = images
    features, stages = [], []
    for channels in (self.width, 2 * self.width):
      strides = 2 if self.pool == 'stride' else 1
      conv = make_conv(self.conv_impl)(channels, (3, 3), strides=strides)
      x = norm(conv(x), train, mask)
      # FedRCL's level taps are pre-ReLU, globally average-pooled, as in
      # the authors' released code (github.com/skynbe/FedRCL,
      # models/resnet_base.py).
      features.append(jnp.mean(x, axis=(1, 2)))
      x = nn.relu(x)
      if self.pool != 'stride':
        x = pool_2x2(x, self.pool)
      x = graft_at(len(stages), x, graft)
      stages.append(x)
    x = x.reshape(x.shape[0], -1)
    embedding = nn.relu(nn.Dense(self.embedding_dim)(x))
    embedding = graft_at(2, embedding, graft)
    stages.append(embedding)
    embedding, logits = head_and_classifier(
      embedding,
      projection_dim=self.projection_dim,
      num_classes=self.num_classes,
    )
    return {
      'logits': logits,
      'embedding': embedding,
      'features': features,
      'stages': stages,
    }
