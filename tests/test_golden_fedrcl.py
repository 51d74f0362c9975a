"""FedRCL, FedSCL and FedAGM against their authors' released code.

The fixtures were written by scripts that run the authors' code unchanged
(float64, fp16 autocast off; stubs only for data, model, device, evaluation
and import-only packages); they need no torch here:

  * tests/golden/fedrcl.npz (benchmarks/crosscheck/fedrcl.py,
    skynbe/FedRCL clients/rcl_client.py RCLClient._algorithm_rcl and
    utils/loss.py CLLoss): the multi-level relaxed supervised contrastive
    loss, its per-example 'scl' and 'penalty' terms per level and its
    gradient w.r.t. the feature maps, for four (temperature, threshold,
    beta) settings, the first the released default, on three batches (one
    with singleton classes and collapsed classes, one whose anchors mostly
    have fewer negatives than topk_neg, one of a single class); FedSCL as
    the same config without its penalty pair.
  * tests/golden/fedrcl_rounds.npz (the same script, Trainer.train with
    RCLClient and the plain-mean Server; 'rcl_fedacg': FedRCL behind
    FedACG's server): three rounds of three clients of a 5-level MLP.
  * tests/golden/fedagm.npz (benchmarks/crosscheck/fedagm.py,
    geehokim/FedACG Trainer.train, servers/base.py ServerM and
    clients/base_client.py Client): FedACG's (FedAGM's) and FedAvgM's server
    on fixed client deltas, and three whole FedACG rounds of softmax
    regression with the proximal client.

Tolerances: the losses and gradients and the server on fixed deltas agree
to ~1e-15 in float64 (compared at rtol 1e-12, atol 1e-13). Whole rounds run
fedjax_metric's engine, which is float32: FedAGM's softmax regression agrees
to ~1e-7 (atol 1e-6); FedRCL's MLP to ~1e-5 (atol 5e-5: the hard-mined loss
at temperature 0.05 and the threshold make its gradient jump where a
similarity crosses another, and float32 rounding moves such crossings).
FedRCL's rounds are also run in float64 through fedjax_metric's hooks and
client optimizer (the engine cannot hold float64): they agree to ~4e-8,
and to ~1e-15 once the gradient clipping uses torch's formula
``max_norm / (norm + 1e-6)`` instead of optax's ``max_norm / norm``: that
epsilon is the only difference (see test_fedrcl_rounds_in_float64).
Every comparison comes with near misses (another temperature, threshold,
form, reduction over levels, proximal weight, weighting or momentum) that
must NOT match.
"""

import functools
import inspect
import pathlib
import re

import fl_fixtures as fx
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from fedjax_metric import (
  contract,
  engine,
  executors,
  losses,
  models,
  optimizers,
)
from fedjax_metric.algorithms import fedagm, fedavg, fedrcl
from fedjax_metric.data import cohort as cohort_lib

GOLDEN = pathlib.Path(__file__).parent / 'golden'
RTOL, ATOL = 1e-12, 1e-13  # float64
NUM_LEVELS = 5
BATCHES = ('main', 'few', 'one')


@functools.cache
def golden(name):
  with np.load(GOLDEN / f'{name}.npz') as f:
    return {k: f[k] for k in f.files}


def close(a, b, rtol=RTOL, atol=ATOL):
  return np.allclose(np.asarray(a), np.asarray(b), rtol=rtol, atol=atol)


def test_fixtures_name_the_authors_code():
  for name, repo in (
    ('fedrcl', 'skynbe/FedRCL'),
    ('fedrcl_rounds', 'skynbe/FedRCL'),
    ('fedagm', 'geehokim/FedACG'),
  ):
    g = golden(name)
    assert str(g['repository']) == repo
    assert re.fullmatch('[0-9a-f]{40}', str(g['commit']))
    assert str(g['function'])
    assert 'float64' in str(g['dtype'])


