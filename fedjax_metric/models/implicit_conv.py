"""A stride-1 'SAME' convolution as one implicit-GEMM Pallas kernel.

Why: `layers.PatchConv` turns a per-client convolution into patches times a
matrix, and under ``vmap`` the matmul becomes a batched GEMM over clients. But
it writes the patches (kh * kw copies of the input) to memory and reads them
back, forward and backward; on an H100 those copies were 18% of a vmapped
FedQuad-CNN round (benchmarks/profile_gpu.md). Here the patches never exist:
each output tile is the sum over the kh * kw kernel offsets of a shifted tile
of the input times that offset's [C, O] weight slice, accumulated in
registers (an implicit GEMM, as cuDNN computes convolutions for one model).

The shift trick: pad the images by the 'SAME' amounts and flatten (image,
row, column) into one row axis of the padded grid, Hp = H + kh - 1 and
Wp = W + kw - 1. The output at padded-grid row r = (b * Hp + y) * Wp + x is

    out[r] = sum_{i < kh, j < kw} x_flat[r + i * Wp + j] @ W[i, j]       (1)

for every y < H, x < W; rows with y >= H or x >= W read across an image's
edge and are cropped. (1) is a sum of kh * kw row-shifted GEMMs, one Pallas
program per (row tile, output-channel tile). The gradients are the same
shape of kernel: d x_flat[q] = sum_k g[q - off_k] @ W_k^T is (1) on the
front-padded output gradient with the kernel flipped and transposed, and
dW_k = sum_r x_flat[r + off_k]^T g[r] is a reduction over row tiles.

Under ``vmap`` over clients (per-client weights), ``pallas_call`` adds the
clients as another grid axis: one kernel launch for the whole cohort.

On GPU the kernels are Triton programs; elsewhere they run in Pallas'
interpreter (correct, slow: for tests). Channel counts are padded to a power
of two >= 16 (Triton's smallest dot) and cropped afterwards.
"""

import functools
import math

import jax
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as pallas_triton
import jax.numpy as jnp

ROW_TILE = 128  # rows of the padded grid per program (a power of two)
CHANNEL_TILE = 64  # output channels per program (power of two, or fewer)
REDUCE_GROUPS = 8  # weight-gradient programs per (tap, channel tile)


def _channels(n: int) -> int:
  """n rounded up to a power of two, at least 16 (Triton's smallest dot)."""
  return max(16, 1 << (n - 1).bit_length())


def _offsets(kernel_size, padded_width):
  """Row offsets of the kernel taps in the flattened padded grid, (i, j)
  row-major: i * Wp + j."""
  kh, kw = kernel_size
  return tuple(i * padded_width + j for i in range(kh) for j in range(kw))


def _on_platform(call, *args):
  """``call(*args, interpret=False)`` (a Triton kernel) when lowered for an
  NVIDIA GPU, Pallas' interpreter on any other platform (tests on CPU). The
  choice is made per lowering platform, so a program lowered for CUDA on a
  CPU-only machine holds the Triton kernels."""
  return jax.lax.platform_dependent(
    *args,
    cuda=functools.partial(call, interpret=False),
    default=functools.partial(call, interpret=True),
  )


def _dot_precision():
  """The run's matmul precision (executors.matmul_precision's context):
  'highest' asks for full float32, anything else lets the GPU use TF32."""
  setting = jax.config.jax_default_matmul_precision
  if setting in ('highest', 'float32'):
    return jax.lax.Precision.HIGHEST
  return jax.lax.Precision.DEFAULT


def _shifted_gemm_kernel(x_ref, w_ref, out_ref, *, offsets, precision):
  """One (row tile, channel tile) of (1).

  x_ref: the whole flattened input [rows, C]; w_ref: [K, C, tile_o];
  out_ref: [ROW_TILE, tile_o].
  """
  start = pl.program_id(0) * ROW_TILE
  acc = jnp.zeros(out_ref.shape, jnp.float32)
  for k, offset in enumerate(offsets):  # unrolled: K = kh * kw taps
    rows = x_ref[pl.ds(start + offset, ROW_TILE), :]
    acc += jax.lax.dot(
      rows, w_ref[k], precision=precision, preferred_element_type=jnp.float32
    )
  out_ref[...] = acc.astype(out_ref.dtype)


