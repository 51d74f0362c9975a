"""Tests for benchmarks.torch_reference: the PyTorch speed references.

The vectorised round (torch.func) is checked against the per-client loop, and
the loop against a hand-written per-client training and average. The
torch.compile checks and the bench.py run take minutes on a small CPU
(compilation), so they run only with FEDJAX_SLOW_TORCH_TESTS=1.
"""

import copy
import math
import os
import subprocess
import sys

import pytest

torch = pytest.importorskip('torch')

# The imports below need torch: after importorskip on purpose.
import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from benchmarks import torch_reference  # noqa: E402
from fedjax_metric.models.small_cnn import SmallCNN  # noqa: E402

# Tiny shapes: one thread is faster than two on a shared CPU, where OpenMP's
# spin-waiting threads fight the other processes for the cores.
torch.set_num_threads(1)

SLOW = pytest.mark.skipif(
  os.environ.get('FEDJAX_SLOW_TORCH_TESTS') != '1',
  reason='torch.compile / bench.py run: set FEDJAX_SLOW_TORCH_TESTS=1',
)
REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SHAPES = [(8, 8, 1), (28, 28, 1), (32, 32, 3)]  # (H, W, C)
POOLS = ['stride', 'avg', 'max']


def _torch_model(shape, pool):
  h, w, c = shape
  return torch_reference.make_torch_small_cnn(
    in_channels=c, image_size=(h, w), num_classes=10, pool=pool
  )


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
    jax.random.key(0), jnp.zeros((1, h, w, c)), train=False
  )
  jax_leaves = jax.tree_util.tree_leaves(variables['params'])
  torch_params = list(_torch_model(shape, pool).parameters())
  assert sum(p.numel() for p in torch_params) == sum(x.size for x in jax_leaves)
  # Same layers too: JAX conv kernels are HWIO, torch's OIHW.
  jax_shapes = sorted(
    tuple(x.shape)
    if x.ndim != 4
    else (x.shape[3], x.shape[2], x.shape[0], x.shape[1])
    for x in jax_leaves
  )
  torch_shapes = sorted(
    # Linear is [out, in].
    tuple(p.shape) if p.ndim != 2 else tuple(p.shape[::-1])
    for p in torch_params
  )
  assert jax_shapes == torch_shapes


def test_fedquad_twin_has_the_same_layers_as_jax():
  from fedjax_metric import models  # pylint: disable=g-import-not-at-top

  variables = models.build('fedquad_cnn', 10, (28, 28, 1)).init(
    jax.random.key(0), jnp.zeros((1, 28, 28, 1))
  )
  jax_shapes = sorted(
    tuple(x.shape)
    if x.ndim != 4
    else (x.shape[3], x.shape[2], x.shape[0], x.shape[1])
    for x in jax.tree_util.tree_leaves(variables['params'])
  )
  twin = torch_reference.make_torch_model(
    'fedquad_cnn', in_channels=1, image_size=(28, 28)
  )
  torch_shapes = sorted(
    tuple(p.shape) if p.ndim != 2 else tuple(p.shape[::-1])
    for p in twin.parameters()
  )
  assert jax_shapes == torch_shapes
  assert tuple(twin(torch.zeros(3, 1, 28, 28)).shape) == (3, 10)


def tiny_rounds(**settings):
  """`time_torch_rounds` on a tiny workload (2 clients, 2 steps of 4
  examples of 8x8x1, 2 timed rounds after 1 warm-up); ``settings``
  override any of it."""
  return torch_reference.time_torch_rounds(
    **{
      'clients_per_round': 2,
      'local_steps': 2,
      'batch_size': 4,
      'image_shape': (8, 8, 1),
      'num_rounds': 2,
      'warmup_rounds': 1,
      **settings,
    }
  )


def test_time_fedquad_rounds_tiny():
  """BatchNorm's integer counter must not break the FedAvg accumulation."""
  result = tiny_rounds(
    local_steps=1, model='fedquad_cnn', num_rounds=1, warmup_rounds=0
  )
  assert result['median'] > 0


