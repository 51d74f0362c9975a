"""The supervised metric-learning family made faithful to its papers.

Per-local-epoch decay counted in anchors (FedQuad / TripletFL steps are 4B /
3B rows wide), FedRCL's Eq. 2 sum and the FedSCL forms, MOON's projection
head on every backbone (and MOON's configs), FedQuad without its
cross-entropy (Table V) and the embedding evaluation such a model needs.
Every number is checked against a float64 NumPy re-derivation.
"""

import importlib.util
import math
import os

import fl_fixtures as fx
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fedjax_metric import (
  algorithms,
  engine,
  executors,
  losses,
  models,
  optimizers,
)
from fedjax_metric.data import cohort as cohort_lib
from fedjax_metric.data import sources
from fedjax_metric.evaluation import embedding_knn
from fedjax_metric.models import split_variables

SERVER = optimizers.make_server_optimizer('sgd')
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def build(name, model, **kwargs):
  return algorithms.REGISTRY[name](model, server_optimizer=SERVER, **kwargs)


def load_config(name, arg):
  path = os.path.join(REPO, 'configs', f'{name}.py')
  spec = importlib.util.spec_from_file_location(f'cfg_{name}', path)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module.get_config(arg)


# ---------------------------------------------------------------------------
# Per-local-epoch learning-rate decay counts anchors, not rows.
# ---------------------------------------------------------------------------


