"""Plain PyTorch per-client FL loop: the speed reference for our benchmark.

This is what the reference implementations (MOON, FedRCL, FedAU) do each
round: for every sampled client, copy the global weights into a client model
(``load_state_dict``), build a fresh SGD optimizer, run ``local_steps``
forward/backward/step iterations on batches of ``batch_size``, then
FedAvg-average the client weights into the global model. Clients run one after
the other in eager PyTorch; nothing is fused or vectorised across clients.

The data are random tensors made once on the CPU before timing starts and each
step's batch is a ``torch.randint`` gather, so what is timed is compute, not
data loading.

The model is architecturally identical to the JAX
``fedjax_metric.models.small_cnn.SmallCNN`` with ``norm='none'``: same layers,
same shapes, same parameter count. One deliberate difference: flax ``'SAME'``
padding on a stride-2 3x3 conv over an even size pads (0 before, 1 after),
while here the stride-2 conv uses ``padding=1`` (1 before, 1 after). Both give
an output of ``ceil(H / 2)``, so the cost is the same; the outputs differ by a
one-pixel shift, which is irrelevant for a speed reference.

Run::

  .venv/bin/python -m launch.torch_reference --clients_per_round 10 \
      --local_steps 10 --batch_size 32
"""

import argparse
import json
import statistics
import time
from typing import Dict, Optional, Sequence

import torch
from torch import nn
import torch.nn.functional as F

POOLS = ('stride', 'avg', 'max')


