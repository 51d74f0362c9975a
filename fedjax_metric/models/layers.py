"""Layers shared by the models, in the forms XLA runs fast on every backend."""

import flax.linen as nn
import jax.numpy as jnp


def pool_2x2(x, kind: str):
  """2x2, stride-2 max or average pooling as a reshape + reduce.

  Same values and gradients as ``nn.max_pool(x, (2, 2), strides=(2, 2))``
  (odd sizes floor, as with VALID padding), but its backward pass is a
  broadcast-compare instead of XLA's select-and-scatter, which was measured
  several times slower on CPU (benchmarks/cpu_notes.md).

  Args:
    x: [B, H, W, C].
    kind: 'max' or 'avg'.

  Returns:
    [B, H // 2, W // 2, C].
  """
  b, h, w, c = x.shape
  x = x[:, :h // 2 * 2, :w // 2 * 2]
  windows = x.reshape(b, h // 2, 2, w // 2, 2, c)
  if kind == 'max':
    return windows.max(axis=(2, 4))
  if kind == 'avg':
    return windows.mean(axis=(2, 4))
  raise ValueError(f"pool kind must be 'max' or 'avg', got {kind!r}")


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
            mask.reshape((-1,) + (1,) * (x.ndim - 1)), x.shape)
      return nn.BatchNorm(use_running_average=not train, momentum=0.9)(
          x, mask=bn_mask)
    return batch_norm
  if kind == 'group':
    return lambda x, train, mask: nn.GroupNorm(num_groups=groups)(x)
  raise ValueError(f"Unknown norm {kind!r}; use 'none', 'batch' or 'group'.")
