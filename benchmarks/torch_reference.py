"""PyTorch FedAvg rounds: the speed references for our benchmark.

Two ways a PyTorch user would write a federated round, both timed by
benchmarks/bench.py against the JAX executors, on the device JAX uses:

* ``loop`` (`fedavg_round`): what the reference implementations (MOON, FedRCL,
  FedAU) do each round: for every sampled client, copy the global weights into
  a client model (``load_state_dict``), build a fresh SGD optimizer, run
  ``local_steps`` forward/backward/step iterations on batches of
  ``batch_size``, then FedAvg-average the client weights into the global
  model. Clients run one after the other in eager PyTorch.
* ``vmap`` (`fedavg_round_vmap`): all clients of the round side by side with
  ``torch.func``: the global state stacked K times
  (``stack_module_state``), ``vmap(grad(functional_call(...)))`` for every
  client's gradient at once, the SGD update applied to the stacked
  parameters, then the FedAvg mean over the client axis. ``vmap_compiled``
  wraps that step in ``torch.compile``.

Both use the same model, example pool, steps, batch size and learning rate,
and, given the same batch indices (`draw_batch_indices`), produce the same
global model up to float rounding (tests/test_torch_reference.py).

The data are random tensors made once before timing starts, and every
round's batch indices are drawn before timing too; each step's batch is a
gather with those indices, so what is timed is compute, not sampling or data
loading. The peer is set up as a PyTorch engineer would time it: the JAX
run's precision (TF32, float32 or bf16 autocast, `set_precision`),
``cudnn.benchmark`` on CUDA, optionally channels-last, and ``torch.compile``
in the mode asked for.

The small CNN is architecturally identical to the JAX
``fedjax_metric.models.small_cnn.SmallCNN`` with ``norm='none'``: same layers,
same shapes, same parameter count. One deliberate difference: flax ``'SAME'``
padding on a stride-2 3x3 conv over an even size pads (0 before, 1 after),
while here the stride-2 conv uses ``padding=1`` (1 before, 1 after). Both give
an output of ``ceil(H / 2)``, so the cost is the same; the outputs differ by a
one-pixel shift, which is irrelevant for a speed reference.

Run::

  .venv/bin/python -m benchmarks.torch_reference --clients_per_round 10 \
      --local_steps 10 --batch_size 32 --variant vmap
"""

import argparse
import contextlib
import json
import statistics
import time
from typing import Callable, Dict, Optional, Sequence

import torch
from torch import nn
import torch.nn.functional as F

POOLS = ('stride', 'avg', 'max')
VARIANTS = ('loop', 'vmap', 'vmap_compiled')
# The JAX side's --precision, which the PyTorch peer matches (`set_precision`).
PRECISIONS = ('default', 'highest', 'bf16')


def _down_size(size: int, pool: str) -> int:
  """Spatial size after one conv + downsampling block (matches the JAX model).

  Args:
    size: input height or width.
    pool: 'stride' (stride-2 conv, ceil), 'avg' or 'max' (2x2 VALID pool,
      floor).

  Returns:
    The output height or width.
  """
  if pool == 'stride':
    return (size + 1) // 2
  return size // 2


