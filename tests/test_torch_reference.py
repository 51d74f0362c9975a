"""Tests for launch.torch_reference: the PyTorch speed reference."""

import copy
import math

import pytest

torch = pytest.importorskip('torch')

import jax  # pylint: disable=g-import-not-at-top
import jax.numpy as jnp
import numpy as np
import torch.nn.functional as F

from fedjax_metric.models.small_cnn import SmallCNN
from launch import torch_reference

SHAPES = [(8, 8, 1), (28, 28, 1), (32, 32, 3)]  # (H, W, C)
POOLS = ['stride', 'avg', 'max']


def _torch_model(shape, pool):
  h, w, c = shape
  return torch_reference.make_torch_small_cnn(
      in_channels=c, image_size=(h, w), num_classes=10, pool=pool)


@pytest.mark.parametrize('pool', POOLS)
@pytest.mark.parametrize('shape', SHAPES)
def test_output_shape(shape, pool):
  h, w, c = shape
  model = _torch_model(shape, pool)
  out = model(torch.zeros(5, c, h, w))
  assert tuple(out.shape) == (5, 10)


@pytest.mark.parametrize('pool', POOLS)
@pytest.mark.parametrize('shape', SHAPES)
def test_param_count_matches_jax(shape, pool):
  h, w, c = shape
  variables = SmallCNN(num_classes=10, pool=pool).init(
      jax.random.key(0), jnp.zeros((1, h, w, c)), train=False)
  jax_leaves = jax.tree_util.tree_leaves(variables['params'])
  torch_params = list(_torch_model(shape, pool).parameters())
  assert sum(p.numel() for p in torch_params) == sum(x.size for x in jax_leaves)
  # Same layers too: JAX conv kernels are HWIO, torch's OIHW.
  jax_shapes = sorted(
      tuple(x.shape) if x.ndim != 4 else
      (x.shape[3], x.shape[2], x.shape[0], x.shape[1])
      for x in jax_leaves)
  torch_shapes = sorted(
      tuple(p.shape) if p.ndim != 2 else tuple(p.shape[::-1])  # Linear is [out, in].
      for p in torch_params)
  assert jax_shapes == torch_shapes


def test_fedquad_twin_has_the_same_layers_as_jax():
  from fedjax_metric import models  # pylint: disable=g-import-not-at-top
  variables = models.build('fedquad_cnn', 10, (28, 28, 1)).init(
      jax.random.key(0), jnp.zeros((1, 28, 28, 1)))
  jax_shapes = sorted(
      tuple(x.shape) if x.ndim != 4 else
      (x.shape[3], x.shape[2], x.shape[0], x.shape[1])
      for x in jax.tree_util.tree_leaves(variables['params']))
  twin = torch_reference.make_torch_model('fedquad_cnn', in_channels=1,
                                          image_size=(28, 28))
  torch_shapes = sorted(
      tuple(p.shape) if p.ndim != 2 else tuple(p.shape[::-1])
      for p in twin.parameters())
  assert jax_shapes == torch_shapes
  assert tuple(twin(torch.zeros(3, 1, 28, 28)).shape) == (3, 10)


def test_time_fedquad_rounds_tiny():
  """BatchNorm's integer counter must not break the FedAvg accumulation."""
  result = torch_reference.time_torch_rounds(
      clients_per_round=2, local_steps=1, batch_size=4, image_shape=(8, 8, 1),
      model='fedquad_cnn', num_rounds=1, warmup_rounds=0)
  assert result['median'] > 0


def test_unknown_pool_raises():
  with pytest.raises(ValueError):
    _torch_model((8, 8, 1), 'median')


def test_time_torch_rounds_tiny():
  result = torch_reference.time_torch_rounds(
      clients_per_round=2, local_steps=2, batch_size=4, image_shape=(8, 8, 1),
      num_rounds=2, warmup_rounds=1)
  assert len(result['seconds_per_round']) == 2
  for key in ('median', 'min', 'client_steps_per_second'):
    assert math.isfinite(result[key]) and result[key] > 0
  assert all(math.isfinite(s) and s > 0 for s in result['seconds_per_round'])
  assert result['min'] <= result['median']
  assert isinstance(result['torch_version'], str)
  assert result['num_threads'] >= 1


def _data(n=64, shape=(8, 8, 1)):
  h, w, c = shape
  g = torch.Generator().manual_seed(1)
  return (torch.randn(n, c, h, w, generator=g),
          torch.randint(10, (n,), generator=g))


def test_fedavg_lr_zero_keeps_global_exactly():
  images, labels = _data()
  torch.manual_seed(0)
  global_model = _torch_model((8, 8, 1), 'stride')
  client_model = _torch_model((8, 8, 1), 'stride')
  before = {k: v.clone() for k, v in global_model.state_dict().items()}
  torch_reference.fedavg_round(
      global_model, client_model, images, labels, clients_per_round=2,
      local_steps=2, batch_size=4, lr=0.0,
      generator=torch.Generator().manual_seed(0))
  after = global_model.state_dict()
  for k, v in before.items():
    assert torch.equal(v, after[k]), k


def test_fedavg_is_mean_of_client_models():
  images, labels = _data()
  torch.manual_seed(0)
  global_model = _torch_model((8, 8, 1), 'max')
  client_model = _torch_model((8, 8, 1), 'max')
  start = copy.deepcopy(global_model.state_dict())
  num_clients, steps, batch, lr = 3, 2, 4, 0.1

  # Reference: train each client from the start weights, average by hand.
  g = torch.Generator().manual_seed(0)
  finals = []
  for _ in range(num_clients):
    m = _torch_model((8, 8, 1), 'max')
    m.load_state_dict(start)
    opt = torch.optim.SGD(m.parameters(), lr=lr)
    for _ in range(steps):
      idx = torch.randint(images.shape[0], (batch,), generator=g)
      opt.zero_grad()
      F.cross_entropy(m(images[idx]), labels[idx]).backward()
      opt.step()
    finals.append({k: v.detach().clone() for k, v in m.state_dict().items()})

  torch_reference.fedavg_round(
      global_model, client_model, images, labels,
      clients_per_round=num_clients, local_steps=steps, batch_size=batch, lr=lr,
      generator=torch.Generator().manual_seed(0))
  after = global_model.state_dict()
  for k in start:
    expected = torch.stack([f[k] for f in finals]).mean(0)
    assert not torch.equal(after[k], start[k]), k
    np.testing.assert_allclose(after[k].numpy(), expected.numpy(),
                               rtol=1e-5, atol=1e-6)