def test_unknown_pool_raises():
  with pytest.raises(ValueError):
    _torch_model((8, 8, 1), 'median')


def test_time_torch_rounds_tiny():
  result = tiny_rounds()
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
  return (
    torch.randn(n, c, h, w, generator=g),
    torch.randint(10, (n,), generator=g),
  )


def test_fedavg_lr_zero_keeps_global_exactly():
  images, labels = _data()
  torch.manual_seed(0)
  global_model = _torch_model((8, 8, 1), 'stride')
  client_model = _torch_model((8, 8, 1), 'stride')
  before = {k: v.clone() for k, v in global_model.state_dict().items()}
  torch_reference.fedavg_round(
    global_model,
    client_model,
    images,
    labels,
    clients_per_round=2,
    local_steps=2,
    batch_size=4,
    lr=0.0,
    generator=torch.Generator().manual_seed(0),
  )
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
    global_model,
    client_model,
    images,
    labels,
    clients_per_round=num_clients,
    local_steps=steps,
    batch_size=batch,
    lr=lr,
    generator=torch.Generator().manual_seed(0),
  )
  after = global_model.state_dict()
  for k in start:
    expected = torch.stack([f[k] for f in finals]).mean(0)
    assert not torch.equal(after[k], start[k]), k
    np.testing.assert_allclose(
      after[k].numpy(), expected.numpy(), rtol=1e-5, atol=1e-6
    )


# ---------------------------------------------------------------------------
# Batch indices, devices, variants.
# ---------------------------------------------------------------------------


def test_draw_batch_indices_are_the_loops_draws():
  """Same generator state -> the loop's own draws and the drawn indices give
  bit-identical rounds (same batches in the same order)."""
  images, labels = _data()
  torch.manual_seed(0)
  start = _torch_model((8, 8, 1), 'stride')
  results = []
  for use_indices in (False, True):
    global_model, client_model = copy.deepcopy(start), copy.deepcopy(start)
    g = torch.Generator().manual_seed(3)
    idx = (
      torch_reference.draw_batch_indices(64, 3, 2, 4, generator=g)
      if use_indices
      else None
    )
    torch_reference.fedavg_round(
      global_model,
      client_model,
      images,
      labels,
      clients_per_round=3,
      local_steps=2,
      batch_size=4,
      lr=0.1,
      generator=g,
      batch_indices=idx,
    )
    results.append(global_model.state_dict())
  for k in results[0]:
    assert torch.equal(results[0][k], results[1][k]), k


def test_draw_batch_indices_shape_and_range():
  idx = torch_reference.draw_batch_indices(
    10, 3, 4, 5, generator=torch.Generator().manual_seed(0)
  )
  assert idx.shape == (3, 4, 5) and idx.dtype == torch.int64
  assert int(idx.min()) >= 0 and int(idx.max()) < 10
  assert len(set(idx.flatten().tolist())) > 1


def test_pick_device_follows_jax_backend():
  assert torch_reference.pick_device('cpu') == torch.device('cpu')
  expected = 'cuda' if torch.cuda.is_available() else 'cpu'
  assert torch_reference.pick_device('gpu').type == expected


def test_unknown_variant_raises():
  with pytest.raises(ValueError):
    torch_reference.time_torch_rounds(
      clients_per_round=1,
      local_steps=1,
      batch_size=2,
      image_shape=(8, 8, 1),
      variant='jit',
    )


def test_time_vmap_rounds_tiny():
  result = tiny_rounds(variant='vmap')
  assert result['variant'] == 'vmap' and result['device'] == 'cpu'
  assert len(result['seconds_per_round']) == 2
  assert len(result['warmup_seconds']) == 1
  assert all(math.isfinite(s) and s > 0 for s in result['seconds_per_round'])
  assert result['peak_device_mb'] is None


