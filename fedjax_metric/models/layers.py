"""Layers shared by the models, in the forms XLA runs fast on every backend."""

import flax.linen as nn
import jax
import jax.numpy as jnp

from fedjax_metric.models import implicit_conv


def pool_2x2(x, kind: str):
  """2x2, stride-2 max or average pooling as a reshape + reduce.

  Same values and gradients as ``nn.max_pool(x, (2, 2), strides=(2, 2))``
  (odd sizes floor, as with VALID padding), but its backward pass is
  elementwise instead of XLA's select-and-scatter, which was measured
  several times slower on CPU (benchmarks/cpu_notes.md).

  Max pooling picks each window's first maximum in the forward pass and its
  gradient goes there, as in PyTorch. (The gradient of ``windows.max()``
  finds the maximum by comparing the input with it for equality, which
  depends on XLA computing both to the same bits. On CPU with
  ``jax_disable_most_optimizations`` it did not: the round updates of the
  FedQuad CNN's first two blocks, the ones before a max-pool, differed by
  40-75% between nn.Conv and the patches form, and by 1e-5 with this form.)

  Args:
    x: [B, H, W, C].
    kind: 'max' or 'avg'.

  Returns:
    [B, H // 2, W // 2, C].
  """
  b, h, w, c = x.shape
  x = x[:, : h // 2 * 2, : w // 2 * 2]
  windows = x.reshape(b, h // 2, 2, w // 2, 2, c)
  if kind == 'max':
    # [B, H/2, W/2, 4, C]: the window's four taps, row-major.
    taps = jnp.moveaxis(windows, 3, 2).reshape(b, h // 2, w // 2, 4, c)
    first_max = jnp.argmax(taps, axis=3, keepdims=True)
    chosen = jax.lax.broadcasted_iota(jnp.int32, taps.shape, 3) == first_max
    return jnp.sum(jnp.where(chosen, taps, 0), axis=3)
  if kind == 'avg':
    return windows.mean(axis=(2, 4))
  raise ValueError(f"pool kind must be 'max' or 'avg', got {kind!r}")


def graft_at(level: int, x, graft):
  """``x`` at branch point ``level``, or the activation ``graft`` brings there.

  ``graft`` is None or ``(level, activation)``: a hybrid forward pass
  (FedMLB's, Kim, Kim and Han, ICML 2022) takes its input up to branch point
  ``level`` from another model, runs the rest of this one, and this puts it
  in. The layers before the branch point still trace but feed nothing that
  is used, so XLA removes them from the compiled program.

  Raises:
    ValueError: the grafted activation's shape is not the branch point's.
  """
  if graft is None or graft[0] != level:
    return x
  if graft[1].shape != x.shape:
    raise ValueError(
      f'grafted activation at branch point {level} has shape '
      f'{graft[1].shape}, the model has {x.shape} there.'
    )
  return graft[1].astype(x.dtype)


def check_graft_level(graft, num_levels: int):
  """Refuses a graft at a branch point the model does not have."""
  if graft is not None and not 0 <= graft[0] < num_levels:
    raise ValueError(
      f'graft level must be in [0, {num_levels}), got {graft[0]}: this model '
      f'has {num_levels} branch points.'
    )


def make_norm(kind: str, groups: int = 2):
  """Returns ``norm(x, train, mask)`` for 'none' | 'batch' | 'group'.

  BatchNorm computes its batch statistics over the examples where ``mask``
  [B] is True, so padded examples change nothing; its running averages live
  in ``batch_stats`` and are averaged across clients like parameters.
  """
  if kind == 'none':
    return lambda x, train, mask: x
  if kind == 'batch':

    def batch_norm(x, train, mask):
      bn_mask = None
      if mask is not None:
        bn_mask = jnp.broadcast_to(
          mask.reshape((-1,) + (1,) * (x.ndim - 1)), x.shape
        )
      return nn.BatchNorm(use_running_average=not train, momentum=0.9)(
        x, mask=bn_mask
      )

    return batch_norm
  if kind == 'group':
    return lambda x, train, mask: nn.GroupNorm(num_groups=groups)(x)
  raise ValueError(f"Unknown norm {kind!r}; use 'none', 'batch' or 'group'.")


def extract_patches(x, kernel_size, strides, padding):
  """im2col by strided slicing: x [B, H, W, C] -> [B, H', W', kh * kw * C],
  features ordered (kh, kw, C) like a reshaped [kh, kw, C, O] kernel.

  One strided slice of the padded input per kernel offset, concatenated.
  (`lax.conv_general_dilated_patches` computes the same tensor as a grouped
  convolution with one-hot kernels, one group per channel: the grouped form
  this module exists to avoid, and on the 2-core CPU 40% of a vmapped
  FedQuad CNN round. Slices and their gradient, a padded add, are memory
  moves.) ``padding``: 'SAME' or 'VALID', as ``nn.Conv``'s.
  """
  kh, kw = kernel_size
  sh, sw = strides
  (top, bottom), (left, right) = jax.lax.padtype_to_pads(
    x.shape[1:3], (kh, kw), (sh, sw), padding
  )
  x = jnp.pad(x, ((0, 0), (top, bottom), (left, right), (0, 0)))
  out_h = (x.shape[1] - kh) // sh + 1
  out_w = (x.shape[2] - kw) // sw + 1
  return jnp.concatenate(
    [
      x[:, i : i + sh * (out_h - 1) + 1 : sh, j : j + sw * (out_w - 1) + 1 : sw]
      for i in range(kh)
      for j in range(kw)
    ],
    axis=-1,
  )


class PatchConv(nn.Module):
  """A 2-D convolution as image patches times a matrix (im2col + GEMM).

  Same parameters (``kernel`` [kh, kw, C, O], ``bias`` [O]), initialisers and
  outputs as ``nn.Conv`` with the same arguments, so the two are
  interchangeable in a checkpoint. Why it exists: under ``vmap`` over
  per-client weights, ``nn.Conv`` becomes one grouped convolution with a
  group per client, which accelerator backends run far below their matmul
  rate; here the weights only enter a ``dot_general``, which vmap turns into
  a batched matrix multiply over the clients axis (tensor-core GEMMs on a
  GPU), while the patch extraction has no per-client weights at all.

  With ``form='implicit'`` a stride-1 'SAME' convolution with an odd kernel
  never writes its patches: `implicit_conv.implicit_conv`, one Pallas kernel
  (Triton on an NVIDIA GPU, Pallas' interpreter elsewhere) that sums the
  kernel taps' shifted GEMMs in registers. Other strides and paddings use
  the patches. Same parameters either way.

  Attributes:
    features: O, output channels.
    kernel_size: (kh, kw).
    strides: int or (sh, sw).
    padding: 'SAME' or 'VALID'.
    use_bias: add a bias.
    form: 'patches' or 'implicit'.
  """

  features: int
  kernel_size: tuple = (3, 3)
  strides: int | tuple = 1
  padding: str = 'SAME'
  use_bias: bool = True
  form: str = 'patches'

  @nn.compact
  def __call__(self, x):
    """x [B, H, W, C] -> [B, H', W', O]."""
    kh, kw = self.kernel_size
    strides = (
      (self.strides, self.strides)
      if isinstance(self.strides, int)
      else tuple(self.strides)
    )
    channels = x.shape[-1]
    kernel = self.param(
      'kernel',
      nn.initializers.lecun_normal(),
      (kh, kw, channels, self.features),
    )
    if self.form not in ('patches', 'implicit'):
      raise ValueError(
        f"form must be 'patches' or 'implicit', not {self.form!r}"
      )
    if (
      self.form == 'implicit'
      and strides == (1, 1)
      and self.padding == 'SAME'
      and kh % 2 == 1
      and kw % 2 == 1
    ):
      y = implicit_conv.implicit_conv(x, kernel)  # computes in x's dtype
    else:
      patches = extract_patches(x, (kh, kw), strides, self.padding)
      matrix = kernel.reshape(kh * kw * channels, self.features)
      y = jnp.einsum('bhwk,ko->bhwo', patches, matrix.astype(patches.dtype))
    if self.use_bias:
      bias = self.param('bias', nn.initializers.zeros, (self.features,))
      y = y + bias.astype(y.dtype)
    return y


class Conv(PatchConv):
  """`PatchConv` under ``nn.Conv``'s class name: flax names submodules after
  their class (``Conv_0``, ``Conv_1``, ...), so a model built with either
  convolution has the same parameter tree and checkpoints load into both."""


def make_conv(impl: str):
  """``nn.Conv`` ('xla') or `PatchConv` ('patches' or 'implicit' form), same
  call signature: ``conv(features, kernel_size, strides=..., padding=...,
  use_bias=...)``."""
  if impl == 'xla':
    return nn.Conv
  if impl in ('patches', 'implicit'):
    return lambda features, kernel_size, **kwargs: Conv(
      features, tuple(kernel_size), form=impl, **kwargs
    )
  raise ValueError(
    f"Unknown conv_impl {impl!r}; use 'xla', 'patches' or 'implicit'."
  )
