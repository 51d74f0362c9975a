"""FedMLB (Kim, Kim and Han, ICML 2022) against independent references.

Eq. 4: L = CE(z, y) + lambda_1 / B sum_b CE(h_b, y)
           + lambda_2 / B sum_b KL(softmax(h_b / tau) || softmax(z / tau)),
h_b the logits of hybrid pathway b: the local model's blocks up to branch
point b, then the frozen global model's. The references build each hybrid
pathway another way, by splicing parameter trees (local blocks below the
branch point, global ones above) and running the plain model, and compute
the loss in float64 NumPy.
"""

import fl_fixtures as fx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fedjax_metric import algorithms, engine, losses, models, optimizers
from fedjax_metric.algorithms import fedmlb
from fedjax_metric.models import split_variables

SERVER = optimizers.make_server_optimizer('sgd')


def np_log_softmax(logits):
  shifted = logits - logits.max(-1, keepdims=True)
  return shifted - np.log(np.exp(shifted).sum(-1, keepdims=True))


def np_kl(target_logits, logits, tau):
  """KL(softmax(target / tau) || softmax(logits / tau)) per example, by a loop."""
  out = []
  for t, s in zip(target_logits, logits, strict=True):
    log_p, log_q = np_log_softmax(t / tau), np_log_softmax(s / tau)
    out.append(sum(np.exp(a) * (a - b) for a, b in zip(log_p, log_q)))
  return np.array(out)


def np_ce(logits, labels):
  return -np_log_softmax(logits)[np.arange(len(labels)), labels]


def test_branch_distillation_is_kl_from_the_hybrid_to_the_main_pathway():
  rng = np.random.default_rng(0)
  main, hybrid = rng.normal(size=(2, 5, 4)) * 3
  for tau in (1.0, 2.5):
    np.testing.assert_allclose(
      losses.branch_distillation(jnp.asarray(main), jnp.asarray(hybrid), tau),
      np_kl(hybrid, main, tau),
      rtol=1e-5,
      atol=1e-6,
    )
  # Both sides get gradient: neither is detached (the authors' code).
  grads = jax.grad(
    lambda m, h: losses.branch_distillation(m, h).sum(), argnums=(0, 1)
  )(jnp.asarray(main), jnp.asarray(hybrid))
  assert all(float(jnp.abs(g).max()) > 1e-3 for g in grads)


# Branch point -> the parameter subtrees at or below it, per model.
SMALL_CNN_BLOCKS = (
  ('Conv_0', 'GroupNorm_0'),
  ('Conv_1', 'GroupNorm_1'),
  ('Dense_0',),
)
RESNET_BLOCKS = (
  ('conv1', 'GroupNorm_0'),
  ('layer1_0', 'layer1_1'),
  ('layer2_0', 'layer2_1'),
  ('layer3_0', 'layer3_1'),
  ('layer4_0', 'layer4_1'),
)


def spliced(local, global_, blocks, level):
  """The parameters of hybrid pathway ``level``: local blocks up to it."""
  mine = {name for block in blocks[: level + 1] for name in block}
  return {name: (local if name in mine else global_)[name] for name in global_}


@pytest.mark.parametrize(
  'name, kwargs, blocks',
  [
    (
      'small_cnn',
      dict(width=2, embedding_dim=4, norm='group'),
      SMALL_CNN_BLOCKS,
    ),
    ('resnet18', dict(width=2, norm='group'), RESNET_BLOCKS),
  ],
)
def test_hybrid_pathways_and_client_loss_match_spliced_models(
  name, kwargs, blocks
):
  """Every hybrid pathway is the plain model on spliced parameters, and the
  client loss is Eq. 4 of their logits (NumPy, float64), with a padding row;
  for the small CNN its gradient is that of the spliced formulation (the
  graft is model-independent; ResNet-18's gradient programs are slow to
  compile)."""
  model = models.build(name, 3, (8, 8, 1), **kwargs)
  local = model.init(jax.random.key(0))
  global_ = model.init(jax.random.key(1))
  rng = np.random.default_rng(0)
  images = jnp.asarray(rng.normal(size=(5, 8, 8, 1)), jnp.float32)
  labels = jnp.asarray([0, 2, 1, 1, 0])
  mask = jnp.asarray([True, True, True, True, False])
  weights, tau = (0.7, 1.3), 2.0

  def spliced_logits(local_params):
    main = model.apply(local_params, {}, images, train=True)[0]['logits']
    hybrid = [
      model.apply(
        spliced(local_params, global_['params'], blocks, level),
        {},
        images,
        train=False,
      )[0]['logits']
      for level in range(len(blocks))
    ]
    return main, hybrid

  def grafted_logits(local_params):
    outputs, _ = model.apply(local_params, {}, images, train=True)
    return fedmlb.hybrid_logits(model, global_, images, outputs['stages'])

  alg = algorithms.REGISTRY['fedmlb'](
    model,
    server_optimizer=SERVER,
    ce_weight=weights[0],
    kl_weight=weights[1],
    temperature=tau,
  )
  batch = engine.Batch(images, labels, mask, images)
  ctx = fx.client_context(engine.ServerState(global_, (), jnp.int32(0)))

  def client_loss(local_params):
    return alg.client_loss(local_params, {}, batch, ctx)

  def reference_total(local_params):
    main, hybrid = spliced_logits(local_params)
    ce = losses.masked_mean(losses.softmax_cross_entropy(main, labels), mask)
    terms = [
      weights[0] * losses.softmax_cross_entropy(h, labels)
      + weights[1] * losses.branch_distillation(main, h, tau)
      for h in hybrid
    ]
    return ce + losses.masked_mean(sum(terms) / len(terms), mask)

  # Each piece one jitted program: eager flax applies took most of the time.
  with jax.default_matmul_precision('highest'):
    main, hybrid = jax.jit(spliced_logits)(local['params'])
    grafted = jax.jit(grafted_logits)(local['params'])
    loss, (_, aux) = jax.jit(client_loss)(local['params'])
    if name == 'small_cnn':  # ResNet-18's gradient programs: 20 s compiles
      got = jax.jit(jax.grad(lambda p: client_loss(p)[0]))(local['params'])
      want = jax.jit(jax.grad(reference_total))(local['params'])
  assert len(grafted) == len(blocks)
  for level, (a, b) in enumerate(zip(grafted, hybrid, strict=True)):
    np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5, err_msg=level)

  real = np.asarray(mask)
  y = np.asarray(labels)[real]
  z = np.asarray(main, np.float64)[real]
  hs = [np.asarray(h, np.float64)[real] for h in hybrid]
  ce = np_ce(z, y).mean()
  ce_hybrid = np.mean([np_ce(h, y).mean() for h in hs])
  kl = np.mean([np_kl(h, z, tau).mean() for h in hs])
  np.testing.assert_allclose(aux['ce'], ce, rtol=1e-5)
  np.testing.assert_allclose(aux['ce_hybrid'], ce_hybrid, rtol=1e-5)
  np.testing.assert_allclose(aux['kl'], kl, rtol=1e-4, atol=1e-7)
  np.testing.assert_allclose(
    loss, ce + weights[0] * ce_hybrid + weights[1] * kl, rtol=1e-5
  )
  if name == 'small_cnn':
    np.testing.assert_allclose(
      fx.max_abs_diff(got, want),
      0.0,
      atol=1e-5 * (1 + fx.max_abs_diff(want, 0)),
    )