def _shifted_gemm(x_flat, weights, *, offsets, num_rows):
  """(1) for the first ``num_rows`` rows: x_flat [R, C] with R >= num_rows
  rounded up to ROW_TILE plus the largest offset; weights [K, C, O], C and
  O powers of two >= 16. Returns [num_rows rounded up to ROW_TILE, O]."""
  tiles = pl.cdiv(num_rows, ROW_TILE)
  c, o = weights.shape[1:]
  tile_o = min(o, CHANNEL_TILE)
  assert x_flat.shape[0] >= tiles * ROW_TILE + max(offsets), x_flat.shape
  kernel = functools.partial(
    _shifted_gemm_kernel, offsets=offsets, precision=_dot_precision()
  )
  call = lambda *args, interpret: pl.pallas_call(
    kernel,
    out_shape=jax.ShapeDtypeStruct((tiles * ROW_TILE, o), x_flat.dtype),
    grid=(tiles, o // tile_o),
    in_specs=[
      pl.BlockSpec(x_flat.shape, lambda i, j: (0, 0)),
      pl.BlockSpec((len(offsets), c, tile_o), lambda i, j: (0, 0, j)),
    ],
    out_specs=pl.BlockSpec((ROW_TILE, tile_o), lambda i, j: (i, j)),
    interpret=interpret,
    compiler_params=pallas_triton.CompilerParams(num_warps=4),
    name='implicit_conv',
  )(*args)
  return _on_platform(call, x_flat, weights)


def _weight_grad_kernel(
  x_ref, g_ref, out_ref, *, padded_width, kernel_width, tiles, precision
):
  """dW_k for one (tap k, channel tile, group of ``tiles`` row tiles).

  x_ref [rows, C] and g_ref [rows_g, O] whole; out_ref [C, tile_o].
  """
  k = pl.program_id(0)
  offset = (k // kernel_width) * padded_width + k % kernel_width
  tile_o = out_ref.shape[-1]
  channels = pl.ds(pl.program_id(1) * tile_o, tile_o)
  first = pl.program_id(2) * tiles * ROW_TILE

  def add_tile(t, acc):
    start = first + t * ROW_TILE
    rows = x_ref[pl.ds(start + offset, ROW_TILE), :]
    grads = g_ref[pl.ds(start, ROW_TILE), channels]
    return acc + jax.lax.dot_general(
      rows,
      grads,
      (((0,), (0,)), ((), ())),
      precision=precision,
      preferred_element_type=jnp.float32,
    )

  acc = jax.lax.fori_loop(
    0, tiles, add_tile, jnp.zeros(out_ref.shape, jnp.float32)
  )
  out_ref[...] = acc


def _weight_grad(x_flat, g_flat, *, kernel_size, padded_width, groups):
  """dW [K, C, O] (float32) = sum_r x_flat[r + off_k]^T g_flat[r]; g_flat
  [R_g, O] is zero outside valid output rows, R_g a multiple of
  groups * ROW_TILE, and x_flat has R_g + max offset rows. Each of the
  ``groups`` programs per (tap, channel tile) sums R_g / groups rows; their
  partial sums are added outside the kernel."""
  kh, kw = kernel_size
  c, o = x_flat.shape[1], g_flat.shape[1]
  tile_o = min(o, CHANNEL_TILE)
  kernel = functools.partial(
    _weight_grad_kernel,
    padded_width=padded_width,
    kernel_width=kw,
    tiles=g_flat.shape[0] // (groups * ROW_TILE),
    precision=_dot_precision(),
  )
  call = lambda *args, interpret: pl.pallas_call(
    kernel,
    out_shape=jax.ShapeDtypeStruct((groups, kh * kw, c, o), jnp.float32),
    grid=(kh * kw, o // tile_o, groups),
    in_specs=[
      pl.BlockSpec(x_flat.shape, lambda k, j, s: (0, 0)),
      pl.BlockSpec(g_flat.shape, lambda k, j, s: (0, 0)),
    ],
    out_specs=pl.BlockSpec(
      (None, None, c, tile_o), lambda k, j, s: (s, k, 0, j)
    ),
    interpret=interpret,
    compiler_params=pallas_triton.CompilerParams(num_warps=4),
    name='implicit_conv_weight_grad',
  )(*args)
  return _on_platform(call, x_flat, g_flat).sum(axis=0)


class _Geometry:
  """Shapes of the flattened padded grid for x [B, H, W, C] and a
  (kh, kw) kernel with O output channels."""

  def __init__(self, x_shape, kernel_size, features):
    b, h, w, c = x_shape
    kh, kw = kernel_size
    self.b, self.h, self.w = b, h, w
    self.pad_h, self.pad_w = kh - 1, kw - 1
    self.hp, self.wp = h + kh - 1, w + kw - 1
    self.offsets = _offsets(kernel_size, self.wp)
    self.rows = b * self.hp * self.wp
    # Whole row tiles, as many in each of the weight gradient's groups
    # (both passes share one padded length; the extra rows are zeros).
    tiles = math.ceil(self.rows / ROW_TILE)
    self.groups = min(REDUCE_GROUPS, tiles)
    self.out_rows = math.ceil(tiles / self.groups) * self.groups * ROW_TILE
    self.in_rows = self.out_rows + max(self.offsets)
    self.c_pad, self.o_pad = _channels(c), _channels(features)

  def flatten(self, images, channels, top_left=None):
    """images [B, h', w', ch] placed at ``top_left`` of a zero [B, Hp, Wp,
    channels] grid, flattened and zero-padded to ``in_rows`` rows.
    ``top_left`` defaults to the 'SAME' padding's (kh // 2 ... as
    lax.padtype_to_pads gives for stride 1)."""
    top, left = top_left if top_left else (self.pad_h // 2, self.pad_w // 2)
    _, hh, ww, ch = images.shape
    grid = jnp.pad(
      images,
      (
        (0, 0),
        (top, self.hp - hh - top),
        (left, self.wp - ww - left),
        (0, channels - ch),
      ),
    )
    flat = grid.reshape(self.rows, channels)
    return jnp.pad(flat, ((0, self.in_rows - self.rows), (0, 0)))

  def crop(self, flat, top_left, channels):
    """Rows of the padded grid back to [B, H, W, channels]."""
    top, left = top_left
    grid = flat[: self.rows].reshape(self.b, self.hp, self.wp, -1)
    return grid[:, top : top + self.h, left : left + self.w, :channels]


@jax.custom_vjp
def implicit_conv(x, kernel):
  """'SAME', stride-1 convolution, no bias, as ``lax.conv_general_dilated``
  in NHWC / HWIO (cross-correlation, as nn.Conv).

  Args:
    x: [B, H, W, C].
    kernel: [kh, kw, C, O], kh and kw odd.

  Returns:
    [B, H, W, O] in x's dtype (float32 accumulation).
  """
  return _forward(x, kernel)[0]


def _forward(x, kernel):
  kh, kw, c, o = kernel.shape
  if kh % 2 == 0 or kw % 2 == 0:
    raise ValueError(f'implicit_conv needs odd kernel sizes, got {(kh, kw)}.')
  geo = _Geometry(x.shape, (kh, kw), o)
  x_flat = geo.flatten(x, geo.c_pad)
  weights = jnp.pad(
    kernel.astype(x.dtype),
    ((0, 0), (0, 0), (0, geo.c_pad - c), (0, geo.o_pad - o)),
  ).reshape(kh * kw, geo.c_pad, geo.o_pad)
  out = _shifted_gemm(
    x_flat, weights, offsets=geo.offsets, num_rows=geo.out_rows
  )
  return geo.crop(out, (0, 0), o), (x_flat, kernel)


def _implicit_conv_fwd(x, kernel):
  out, (x_flat, _) = _forward(x, kernel)
  return out, (x_flat, kernel, x.shape)


def _implicit_conv_bwd(residuals, grad):
  x_flat, kernel, x_shape = residuals
  kh, kw, c, o = kernel.shape
  geo = _Geometry(x_shape, (kh, kw), o)
  # The output gradient on the padded grid where (1) wrote it: output
  # (y, x) at grid position (y, x), zeros elsewhere.
  g_flat = geo.flatten(grad.astype(x_flat.dtype), geo.o_pad, top_left=(0, 0))
  # d x_flat[q] = sum_k g[q - off_k] W_k^T = sum_k gF[q + off_{K-1-k}]
  # W_{K-1-k}^T with gF = g shifted down by the largest offset: (1) again,
  # kernel flipped in space, transposed in channels.
  flipped = jnp.pad(
    kernel[::-1, ::-1].astype(x_flat.dtype),
    ((0, 0), (0, 0), (0, geo.c_pad - c), (0, geo.o_pad - o)),
  )
  flipped = jnp.swapaxes(flipped, 2, 3).reshape(kh * kw, geo.o_pad, geo.c_pad)
  shift = max(geo.offsets)
  g_shifted = jnp.pad(g_flat, ((shift, 0), (0, 0)))
  dx_flat = _shifted_gemm(
    g_shifted, flipped, offsets=geo.offsets, num_rows=geo.out_rows
  )
  dx = geo.crop(dx_flat, (geo.pad_h // 2, geo.pad_w // 2), c)
  dw = _weight_grad(
    x_flat,
    g_flat[: geo.out_rows],
    kernel_size=(kh, kw),
    padded_width=geo.wp,
    groups=geo.groups,
  )
  dw = dw.reshape(kh, kw, geo.c_pad, geo.o_pad)[:, :, :c, :o]
  return dx.astype(x_flat.dtype), dw.astype(kernel.dtype)


implicit_conv.defvjp(_implicit_conv_fwd, _implicit_conv_bwd)