def test_our_defaults_are_the_released_config():
  """FedRCL's default options are the fixture's first case, which the
  script read from the authors' configs/client/fedrcl.yaml."""
  g = golden('fedrcl')
  defaults = fedrcl.FEDRCL.make_options()
  assert defaults.temperature == g['temperatures'][0]
  assert defaults.threshold == g['thresholds'][0]
  assert defaults.beta == g['betas'][0]
  assert defaults.form == 'code'
  weighting = inspect.signature(fedrcl.build).parameters['weighting']
  assert weighting.default == 'uniform'  # their server: a plain mean
  assert (int(g['topk_pos']), int(g['topk_neg'])) == (1, 2)
  scl = fedrcl.FEDSCL.make_options()
  assert scl.temperature == g['temperatures'][0]


# ---------------------------------------------------------------------------
# The loss: per-example terms, multi-level totals, feature gradients.
# ---------------------------------------------------------------------------


def case_kwargs(g, k):
  return dict(
    temperature=float(g['temperatures'][k]),
    threshold=float(g['thresholds'][k]),
    beta=float(g['betas'][k]),
  )


def feature_maps(g, batch):
  """The [B, C, H, W] maps (NumPy float64: make JAX arrays of them inside
  ``jax.enable_x64``)."""
  return [g[f'{batch}/level{l}'] for l in range(NUM_LEVELS)]


def pooled(maps):
  """The authors' F.adaptive_avg_pool2d(x, 1) of each [B, C, H, W] map."""
  return [m.mean(axis=(2, 3)) for m in maps]


# The hyper-parameters are traced (one program per batch shape and form).
@functools.partial(jax.jit, static_argnames=('form',))
def level_terms(feature, labels, mask, temperature, threshold, beta, form):
  return losses.relaxed_supcon_loss(
    feature,
    labels,
    temperature=temperature,
    threshold=threshold,
    beta=beta,
    form=form,
    mask=mask,
  )


def rcl_mean(maps, labels, reduce=jnp.mean, **kwargs):
  per_level = [
    losses.relaxed_supcon_loss(f, labels, **kwargs) for f in pooled(maps)
  ]
  if reduce is jnp.sum:  # near miss: the sum over levels, not the mean
    return jnp.mean(sum(per_level))
  return jnp.mean(
    losses.multilevel_relaxed_supcon_loss(pooled(maps), labels, **kwargs)
  )


def scl_mean(maps, labels, **kwargs):
  return jnp.mean(losses.multilevel_supcon_loss(pooled(maps), labels, **kwargs))


rcl_value_and_grad = jax.jit(
  jax.value_and_grad(rcl_mean), static_argnames=('reduce', 'form')
)
scl_value_and_grad = jax.jit(
  jax.value_and_grad(scl_mean), static_argnames=('form',)
)


@pytest.mark.parametrize('batch', BATCHES)
def test_per_example_terms_match_authors(batch):
  """relaxed_supcon_loss at each level: beta 0 gives CLLoss's 'scl' pair
  per example, beta b gives 'scl' + b * 'penalty' (reduction=False)."""
  g = golden('fedrcl')
  labels = g[f'{batch}/labels']
  features = pooled(feature_maps(g, batch))
  with jax.enable_x64(True):
    labels = jnp.asarray(labels)
    for k in range(len(g['temperatures'])):
      kw = case_kwargs(g, k)
      scl, pen = (
        g[f'{batch}/case{k}/rcl/{t}_terms'] for t in ('scl', 'penalty')
      )
      np.testing.assert_array_equal(g[f'{batch}/case{k}/scl/scl_terms'], scl)
      for l, f in enumerate(features):
        f = jnp.asarray(f)
        ours_scl = level_terms(
          f, labels, None, form='code', **{**kw, 'beta': 0.0}
        )
        ours = level_terms(f, labels, None, form='code', **kw)
        np.testing.assert_allclose(ours_scl, scl[l], rtol=RTOL, atol=ATOL)
        np.testing.assert_allclose(
          ours, scl[l] + kw['beta'] * pen[l], rtol=RTOL, atol=ATOL
        )