# ---------------------------------------------------------------------------
# The vectorised round against the loop.
# ---------------------------------------------------------------------------


def _model(name):
  return torch_reference.make_torch_model(
    name, in_channels=1, image_size=(8, 8)
  ).train()


def _loop_and_vmap(
  name,
  *,
  lr=0.1,
  clients=3,
  steps=2,
  batch=4,
  compile_step=False,
  precision='highest',
  channels_last=False,
):
  """Start state, loop result and vmap result from the same weights and
  batches."""
  images, labels = _data()
  torch.manual_seed(0)
  start = _model(name)
  forward = torch_reference.set_precision(precision, torch.device('cpu'))
  if channels_last:
    start = start.to(memory_format=torch.channels_last)
    images = images.contiguous(memory_format=torch.channels_last)
  idx = torch_reference.draw_batch_indices(
    images.shape[0],
    clients,
    steps,
    batch,
    generator=torch.Generator().manual_seed(0),
  )
  loop_global, client = copy.deepcopy(start), copy.deepcopy(start)
  torch_reference.fedavg_round(
    loop_global,
    client,
    images,
    labels,
    clients_per_round=clients,
    local_steps=steps,
    batch_size=batch,
    lr=lr,
    batch_indices=idx,
    forward_context=forward,
  )
  vmap_global = copy.deepcopy(start)
  if name == 'fedquad_cnn':
    # As time_torch_rounds builds it: bf16 autocast inside torch.func.vmap
    # needs BatchNorm's input in float32.
    vmap_global.norm_in_float32 = precision == 'bf16'
  step = torch_reference.make_vmap_sgd_step(
    vmap_global, lr=lr, compile_step=compile_step, forward_context=forward
  )
  torch_reference.fedavg_round_vmap(
    vmap_global, images, labels, idx, sgd_step=step
  )
  return (
    start.state_dict(),
    loop_global.state_dict(),
    vmap_global.state_dict(),
  )


@pytest.mark.parametrize('name', ['small_cnn', 'fedquad_cnn'])
def test_vmap_round_equals_loop(name):
  start, loop, vmapped = _loop_and_vmap(name)
  assert loop.keys() == vmapped.keys()
  for k, v in loop.items():
    np.testing.assert_allclose(
      vmapped[k].numpy(), v.numpy(), rtol=1e-5, atol=1e-5, err_msg=k
    )
    if k.endswith('num_batches_tracked'):
      # Not averaged: both keep the global counter.
      assert torch.equal(v, start[k]) and torch.equal(vmapped[k], start[k])
    elif not (
      name == 'fedquad_cnn' and k.startswith('convs.') and k.endswith('.bias')
    ):
      # Everything else moves (BatchNorm cancels the conv biases' gradient),
      # so the two rounds are not compared as two copies of the start.
      assert not torch.allclose(v, start[k], atol=1e-4), k


@pytest.mark.parametrize('name', ['small_cnn', 'fedquad_cnn'])
def test_bf16_autocast_rounds_are_bf16_and_close_to_float32(name):
  """The bf16 peer (`set_precision('bf16')`): its forward pass runs in
  bfloat16, so both forms move away from the float32 round, by about
  bfloat16's rounding (8 bits of mantissa) and not more; the loop and the
  vmap form still agree with each other. The FedQuad CNN has BatchNorm,
  which bf16 autocast inside torch.func.vmap refused until its input was
  float32 (the GPU session's bf16 peer row failed on it)."""
  _, loop32, vmap32 = _loop_and_vmap(name)
  _, loop16, vmap16 = _loop_and_vmap(name, precision='bf16')
  for k, v in loop32.items():
    if not v.is_floating_point():  # BatchNorm's num_batches_tracked.
      continue
    scale = float(v.abs().max())
    for got in (loop16[k], vmap16[k]):
      assert got.dtype == torch.float32, k  # Weights stay float32.
      difference = float((got - v).abs().max())
      assert difference < 0.05 * scale + 1e-3, (k, difference, scale)
    np.testing.assert_allclose(
      vmap16[k].numpy(), loop16[k].numpy(), rtol=1e-2, atol=1e-2, err_msg=k
    )
  assert any(not torch.equal(loop16[k], loop32[k]) for k in loop32)
  with torch_reference.set_precision('bf16', torch.device('cpu'))():
    assert torch.nn.Linear(3, 2)(torch.ones(1, 3)).dtype == torch.bfloat16


