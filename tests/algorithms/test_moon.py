"""MOON: its client loss and client table inside rounds, its configs, and
training with a projection-head model."""

import fl_fixtures as fx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fedjax_metric import engine, executors, models
from fedjax_metric.models import split_variables

from .metric_helpers import build, load_config, numpy_ce, one_step_loss


def test_moon_loss_round_zero_and_later():
  """Embedding = input for every model, so all cosines are 1 and
  l_con = -log(e^(1/t) / (e^(1/t) + e^(1/t))) = log 2 after round 0."""
  images, labels, parts, _ = fx.dirichlet_federation()
  model = fx.linear()
  alg = build('moon', model, mu=2.0)
  variables = fx.init_variables(model, images)
  idx = parts[0][:6]
  mask = np.ones(6, bool)
  x = images[idx].reshape(6, -1).astype(np.float64) / 255.0
  ce = numpy_ce(variables, x, labels[idx])
  row = model.init(jax.random.key(5))
  np.testing.assert_allclose(
    one_step_loss(alg, variables, images, labels, idx, mask, 0, row),
    ce,
    rtol=1e-5,
  )
  np.testing.assert_allclose(
    one_step_loss(alg, variables, images, labels, idx, mask, 3, row),
    ce + 2.0 * np.log(2.0),
    rtol=1e-5,
  )


def test_moon_table_holds_random_inits_then_local_models():
  images, labels, parts, data = fx.dirichlet_federation()
  model = fx.cnn()
  alg = build('moon', model)
  variables = fx.init_variables(model, images)
  state, table = engine.init_state(
    alg, variables, len(parts), key=jax.random.key(9)
  )
  kernels = np.asarray(table['params']['Conv_0']['kernel'])
  assert not np.allclose(kernels[0], kernels[1])  # independent random inits
  round_fn = executors.make_round_fn(fx.make_spec(alg), data, executor='vmap')
  c = fx.round_cohorts(alg, parts, labels, [[2]])[0]
  before = np.asarray(table['params']['Conv_0']['kernel'])
  new_state, table, _ = round_fn(state, table, c)
  after = np.asarray(table['params']['Conv_0']['kernel'])
  np.testing.assert_array_equal(after[[0, 1, 3]], before[[0, 1, 3]])
  assert not np.allclose(after[2], before[2])
  # Client 2's row is its local model: global + its (only) delta.
  np.testing.assert_allclose(
    after[2], new_state.variables['params']['Conv_0']['kernel'], atol=1e-6
  )


def test_moon_configs_put_a_head_on_every_backbone():
  fq = load_config('moon', 'setting=fedquad,model=small_cnn,alpha=0.3')
  assert fq.model.projection_dim == 256 and fq.model.name == 'small_cnn'
  # FedQuad's protocol: "Adam ... 0.001 for all approaches".
  assert (fq.local.optimizer, fq.local.learning_rate) == ('adam', 1e-3)
  assert (fq.local.batch_size, fq.local.epochs, fq.num_rounds) == (128, 5, 20)
  assert fq.partition.alpha == 0.3
  fq_paper = load_config('moon', 'setting=fedquad')
  assert fq_paper.model.name == 'fedquad_cnn'
  assert fq_paper.model.projection_dim == 256
  rcl = load_config('moon', 'setting=fedrcl,alpha=0.1')
  assert (rcl.model.name, rcl.model.projection_dim) == ('resnet18', 256)
  assert (rcl.local.optimizer, rcl.local.learning_rate) == ('sgd', 0.1)
  assert (rcl.clients_per_round, rcl.num_clients) == (5, 100)
  own = load_config('moon', '')
  assert own.model.name == 'moon_cnn' and own.local.optimizer == 'sgd'
  prox = load_config('fedprox', 'setting=fedrcl,alpha=0.1')
  assert prox.algorithm == 'fedprox' and prox.server.weighting == 'uniform'
  assert prox.eval_every == 1  # FedRCL's EMA needs per-round evaluations.
  with pytest.raises(ValueError, match='setting'):
    load_config('moon', 'setting=moon')


def test_moon_trains_with_a_projection_head_model():
  images, labels = fx.make_data(24, seed=5)
  model = models.make_model_fns(
    models.small_cnn.SmallCNN(
      num_classes=fx.NUM_CLASSES, width=4, embedding_dim=8, projection_dim=6
    ),
    fx.INPUT_SHAPE,
  )
  alg = build('moon', model, mu=1.0)
  variables = fx.init_variables(model, images)
  params, model_state = split_variables(variables)
  batch = engine.Batch(
    fx.identity_preprocess()(jnp.asarray(images), None),
    jnp.asarray(labels),
    jnp.ones(24, bool),
    jnp.asarray(images),
  )
  row = model.init(jax.random.key(7))
  ctx = fx.client_context(
    engine.ServerState(variables, (), jnp.asarray(2), ()),
    client_row=row,
    num_examples=24,
  )
  (loss, (_, metrics)), grads = jax.value_and_grad(
    alg.client_loss, has_aux=True
  )(params, model_state, batch, ctx)
  # The global model is the one being trained: cos(z, z_glob) = 1.
  out, _ = model.apply(params, model_state, batch.images, train=False)
  prev, _ = model.apply(row['params'], {}, batch.images, train=False)
  z, zp = (
    np.asarray(out['embedding'], np.float64),
    np.asarray(prev['embedding'], np.float64),
  )
  cos = (z * zp).sum(1) / np.linalg.norm(z, axis=1) / np.linalg.norm(zp, axis=1)
  want = np.mean(np.log(np.exp(2.0) + np.exp(cos / 0.5)) - 2.0)
  np.testing.assert_allclose(metrics['metric'], want, rtol=1e-4)
  head_grad = grads['projection_head']['l2']['kernel']
  assert np.all(np.isfinite(head_grad)) and np.any(head_grad != 0)