@pytest.mark.parametrize('batch', BATCHES)
def test_multilevel_loss_and_gradients_match_authors(batch):
  """The batch loss local_train minimises (scl + beta * penalty, each the
  mean over levels 0-4 of the batch mean; their weights from get_weights)
  and its gradient w.r.t. every level's feature map, through the pooling;
  and FedSCL (the config without the penalty pair)."""
  g = golden('fedrcl')
  labels = g[f'{batch}/labels']
  with jax.enable_x64(True):
    labels = jnp.asarray(labels)
    maps = [jnp.asarray(m) for m in feature_maps(g, batch)]
    for k in range(len(g['temperatures'])):
      kw = case_kwargs(g, k)
      p = f'{batch}/case{k}'
      value, grads = rcl_value_and_grad(maps, labels, form='code', **kw)
      np.testing.assert_allclose(
        value, g[f'{p}/rcl/total'], rtol=RTOL, atol=ATOL
      )
      np.testing.assert_allclose(
        value,
        g[f'{p}/rcl/scl'] + kw['beta'] * g[f'{p}/rcl/penalty'],
        rtol=RTOL,
        atol=ATOL,
      )
      for l in range(NUM_LEVELS):
        np.testing.assert_allclose(
          grads[l], g[f'{p}/rcl/grad{l}'], rtol=RTOL, atol=ATOL
        )
      value, grads = scl_value_and_grad(
        maps, labels, temperature=kw['temperature'], form='code'
      )
      np.testing.assert_allclose(
        value, g[f'{p}/scl/total'], rtol=RTOL, atol=ATOL
      )
      for l in range(NUM_LEVELS):
        np.testing.assert_allclose(
          grads[l], g[f'{p}/scl/grad{l}'], rtol=RTOL, atol=ATOL
        )


def test_loss_near_misses_do_not_match():
  """Plausible slips, computed with our code, miss the authors' values by
  far more than the tolerance (smallest: threshold + 0.02, 1.8e-4)."""
  g = golden('fedrcl')
  labels = g['main/labels']
  with jax.enable_x64(True):
    labels = jnp.asarray(labels)
    maps = [jnp.asarray(m) for m in feature_maps(g, 'main')]
    for k in range(len(g['temperatures'])):
      kw = case_kwargs(g, k)
      p = f'main/case{k}'
      want = g[f'{p}/rcl/total']
      assert close(rcl_value_and_grad(maps, labels, form='code', **kw)[0], want)
      misses = {
        'temperature x 1.1': {**kw, 'temperature': kw['temperature'] * 1.1},
        'threshold + 0.02': {**kw, 'threshold': kw['threshold'] + 0.02},
        'no penalty (FedSCL)': {**kw, 'beta': 0.0},
        "Eq. 5 as printed (form='paper')": {**kw, 'form': 'paper'},
      }
      for name, miss in misses.items():
        miss = {'form': 'code', **miss}
        value = rcl_value_and_grad(maps, labels, **miss)[0]
        assert not close(value, want), (p, name, float(value - want))
      value = rcl_value_and_grad(
        maps, labels, reduce=jnp.sum, form='code', **kw
      )[0]
      assert not close(value, want), (p, 'sum over levels')
      # FedSCL: the other readings of its SCL term (Khosla's mean over
      # positives, Eq. 2's sum) are not the released code's.
      want_scl = g[f'{p}/scl/total']
      t = kw['temperature']
      for form in ('khosla', 'paper'):
        value = scl_value_and_grad(maps, labels, temperature=t, form=form)[0]
        assert not close(value, want_scl), (p, form)


