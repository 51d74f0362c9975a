"""`implicit_conv` (the implicit-GEMM Pallas convolution) against NumPy loops:
forward, both gradients, per-client weights under vmap, the models' forms,
and that a program lowered for an NVIDIA GPU holds Triton kernels (checked
here without a GPU: JAX lowers for 'cuda' on any machine).

On CPU the kernels run in Pallas' interpreter: the same kernel bodies, so
these tests check the index arithmetic the GPU runs."""

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fedjax_metric.models import implicit_conv, layers


def numpy_same_conv(x, kernel):
  """Stride-1 'SAME' cross-correlation, loops over kernel taps (float64).

  x [B, H, W, C], kernel [kh, kw, C, O] -> [B, H, W, O]."""
  x, kernel = np.asarray(x, np.float64), np.asarray(kernel, np.float64)
  kh, kw = kernel.shape[:2]
  _, h, w, _ = x.shape
  xp = np.pad(x, ((0, 0), (kh // 2, kh // 2), (kw // 2, kw // 2), (0, 0)))
  out = 0.0
  for i in range(kh):
    for j in range(kw):
      out = out + xp[:, i : i + h, j : j + w, :] @ kernel[i, j]
  return out


def numpy_same_conv_grads(x, kernel, g):
  """d/dx and d/dkernel of sum(conv(x, kernel) * g), by hand (float64):
  dkernel[i, j] = sum_{b,y,x} xpad[b, y+i, x+j]^T g[b, y, x] and
  dx = the padded-input gradient sum_{i,j} shift(g @ kernel[i, j]^T) cropped."""
  x, kernel, g = (np.asarray(a, np.float64) for a in (x, kernel, g))
  kh, kw = kernel.shape[:2]
  _, h, w, c = x.shape
  ph, pw = kh // 2, kw // 2
  xp = np.pad(x, ((0, 0), (ph, ph), (pw, pw), (0, 0)))
  dxp = np.zeros_like(xp)
  dk = np.zeros_like(kernel)
  for i in range(kh):
    for j in range(kw):
      window = xp[:, i : i + h, j : j + w, :]
      dk[i, j] = np.einsum('byxc,byxo->co', window, g)
      dxp[:, i : i + h, j : j + w, :] += g @ kernel[i, j].T
  return dxp[:, ph : ph + h, pw : pw + w, :], dk


SHAPES = [
  # (B, H, W, C, O, k): odd channel counts (padded to 16 inside), a 1x1 and
  # a 5x5 kernel, and one input long enough for several row tiles and
  # weight-gradient groups (2 * 18 * 20 = 720 grid rows > 5 tiles of 128).
  (2, 5, 6, 3, 20, 3),
  (1, 6, 5, 2, 3, 5),
  (2, 4, 4, 5, 7, 1),
  (2, 16, 18, 1, 32, 3),
]


@pytest.mark.parametrize('shape', SHAPES)
def test_forward_and_gradients_match_numpy(shape):
  b, h, w, c, o, k = shape
  rng = np.random.default_rng(sum(shape))
  x = rng.normal(size=(b, h, w, c)).astype(np.float32)
  kernel = rng.normal(size=(k, k, c, o)).astype(np.float32)
  g = rng.normal(size=(b, h, w, o)).astype(np.float32)
  with jax.default_matmul_precision('highest'):
    out = implicit_conv.implicit_conv(x, kernel)
    dx, dk = jax.grad(
      lambda x, k: jnp.sum(implicit_conv.implicit_conv(x, k) * g), (0, 1)
    )(x, kernel)
  assert out.shape == (b, h, w, o) and out.dtype == jnp.float32
  np.testing.assert_allclose(
    out, numpy_same_conv(x, kernel), rtol=1e-5, atol=1e-4
  )
  want_dx, want_dk = numpy_same_conv_grads(x, kernel, g)
  np.testing.assert_allclose(dx, want_dx, rtol=1e-5, atol=1e-4)
  np.testing.assert_allclose(dk, want_dk, rtol=1e-5, atol=2e-4)


def test_vmapped_over_client_weights_matches_numpy_per_client():
  """3 clients, each its own kernel, batch and output gradient: the case the
  kernel exists for (pallas_call turns the clients into a grid axis)."""
  rng = np.random.default_rng(0)
  x = rng.normal(size=(3, 2, 6, 7, 3)).astype(np.float32)
  kernel = rng.normal(size=(3, 3, 3, 3, 16)).astype(np.float32)
  g = rng.normal(size=(3, 2, 6, 7, 16)).astype(np.float32)

  def value_and_grads(x, k, g):
    out, vjp = jax.vjp(implicit_conv.implicit_conv, x, k)
    return (out, *vjp(g))

  with jax.default_matmul_precision('highest'):
    outs, dxs, dks = jax.jit(jax.vmap(value_and_grads))(x, kernel, g)
  for client in range(3):
    np.testing.assert_allclose(
      outs[client],
      numpy_same_conv(x[client], kernel[client]),
      rtol=1e-5,
      atol=1e-4,
    )
    want_dx, want_dk = numpy_same_conv_grads(
      x[client], kernel[client], g[client]
    )
    np.testing.assert_allclose(dxs[client], want_dx, rtol=1e-5, atol=1e-4)
    np.testing.assert_allclose(dks[client], want_dk, rtol=1e-5, atol=2e-4)


def test_bfloat16_inputs_give_bfloat16_outputs_near_float32():
  rng = np.random.default_rng(1)
  x = rng.normal(size=(2, 6, 6, 4)).astype(np.float32)
  kernel = rng.normal(size=(3, 3, 4, 16)).astype(np.float32)
  out = implicit_conv.implicit_conv(
    jnp.asarray(x, jnp.bfloat16), jnp.asarray(kernel, jnp.bfloat16)
  )
  assert out.dtype == jnp.bfloat16
  # bf16 inputs (8-bit mantissa), float32 accumulation over 36 terms.
  np.testing.assert_allclose(
    np.asarray(out, np.float32), numpy_same_conv(x, kernel), atol=0.25
  )


def test_even_kernels_are_refused():
  with pytest.raises(ValueError, match='odd kernel'):
    implicit_conv.implicit_conv(
      jnp.zeros((1, 4, 4, 1)), jnp.zeros((2, 2, 1, 4))
    )


def test_patch_conv_implicit_form_same_parameters_and_outputs():
  """The layer's 'implicit' form: same parameter tree and outputs as the
  patches form; strides other than 1 fall back to the patches."""
  x = jax.random.normal(jax.random.key(0), (2, 7, 6, 3))
  for strides in (1, 2):
    patches = layers.PatchConv(16, (3, 3), strides=strides)
    implicit = layers.PatchConv(16, (3, 3), strides=strides, form='implicit')
    variables = patches.init(jax.random.key(1), x)
    assert jax.tree.map(
      jnp.shape, implicit.init(jax.random.key(1), x)
    ) == jax.tree.map(jnp.shape, variables)
    with jax.default_matmul_precision('highest'):
      np.testing.assert_allclose(
        implicit.apply(variables, x), patches.apply(variables, x), atol=1e-5
      )
  with pytest.raises(ValueError, match='form'):
    layers.PatchConv(16, form='winograd').init(jax.random.key(1), x)


def test_fedquad_cnn_implicit_equals_xla_outputs_and_gradients():
  from fedjax_metric import models  # pylint: disable=g-import-not-at-top

  kwargs = dict(widths=(4, 8, 8), embedding_dim=8)
  x = jax.random.normal(jax.random.key(0), (3, 8, 8, 3))
  xla = models.build('fedquad_cnn', 3, (8, 8, 3), **kwargs)
  implicit = models.build(
    'fedquad_cnn', 3, (8, 8, 3), conv_impl='implicit', **kwargs
  )
  params, state = models.split_variables(xla.init(jax.random.key(1), x))
  mask = jnp.ones(3, bool)

  def loss(module, params):
    out, _ = module.apply(params, state, x, train=True, mask=mask)
    return jnp.sum(jnp.tanh(out['logits']))

  with jax.default_matmul_precision('highest'):
    want = jax.value_and_grad(loss, argnums=1)(xla, params)
    got = jax.value_and_grad(loss, argnums=1)(implicit, params)
  for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
    np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)


def test_lowered_for_cuda_holds_triton_kernels_and_no_patches():
  """Lowering for 'cuda' runs Pallas' Triton lowering (no GPU needed): the
  vmapped training step's convolution becomes three Triton kernels (output,
  input gradient, weight gradient) and no concatenation of patches."""
  x = jnp.zeros((4, 8, 16, 16, 32), jnp.bfloat16)
  kernel = jnp.zeros((4, 3, 3, 32, 64), jnp.bfloat16)

  def loss(x, k):
    return jnp.sum(implicit_conv.implicit_conv(x, k).astype(jnp.float32) ** 2)

  step = jax.jit(jax.vmap(jax.value_and_grad(loss, (0, 1))))
  text = step.trace(x, kernel).lower(lowering_platforms=('cuda',)).as_text()
  calls = re.findall(r'custom_call @([\w$.]+)', text)
  assert calls.count('__gpu$xla.gpu.triton') == 3, calls
  assert 'stablehlo.concatenate' not in text
  assert 'stablehlo.convolution' not in text


def _fedquad_run(form, *, num_clients, examples_per_client):
  """A FedAvg run of the FedQuad CNN on synthetic 8x8x3 data, with
  convolution form ``form``."""
  from benchmarks import scaling  # pylint: disable=g-import-not-at-top

  return scaling.synthetic_run(
    'fedavg',
    'fedquad_cnn',
    pool='stride',
    image_shape=(8, 8, 3),
    num_clients=num_clients,
    examples_per_client=examples_per_client,
    conv_impl=form,
  )


def test_bench_counts_the_same_flops_for_every_conv_form():
  """The bench's TFLOP/s credit the model's arithmetic as nn.Conv writes it:
  XLA counts no FLOPs inside a Pallas kernel, and the implicit form would
  otherwise look ~4x cheaper than it is (0.002 vs 0.008 TFLOP/s seen)."""
  from benchmarks import scaling  # pylint: disable=g-import-not-at-top

  counts = {}
  for form in ('xla', 'patches', 'implicit'):
    run = _fedquad_run(form, num_clients=2, examples_per_client=4)
    counts[form] = scaling.client_step_flops(run, 4)
  # The three 3x3 'SAME' convolutions' forward pass alone, 2 FLOPs per
  # multiply-add over the taps inside the image (XLA does not count the
  # zero padding's): (3n - 2)^2 taps per channel pair at n = 8, 4, 2, with
  # 3->64->128->256 channels, batch 4. Training is that and both gradients.
  conv_forward = 2 * 4 * (22**2 * 3 * 64 + 10**2 * 64 * 128 + 4**2 * 128 * 256)
  assert counts['xla'] > 2 * conv_forward
  assert counts['patches'] == counts['xla']
  assert counts['implicit'] == counts['xla']


def test_vmapped_round_same_result_with_every_conv_form():
  """A whole FedAvg round of the FedQuad CNN, vmapped over 3 clients with 2
  local steps in the engine's scan, trains the same global model with
  nn.Conv, patches and the implicit kernel. (Under the suite's
  jax_disable_most_optimizations this failed, the first two blocks'
  updates differing by tens of percent between forms, until
  layers.pool_2x2 chose its maxima in the forward pass.)"""
  from benchmarks import scaling  # pylint: disable=g-import-not-at-top
  from fedjax_metric import engine, executors  # pylint: disable=g-import-not-at-top

  updates, losses = {}, {}
  for form in ('xla', 'patches', 'implicit'):
    run = _fedquad_run(form, num_clients=3, examples_per_client=8)
    data = engine.DeviceData(run.images, run.labels)
    round_fn = executors.make_round_fn(
      run.spec, data, executor='vmap', steps_per_call=2
    )
    state, table = engine.init_state(run.algorithm, run.variables, 3)
    cohort = scaling.full_cohort(run, 0, local_steps=2, batch_size=4)
    with jax.default_matmul_precision('highest'):
      state, _, metrics = round_fn(state, table, cohort)
    params = state.variables['params']
    updates[form] = jax.tree.map(
      lambda new, old: np.asarray(new) - np.asarray(old),
      {k: v['kernel'] for k, v in params.items() if k.startswith('Conv')},
      {
        k: v['kernel']
        for k, v in run.variables['params'].items()
        if k.startswith('Conv')
      },
    )
    losses[form] = float(metrics['train_loss_sum'])
  for form in ('patches', 'implicit'):
    for layer, want in updates['xla'].items():
      got = updates[form][layer]
      # Relative to the round's update of that kernel (norm 0.01-0.04).
      assert np.linalg.norm(got - want) < 1e-3 * np.linalg.norm(want), (
        form,
        layer,
      )
    assert losses[form] == pytest.approx(losses['xla'], rel=1e-5)
