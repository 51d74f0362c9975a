"""CIFAR ResNet-18 with FedRCL's pre-ReLU multi-level taps.

FedRCL: Seo, Kim, Kim and Han, 'Relaxed Contrastive Learning for Federated
Learning', CVPR 2024, Sec. 4.4 (multi-level contrastive training). Port of
``ResNet18_base`` from the authors' released code (github.com/skynbe/FedRCL,
``models/resnet_base.py``) as the
FedRCL client calls it (``no_relu=True``): 3x3 stride-1 stem without max-pool,
BasicBlocks [2, 2, 2, 2] with widths w, 2w, 4w, 8w and strides 1, 2, 2, 2, a
1x1 conv + norm shortcut where the shape changes, bias-free convs, and every
norm GroupNorm(2) (``use_bn_layer: False``) unless ``norm='batch'``.

Feature taps ('features', FedRCL levels 0-4), all taken BEFORE the ReLU and
global-average-pooled, because FedRCL's relaxed contrastive loss runs on
pre-ReLU features (a ReLU'd tap would be a different, non-negative feature):
  level 0: norm(conv1(x)), [B, w];
  level l = 1..4: the last BasicBlock of stage l without its final ReLU,
    i.e. norm(conv2(.)) + shortcut, [B, w * 2**(l-1)].
The ReLU is applied to each tap before it feeds the next stage, so the logits
path is exactly that of a plain ResNet-18.

Norm epsilon follows flax's defaults (GroupNorm 1e-6 vs PyTorch's 1e-5;
BatchNorm 1e-5 as in PyTorch): `layers.make_norm` owns that choice.
"""

from typing import Optional

import flax.linen as nn
import jax.numpy as jnp

from fedjax_metric.models.layers import check_graft_level, graft_at, make_norm
from fedjax_metric.models.projection import head_and_classifier

_STAGE_BLOCKS = (2, 2, 2, 2)
_STAGE_STRIDES = (1, 2, 2, 2)


class BasicBlock(nn.Module):
  """conv3x3 -> norm -> ReLU -> conv3x3 -> norm, plus a (projected) shortcut.

  Returns the sum BEFORE the block's final ReLU; the caller applies it, so the
  last block of a stage doubles as FedRCL's pre-ReLU tap.

  Attributes:
    channels: output channels.
    strides: stride of the first conv (and of the shortcut's 1x1 conv).
    norm: 'group', 'batch' or 'none'.
    groups: GroupNorm groups.
  """

  channels: int
  strides: int = 1
  norm: str = 'group'
  groups: int = 2

  @nn.compact
  def __call__(self, x, train: bool, mask: Optional[jnp.ndarray]):
    """x [B, H, W, C_in] -> pre-ReLU [B, H / strides, W / strides, channels]."""
    norm = make_norm(self.norm, self.groups)
    # PyTorch's padding=1, not 'SAME': at stride 2 'SAME' pads (0, 1), which
    # centres each output on input pixel 2o + 1 while the 1x1 shortcut reads
    # pixel 2o; (1, 1) keeps the two paths aligned, as in the ported code.
    out = nn.Conv(
      self.channels,
      (3, 3),
      strides=self.strides,
      padding=((1, 1), (1, 1)),
      use_bias=False,
    )(x)
    out = nn.relu(norm(out, train, mask))
    out = nn.Conv(
      self.channels, (3, 3), padding=((1, 1), (1, 1)), use_bias=False
    )(out)
    out = norm(out, train, mask)
    shortcut = x
    if self.strides != 1 or x.shape[-1] != self.channels:
      shortcut = nn.Conv(
        self.channels, (1, 1), strides=self.strides, use_bias=False
      )(x)
      shortcut = norm(shortcut, train, mask)
    return out + shortcut


