"""The precision policy: full float32, the platform default, bf16 compute."""

import fl_fixtures as fx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fedjax_metric import executors, experiment, models


def small_cnn(compute_dtype=None):
  return models.build(
    'small_cnn',
    3,
    (6, 6, 1),
    compute_dtype=compute_dtype,
    width=4,
    embedding_dim=8,
    norm='batch',
  )


def test_bf16_compute_keeps_float32_variables_and_outputs():
  images, _ = fx.make_data(8)
  x = jnp.asarray(images, jnp.float32) / 255.0
  f32, bf16 = small_cnn(), small_cnn(jnp.bfloat16)
  variables = f32.init(jax.random.key(0), x)
  params, state = models.split_variables(variables)
  mask = jnp.ones((8,), bool)
  out32, new32 = f32.apply(params, state, x, train=True, mask=mask)
  out16, new16 = bf16.apply(params, state, x, train=True, mask=mask)
  assert out16['logits'].dtype == jnp.float32
  assert jax.tree.map(lambda a: a.dtype, new16) == jax.tree.map(
    lambda a: a.dtype, new32
  )
  # bf16 keeps 8 mantissa bits: close to float32, but not equal to it.
  np.testing.assert_allclose(out16['logits'], out32['logits'], atol=5e-2)
  assert np.abs(np.asarray(out16['logits'] - out32['logits'])).max() > 0

  def loss(p, model):
    return jnp.sum(model.apply(p, state, x, train=True, mask=mask)[0]['logits'])

  grads = jax.grad(loss)(params, bf16)
  assert all(g.dtype == jnp.float32 for g in jax.tree.leaves(grads))
  assert all(np.all(np.isfinite(g)) for g in jax.tree.leaves(grads))


def test_precision_names():
  # Conftest pins 'highest' for the suite; each name sets its own level and
  # the previous one comes back after the block.
  before = jax.config.jax_default_matmul_precision
  for name, level in (('highest', 'highest'), ('default', 'default')):
    with executors.matmul_precision(name):
      assert jax.config.jax_default_matmul_precision == level
    assert jax.config.jax_default_matmul_precision == before
  with pytest.raises(ValueError, match='config.precision'):
    executors.matmul_precision('fp8')


def test_a_bf16_run_trains(tmp_path):
  from configs import fedavg  # pylint: disable=g-import-not-at-top

  config = fedavg.get_config('runlocal')
  config.unlock()
  config.precision = 'bf16'
  config.progress = config.plot_partition = False
  summary = experiment.run(config, str(tmp_path / 'bf16'))
  assert summary['rounds_completed'] == 2
  assert np.isfinite(summary['train_loss'])
  # The same run in float32 starts from the same model and data: bf16
  # compute changes its loss, but only by bf16's rounding.
  config.precision = 'highest'
  reference = experiment.run(config, str(tmp_path / 'f32'))
  assert summary['train_loss'] != reference['train_loss']
  np.testing.assert_allclose(
    summary['train_loss'], reference['train_loss'], rtol=5e-2
  )