class TorchSmallCNN(nn.Module):
  """conv3x3(w) -> down -> conv3x3(2w) -> down -> dense(D) -> dense(classes).

  Order inside a block: conv -> relu -> pool (pool only for 'avg' / 'max').

  Attributes:
    pool: 'stride', 'avg' or 'max'.
  """

  def __init__(
    self,
    *,
    in_channels: int,
    image_size: Sequence[int],
    num_classes: int = 10,
    width: int = 32,
    embedding_dim: int = 128,
    pool: str = 'stride',
  ):
    """Builds the layers.

    Args:
      in_channels: C of the [B, C, H, W] input.
      image_size: (H, W) of the input.
      num_classes: number of output logits.
      width: channels of the first conv (the second has 2 * width).
      embedding_dim: width of the penultimate dense layer.
      pool: 'stride', 'avg' or 'max'.

    Raises:
      ValueError: on an unknown ``pool``.
    """
    super().__init__()
    if pool not in POOLS:
      raise ValueError(f"pool must be 'stride', 'avg' or 'max', got {pool!r}")
    self.pool = pool
    stride = 2 if pool == 'stride' else 1
    self.conv1 = nn.Conv2d(in_channels, width, 3, stride=stride, padding=1)
    self.conv2 = nn.Conv2d(width, 2 * width, 3, stride=stride, padding=1)
    h, w = image_size
    for _ in range(2):
      h, w = _down_size(h, pool), _down_size(w, pool)
    self.fc1 = nn.Linear(2 * width * h * w, embedding_dim)
    self.fc2 = nn.Linear(embedding_dim, num_classes)

  def _down(self, x: torch.Tensor) -> torch.Tensor:
    """Applies the 2x2 pool for 'avg' / 'max'; identity for 'stride'."""
    if self.pool == 'avg':
      return F.avg_pool2d(x, 2)
    if self.pool == 'max':
      return F.max_pool2d(x, 2)
    return x

  def forward(self, x: torch.Tensor) -> torch.Tensor:
    """Maps images [B, C, H, W] float32 to logits [B, num_classes]."""
    x = self._down(F.relu(self.conv1(x)))
    x = self._down(F.relu(self.conv2(x)))
    x = torch.flatten(x, 1)
    x = F.relu(self.fc1(x))
    return self.fc2(x)


def make_torch_small_cnn(
  *,
  in_channels: int,
  image_size,
  num_classes: int = 10,
  width: int = 32,
  embedding_dim: int = 128,
  pool: str = 'stride',
) -> nn.Module:
  """Returns the PyTorch twin of the JAX ``SmallCNN`` (norm='none').

  Args:
    in_channels: C of the [B, C, H, W] input.
    image_size: H (square images) or an (H, W) pair.
    num_classes: number of output logits.
    width: channels of the first conv (the second has 2 * width).
    embedding_dim: width of the penultimate dense layer.
    pool: 'stride' (stride-2 convs), 'avg' or 'max' (2x2 pooling).

  Returns:
    A ``torch.nn.Module`` mapping [B, C, H, W] to logits [B, num_classes].
  """
  if isinstance(image_size, int):
    image_size = (image_size, image_size)
  return TorchSmallCNN(
    in_channels=in_channels,
    image_size=tuple(image_size),
    num_classes=num_classes,
    width=width,
    embedding_dim=embedding_dim,
    pool=pool,
  )


class TorchFedQuadCNN(nn.Module):
  """Twin of fedjax_metric.models.fedquad_cnn: 3 x [conv3x3 -> BN -> ReLU]
  (max-pool, max-pool, global average pool) -> Linear(128) -> Linear(classes).
  """

  def __init__(
    self,
    *,
    in_channels: int,
    num_classes: int = 10,
    widths: Sequence[int] = (64, 128, 256),
    embedding_dim: int = 128,
    norm_in_float32: bool = False,
  ):
    """Builds the layers.

    Args:
      in_channels: C of the [B, C, H, W] input.
      num_classes: number of output logits.
      widths: channels of the three conv blocks.
      embedding_dim: width of the embedding layer.
      norm_in_float32: BatchNorm normalises the float32 value of a
        convolution's output. Under bf16 autocast inside ``torch.func.vmap``,
        batch_norm refuses a bfloat16 input with float32 statistics; flax's
        BatchNorm reduces in float32 too, so the arithmetic stays the JAX
        run's.
    """
    super().__init__()
    self.norm_in_float32 = norm_in_float32
    channels = [in_channels, *widths]
    self.convs = nn.ModuleList(
      nn.Conv2d(a, b, 3, padding=1)
      for a, b in zip(channels[:-1], channels[1:], strict=True)
    )
    self.norms = nn.ModuleList(nn.BatchNorm2d(b) for b in widths)
    self.fc1 = nn.Linear(widths[-1], embedding_dim)
    self.fc2 = nn.Linear(embedding_dim, num_classes)

  def forward(self, x: torch.Tensor) -> torch.Tensor:
    """Maps images [B, C, H, W] float32 to logits [B, num_classes]."""
    blocks = zip(self.convs, self.norms, strict=True)
    for block, (conv, norm) in enumerate(blocks):
      x = conv(x)
      x = F.relu(norm(x.float() if self.norm_in_float32 else x))
      x = F.max_pool2d(x, 2) if block < 2 else x.mean(dim=(2, 3))
    return self.fc2(self.fc1(x))