def test_padding_leaves_the_authors_values():
  """Three masked padding rows appended: the real rows' terms and the
  masked mean are the authors' (padding joins no pair set)."""
  g = golden('fedrcl')
  rng = np.random.default_rng(0)
  labels = np.asarray(g['main/labels'])
  pad_labels = np.concatenate([labels, labels[:3]])
  mask = np.arange(len(pad_labels)) < len(labels)
  with jax.enable_x64(True):
    kw = case_kwargs(g, 0)
    per_example = 0.0
    for l, f in enumerate(pooled(feature_maps(g, 'main'))):
      padded = np.concatenate([f, rng.normal(size=(3, f.shape[1]))])
      terms = level_terms(
        jnp.asarray(padded),
        jnp.asarray(pad_labels),
        jnp.asarray(mask),
        form='code',
        **kw,
      )
      want = (
        g['main/case0/rcl/scl_terms'][l]
        + kw['beta'] * g['main/case0/rcl/penalty_terms'][l]
      )
      np.testing.assert_allclose(
        terms[: len(labels)], want, rtol=RTOL, atol=ATOL
      )
      np.testing.assert_array_equal(terms[len(labels) :], 0.0)
      per_example = per_example + terms
    total = np.sum(per_example) / NUM_LEVELS / len(labels)
    np.testing.assert_allclose(
      total, g['main/case0/rcl/total'], rtol=RTOL, atol=ATOL
    )


class FeedFeatures(nn.Module):
  """Feeds the fixture's pooled features through as the model's levels
  (images [B, 1, 1, sum D_l]); logits from a Dense layer."""

  dims: tuple

  @nn.compact
  def __call__(self, images, *, train, mask=None):
    del train, mask
    x = images.reshape(images.shape[0], -1)
    bounds = np.cumsum(self.dims)[:-1]
    return {
      'logits': nn.Dense(3)(x),
      'embedding': x,
      'features': list(jnp.split(x, bounds, axis=-1)),
    }


def test_client_loss_hooks_add_the_authors_term():
  """FedRCL's and FedSCL's client_loss at their defaults: CE plus (weight
  1) the authors' released loss on the model's feature levels."""
  g = golden('fedrcl')
  labels = np.asarray(g['main/labels'])
  with jax.enable_x64(True):
    features = pooled(feature_maps(g, 'main'))
    dims = tuple(f.shape[1] for f in features)
    x = np.concatenate(features, axis=1)[:, None, None, :]
    model = models.make_model_fns(FeedFeatures(dims), x.shape)
    variables = model.init(jax.random.key(0), jnp.asarray(x))
    batch = contract.Batch(
      jnp.asarray(x),
      jnp.asarray(labels, jnp.int32),
      jnp.ones(len(labels), bool),
      jnp.zeros(x.shape, jnp.uint8),
    )
    server = optimizers.make_server_optimizer('sgd')
    for make, want in (
      (fedrcl.FEDRCL, g['main/case0/rcl/total']),
      (fedrcl.FEDSCL, g['main/case0/scl/total']),
    ):
      alg = make(model, server_optimizer=server)
      loss, (_, terms) = alg.client_loss(variables['params'], {}, batch, None)
      np.testing.assert_allclose(terms['metric'], want, rtol=RTOL, atol=ATOL)
      np.testing.assert_allclose(loss, terms['ce'] + want, rtol=1e-7)


# ---------------------------------------------------------------------------
# FedAGM / FedACG's server on fixed client deltas.
# ---------------------------------------------------------------------------


def linear_variables(g, prefix, dtype=np.float64):
  """torch Linear 'fc.weight' [K, D], 'fc.bias' -> fx.linear's Dense_0."""
  return {
    'params': {
      'Dense_0': {
        'kernel': jnp.asarray(g[f'{prefix}/fc.weight'].T.astype(dtype)),
        'bias': jnp.asarray(g[f'{prefix}/fc.bias'].astype(dtype)),
      }
    }
  }


