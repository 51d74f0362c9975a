"""FedRCL and FedSCL: the feature levels FedRCL contrasts, its composition
with a server optimizer, and FedSCL's client loss against NumPy."""

import fl_fixtures as fx
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fedjax_metric import algorithms, engine, executors, models, optimizers
from fedjax_metric.models import split_variables

from .metric_helpers import SERVER, build, one_step_loss, ref_code_scl, ref_eq2

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


class TwoLevels(nn.Module):
  """Softmax regression whose feature levels are halves of the input."""

  num_classes: int = fx.NUM_CLASSES

  @nn.compact
  def __call__(self, images, *, train, mask=None):
    del train, mask
    x = images.reshape(images.shape[0], -1)
    return {
      'logits': nn.Dense(self.num_classes)(x),
      'embedding': x,
      'features': [x[:, :18], x[:, 18:]],
    }


def numpy_ce(variables, x, y, mask):
  w = np.asarray(variables['params']['Dense_0']['kernel'], np.float64)
  b = np.asarray(variables['params']['Dense_0']['bias'], np.float64)
  z = x @ w + b
  z = z - z.max(1, keepdims=True)
  ce = np.log(np.exp(z).sum(1)) - z[np.arange(len(y)), y]
  return ce[mask].mean()


@pytest.mark.parametrize('form', ['code', 'paper'])
def test_fedscl_client_loss_is_ce_plus_mean_over_levels(form):
  images, labels = fx.make_data(10, seed=4)
  model = models.make_model_fns(TwoLevels(), fx.INPUT_SHAPE)
  variables = fx.init_variables(model, images)
  idx, mask = np.arange(10), np.array([1] * 9 + [0], bool)
  alg = build('fedscl', model, temperature=0.5, form=form)
  x = images.reshape(10, -1).astype(np.float64) / 255.0
  ref = (
    ref_code_scl
    if form == 'code'
    else (lambda f, y, t, m: ref_eq2(f, y, t, 'sum', m))
  )
  term = (
    ref(x[:, :18], labels, 0.5, mask) + ref(x[:, 18:], labels, 0.5, mask)
  ) / 2
  want = numpy_ce(variables, x, labels, mask) + term[mask].mean()
  np.testing.assert_allclose(
    one_step_loss(alg, variables, images, labels, idx, mask), want, rtol=1e-5
  )
  with pytest.raises(ValueError, match='form'):
    build('fedscl', model, form='sum')