def make_torch_model(
  model: str,
  *,
  in_channels: int,
  image_size,
  pool: str = 'stride',
  norm_in_float32: bool = False,
) -> nn.Module:
  """The PyTorch twin of a JAX model, 10 classes.

  Args:
    model: 'small_cnn' (with ``pool``) or 'fedquad_cnn'.
    in_channels: C of the [B, C, H, W] input.
    image_size: H (square images) or an (H, W) pair.
    pool: small_cnn's downsampling: 'stride', 'avg' or 'max'.
    norm_in_float32: fedquad_cnn's BatchNorm in float32 (`TorchFedQuadCNN`).

  Returns:
    A ``torch.nn.Module`` mapping [B, C, H, W] to logits [B, 10].

  Raises:
    ValueError: on an unknown ``model``.
  """
  if model == 'small_cnn':
    return make_torch_small_cnn(
      in_channels=in_channels, image_size=image_size, pool=pool
    )
  if model == 'fedquad_cnn':
    return TorchFedQuadCNN(
      in_channels=in_channels, norm_in_float32=norm_in_float32
    )
  raise ValueError(f"model must be 'small_cnn' or 'fedquad_cnn', got {model!r}")


def pick_device(jax_backend: str) -> torch.device:
  """The device the PyTorch reference runs on: the one JAX runs on.

  Args:
    jax_backend: ``jax.default_backend()`` of the JAX side ('cpu', 'gpu', ...).

  Returns:
    ``cuda`` when JAX runs on a GPU and this torch build sees one, else ``cpu``
    (a CPU-only torch wheel on a GPU machine falls back to the CPU, and the
    benchmark table says so).
  """
  if jax_backend == 'gpu' and torch.cuda.is_available():
    return torch.device('cuda')
  return torch.device('cpu')


def set_precision(precision: str, device: torch.device):
  """Sets PyTorch to the arithmetic the JAX run uses; returns the context
  to run forward passes in.

  * ``'default'``: on NVIDIA GPUs JAX multiplies float32 matrices in TF32,
    so TF32 is allowed for PyTorch's matmuls and cuDNN convolutions too
    (PyTorch's own default allows it for convolutions only);
  * ``'highest'``: plain float32, TF32 off;
  * ``'bf16'``: JAX computes in bfloat16 with float32 variables, so the
    forward pass runs under ``torch.autocast(dtype=torch.bfloat16)``
    (weights and optimizer stay float32). A bf16 JAX row is compared with
    this peer, never with a float32 one.

  On the CPU the TF32 switches do nothing.

  Args:
    precision: one of `PRECISIONS`.
    device: where the rounds run.

  Returns:
    A context manager factory: ``with forward_context(): logits = model(x)``.

  Raises:
    ValueError: an unknown precision.
  """
  if precision not in PRECISIONS:
    raise ValueError(
      f'precision must be one of {PRECISIONS}, got {precision!r}'
    )
  if device.type == 'cuda':
    allow_tf32 = precision == 'default'
    torch.backends.cuda.matmul.allow_tf32 = allow_tf32
    torch.backends.cudnn.allow_tf32 = allow_tf32
  if precision == 'bf16':
    return lambda: torch.autocast(device_type=device.type, dtype=torch.bfloat16)
  return contextlib.nullcontext


def synchronize(device: torch.device) -> None:
  """Waits for queued CUDA kernels, so a wall-clock timer sees their cost."""
  if device.type == 'cuda':
    torch.cuda.synchronize(device)


def draw_batch_indices(
  num_examples: int,
  clients: int,
  steps: int,
  batch_size: int,
  *,
  generator: Optional[torch.Generator] = None,
  device=None,
) -> torch.Tensor:
  """Uniform example indices of one round, laid out [clients, steps, batch].

  Draws them with one ``torch.randint`` per (client, step) in client-major
  order, the order `fedavg_round` draws its own batches in: with the same
  generator state, both rounds see the same batches.

  Args:
    num_examples: size N of the example pool.
    clients: clients in the round.
    steps: local steps per client.
    batch_size: examples per step.
    generator: optional ``torch.Generator`` (on ``device``).
    device: where the indices live (the generator's device).

  Returns:
    int64 [clients, steps, batch_size] in [0, N).
  """
  draws = [
    torch.randint(
      num_examples, (batch_size,), generator=generator, device=device
    )
    for _ in range(clients * steps)
  ]
  return torch.stack(draws).reshape(clients, steps, batch_size)