def run_server(
  g,
  server_name,
  *,
  lookahead,
  momentum=None,
  tau=1.0,
  step_from_lookahead=False,
):
  """Our server over the fixture's rounds: (sent models, global models,
  final state). ``lookahead``: FedAGM (clients get theta + lambda m)."""
  p = f'a_{server_name}'
  lam = float(g[f'{p}/momentum']) if momentum is None else momentum
  server = optimizers.make_server_optimizer(
    'fedagm' if lookahead else 'sgd', learning_rate=tau, momentum=lam
  )
  state = fedavg.make_init_server(server)(
    linear_variables(g, f'{p}/init'), 3, jax.random.key(0)
  )
  sent, models_ = [], []
  num_clients = int(g['num_clients'])
  for r in range(4):
    start = fedagm.lookahead(server, state) if lookahead else state
    sent.append(start.variables)
    deltas = [
      linear_variables(g, f'{p}/delta/{r}/{c}') for c in range(num_clients)
    ]
    mean = jax.tree.map(lambda *d: sum(d) / num_clients, *deltas)
    base = start if step_from_lookahead else state
    state = fedavg.apply_server_optimizer(server, base, mean)
    models_.append(state.variables)
  return sent, models_, state, tau


@pytest.mark.parametrize('server_name', ['FedACG', 'FedAvgM'])
def test_server_on_fixed_deltas_matches_authors(server_name):
  """ServerM with FedACG.yaml (lambda 0.85, the lookahead sent) and with
  FedAvgM.yaml (lambda 0.4): the model the clients receive each round,
  the global model after it, and the final momentum."""
  g = golden('fedagm')
  p = f'a_{server_name}'
  assert bool(g[f'{p}/fedacg']) == (server_name == 'FedACG')
  with jax.enable_x64(True):
    sent, models_, state, tau = run_server(
      g, server_name, lookahead=server_name == 'FedACG'
    )
    for r in range(4):
      want = linear_variables(g, f'{p}/received/{r}')
      assert fx.max_abs_diff(sent[r], want) < ATOL
      want = linear_variables(g, f'{p}/global/{r}')
      assert fx.max_abs_diff(models_[r], want) < ATOL
    # Their m_t = lambda m + mean delta; optax's trace is of -mean delta.
    trace = state.opt_state[0].trace['Dense_0']
    np.testing.assert_allclose(
      -tau * trace['kernel'], g[f'{p}/final_momentum/fc.weight'].T, atol=ATOL
    )
    np.testing.assert_allclose(
      -tau * trace['bias'], g[f'{p}/final_momentum/fc.bias'], atol=ATOL
    )


def test_server_near_misses_do_not_match():
  g = golden('fedagm')
  p = 'a_FedACG'
  with jax.enable_x64(True):
    misses = {
      'lambda 0.9': dict(lookahead=True, momentum=0.9),
      'tau 0.9': dict(lookahead=True, tau=0.9),
      'step from the lookahead': dict(lookahead=True, step_from_lookahead=True),
    }
    for name, kw in misses.items():
      _, models_, _, _ = run_server(g, 'FedACG', **kw)
      got = fx.max_abs_diff(models_[-1], linear_variables(g, f'{p}/global/3'))
      assert got > 1e3 * ATOL, (name, got)
    # FedAvgM sends theta, FedACG the lookahead: each fixture tells them apart.
    for server_name, lookahead in (('FedACG', False), ('FedAvgM', True)):
      sent, _, _, _ = run_server(g, server_name, lookahead=lookahead)
      want = linear_variables(g, f'a_{server_name}/received/1')
      assert fx.max_abs_diff(sent[1], want) > 1e3 * ATOL, server_name


# ---------------------------------------------------------------------------
# Whole rounds: fedjax_metric's engine (float32) against the authors' loop.
# ---------------------------------------------------------------------------


def round_spec(g, p, alg, *, epoch_decay=None):
  decay = float(g[f'{p}/local_lr_decay'])
  return engine.RoundSpec(
    alg,
    optimizers.make_client_optimizer(
      'sgd',
      momentum=float(g[f'{p}/optimizer_momentum']),
      weight_decay=float(g[f'{p}/weight_decay']),
      grad_clip_norm=float(g[f'{p}/grad_clip_norm']),
    ),
    optimizers.make_round_schedule(
      float(g[f'{p}/local_lr']), kind='exponential', decay_rate=decay
    ),
    fx.identity_preprocess(),
    0,
    local_epoch_decay=decay if epoch_decay is None else epoch_decay,
    batch_size=int(g[f'{p}/batch_size']),
  )


