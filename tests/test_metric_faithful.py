"""The supervised metric-learning family made faithful to its papers: the
parts outside the algorithms.

Per-local-epoch decay counted in anchors (FedQuad / TripletFL steps are 4B /
3B rows wide), FedRCL's Eq. 2 sum and the FedSCL forms of the contrastive
losses, MOON's projection head on every backbone, and the embedding
evaluation that FedQuad without its cross-entropy (Table V) needs. Every
number is checked against a float64 NumPy re-derivation. The algorithms'
own checks (FedSCL's client loss, MOON with a head and its configs, FedQuad
without l_ce) are in tests/algorithms/ (test_fedrcl.py, test_moon.py,
test_fedquad.py).
"""

import math

from algorithms.metric_helpers import build, ref_code_scl, ref_eq2
import fl_fixtures as fx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fedjax_metric import engine, executors, losses, models, optimizers
from fedjax_metric.data import cohort as cohort_lib
from fedjax_metric.data import sources
from fedjax_metric.evaluation import embedding_knn
from fedjax_metric.models import split_variables

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
# FedRCL Eq. 2 and the FedSCL forms of the loss.
# ---------------------------------------------------------------------------


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


# ---------------------------------------------------------------------------
# The evaluation of FedQuad without l_ce (Table V).
# ---------------------------------------------------------------------------


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