def fedavg_round(
  global_model: nn.Module,
  client_model: nn.Module,
  images: torch.Tensor,
  labels: torch.Tensor,
  *,
  clients_per_round: int,
  local_steps: int,
  batch_size: int,
  lr: float,
  generator: Optional[torch.Generator] = None,
  batch_indices: Optional[torch.Tensor] = None,
  forward_context: Callable = contextlib.nullcontext,
) -> None:
  """Runs one FL round in place on ``global_model``, one client at a time.

  FedAvg (McMahan et al., 'Communication-Efficient Learning of Deep Networks
  from Decentralized Data', AISTATS 2017, Algorithm 1): every client starts
  from the global weights w, takes ``local_steps`` SGD steps
  w <- w - lr * grad(mean cross-entropy of its batch), and the server sets
  w <- sum_k (n_k / n) w_k. Every client runs the same number of steps on the
  same batch size, so the weights n_k / n are uniform. The average is
  accumulated as ``global + sum_k w_k * (client_k - global)``, which is FedAvg
  exactly in real arithmetic and, unlike a plain weighted sum of the client
  weights, leaves the global weights bit-for-bit unchanged when no client
  moves.

  BatchNorm buffers: each client starts from the global running statistics,
  updates them in train mode as ``nn.BatchNorm2d`` does, and the server
  averages them like the weights; the integer ``num_batches_tracked`` counter
  is not averaged and keeps the global value (with the default momentum it
  is never read).

  Args:
    global_model: the server model; updated in place.
    client_model: scratch model with the same architecture, reused by clients.
    images: [N, C, H, W] float32 pool to sample batches from.
    labels: [N] int64.
    clients_per_round: clients trained this round.
    local_steps: SGD steps per client.
    batch_size: examples per step.
    lr: SGD learning rate.
    generator: optional ``torch.Generator`` for the batch indices.
    batch_indices: optional int64 [clients, steps, batch_size] batches to use
      instead of drawing them (as `draw_batch_indices` draws them).
    forward_context: what the forward pass and loss run in (`set_precision`:
      bf16 autocast); the backward pass runs outside it, as PyTorch advises.
  """
  num_examples = images.shape[0]
  global_state = {
    k: v.detach().clone() for k, v in global_model.state_dict().items()
  }
  delta_sum = {k: torch.zeros_like(v) for k, v in global_state.items()}
  weight = 1.0 / clients_per_round
  client_model.train()
  for client in range(clients_per_round):
    client_model.load_state_dict(global_state)
    optimizer = torch.optim.SGD(client_model.parameters(), lr=lr)
    for step in range(local_steps):
      if batch_indices is None:
        idx = torch.randint(
          num_examples, (batch_size,), generator=generator, device=images.device
        )
      else:
        idx = batch_indices[client, step]
      x, y = images[idx], labels[idx]
      optimizer.zero_grad(set_to_none=True)
      with forward_context():
        loss = F.cross_entropy(client_model(x), y)
      loss.backward()
      optimizer.step()
    with torch.no_grad():
      for k, v in client_model.state_dict().items():
        if v.is_floating_point():  # Not BatchNorm's integer step counter.
          delta_sum[k].add_(v - global_state[k], alpha=weight)
  with torch.no_grad():
    global_model.load_state_dict(
      {k: global_state[k] + delta_sum[k] for k in global_state}
    )


SgdStep = Callable[
  [
    Dict[str, torch.Tensor],
    Dict[str, torch.Tensor],
    torch.Tensor,
    torch.Tensor,
    torch.Tensor,
  ],
  Dict[str, torch.Tensor],
]