def engine_rounds(g, p, alg, variables, **spec_kwargs):
  """The global variables after each of the fixture's rounds, all clients
  taking part in order, each local epoch one full batch."""
  parts = [g[f'{p}/part/{c}'] for c in range(3)]
  batch_size = int(g[f'{p}/batch_size'])
  epochs = int(g[f'{p}/local_epochs'])
  steps = cohort_lib.num_local_steps(
    [len(q) for q in parts],
    batch_size=batch_size,
    local_epochs=epochs,
    local_steps=0,
  )
  data = engine.DeviceData(
    jnp.asarray(g[f'{p}/images']), jnp.asarray(g[f'{p}/labels'], jnp.int32)
  )
  round_fn = executors.make_round_fn(
    round_spec(g, p, alg, **spec_kwargs), data, executor='vmap'
  )
  state, table = engine.init_state(alg, variables, len(parts))
  out = []
  with jax.default_matmul_precision('highest'):
    for r in range(3):
      cohort = cohort_lib.make_cohort(
        np.arange(len(parts)),
        parts,
        num_slots=len(parts),
        num_steps=steps,
        batch_size=batch_size,
        local_epochs=epochs,
        local_steps=0,
        seed=0,
        round_idx=r,
      )
      state, table, _ = round_fn(state, table, cohort)
      # A copy: the next round donates the state's buffers.
      out.append(jax.tree.map(np.array, state.variables))
  return out


def fedagm_rounds(
  g, p, *, beta=None, lookahead=True, weighting='uniform', **kw
):
  server = optimizers.make_server_optimizer(
    'fedagm', momentum=float(g[f'{p}/momentum'])
  )
  alg = fedavg.build(fx.linear(), server_optimizer=server, weighting=weighting)
  if lookahead:
    # Their loss adds w * ||theta - received||^2: beta / 2 = w.
    beta = 2 * float(g[f'{p}/prox_weight']) if beta is None else beta
    alg = fedagm.accelerate(alg, server, beta=beta)
  variables = linear_variables(g, f'{p}/init', np.float32)
  return engine_rounds(g, p, alg, variables, **kw)


FEDAGM_ROUND_ATOL = 1e-6  # float32 engine; ~8e-8 seen


@pytest.mark.parametrize('run', ['default', 'prox_heavy'])
def test_fedagm_rounds_match_authors(run):
  """Three FedACG rounds (the authors' Trainer, ServerM and proximal
  Client) against fedagm.accelerate(fedavg) in the engine; 'prox_heavy' has
  the proximal weight 0.05 instead of ACG.yaml's 1e-3."""
  g = golden('fedagm')
  p = f'b_{run}'
  got = fedagm_rounds(g, p)
  for r in range(3):
    want = linear_variables(g, f'{p}/global/{r}')
    assert fx.max_abs_diff(got[r], want) < FEDAGM_ROUND_ATOL, r


@pytest.mark.parametrize(
  'miss',
  [
    dict(beta=1e-3),  # reading their weight 1e-3 as beta (not beta / 2)
    dict(lookahead=False),  # FedAvgM's clients: they start from theta
    dict(weighting='num_examples'),  # their server takes the plain mean
    dict(epoch_decay=1.0),  # without their per-local-epoch LambdaLR
  ],
  ids=['beta_not_halved', 'no_lookahead', 'size_weighted', 'no_epoch_decay'],
)
def test_fedagm_round_near_misses_do_not_match(miss):
  g = golden('fedagm')
  got = fedagm_rounds(g, 'b_default', **miss)
  want = linear_variables(g, 'b_default/global/2')
  assert fx.max_abs_diff(got[-1], want) > 10 * FEDAGM_ROUND_ATOL


class LevelsMLP(nn.Module):
  """The fixture's torch LevelsMLP: Dense_0..Dense_4 whose pre-ReLU
  outputs are the 5 feature levels, Dense_5 the logits."""

  @nn.compact
  def __call__(self, images, *, train, mask=None):
    del train, mask
    h = images.reshape(images.shape[0], -1)
    features = []
    for l in range(NUM_LEVELS):
      h = nn.Dense(8)(h if l == 0 else nn.relu(h))
      features.append(h)
    logits = nn.Dense(3)(nn.relu(h))
    return {'logits': logits, 'embedding': nn.relu(h), 'features': features}


