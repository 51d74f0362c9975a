"""The Deep SVDD LeNet for MNIST, the FedMetric embedding network for MNIST.

Park, Hosseini and Yun, 'Federated Learning with Metric Loss', FL-ICML
workshop 2021, Sec. 4.1: "embedding networks based on LeNet used in (Ruff et
al., 2018) for MNIST", 32-d embedding, GroupNorm instead of BatchNorm. The
layers follow the authors' released Deep SVDD code (github.com/lukasruff/
Deep-SVDD-PyTorch, src/networks/mnist_LeNet.py, class MNIST_LeNet):

  conv5x5(8, pad 2, no bias) -> norm -> leaky ReLU -> max-pool 2x2
  conv5x5(4, pad 2, no bias) -> norm -> leaky ReLU -> max-pool 2x2
  flatten (4 x 7 x 7 = 196 for 28x28 input) -> dense(32, no bias)

Ruff et al. ('Deep One-Class Classification', ICML 2018, the properties of
Deep SVDD) remove every bias term, because a bias lets the network map
everything onto the center (hypersphere collapse); that code also uses
non-affine BatchNorm (eps 1e-4, affine=False). ``use_bias=False`` (default)
keeps the convolutions and the dense layer bias-free, ``norm_affine=False``
(default) the norms without scale and offset. FedMetric does not say
whether its GroupNorm is affine; GroupNorm keeps no running statistics, so
the model has no ``batch_stats``.
"""

from typing import Optional

import flax.linen as nn
import jax.numpy as jnp

from fedjax_metric.models.layers import make_conv, pool_2x2

_NORM_EPS = 1e-4  # BatchNorm2d(eps=1e-04) in the Deep SVDD LeNet.


class LeNet(nn.Module):
  """Deep SVDD MNIST LeNet: two conv5x5 stages, one dense embedding layer.

  Attributes:
    num_classes: accepted for registry compatibility and unused: this is an
      embedding network and has no classifier ('logits' is not returned).
    embedding_dim: D, width of the final dense layer (32).
    widths: channels of the two convolutions ((8, 4) in Deep SVDD).
    norm: 'group' (FedMetric), 'batch' (Deep SVDD) or 'none'.
    groups: GroupNorm groups (must divide both widths).
    norm_affine: learn a scale and offset in the norms (False in Deep SVDD).
    use_bias: biases in the convolutions and the dense layer (False in
      Deep SVDD).
    l2_normalize: return the embedding divided by its norm (on the unit
      sphere). Not Deep SVDD's or FedMetric's form; an option for the
      distance losses, whose unnormalised embeddings can grow without bound
      (docs/methods.md, FedMetric).
    conv_impl: 'xla' (nn.Conv) or 'patches' (`layers.PatchConv`: im2col by
      slicing, then a matmul; same parameters). On the 2-core CPU a
      16-example forward pass takes 0.94 ms with patches and 1.30 ms with
      nn.Conv (the one-channel 5x5 first convolution: 0.34 vs 0.83 ms).
  """

  num_classes: int = 0
  embedding_dim: int = 32
  widths: tuple = (8, 4)
  norm: str = 'group'
  groups: int = 2
  norm_affine: bool = False
  use_bias: bool = False
  conv_impl: str = 'xla'
  l2_normalize: bool = False

  def _norm(self, x, train, mask):
    if self.norm == 'none':
      return x
    if self.norm == 'group':
      return nn.GroupNorm(
        num_groups=self.groups,
        epsilon=_NORM_EPS,
        use_bias=self.norm_affine,
        use_scale=self.norm_affine,
      )(x)
    bn_mask = None
    if mask is not None:
      bn_mask = jnp.broadcast_to(mask[:, None, None, None], x.shape)
    return nn.BatchNorm(
      use_running_average=not train,
      momentum=0.9,
      epsilon=_NORM_EPS,
      use_bias=self.norm_affine,
      use_scale=self.norm_affine,
    )(x, mask=bn_mask)

  @nn.compact
  def __call__(
    self, images, *, train: bool, mask: Optional[jnp.ndarray] = None
  ):
    """Forward pass.

    Args:
      images: [B, H, W, C] float (28x28x1 for MNIST).
      train: BatchNorm uses (and updates) batch statistics when True.
      mask: optional [B] bool; False rows are padding, kept out of
        BatchNorm's batch statistics.

    Returns:
      {'embedding': [B, embedding_dim], 'features': the two conv stages'
       normalised pre-activation maps, average-pooled: [B, widths[0]],
       [B, widths[1]]}.
    """
    if self.norm not in ('group', 'batch', 'none'):
      raise ValueError(
        f"norm must be 'group', 'batch' or 'none', got {self.norm!r}"
      )
    x = images
    features = []
    for channels in self.widths:
      # padding 2 of a 5x5 kernel at stride 1 is 'SAME'.
      x = make_conv(self.conv_impl)(
        channels, (5, 5), padding='SAME', use_bias=self.use_bias
      )(x)
      x = self._norm(x, train, mask)
      features.append(jnp.mean(x, axis=(1, 2)))
      x = pool_2x2(nn.leaky_relu(x), 'max')
    x = x.reshape(x.shape[0], -1)
    embedding = nn.Dense(self.embedding_dim, use_bias=self.use_bias)(x)
    if self.l2_normalize:
      # The epsilon keeps the gradient finite at a zero embedding.
      norm = jnp.sqrt(jnp.sum(jnp.square(embedding), -1, keepdims=True))
      embedding = embedding / jnp.maximum(norm, 1e-12)
    return {'embedding': embedding, 'features': features}
