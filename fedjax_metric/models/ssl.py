"""Encoder + projector models for federated self-supervised learning.

SSD (Fang et al., 'Soft Separation and Distillation: Toward Global Uniformity
in Federated Unsupervised Learning', ICCV 2025) and FedU2 (Liao et al.,
'Rethinking the Representation in Federated Unsupervised Learning with
Non-IID Data', CVPR 2024) train an encoder f and a projector g on two views:
the losses see the projection z = g(f(x)), downstream evaluation (kNN, linear
probe) sees the representation h = f(x). As in the authors' released code
(github.com/hc-fang/ssd, mains/train_fedalignuniform.py ``create_model``):

  encoder: CIFAR ResNet-18 with BatchNorm, global average pool, fc removed;
    h is the pooled post-ReLU output of the last stage, [B, 512], >= 0.
  projector: Linear(512, 2048) -> BatchNorm1d(2048) -> ReLU ->
    Linear(2048, 512); z is un-normalised (the losses normalise).

Both parts are federated (parameters and BatchNorm statistics), so they live
in one module with sub-trees 'encoder' and 'projector'. The outputs are
``{'embedding': h [B, E], 'projection': z [B, P], 'features': []}``: no
'logits', since these models have no classifier (see `SSLResNet18`).
"""

from typing import Optional

import flax.linen as nn
import jax.numpy as jnp

from fedjax_metric.models.layers import make_norm
from fedjax_metric.models.resnet import cifar_resnet_trunk


class Projector(nn.Module):
  """Linear(D, hidden) -> norm -> ReLU -> Linear(hidden, out).

  The SimCLR-style two-layer projection head of SSD / FedU2 (Chen et al., 'A
  Simple Framework for Contrastive Learning of Visual Representations', ICML
  2020, Eq. 2, with BatchNorm on the hidden layer as in the released SSD and
  FedU2 code). Both linear layers have a bias, as torch.nn.Linear.

  Attributes:
    hidden: width of the hidden layer (2048 in SSD).
    out: output width P (512 in SSD).
    norm: 'batch' (BatchNorm1d, the papers' choice), 'group' or 'none'.
  """

  hidden: int = 2048
  out: int = 512
  norm: str = 'batch'

  @nn.compact
  def __call__(self, h, train: bool, mask: Optional[jnp.ndarray]):
    """h [B, D] -> z [B, out]."""
    x = nn.Dense(self.hidden, name='fc1')(h)
    x = nn.relu(make_norm(self.norm)(x, train, mask))
    return nn.Dense(self.out, name='fc2')(x)


class ResNet18Encoder(nn.Module):
  """CIFAR ResNet-18 trunk: 3x3 stride-1 stem, no max-pool, BasicBlocks
  [2, 2, 2, 2], global average pool (He et al., 'Deep Residual Learning for
  Image Recognition', CVPR 2016, with the CIFAR stem of the SSD code).

  Same layers and parameter names as `resnet.ResNet18` (both are
  `resnet.cifar_resnet_trunk`), without the classifier.

  Attributes:
    norm: 'batch' (SSD / FedU2), 'group' or 'none'.
    groups: GroupNorm groups when norm == 'group'.
    width: channels w of the stem and first stage (64: 512-d output).
  """

  norm: str = 'batch'
  groups: int = 2
  width: int = 64

  @nn.compact
  def __call__(self, images, train: bool, mask: Optional[jnp.ndarray]):
    """images [B, H, W, C] -> pooled ReLU(layer4) [B, 8w] (>= 0)."""
    x, _, _ = cifar_resnet_trunk(
      images,
      train,
      mask,
      width=self.width,
      norm=self.norm,
      groups=self.groups,
    )
    return jnp.mean(x, axis=(1, 2))