@functools.cache
def levels_mlp():
  return models.make_model_fns(LevelsMLP(), fx.INPUT_SHAPE)


def mlp_variables(g, prefix, dtype=np.float32):
  return {
    'params': {
      f'Dense_{l}': {
        'kernel': jnp.asarray(g[f'{prefix}/layers.{l}.weight'].T.astype(dtype)),
        'bias': jnp.asarray(g[f'{prefix}/layers.{l}.bias'].astype(dtype)),
      }
      for l in range(NUM_LEVELS + 1)
    }
  }


def rcl_algorithm(g, p, **kw):
  """Our algorithm for run ``p`` (kw: near misses)."""
  fedacg = bool(g[f'{p}/fedacg'])
  server = (
    optimizers.make_server_optimizer(
      'fedagm', momentum=float(g[f'{p}/server_momentum'])
    )
    if fedacg
    else optimizers.make_server_optimizer('sgd')
  )
  args = dict(
    server_optimizer=server,
    weighting='uniform',
    temperature=kw.pop('temperature', float(g[f'{p}/temperature'])),
    form=kw.pop('form', 'code'),
  )
  if bool(g[f'{p}/penalty']):
    args['threshold'] = kw.pop('threshold', float(g[f'{p}/threshold']))
    args['beta'] = kw.pop('beta', float(g[f'{p}/beta']))
    alg = fedrcl.FEDRCL(levels_mlp(), **args)
  else:
    alg = fedrcl.FEDSCL(levels_mlp(), **args)
  assert not kw, kw
  if fedacg:
    beta = 2 * float(g[f'{p}/prox_weight'])
    alg = fedagm.accelerate(alg, server, beta=beta)
  return alg, server, fedacg


FEDRCL_ROUND_ATOL = 5e-5  # float32 engine; 1.4e-6 ('rcl'), 1.3e-5 ('scl')


@pytest.mark.parametrize('run', ['rcl', 'scl'])
def test_fedrcl_rounds_in_the_engine_match_authors(run):
  """Three rounds of FedRCL / FedSCL clients (the authors' Trainer,
  RCLClient, Server) against our engine, in float32. ('rcl_fedacg' is
  compared in float64 below: behind FedACG's momentum its float32 run
  drifts ~4e-3 from the float64 one, and so would ours.)"""
  g = golden('fedrcl_rounds')
  alg, _, _ = rcl_algorithm(g, run)
  got = engine_rounds(g, run, alg, mlp_variables(g, f'{run}/init'))
  for r in range(3):
    want = mlp_variables(g, f'{run}/global/{r}', np.float64)
    assert fx.max_abs_diff(got[r], want) < FEDRCL_ROUND_ATOL, r


def torch_clip(max_norm):
  """torch.nn.utils.clip_grad_norm_: scale by min(max_norm / (norm +
  1e-6), 1)."""

  def update(grads, state, params=None):
    del params
    scale = jnp.minimum(max_norm / (optax.tree.norm(grads) + 1e-6), 1.0)
    return jax.tree.map(lambda x: x * scale, grads), state

  return optax.GradientTransformation(lambda _: optax.EmptyState(), update)


