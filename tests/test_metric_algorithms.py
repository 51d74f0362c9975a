"""FedQuad family, MOON, FedRCL/FedSCL inside real rounds.

The softmax-regression fixture's embedding is its flattened input, so each
client loss can be re-derived in NumPy from the images alone.
"""

import fl_fixtures as fx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fedjax_metric import algorithms, engine, executors, optimizers
from fedjax_metric.models import split_variables

SERVER = optimizers.make_server_optimizer('sgd')


def build(name, model, **kwargs):
  return algorithms.REGISTRY[name](model, server_optimizer=SERVER, **kwargs)


def one_step_loss(
  alg, variables, images, labels, idx, mask, round_idx=0, client_row=()
):
  params, model_state = split_variables(variables)
  preprocess = fx.identity_preprocess()
  batch = engine.Batch(
    preprocess(jnp.asarray(images[idx]), None),
    jnp.asarray(labels[idx]),
    jnp.asarray(mask),
    jnp.asarray(images[idx]),
  )
  state = engine.ServerState(variables, (), jnp.asarray(round_idx), ())
  ctx = fx.client_context(state, client_row=client_row, num_examples=len(idx))
  loss, _ = alg.client_loss(params, model_state, batch, ctx)
  return float(loss)


def numpy_ce(variables, x, y):
  w = np.asarray(variables['params']['Dense_0']['kernel'], np.float64)
  b = np.asarray(variables['params']['Dense_0']['bias'], np.float64)
  z = x @ w + b
  z = z - z.max(1, keepdims=True)
  return np.mean(np.log(np.exp(z).sum(1)) - z[np.arange(len(y)), y])


@pytest.mark.parametrize('squared', [None, True])
def test_fedquad_loss_is_ce_plus_beta_quad_on_sampled_quadruplets(squared):
  """l = CE(anchors) + beta * mean[d_ap - d_an1 + m1]_+ + [d_ap - d_an2 + m2]_+
  (FedQuad, Goksu & Pugeault, arXiv 2025, Eq. 3 and Eq. 5), recomputed in
  NumPy: by default d is Eq. 5's Euclidean distance, with squared=True
  Algorithm 1's squared distance."""
  images, labels, parts, _ = fx.dirichlet_federation()
  model = fx.linear()
  variables = fx.init_variables(model, images)
  kwargs = {} if squared is None else {'squared': squared}
  for name, beta in [('fedquad', 0.5), ('quadrupletfl', 0.3)]:
    alg = build(name, model, beta=beta, **kwargs)
    idx, mask = alg.client_batches(
      parts[0],
      labels,
      np.random.default_rng(1),
      num_steps=3,
      batch_size=4,
      local_epochs=1,
      local_steps=3,
    )
    got = one_step_loss(alg, variables, images, labels, idx[0], mask[0])
    x = images[idx[0]].reshape(16, -1).astype(np.float64) / 255.0
    a, p, n1, n2 = x[:4], x[4:8], x[8:12], x[12:]
    power = 1.0 if squared else 0.5
    d = lambda u, v: ((u - v) ** 2).sum(1) ** power
    second = d(a, n2) if name == 'fedquad' else d(n1, n2)
    quad = np.maximum(d(a, p) - d(a, n1) + 1.0, 0) + np.maximum(
      d(a, p) - second + 0.5, 0
    )
    valid = mask[0, 4:8]
    expected = (
      numpy_ce(variables, a, labels[idx[0, :4]]) + beta * quad[valid].mean()
    )
    np.testing.assert_allclose(got, expected, rtol=1e-5, err_msg=name)


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


def test_bad_hyperparameters_are_errors():
  model = fx.linear()
  with pytest.raises(ValueError, match='beta'):
    build('fedquad', model, beta=-1.0)
  with pytest.raises(ValueError, match='form'):
    build('fedrcl', model, form='blog')
  with pytest.raises(ValueError, match='temperature'):
    build('moon', model, temperature=0.0)


# The levels FedRCL contrasts, per model it is run with (Seo et al., CVPR
# 2024, Sec. 4.4, and the authors' released ResNet18_base): the pre-ReLU
# output of the stem and of each stage's last block, global-average-pooled.
# name -> (model fields, [(module whose output is tapped, width)]).
FEDRCL_LEVELS = {
  'resnet18': (
    dict(width=4, norm='group', groups=2),
    [
      ('GroupNorm_0', 4),
      ('layer1_1', 4),
      ('layer2_1', 8),
      ('layer3_1', 16),
      ('layer4_1', 32),
    ],
  ),
  'small_cnn': (
    dict(width=4, embedding_dim=8, norm='group'),
    [('GroupNorm_0', 4), ('GroupNorm_1', 8)],
  ),
}