def make_vmap_sgd_step(
  model: nn.Module,
  *,
  lr: float,
  compile_step: bool = False,
  compile_mode: Optional[str] = None,
  forward_context: Callable = contextlib.nullcontext,
) -> SgdStep:
  """One SGD step of every client at once, vectorised with ``torch.func``.

  The step maps stacked client parameters theta [K, ...] to
  theta_k - lr * grad_theta L_k(theta_k) for every client k, where L_k is the
  mean cross-entropy of client k's batch: the local update of FedAvg (McMahan
  et al., 'Communication-Efficient Learning of Deep Networks from
  Decentralized Data', AISTATS 2017, Algorithm 1, ClientUpdate), written as
  ``vmap(grad(functional_call(model, ...)))`` over the client axis. The update
  ``p.add(g, alpha=-lr)`` is the one ``torch.optim.SGD`` applies, so the loop
  and this step do the same arithmetic per parameter.

  BatchNorm: the stacked buffers [K, ...] are passed to ``functional_call``
  and ``nn.BatchNorm2d`` updates its running statistics in place, as it does
  in the loop, so client k's buffers move exactly as its model's would.

  Args:
    model: the architecture (its own weights are not used); in train mode.
    lr: SGD learning rate.
    compile_step: wrap the step in ``torch.compile``.
    compile_mode: ``torch.compile``'s mode (None: its default;
      'max-autotune' searches kernels at compile time).
    forward_context: what each client's forward pass and loss run in
      (`set_precision`: bf16 autocast).

  Returns:
    ``step(params, buffers, images, labels, idx) -> new params`` where params
    and buffers are stacked [K, ...] dicts, images [N, C, H, W] and labels [N]
    the example pool and idx int64 [K, B] this step's batches; ``buffers`` are
    updated in place.
  """

  def client_loss(params, buffers, x, y):
    with forward_context():
      logits = torch.func.functional_call(model, (params, buffers), (x,))
      return F.cross_entropy(logits, y)

  client_grads = torch.func.vmap(torch.func.grad(client_loss))

  def step(params, buffers, images, labels, idx):
    grads = client_grads(params, buffers, images[idx], labels[idx])
    return {k: p.add(grads[k], alpha=-lr) for k, p in params.items()}

  return torch.compile(step, mode=compile_mode) if compile_step else step


def fedavg_round_vmap(
  global_model: nn.Module,
  images: torch.Tensor,
  labels: torch.Tensor,
  batch_indices: torch.Tensor,
  *,
  sgd_step: SgdStep,
) -> None:
  """Runs one FedAvg round in place, all clients side by side.

  The same round as `fedavg_round` (McMahan et al., 'Communication-Efficient
  Learning of Deep Networks from Decentralized Data', AISTATS 2017,
  Algorithm 1, with uniform client weights): the global parameters and
  buffers are copied K times (``torch.func.stack_module_state``), every local
  step trains all K clients at once with ``sgd_step``
  (`make_vmap_sgd_step`), and the server sets
  w <- w + (1 / K) sum_k (w_k - w) for the parameters and the floating-point
  BatchNorm buffers; the integer ``num_batches_tracked`` keeps the global
  value, as in `fedavg_round`.

  Args:
    global_model: the server model, in train mode; updated in place.
    images: [N, C, H, W] float32 example pool.
    labels: [N] int64.
    batch_indices: int64 [K, steps, B]: client k's batch at each step.
    sgd_step: from `make_vmap_sgd_step` for ``global_model``'s architecture.
  """
  clients = batch_indices.shape[0]
  params, buffers = torch.func.stack_module_state([global_model] * clients)
  params = {k: v.detach() for k, v in params.items()}
  for step in range(batch_indices.shape[1]):
    params = sgd_step(params, buffers, images, labels, batch_indices[:, step])
  with torch.no_grad():
    averaged = {**params, **buffers}
    for k, v in global_model.state_dict().items():
      if v.is_floating_point():
        v.add_((averaged[k] - v).mean(0))