def float64_rounds(g, p, clip='ours', **kw):
  """The fixture's rounds through our hooks (fedagm.lookahead, client_loss,
  apply_server_optimizer) and client optimizer, in float64 -- the engine's
  loop by hand: full-batch local epochs, lr x decay ** round x decay **
  epoch, uniform mean of the deltas. ``clip='torch'`` swaps optax's
  gradient clipping for torch's formula."""
  alg, server, fedacg = rcl_algorithm(g, p, **kw)
  decay = float(g[f'{p}/local_lr_decay'])
  epochs = int(g[f'{p}/local_epochs'])
  max_norm = float(g[f'{p}/grad_clip_norm'])
  if clip == 'ours':
    make_opt = optimizers.make_client_optimizer(
      'sgd', weight_decay=float(g[f'{p}/weight_decay']), grad_clip_norm=max_norm
    )
  elif clip == 'torch':
    make_opt = lambda lr: optax.chain(
      torch_clip(max_norm),
      optax.add_decayed_weights(float(g[f'{p}/weight_decay'])),
      optax.sgd(lr),
    )
  else:  # near miss: no clipping
    make_opt = optimizers.make_client_optimizer(
      'sgd', weight_decay=float(g[f'{p}/weight_decay'])
    )
  images, labels = g[f'{p}/images'], g[f'{p}/labels']
  parts = [g[f'{p}/part/{c}'] for c in range(3)]
  width = max(len(q) for q in parts)

  @jax.jit
  def local_train(params, server_state, batch, lr):
    ctx = fx.client_context(server_state)
    opt = make_opt(lr)
    grad_fn = jax.grad(lambda q: alg.client_loss(q, {}, batch, ctx)[0])

    def epoch(e, carry):
      params, opt_state = carry
      updates, opt_state = opt.update(grad_fn(params), opt_state, params)
      factor = decay ** e.astype(jnp.float64)
      return jax.tree.map(
        lambda a, u: a + u * factor, params, updates
      ), opt_state

    return jax.lax.fori_loop(0, epochs, epoch, (params, opt.init(params)))[0]

  state = fedavg.make_init_server(server)(
    mlp_variables(g, f'{p}/init', np.float64), 3, jax.random.key(0)
  )
  out = []
  for r in range(3):
    start = fedagm.lookahead(server, state) if fedacg else state
    deltas = []
    for part in parts:
      idx = np.concatenate([part, np.zeros(width - len(part), int)])
      batch = contract.Batch(
        jnp.asarray(images[idx], jnp.float64) / 255.0,
        jnp.asarray(labels[idx], jnp.int32),
        jnp.asarray(np.arange(width) < len(part)),
        jnp.asarray(images[idx]),
      )
      lr = float(g[f'{p}/local_lr']) * decay**r
      end = local_train(start.variables['params'], state, batch, lr)
      deltas.append(jax.tree.map(jnp.subtract, end, start.variables['params']))
    mean = {'params': jax.tree.map(lambda *d: sum(d) / len(d), *deltas)}
    state = fedavg.apply_server_optimizer(server, state, mean)
    out.append(state.variables)
  return out


@pytest.mark.parametrize('run', ['rcl', 'scl', 'rcl_fedacg'])
def test_fedrcl_rounds_in_float64(run):
  """Our hooks in float64 follow the authors' three rounds to ~4e-8 with
  our client optimizer, and to ~1e-15 with torch's clipping formula: the
  residual is clip_grad_norm_'s 1e-6 in ``max_norm / (norm + 1e-6)``
  (the clipping is active here: 'no clipping' is a near miss below)."""
  g = golden('fedrcl_rounds')
  with jax.enable_x64(True):
    for clip, atol in (('ours', 2e-7), ('torch', 1e-13)):
      got = float64_rounds(g, run, clip=clip)
      for r in range(3):
        want = mlp_variables(g, f'{run}/global/{r}', np.float64)
        assert fx.max_abs_diff(got[r], want) < atol, (clip, r)


@pytest.mark.parametrize(
  'miss',
  [
    dict(temperature=0.06),
    dict(threshold=0.75),
    dict(beta=0.0),
    dict(form='paper'),
    dict(clip='none'),
  ],
  ids=['temperature', 'threshold', 'no_penalty', 'paper_form', 'no_clip'],
)
def test_fedrcl_round_near_misses_do_not_match(miss):
  g = golden('fedrcl_rounds')
  with jax.enable_x64(True):
    got = float64_rounds(g, 'rcl', **miss)
  want = mlp_variables(g, 'rcl/global/2', np.float64)
  assert fx.max_abs_diff(got[-1], want) > 1e-4