def cifar_resnet_trunk(
  images,
  train: bool,
  mask: Optional[jnp.ndarray],
  *,
  width: int,
  stage_blocks=_STAGE_BLOCKS,
  stage_strides=_STAGE_STRIDES,
  norm: str,
  groups: int,
  graft=None,
):
  """The CIFAR ResNet body shared by ResNet-18, ResNet-32 and the SSL encoder.

  conv3x3(w) -> norm -> ReLU, then stage s = 0, 1, ... of ``stage_blocks[s]``
  `BasicBlock`s of width w * 2**s (the first with ``stage_strides[s]``), each
  followed by a ReLU; no stem max-pool (He et al., CVPR 2016, Sec. 4.2).
  Call it from inside a module's ``nn.compact`` method: the layers it makes
  become that module's children, named 'conv1' and 'layer{s+1}_{b}'.

  Args:
    images: [B, H, W, C] float.
    train, mask: as the calling module's (BatchNorm statistics, padding rows).
    width: w, channels of the stem and first stage.
    stage_blocks, stage_strides: blocks and first-block stride per stage
      (default ResNet-18's: 2, 2, 2, 2 blocks, strides 1, 2, 2, 2).
    norm, groups: `layers.make_norm`'s arguments.
    graft: None or ``(level, activation)``: replace the ReLU'd output of
      branch point ``level`` (0 the stem, s + 1 stage s) with ``activation``
      (FedMLB's hybrid pathways, `layers.graft_at`).

  Returns:
    (x, taps, stages): x = ReLU(last block) [B, H', W', w * 2**(S-1)];
    taps = the global-average-pooled pre-ReLU stem output and the pre-ReLU
    output of each stage's last block, [B, w], [B, w], [B, 2w], ...
    (FedRCL's levels); stages = the ReLU'd stem and stage outputs, the
    maps a graft replaces ([B, H, W, w], [B, H, W, w], [B, H/2, W/2, 2w],
    ...; the last is x).
  """
  check_graft_level(graft, len(stage_blocks) + 1)
  x = nn.Conv(width, (3, 3), padding='SAME', use_bias=False, name='conv1')(
    images
  )
  x = make_norm(norm, groups)(x, train, mask)
  taps = [jnp.mean(x, axis=(1, 2))]
  x = graft_at(0, nn.relu(x), graft)
  stages = [x]
  for stage, (num_blocks, stride) in enumerate(
    zip(stage_blocks, stage_strides, strict=True)
  ):
    for block in range(num_blocks):
      x = BasicBlock(
        width * 2**stage,
        strides=stride if block == 0 else 1,
        norm=norm,
        groups=groups,
        name=f'layer{stage + 1}_{block}',
      )(x, train, mask)
      if block == num_blocks - 1:
        taps.append(jnp.mean(x, axis=(1, 2)))
      x = nn.relu(x)
    x = graft_at(stage + 1, x, graft)
    stages.append(x)
  return x, taps, stages


class ResNet18(nn.Module):
  """CIFAR ResNet-18 (no stem max-pool) returning FedRCL's 5 pre-ReLU taps.

  Attributes:
    num_classes: K, outputs of the classifier.
    norm: 'group' (FedRCL default, GroupNorm(groups)), 'batch' or 'none'.
    groups: GroupNorm groups (2 in FedRCL).
    width: w, channels of the stem and first stage (64 for the standard model;
      tests use a tiny one).
    projection_dim: > 0 adds MOON's projection head (models/projection.py)
      on the pooled features: 'embedding' is then its output z and the
      classifier 'fc' sits on z (MOON's ResNet layout; FedRCL uses 0).
  """

  num_classes: int
  norm: str = 'group'
  groups: int = 2
  width: int = 64
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
    """Forward pass.

    Args:
      images: [B, H, W, C] float.
      train: BatchNorm uses (and updates) batch statistics when True.
      mask: optional [B] bool; False rows are padding, kept out of BatchNorm's
        batch statistics.
      graft: None or ``(level, activation)``, level 0-4: the hybrid pass of
        FedMLB, from ``stages[level]`` of another model (`layers.graft_at`).

    Returns:
      {'logits': [B, K], 'embedding': pooled ReLU(layer4) [B, 8w] (>= 0), or
       its projection z [B, projection_dim] with a projection head,
       'features': 5 pooled pre-ReLU taps [B, w], [B, w], [B, 2w], [B, 4w],
       [B, 8w], 'stages': the 5 ReLU'd maps of the stem and stages, FedMLB's
       branch points}.
    """
    x, features, stages = cifar_resnet_trunk(
      images,
      train,
      mask,
      width=self.width,
      norm=self.norm,
      groups=self.groups,
      graft=graft,
    )
    embedding, logits = head_and_classifier(
      jnp.mean(x, axis=(1, 2)),
      projection_dim=self.projection_dim,
      num_classes=self.num_classes,
      classifier_name='fc',
    )
    return {
      'logits': logits,
      'embedding': embedding,
      'features': features,
      'stages': stages,
    }