def make_data(num_examples: int, image_shape, *, device, seed: int = 0):
  """Random float32 images [N, C, H, W] and int64 labels [N] on ``device``.

  Made on the CPU with a seeded generator (the same values whatever the
  device), then moved once, before any timing.

  Args:
    num_examples: N.
    image_shape: (H, W, C).
    device: where the tensors go.
    seed: the generator's seed.

  Returns:
    (images [N, C, H, W] standard normal, labels [N] uniform in [0, 10)).
  """
  height, width, channels = image_shape
  generator = torch.Generator().manual_seed(seed)
  images = torch.randn(
    num_examples,
    channels,
    height,
    width,
    generator=generator,
    dtype=torch.float32,
  )
  labels = torch.randint(
    10, (num_examples,), generator=generator, dtype=torch.int64
  )
  return images.to(device), labels.to(device)


def time_torch_rounds(
  *,
  clients_per_round: int,
  local_steps: int,
  batch_size: int,
  image_shape=(28, 28, 1),
  pool: str = 'stride',
  model: str = 'small_cnn',
  num_rounds: int = 5,
  warmup_rounds: int = 1,
  num_threads: Optional[int] = None,
  lr: float = 0.01,
  variant: str = 'loop',
  device=None,
  precision: str = 'default',
  channels_last: bool = False,
  compile_mode: Optional[str] = None,
) -> Dict:
  """Times a PyTorch FedAvg round on random data, set up as a PyTorch
  engineer would time it.

  The batches of every round are drawn before timing starts (what is timed
  is the training, not the sampling); on CUDA ``cudnn.benchmark`` is on
  (cuDNN picks its fastest convolution for these fixed shapes during the
  warm-up rounds); the arithmetic matches the JAX run's (`set_precision`).

  Args:
    clients_per_round: clients trained per round.
    local_steps: SGD steps per client.
    batch_size: examples per step.
    image_shape: (H, W, C), as in the JAX code; converted to NCHW here.
    pool: 'stride', 'avg' or 'max' (small_cnn).
    model: 'small_cnn' or 'fedquad_cnn'.
    num_rounds: timed rounds.
    warmup_rounds: untimed rounds run first (they include torch.compile's
      compilation for 'vmap_compiled').
    num_threads: if given, passed to ``torch.set_num_threads``; otherwise
      torch's default is kept.
    lr: SGD learning rate.
    variant: 'loop' (`fedavg_round`, one client after the other), 'vmap'
      (`fedavg_round_vmap`, eager) or 'vmap_compiled' (its step in
      ``torch.compile``).
    device: torch device (default CPU); CUDA rounds are timed after
      ``torch.cuda.synchronize``.
    precision: the JAX run's precision, one of `PRECISIONS`.
    channels_last: models and images in ``torch.channels_last`` memory
      format (NHWC, which cuDNN's tensor-core convolutions prefer), in the
      loop only: the vmap forms' stacked parameters are 5-D and keep their
      layout, and on CUDA their backward pass refuses channels-last images
      ('Tensor.clone(memory_format) inside vmap' is not implemented, torch
      2.11), so there it is off and the result says so.
    compile_mode: ``torch.compile``'s mode for 'vmap_compiled' (None: its
      default).

  Returns:
    A dict with 'seconds_per_round' (list of per-round seconds), 'median',
    'min', 'warmup_seconds' (list), 'client_steps_per_second'
    (clients * steps / median), 'torch_version', 'num_threads', 'device',
    'variant', 'peak_device_mb' (CUDA's peak allocated MiB, else None), and
    the settings: 'precision', 'channels_last', 'cudnn_benchmark',
    'compile_mode'.

  Raises:
    ValueError: on an unknown ``variant``.
  """
  if variant not in VARIANTS:
    raise ValueError(f'variant must be one of {VARIANTS}, got {variant!r}')
  device = torch.device(device or 'cpu')
  if num_threads is not None:
    torch.set_num_threads(num_threads)
  forward_context = set_precision(precision, device)
  channels_last = channels_last and variant == 'loop'
  cudnn_benchmark = device.type == 'cuda'
  torch.backends.cudnn.benchmark = cudnn_benchmark
  memory_format = (
    torch.channels_last if channels_last else torch.contiguous_format
  )
  height, width, channels = image_shape
  torch.manual_seed(0)
  num_examples = max(1024, 4 * batch_size)
  images, labels = make_data(num_examples, image_shape, device=device)
  images = images.contiguous(memory_format=memory_format)
  generator = torch.Generator(device=device).manual_seed(0)
  # Every round's batches, drawn before any round is timed.
  schedule = [
    draw_batch_indices(
      num_examples,
      clients_per_round,
      local_steps,
      batch_size,
      generator=generator,
      device=device,
    )
    for _ in range(warmup_rounds + num_rounds)
  ]
  make = lambda: (
    make_torch_model(
      model,
      in_channels=channels,
      image_size=(height, width),
      pool=pool,
      # bf16 autocast under torch.func.vmap needs it (`TorchFedQuadCNN`).
      norm_in_float32=precision == 'bf16' and variant != 'loop',
    )
    .to(device, memory_format=memory_format)
    .train()
  )
  global_model = make()
  if variant == 'loop':
    client_model = make()

    def one_round(batch_indices):
      fedavg_round(
        global_model,
        client_model,
        images,
        labels,
        clients_per_round=clients_per_round,
        local_steps=local_steps,
        batch_size=batch_size,
        lr=lr,
        batch_indices=batch_indices,
        forward_context=forward_context,
      )
  else:
    sgd_step = make_vmap_sgd_step(
      global_model,
      lr=lr,
      compile_step=variant == 'vmap_compiled',
      compile_mode=compile_mode,
      forward_context=forward_context,
    )

    def one_round(batch_indices):
      fedavg_round_vmap(
        global_model, images, labels, batch_indices, sgd_step=sgd_step
      )

  def timed_round(batch_indices):
    synchronize(device)
    start = time.perf_counter()
    one_round(batch_indices)
    synchronize(device)
    return time.perf_counter() - start

  warmup = [timed_round(b) for b in schedule[:warmup_rounds]]
  seconds = [timed_round(b) for b in schedule[warmup_rounds:]]
  median = statistics.median(seconds)
  return {
    'seconds_per_round': seconds,
    'warmup_seconds': warmup,
    'median': median,
    'min': min(seconds),
    'client_steps_per_second': clients_per_round * local_steps / median,
    'torch_version': torch.__version__,
    'num_threads': torch.get_num_threads(),
    'device': str(device),
    'variant': variant,
    'peak_device_mb': (
      torch.cuda.max_memory_allocated(device) / 2**20
      if device.type == 'cuda'
      else None
    ),
    'precision': precision,
    'channels_last': channels_last,
    'cudnn_benchmark': cudnn_benchmark,
    'compile_mode': compile_mode if variant == 'vmap_compiled' else None,
  }