@pytest.mark.parametrize('name', ['small_cnn', 'fedquad_cnn'])
def test_channels_last_rounds_equal_contiguous_ones(name):
  _, loop, vmapped = _loop_and_vmap(name)
  _, loop_nhwc, vmapped_nhwc = _loop_and_vmap(name, channels_last=True)
  for k, v in loop.items():
    np.testing.assert_allclose(
      loop_nhwc[k].numpy(), v.numpy(), rtol=1e-5, atol=1e-6, err_msg=k
    )
    np.testing.assert_allclose(
      vmapped_nhwc[k].numpy(), vmapped[k].numpy(), rtol=1e-5, atol=1e-6
    )


def test_set_precision_refuses_an_unknown_name():
  with pytest.raises(ValueError, match='precision must be one of'):
    torch_reference.set_precision('fp8', torch.device('cpu'))


@pytest.mark.parametrize('variant', ['loop', 'vmap_compiled'])
def test_batches_are_drawn_before_timing_and_settings_recorded(
  monkeypatch, variant
):
  """Every round's batch indices exist before the first round runs, and the
  result names the settings it was timed with; torch.compile gets the mode
  asked for (stood in for here: compiling is the slow test's business)."""
  events, modes = [], []
  draw = torch_reference.draw_batch_indices
  monkeypatch.setattr(
    torch_reference,
    'draw_batch_indices',
    lambda *a, **k: events.append('draw') or draw(*a, **k),
  )
  for name in ('fedavg_round', 'fedavg_round_vmap'):
    original = getattr(torch_reference, name)
    monkeypatch.setattr(
      torch_reference,
      name,
      lambda *a, _f=original, **k: events.append('round') or _f(*a, **k),
    )
  monkeypatch.setattr(
    torch, 'compile', lambda fn, mode=None: modes.append(mode) or fn
  )
  result = tiny_rounds(
    local_steps=1,
    variant=variant,
    precision='bf16',
    channels_last=True,
    compile_mode='max-autotune',
  )
  assert events == ['draw'] * 3 + ['round'] * 3
  # Channels-last is the loop's only: the vmap forms' backward refuses it on
  # CUDA, so the result records it off there.
  assert result['precision'] == 'bf16'
  assert result['channels_last'] is (variant == 'loop')
  assert result['cudnn_benchmark'] is False  # A CPU run.
  if variant == 'vmap_compiled':
    assert modes == ['max-autotune']
    assert result['compile_mode'] == 'max-autotune'
  else:
    assert modes == [] and result['compile_mode'] is None


def test_vmap_round_with_lr_zero_keeps_weights_exactly():
  start, _, vmapped = _loop_and_vmap('small_cnn', lr=0.0)
  for k, v in start.items():
    assert torch.equal(v, vmapped[k]), k