def test_the_global_model_is_frozen_and_local_equals_global_is_plain_ce():
  """With the local model equal to the global one every hybrid pathway is
  the main one: the KL term is 0 and the hybrid CE is the CE. No gradient
  reaches the global variables."""
  model = fx.cnn()
  images, labels = fx.make_data(8)
  x = fx.identity_preprocess()(jnp.asarray(images), None)
  variables = fx.init_variables(model, images)
  params, state = split_variables(variables)
  alg = algorithms.REGISTRY['fedmlb'](model, server_optimizer=SERVER)
  batch = engine.Batch(x, jnp.asarray(labels), jnp.ones(8, bool), x)

  def loss_of(global_variables):
    ctx = fx.client_context(
      engine.ServerState(global_variables, (), jnp.int32(0))
    )
    return alg.client_loss(params, state, batch, ctx)

  loss, (_, aux) = loss_of(variables)
  assert abs(float(aux['kl'])) < 1e-6
  np.testing.assert_allclose(aux['ce_hybrid'], aux['ce'], rtol=1e-5)
  np.testing.assert_allclose(loss, 2 * aux['ce'], rtol=1e-5)
  global_grad = jax.grad(lambda v: loss_of(v)[0])(variables)
  assert (
    fx.max_abs_diff(global_grad, jax.tree.map(jnp.zeros_like, variables)) == 0
  )


@pytest.mark.parametrize(
  'kwargs, match',
  [
    (dict(ce_weight=-1.0), 'ce_weight must be >= 0'),
    (dict(kl_weight=-0.1), 'kl_weight must be >= 0'),
    (dict(temperature=0.0), 'temperature must be > 0'),
  ],
)
def test_bad_options_are_named(kwargs, match):
  with pytest.raises(ValueError, match=match):
    algorithms.REGISTRY['fedmlb'](fx.cnn(), server_optimizer=SERVER, **kwargs)


def test_a_model_without_branch_points_is_refused_by_name():
  alg = algorithms.REGISTRY['fedmlb'](fx.linear(), server_optimizer=SERVER)
  model = fx.linear()
  images, labels = fx.make_data(4)
  x = fx.identity_preprocess()(jnp.asarray(images), None)
  variables = fx.init_variables(model, images)
  params, state = split_variables(variables)
  ctx = fx.client_context(engine.ServerState(variables, (), jnp.int32(0)))
  batch = engine.Batch(x, jnp.asarray(labels), jnp.ones(4, bool), x)
  with pytest.raises(ValueError, match="small_cnn' or 'resnet18'"):
    alg.client_loss(params, state, batch, ctx)


def test_a_graft_of_the_wrong_shape_or_level_is_refused():
  model = models.build('small_cnn', 3, (8, 8, 1), width=2, embedding_dim=4)
  variables = model.init(jax.random.key(0))
  images = jnp.zeros((2, 8, 8, 1))
  with pytest.raises(ValueError, match='branch point 2 has shape'):
    model.apply(
      variables['params'], {}, images, train=False, graft=(2, jnp.zeros((2, 5)))
    )
  with pytest.raises(ValueError, match=r'graft level must be in \[0, 3\)'):
    model.apply(
      variables['params'], {}, images, train=False, graft=(3, jnp.zeros((2, 4)))
    )