@pytest.mark.parametrize('name', sorted(FEDRCL_LEVELS))
def test_fedrcl_contrasts_each_models_pre_relu_stage_taps(name, monkeypatch):
  """What reaches FedRCL's loss is, level by level, the spatial mean of the
  tapped module's output (captured by flax, not read from 'features'):
  pre-ReLU (so some entries are negative), in stage order."""
  from fedjax_metric import losses, models  # pylint: disable=g-import-not-at-top

  fields, levels = FEDRCL_LEVELS[name]
  model = models.build(name, 10, (8, 8, 3), **fields)
  images = jax.random.normal(jax.random.key(0), (6, 8, 8, 3))
  variables = model.init(jax.random.key(1), images)
  seen = []
  loss_fn = losses.multilevel_relaxed_supcon_loss

  def recording(features, labels, **kwargs):
    seen.append(features)
    return loss_fn(features, labels, **kwargs)

  monkeypatch.setattr(losses, 'multilevel_relaxed_supcon_loss', recording)
  alg = algorithms.REGISTRY['fedrcl'](model, server_optimizer=SERVER)
  params, state = split_variables(variables)
  batch = engine.Batch(
    images, jnp.arange(6) % 3, jnp.ones(6, bool), images.astype(jnp.uint8)
  )
  ctx = fx.client_context(engine.ServerState(variables, (), jnp.int32(0)))
  alg.client_loss(params, state, batch, ctx)
  (features,) = seen
  _, captured = model.module.apply(
    variables,
    images,
    train=True,
    capture_intermediates=lambda mdl, _: mdl.name in dict(levels),
  )
  captured = captured['intermediates']
  assert len(features) == len(levels)
  for feature, (module, width) in zip(features, levels):
    tapped = np.asarray(captured[module]['__call__'][0])
    assert feature.shape == (6, width), module
    np.testing.assert_allclose(feature, tapped.mean(axis=(1, 2)), atol=1e-6)
    assert (tapped < 0).any(), f'{module}: a ReLU output has no negatives'


@pytest.mark.parametrize('server', ['adam', 'momentum'])
def test_fedrcl_composes_with_a_server_optimizer(server):
  """A client-side method with any server-side one (FedRCL's Table 5:
  FedAvgM / FedAdam + FedRCL), from the server optimizer alone. One round
  from the same start: FedAvg's new model gives the mean client delta d;
  FedAdam's first step (bias-corrected, m = g, v = g^2 with g = -d) must then
  be lr d / (|d| + eps), and FedAvgM's first step (no momentum yet) d."""
  images, labels, parts, data = fx.dirichlet_federation()
  model = fx.all_outputs()
  variables = fx.init_variables(model, images)
  lr, eps = 0.01, 1e-3

  def one_round(server_optimizer):
    alg = algorithms.REGISTRY['fedrcl'](
      model, server_optimizer=server_optimizer
    )
    (cohort,) = fx.round_cohorts(alg, parts, labels, [[0, 1, 3]])
    state, table = engine.init_state(alg, variables, len(parts))
    round_fn = executors.make_round_fn(
      fx.make_spec(alg, lr=0.05), data, executor='vmap'
    )
    state, _, _ = round_fn(state, table, cohort)
    return state.variables['params']

  start = variables['params']
  averaged = one_round(optimizers.make_server_optimizer('sgd'))
  if server == 'adam':
    got = one_round(
      optimizers.make_server_optimizer('adam', learning_rate=lr, eps=eps)
    )
  else:
    got = one_round(optimizers.make_server_optimizer('sgd', momentum=0.9))
  for p0, pa, pg in zip(
    jax.tree.leaves(start), jax.tree.leaves(averaged), jax.tree.leaves(got)
  ):
    d = np.asarray(pa, np.float64) - np.asarray(p0, np.float64)
    want = lr * d / (np.abs(d) + eps) if server == 'adam' else d
    np.testing.assert_allclose(
      np.asarray(pg) - np.asarray(p0), want, atol=2e-5, rtol=1e-3
    )