def _down_size(size: int, pool: str) -> int:
  """Spatial size after one conv + downsampling block (matches the JAX model).

  Args:
    size: input height or width.
    pool: 'stride' (stride-2 conv, ceil), 'avg' or 'max' (2x2 VALID pool, floor).

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

  def __init__(self, *, in_channels: int, image_size: Sequence[int],
               num_classes: int = 10, width: int = 32,
               embedding_dim: int = 128, pool: str = 'stride'):
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


def make_torch_small_cnn(*, in_channels: int, image_size, num_classes: int = 10,
                         width: int = 32, embedding_dim: int = 128,
                         pool: str = 'stride') -> nn.Module:
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
  return TorchSmallCNN(in_channels=in_channels, image_size=tuple(image_size),
                       num_classes=num_classes, width=width,
                       embedding_dim=embedding_dim, pool=pool)


class TorchFedQuadCNN(nn.Module):
  """Twin of fedjax_metric.models.fedquad_cnn: 3 x [conv3x3 -> BN -> ReLU]
  (max-pool, max-pool, global average pool) -> Linear(128) -> Linear(classes).
  """

  def __init__(self, *, in_channels: int, num_classes: int = 10,
               widths: Sequence[int] = (64, 128, 256),
               embedding_dim: int = 128):
    super().__init__()
    channels = [in_channels, *widths]
    self.convs = nn.ModuleList(
        nn.Conv2d(a, b, 3, padding=1) for a, b in zip(channels, channels[1:]))
    self.norms = nn.ModuleList(nn.BatchNorm2d(b) for b in widths)
    self.fc1 = nn.Linear(widths[-1], embedding_dim)
    self.fc2 = nn.Linear(embedding_dim, num_classes)

  def forward(self, x: torch.Tensor) -> torch.Tensor:
    """Maps images [B, C, H, W] float32 to logits [B, num_classes]."""
    for block, (conv, norm) in enumerate(zip(self.convs, self.norms)):
      x = F.relu(norm(conv(x)))
      x = F.max_pool2d(x, 2) if block < 2 else x.mean(dim=(2, 3))
    return self.fc2(self.fc1(x))


def make_torch_model(model: str, *, in_channels: int, image_size,
                     pool: str = 'stride') -> nn.Module:
  """'small_cnn' (with ``pool``) or 'fedquad_cnn', 10 classes."""
  if model == 'small_cnn':
    return make_torch_small_cnn(in_channels=in_channels, image_size=image_size,
                                pool=pool)
  if model == 'fedquad_cnn':
    return TorchFedQuadCNN(in_channels=in_channels)
  raise ValueError(f"model must be 'small_cnn' or 'fedquad_cnn', got {model!r}")


def fedavg_round(global_model: nn.Module, client_model: nn.Module,
                 images: torch.Tensor, labels: torch.Tensor, *,
                 clients_per_round: int, local_steps: int, batch_size: int,
                 lr: float, generator: Optional[torch.Generator] = None) -> None:
  """Runs one FL round in place on ``global_model``, one client at a time.

  Every client runs the same number of steps on the same batch size, so the
  FedAvg weights are uniform. The average is accumulated as
  ``global + sum_i w_i * (client_i - global)``, which is FedAvg exactly in
  real arithmetic and, unlike a plain weighted sum of the client weights,
  leaves the global weights bit-for-bit unchanged when no client moves.

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
  """
  num_examples = images.shape[0]
  global_state = {k: v.detach().clone() for k, v in
                  global_model.state_dict().items()}
  delta_sum = {k: torch.zeros_like(v) for k, v in global_state.items()}
  weight = 1.0 / clients_per_round
  client_model.train()
  for _ in range(clients_per_round):
    client_model.load_state_dict(global_state)
    optimizer = torch.optim.SGD(client_model.parameters(), lr=lr)
    for _ in range(local_steps):
      idx = torch.randint(num_examples, (batch_size,), generator=generator)
      x, y = images[idx], labels[idx]
      optimizer.zero_grad(set_to_none=True)
      loss = F.cross_entropy(client_model(x), y)
      loss.backward()
      optimizer.step()
    with torch.no_grad():
      for k, v in client_model.state_dict().items():
        if v.is_floating_point():  # Not BatchNorm's integer step counter.
          delta_sum[k].add_(v - global_state[k], alpha=weight)
  with torch.no_grad():
    global_model.load_state_dict(
        {k: global_state[k] + delta_sum[k] for k in global_state})


def time_torch_rounds(*, clients_per_round: int, local_steps: int,
                      batch_size: int, image_shape=(28, 28, 1),
                      pool: str = 'stride', model: str = 'small_cnn',
                      num_rounds: int = 5,
                      warmup_rounds: int = 1, num_threads: Optional[int] = None,
                      lr: float = 0.01) -> Dict:
  """Times the eager per-client PyTorch FL loop on random CPU data.

  Args:
    clients_per_round: clients trained sequentially per round.
    local_steps: SGD steps per client.
    batch_size: examples per step.
    image_shape: (H, W, C), as in the JAX code; converted to NCHW here.
    pool: 'stride', 'avg' or 'max' (small_cnn).
    model: 'small_cnn' or 'fedquad_cnn'.
    num_rounds: timed rounds.
    warmup_rounds: untimed rounds run first.
    num_threads: if given, passed to ``torch.set_num_threads``; otherwise
      torch's default is kept.
    lr: SGD learning rate.

  Returns:
    A dict with 'seconds_per_round' (list of per-round seconds), 'median',
    'min', 'client_steps_per_second' (clients * steps / median),
    'torch_version' and 'num_threads'.
  """
  if num_threads is not None:
    torch.set_num_threads(num_threads)
  height, width, channels = image_shape
  generator = torch.Generator().manual_seed(0)
  torch.manual_seed(0)
  num_examples = max(1024, 4 * batch_size)
  images = torch.randn(num_examples, channels, height, width,
                       generator=generator, dtype=torch.float32)
  labels = torch.randint(10, (num_examples,), generator=generator,
                         dtype=torch.int64)
  make = lambda: make_torch_model(model, in_channels=channels,
                                  image_size=(height, width), pool=pool)
  global_model, client_model = make(), make()

  def one_round():
    fedavg_round(global_model, client_model, images, labels,
                 clients_per_round=clients_per_round, local_steps=local_steps,
                 batch_size=batch_size, lr=lr, generator=generator)

  for _ in range(warmup_rounds):
    one_round()
  seconds = []
  for _ in range(num_rounds):
    start = time.perf_counter()
    one_round()
    seconds.append(time.perf_counter() - start)
  median = statistics.median(seconds)
  return {
      'seconds_per_round': seconds,
      'median': median,
      'min': min(seconds),
      'client_steps_per_second': clients_per_round * local_steps / median,
      'torch_version': torch.__version__,
      'num_threads': torch.get_num_threads(),
  }


def main(argv=None):
  """Parses flags, times the loop and prints the result dict as JSON."""
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument('--clients_per_round', type=int, default=10)
  parser.add_argument('--local_steps', type=int, default=10)
  parser.add_argument('--batch_size', type=int, default=32)
  parser.add_argument('--image_size', type=int, default=28)
  parser.add_argument('--channels', type=int, default=1)
  parser.add_argument('--pool', choices=POOLS, default='stride')
  parser.add_argument('--model', choices=('small_cnn', 'fedquad_cnn'),
                      default='small_cnn')
  parser.add_argument('--rounds', type=int, default=5)
  parser.add_argument('--warmup_rounds', type=int, default=1)
  parser.add_argument('--num_threads', type=int, default=None)
  parser.add_argument('--lr', type=float, default=0.01)
  args = parser.parse_args(argv)
  result = time_torch_rounds(
      clients_per_round=args.clients_per_round, local_steps=args.local_steps,
      batch_size=args.batch_size,
      image_shape=(args.image_size, args.image_size, args.channels),
      pool=args.pool, model=args.model, num_rounds=args.rounds, warmup_rounds=args.warmup_rounds,
      num_threads=args.num_threads, lr=args.lr)
  print(json.dumps(result, indent=2))


if __name__ == '__main__':
  main()