def numpy_softmax_regression_sgd(
  w, b, images, labels, idx, mask, *, lr, decay, steps_per_epoch, anchors
):
  """SGD on the masked-mean CE of the anchors (the first ``anchors`` columns
  of each step), lr * decay ** (step // steps_per_epoch) at each step."""
  w, b = w.astype(np.float64).copy(), b.astype(np.float64).copy()
  for step in range(idx.shape[0]):
    rows, real = idx[step, :anchors], mask[step, :anchors]
    if not real.any():
      continue
    gw, gb = fx.ref_softmax_regression_grad(w, b, images, labels, rows, real)
    factor = decay ** (step // steps_per_epoch)
    w -= lr * factor * gw
    b -= lr * factor * gb
  return w, b


@pytest.mark.parametrize('name,groups', [('fedquad', 4), ('tripletfl', 3)])
def test_epoch_decay_switches_at_the_anchor_epoch_boundary(name, groups):
  """n = 24 examples, B = 4 anchors: an epoch is ceil(24 / 4) = 6 steps of
  4B (or 3B) rows, so over 2 epochs the rate is lr for steps 0-5 and
  lr * 0.5 for steps 6-11. Counting rows (4B = 16 wide -> 2 steps per
  epoch) would decay after step 1. With the softmax-regression fixture the
  metric term does not depend on the parameters, so the update is SGD on
  the anchors' CE, re-derived in NumPy."""
  images, labels = fx.make_data(24, seed=3)
  parts = [np.arange(24)]
  model = fx.linear()
  alg = build(name, model, beta=0.5)
  batch, epochs, lr, decay = 4, 2, 0.5, 0.5
  cohort = cohort_lib.make_cohort(
    np.array([0]),
    parts,
    num_slots=1,
    num_steps=12,
    batch_size=batch,
    local_epochs=epochs,
    local_steps=0,
    seed=0,
    round_idx=0,
    labels=labels,
    batches_fn=alg.client_batches,
  )
  assert cohort.example_idx.shape == (1, 12, groups * batch)
  spec = engine.RoundSpec(
    alg,
    optimizers.make_client_optimizer('sgd'),
    optimizers.make_round_schedule(lr),
    fx.identity_preprocess(),
    0,
    local_epoch_decay=decay,
    batch_size=batch,
  )
  variables = fx.init_variables(model, images)
  state, table = engine.init_state(alg, variables, 1)
  data = engine.DeviceData(jnp.asarray(images), jnp.asarray(labels))
  with jax.default_matmul_precision('highest'):
    round_fn = executors.make_round_fn(spec, data, executor='vmap')
    state, _, _ = round_fn(state, table, cohort)
  got = state.variables['params']['Dense_0']
  w0 = np.asarray(variables['params']['Dense_0']['kernel'])
  b0 = np.asarray(variables['params']['Dense_0']['bias'])
  args = (images, labels, cohort.example_idx[0], cohort.example_mask[0])
  want = numpy_softmax_regression_sgd(
    w0, b0, *args, lr=lr, decay=decay, steps_per_epoch=6, anchors=batch
  )
  np.testing.assert_allclose(got['kernel'], want[0], rtol=1e-4, atol=1e-5)
  np.testing.assert_allclose(got['bias'], want[1], rtol=1e-4, atol=1e-5)
  rows_counted = numpy_softmax_regression_sgd(
    w0,
    b0,
    *args,
    lr=lr,
    decay=decay,
    steps_per_epoch=math.ceil(24 / (groups * batch)),
    anchors=batch,
  )
  assert np.max(np.abs(rows_counted[0] - want[0])) > 1e-3  # Discriminates.


# ---------------------------------------------------------------------------
# FedRCL Eq. 2 and the FedSCL forms.
# ---------------------------------------------------------------------------


def np_cos(f):
  f = np.asarray(f, np.float64)
  z = f / np.maximum(np.linalg.norm(f, axis=1, keepdims=True), 1e-12)
  return z @ z.T


def ref_eq2(f, y, t, reduction, mask=None):
  """FedRCL Eq. 2 (sum over positives) or Khosla's L_out (mean), loops."""
  s, b = np_cos(f), len(f)
  real = [True] * b if mask is None else list(mask)
  out = np.zeros(b)
  for i in range(b):
    if not real[i]:
      continue
    denom = sum(math.exp(s[i, k] / t) for k in range(b) if k != i and real[k])
    positives = [j for j in range(b) if j != i and real[j] and y[j] == y[i]]
    terms = [-math.log(math.exp(s[i, j] / t) / denom) for j in positives]
    if terms:
      out[i] = sum(terms) / (len(terms) if reduction == 'mean' else 1)
  return out


def ref_code_scl(f, y, t, mask=None):
  """The released CLLoss supervised pair: the least similar same-class
  sample (self included) against the two most similar other-class ones."""
  s, b = np_cos(f), len(f)
  real = [True] * b if mask is None else list(mask)
  out = np.zeros(b)
  for i in range(b):
    if not real[i]:
      continue
    same = [s[i, j] for j in range(b) if real[j] and y[j] == y[i]]
    others = sorted(
      (s[i, j] for j in range(b) if real[j] and y[j] != y[i]), reverse=True
    )[:2]
    if not others:
      continue
    pos = math.exp(min(same) / t)
    out[i] = -math.log(pos / (pos + sum(math.exp(o / t) for o in others)))
  return out


def test_supcon_sum_is_fedrcl_eq2_and_mean_is_khosla():
  rng = np.random.default_rng(0)
  f = rng.normal(size=(9, 5)).astype(np.float32)
  y = np.array([0, 1, 0, 2, 1, 0, 3, 1, 2])
  mask = np.array([1, 1, 1, 1, 0, 1, 1, 1, 1], bool)
  with jax.default_matmul_precision('highest'):
    for reduction in ('sum', 'mean'):
      got = losses.supcon_loss(
        f, y, temperature=0.2, reduction=reduction, mask=mask
      )
      np.testing.assert_allclose(
        got, ref_eq2(f, y, 0.2, reduction, mask), rtol=1e-5, atol=1e-6
      )
    grad = jax.grad(
      lambda x: jnp.sum(
        losses.supcon_loss(x, y, reduction='sum', mask=np.zeros(9, bool))
      )
    )(jnp.zeros((9, 5)))
  assert np.all(np.isfinite(grad))
  with pytest.raises(ValueError, match='reduction'):
    losses.supcon_loss(f, y, reduction='max')


@pytest.mark.parametrize('form', losses.SCL_FORMS)
def test_multilevel_supcon_forms(form):
  rng = np.random.default_rng(1)
  y = np.array([0, 0, 1, 1, 1, 2, 0, 2])
  levels = [rng.normal(size=(8, d)).astype(np.float32) for d in (3, 6)]
  mask = np.array([1, 1, 1, 1, 1, 1, 1, 0], bool)
  ref = {
    'code': lambda f: ref_code_scl(f, y, 0.1, mask),
    'paper': lambda f: ref_eq2(f, y, 0.1, 'sum', mask),
    'khosla': lambda f: ref_eq2(f, y, 0.1, 'mean', mask),
  }[form]
  with jax.default_matmul_precision('highest'):
    got = losses.multilevel_supcon_loss(
      levels, y, temperature=0.1, form=form, mask=mask
    )
    grads = jax.grad(
      lambda *ls: jnp.sum(
        losses.multilevel_supcon_loss(list(ls), y, form=form, mask=mask)
      ),
      argnums=(0, 1),
    )(*[jnp.zeros_like(f) for f in levels])
  np.testing.assert_allclose(
    got, (ref(levels[0]) + ref(levels[1])) / 2, rtol=1e-5, atol=1e-6
  )
  assert all(np.all(np.isfinite(g)) for g in grads)


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


def one_step_loss(alg, variables, images, labels, idx, mask):
  params, model_state = split_variables(variables)
  batch = engine.Batch(
    fx.identity_preprocess()(jnp.asarray(images[idx]), None),
    jnp.asarray(labels[idx]),
    jnp.asarray(mask),
    jnp.asarray(images[idx]),
  )
  ctx = fx.client_context(
    engine.ServerState(variables, (), jnp.asarray(0), ()),
    num_examples=len(idx),
  )
  with jax.default_matmul_precision('highest'):
    loss, _ = alg.client_loss(params, model_state, batch, ctx)
  return float(loss)


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


# ---------------------------------------------------------------------------
# MOON's projection head on every backbone.
# ---------------------------------------------------------------------------


BACKBONES = {
  'small_cnn': {'width': 4, 'embedding_dim': 8},
  'fedquad_cnn': {'widths': (4, 8, 16), 'embedding_dim': 8, 'norm': 'batch'},
  'resnet18': {'width': 2},
}


@pytest.mark.parametrize('name', sorted(BACKBONES))
def test_projection_head_feeds_the_classifier(name):
  """z = l2(relu(l1(h))) with l1: d_h -> d_h, logits = classifier(z) (MOON,
  model.py ModelFedCon), where h is what the same backbone without a head
  returns as its embedding."""
  kwargs = BACKBONES[name]
  images = np.random.default_rng(0).normal(size=(3, 8, 8, 1)).astype(np.float32)
  head = models.build(name, 5, (8, 8, 1), projection_dim=6, **kwargs)
  plain = models.build(name, 5, (8, 8, 1), **kwargs)
  variables = head.init(jax.random.key(1))
  params, model_state = split_variables(variables)
  classifier_name = 'fc' if name == 'resnet18' else 'Dense_1'
  plain_params = plain.init(jax.random.key(1))['params']
  assert sorted(params) == sorted([*plain_params, 'projection_head'])
  # The head's trunk with the plain model's own classifier (h ignores it).
  trunk = {k: v for k, v in params.items() if k != 'projection_head'}
  trunk[classifier_name] = plain_params[classifier_name]
  with jax.default_matmul_precision('highest'):
    out, _ = head.apply(params, model_state, images, train=False)
    h, _ = plain.apply(trunk, model_state, images, train=False)
  h = np.asarray(h['embedding'], np.float64)
  l1 = params['projection_head']['l1']
  l2 = params['projection_head']['l2']
  assert l1['kernel'].shape == (h.shape[1], h.shape[1])
  z = np.maximum(h @ np.asarray(l1['kernel'], np.float64) + l1['bias'], 0)
  z = z @ np.asarray(l2['kernel'], np.float64) + l2['bias']
  classifier = params[classifier_name]
  logits = z @ np.asarray(classifier['kernel'], np.float64) + classifier['bias']
  assert out['embedding'].shape == (3, 6)
  np.testing.assert_allclose(out['embedding'], z, rtol=1e-4, atol=1e-5)
  np.testing.assert_allclose(out['logits'], logits, rtol=1e-4, atol=1e-5)


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


# ---------------------------------------------------------------------------
# FedQuad without l_ce (Table V) and its evaluation.
# ---------------------------------------------------------------------------


def test_fedquad_without_cross_entropy_is_beta_times_the_metric_term():
  images, labels = fx.make_data(30, seed=6)
  model = fx.linear()
  variables = fx.init_variables(model, images)
  alg = build('fedquad', model, beta=0.5, cross_entropy=False)
  idx, mask = alg.client_batches(
    np.arange(30),
    labels,
    np.random.default_rng(2),
    num_steps=2,
    batch_size=5,
    local_epochs=1,
    local_steps=2,
  )
  x = images[idx[0]].reshape(20, -1).astype(np.float64) / 255.0
  a, p, n1, n2 = x[:5], x[5:10], x[10:15], x[15:]
  d = lambda u, v: np.sqrt(((u - v) ** 2).sum(1))
  quad = np.maximum(d(a, p) - d(a, n1) + 1.0, 0) + np.maximum(
    d(a, p) - d(a, n2) + 0.5, 0
  )
  got = one_step_loss(alg, variables, images, labels, idx[0], mask[0])
  np.testing.assert_allclose(got, 0.5 * quad[mask[0, 5:10]].mean(), rtol=1e-5)
  with pytest.raises(ValueError, match='beta'):
    build('fedquad', model, beta=0.0, cross_entropy=False)
  config = load_config('fedquad', 'iid,no_ce')
  assert config.algorithm_kwargs.cross_entropy is False
  assert config.eval_protocol == 'embedding_knn'
  assert load_config('fedquad', '').algorithm_kwargs.squared is False


def test_embedding_knn_protocol_matches_a_numpy_knn():
  """The bank is the union of the clients' examples (not the whole train
  split), embeddings are the preprocessed pixels (softmax-regression
  fixture), k is clamped to the bank size, votes are exp(cos / 0.1)."""
  rng = np.random.default_rng(7)
  centers = rng.integers(0, 256, (3, 6, 6, 1))

  def split(n):
    y = rng.integers(0, 3, n).astype(np.int32)
    x = np.clip(centers[y] + rng.normal(0, 60, (n, 6, 6, 1)), 0, 255)
    return sources.ArrayDataset(x.astype(np.uint8), y, 3)

  train, test = split(40), split(25)
  clients = [np.arange(0, 12), np.arange(20, 30)]  # 18 examples unused.
  model = fx.linear()
  variables = fx.init_variables(model, train.images)
  with jax.default_matmul_precision('highest'):
    every, final = embedding_knn.make_embedding_fns(
      model, fx.identity_preprocess(), train, test, clients, batch_size=16
    )
    metrics = every(variables)
    probe = final(variables)
  bank = np.concatenate(clients)
  xb = train.images[bank].reshape(len(bank), -1).astype(np.float64) / 255
  xt = test.images.reshape(25, -1).astype(np.float64) / 255
  xb /= np.linalg.norm(xb, axis=1, keepdims=True)
  xt /= np.linalg.norm(xt, axis=1, keepdims=True)
  correct = 0
  for i in range(25):
    votes = np.zeros(3)
    for j in range(len(bank)):
      votes[train.labels[bank[j]]] += math.exp(xt[i] @ xb[j] / 0.1)
    correct += int(np.argmax(votes) == test.labels[i])
  assert metrics['test_knn_accuracy'] == pytest.approx(correct / 25)
  assert 0.0 <= metrics['test_accuracy'] <= 1.0  # The logits, beside it.
  assert set(probe) == {'test_linear_probe_accuracy'}
  assert probe['test_linear_probe_accuracy'] > 0.8  # Separable classes.