class SSLResNet18(nn.Module):
  """SSD / FedU2 model: ResNet-18 encoder + 512-2048-512 projector.

  Attributes:
    num_classes: unused (there is no classifier); present so that
      `models.build(name, num_classes, ...)` constructs it like the others.
    projector_hidden: hidden width of the projector (2048).
    projection_dim: P, projector output width (512).
    norm: normalisation of encoder and projector: 'batch' (default, as the
      papers), 'group' or 'none'.
    width: encoder width w; the representation has 8w = 512 dims for w = 64.
  """

  num_classes: int = 0
  projector_hidden: int = 2048
  projection_dim: int = 512
  norm: str = 'batch'
  width: int = 64

  @nn.compact
  def __call__(
    self, images, *, train: bool, mask: Optional[jnp.ndarray] = None
  ):
    """Forward pass.

    Args:
      images: [B, H, W, C] float (0..1, not normalised, for SSD / FedU2).
      train: BatchNorm uses (and updates) batch statistics when True.
      mask: optional [B] bool; False rows are padding, kept out of
        BatchNorm's batch statistics (encoder and projector).

    Returns:
      {'embedding': h [B, 8w] (>= 0), 'projection': z [B, P],
       'features': []}.
    """
    h = ResNet18Encoder(norm=self.norm, width=self.width, name='encoder')(
      images, train, mask
    )
    z = Projector(
      self.projector_hidden, self.projection_dim, self.norm, name='projector'
    )(h, train, mask)
    return {'embedding': h, 'projection': z, 'features': []}


class SmallCNNEncoder(nn.Module):
  """conv3x3(w, stride 2) -> norm -> ReLU -> conv3x3(2w, stride 2) -> norm
  -> ReLU -> flatten -> Dense(E) -> ReLU.

  The trunk of `small_cnn.SmallCNN` (stride-2 downsampling, the fast form on
  CPU) with a normalisation after each conv; the convs have no bias when a
  norm follows, since its shift makes a bias redundant.

  Attributes:
    width: channels of the first conv (the second has 2w).
    embedding_dim: E, the representation width.
    norm: 'batch', 'group' or 'none'.
  """

  width: int = 32
  embedding_dim: int = 128
  norm: str = 'batch'

  @nn.compact
  def __call__(self, images, train: bool, mask: Optional[jnp.ndarray]):
    """images [B, H, W, C] -> h [B, E] (>= 0)."""
    norm = make_norm(self.norm)
    x = images
    for channels in (self.width, 2 * self.width):
      x = nn.Conv(channels, (3, 3), strides=2, use_bias=self.norm == 'none')(x)
      x = nn.relu(norm(x, train, mask))
    x = x.reshape(x.shape[0], -1)
    return nn.relu(nn.Dense(self.embedding_dim)(x))


class SSLSmallCNN(nn.Module):
  """Small-CNN encoder + projector, for 28x28x1 images on a CPU.

  The SSD projector shape (E -> 4E -> E) scaled to a 128-d representation:
  128 -> 512 -> 128 by default.

  Attributes:
    num_classes: unused (no classifier); see `SSLResNet18`.
    width: first conv's channels.
    embedding_dim: E, encoder output width.
    projector_hidden: hidden width of the projector.
    projection_dim: P, projector output width.
    norm: 'batch' (default), 'group' or 'none', in encoder and projector.
  """

  num_classes: int = 0
  width: int = 32
  embedding_dim: int = 128
  projector_hidden: int = 512
  projection_dim: int = 128
  norm: str = 'batch'

  @nn.compact
  def __call__(
    self, images, *, train: bool, mask: Optional[jnp.ndarray] = None
  ):
    """images [B, H, W, C] float -> {'embedding' [B, E] (>= 0),
    'projection' [B, P], 'features': []}; mask as in `SSLResNet18`."""
    h = SmallCNNEncoder(
      self.width, self.embedding_dim, self.norm, name='encoder'
    )(images, train, mask)
    z = Projector(
      self.projector_hidden, self.projection_dim, self.norm, name='projector'
    )(h, train, mask)
    return {'embedding': h, 'projection': z, 'features': []}
