"""CIFAR ResNet-32 with GroupNorm, the FedMetric embedding network for CIFAR-10.

Park, Hosseini and Yun, 'Federated Learning with Metric Loss', FL-ICML
workshop 2021, Sec. 4.1: "ResNet-32 used in (Yu et al., 2020) for CIFAR-10",
GroupNorm instead of BatchNorm, 64-d embedding. The network is the CIFAR
ResNet of He et al., 'Deep Residual Learning for Image Recognition', CVPR
2016, Sec. 4.2, with n = 5 (6n + 2 = 32 layers):

  conv3x3(w) -> norm -> ReLU
  3 stages x 5 BasicBlocks, widths w, 2w, 4w (16/32/64), strides 1, 2, 2
  global average pooling -> [B, 4w] = the 64-d embedding

The blocks are `resnet.BasicBlock` (bias-free convs, GroupNorm(groups)):
where the shape changes its shortcut is a 1x1 conv + norm ("option B" of
He et al.), while their CIFAR ResNets used parameter-free zero-padded
identity shortcuts ("option A"); option B adds 16*32 + 32*64 = 2,560 conv
weights and 2 * (32 + 64) = 192 norm parameters to the 0.46M. Neither
FedMetric nor FedAwS says which shortcut they used.
"""

from typing import Optional

import flax.linen as nn
import jax.numpy as jnp

from fedjax_metric.models.resnet import cifar_resnet_trunk

_BLOCKS_PER_STAGE = 5
_STAGE_STRIDES = (1, 2, 2)


class ResNet32(nn.Module):
  """CIFAR ResNet-32 embedding network (no classifier).

  Attributes:
    num_classes: accepted for registry compatibility and unused: this is an
      embedding network and has no classifier ('logits' is not returned).
    embedding_dim: D. When D equals the last stage's width 4 * width (64,
      the paper) the pooled features are the embedding; otherwise a linear
      layer maps them to D.
    width: w, channels of the stem and first stage (16).
    norm: 'group' (FedMetric), 'batch' or 'none'.
    groups: GroupNorm groups (must divide w).
    use_bias: bias of the projection layer (only when D != 4 * width).
  """

  num_classes: int = 0
  embedding_dim: int = 64
  width: int = 16
  norm: str = 'group'
  groups: int = 2
  use_bias: bool = True

  @nn.compact
  def __call__(
    self, images, *, train: bool, mask: Optional[jnp.ndarray] = None
  ):
    """Forward pass.

    Args:
      images: [B, H, W, C] float (32x32x3 for CIFAR-10).
      train: BatchNorm uses (and updates) batch statistics when True.
      mask: optional [B] bool; False rows are padding, kept out of
        BatchNorm's batch statistics.

    Returns:
      {'embedding': [B, embedding_dim], 'features': 4 average-pooled
       pre-ReLU taps (stem, then the last block of each stage, as in
       `resnet.ResNet18`): [B, w], [B, w], [B, 2w], [B, 4w]}.
    """
    x, features, _ = cifar_resnet_trunk(
      images,
      train,
      mask,
      width=self.width,
      stage_blocks=(_BLOCKS_PER_STAGE,) * len(_STAGE_STRIDES),
      stage_strides=_STAGE_STRIDES,
      norm=self.norm,
      groups=self.groups,
    )
    embedding = jnp.mean(x, axis=(1, 2))
    if self.embedding_dim != embedding.shape[-1]:
      embedding = nn.Dense(
        self.embedding_dim, use_bias=self.use_bias, name='projection'
      )(embedding)
    return {'embedding': embedding, 'features': features}