def test_loop_batchnorm_buffers_are_the_client_mean():
  """The loop's BN running statistics are the mean of the clients' (trained
  one by one by hand with nn.Module), its counter the global's."""
  images, labels = _data()
  torch.manual_seed(0)
  start = _model('fedquad_cnn')
  clients, steps, batch, lr = 3, 2, 4, 0.1
  idx = torch_reference.draw_batch_indices(
    64, clients, steps, batch, generator=torch.Generator().manual_seed(0)
  )
  finals = []
  for k in range(clients):
    m = copy.deepcopy(start)
    opt = torch.optim.SGD(m.parameters(), lr=lr)
    for s in range(steps):
      opt.zero_grad()
      F.cross_entropy(m(images[idx[k, s]]), labels[idx[k, s]]).backward()
      opt.step()
    finals.append(m.state_dict())
  global_model, client = copy.deepcopy(start), copy.deepcopy(start)
  torch_reference.fedavg_round(
    global_model,
    client,
    images,
    labels,
    clients_per_round=clients,
    local_steps=steps,
    batch_size=batch,
    lr=lr,
    batch_indices=idx,
  )
  after = global_model.state_dict()
  for k, v in after.items():
    if not v.is_floating_point():
      assert torch.equal(v, start.state_dict()[k]), k
      continue
    expected = torch.stack([f[k].double() for f in finals]).mean(0)
    np.testing.assert_allclose(
      v.numpy(), expected.numpy(), rtol=1e-5, atol=1e-6, err_msg=k
    )


# ---------------------------------------------------------------------------
# torch.compile and the benchmark (slow: compilation).
# ---------------------------------------------------------------------------


@SLOW
@pytest.mark.parametrize('name', ['small_cnn', 'fedquad_cnn'])
def test_compiled_vmap_round_equals_eager(name):
  _, _, eager = _loop_and_vmap(name)
  try:
    _, _, compiled = _loop_and_vmap(name, compile_step=True)
  except torch._inductor.exc.InvalidCxxCompiler as e:  # pylint: disable=protected-access
    pytest.skip(f'torch.compile does not work here: {e}')
  for k, v in eager.items():
    np.testing.assert_allclose(
      compiled[k].numpy(), v.numpy(), rtol=1e-5, atol=1e-6, err_msg=k
    )


@SLOW
def test_bench_times_torch_forms_and_ratios(tmp_path):
  out = tmp_path / 'bench.md'
  env = dict(os.environ, PYTHONPATH=REPO_ROOT, JAX_PLATFORMS='cpu')
  proc = subprocess.run(
    [
      sys.executable,
      '-m',
      'benchmarks.bench',
      '--clients=2',
      '--local_steps=1',
      '--batch_size=4',
      '--image_shape=8,8,1',
      '--rounds=1',
      '--executors=host,torch_vmap',
      f'--out={out}',
    ],
    cwd=REPO_ROOT,
    env=env,
    capture_output=True,
    text=True,
    check=False,
  )
  assert proc.returncode == 0, proc.stderr[-2000:]
  table = out.read_text()
  rows = {}
  for line in table.splitlines():
    cells = [cell.strip() for cell in line.strip('|').split('|')]
    if cells[0] == 'clients/round':
      header = cells
    elif cells[0] == '2':
      rows[cells[1]] = dict(zip(header, cells))
  assert set(rows) == {
    'host',
    'pytorch vmap',
    'pytorch vmap + compile',
    'pytorch loop',
  }
  medians = {name: float(r['s/round (median)']) for name, r in rows.items()}
  best_label = rows['host']['vs best PyTorch'].split('(', 1)[1].rstrip(')')
  assert (
    medians[best_label]
    <= min(m for n, m in medians.items() if n.startswith('pytorch')) + 1e-3
  )
  assert rows['pytorch loop']['vs PyTorch loop'] == '1.00x'
  assert rows[best_label]['vs best PyTorch'] == f'1.00x ({best_label})'
  for name, r in rows.items():
    # Time ratios: above 1 exactly where the row is slower than the loop.
    loop_ratio = float(r['vs PyTorch loop'].rstrip('x'))
    assert (loop_ratio > 1.005) <= (medians[name] > medians['pytorch loop'])
  assert 'PyTorch: torch' in table and 'on cpu' in table
  # The peer's settings are in the table's notes.
  assert 'Same arithmetic as the JAX rows: TF32 allowed' in table
  assert 'drawn before timing' in table and 'cudnn.benchmark off (CPU)' in table