def main(argv=None):
  """Parses flags, times one variant and prints the result dict as JSON."""
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument('--clients_per_round', type=int, default=10)
  parser.add_argument('--local_steps', type=int, default=10)
  parser.add_argument('--batch_size', type=int, default=32)
  parser.add_argument('--image_size', type=int, default=28)
  parser.add_argument('--channels', type=int, default=1)
  parser.add_argument('--pool', choices=POOLS, default='stride')
  parser.add_argument(
    '--model', choices=('small_cnn', 'fedquad_cnn'), default='small_cnn'
  )
  parser.add_argument('--variant', choices=VARIANTS, default='loop')
  parser.add_argument('--device', default='cpu', help="'cpu' or 'cuda'")
  parser.add_argument('--rounds', type=int, default=5)
  parser.add_argument('--warmup_rounds', type=int, default=1)
  parser.add_argument('--num_threads', type=int, default=None)
  parser.add_argument('--lr', type=float, default=0.01)
  parser.add_argument('--precision', choices=PRECISIONS, default='default')
  parser.add_argument('--channels_last', action='store_true')
  parser.add_argument('--compile_mode', default=None)
  args = parser.parse_args(argv)
  result = time_torch_rounds(
    clients_per_round=args.clients_per_round,
    local_steps=args.local_steps,
    batch_size=args.batch_size,
    image_shape=(args.image_size, args.image_size, args.channels),
    pool=args.pool,
    model=args.model,
    num_rounds=args.rounds,
    warmup_rounds=args.warmup_rounds,
    num_threads=args.num_threads,
    lr=args.lr,
    variant=args.variant,
    device=args.device,
    precision=args.precision,
    channels_last=args.channels_last,
    compile_mode=args.compile_mode,
  )
  print(json.dumps(result, indent=2))


if __name__ == '__main__':
  main()
