"""Tiny synthetic federations shared by the engine and algorithm tests."""

import functools
import re

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from fedjax_metric import contract, engine, models, optimizers
from fedjax_metric.data import augment
from fedjax_metric.data import cohort as cohort_lib
from fedjax_metric.data import partition as partition_lib
from fedjax_metric.models import layers

NUM_CLASSES = 3


class Linear(nn.Module):
  """Softmax regression on flattened images: a model with a hand gradient."""

  num_classes: int = NUM_CLASSES

  @nn.compact
  def __call__(self, images, *, train, mask=None):
    del train, mask
    x = images.reshape(images.shape[0], -1)
    logits = nn.Dense(self.num_classes)(x)
    return {'logits': logits, 'embedding': x, 'features': []}


class AllOutputs(nn.Module):
  """Every output any algorithm reads, from a tiny conv net with BatchNorm:
  logits, embedding (post-ReLU), projection, two feature levels, two
  branch points (FedMLB's stages, with a graft)."""

  num_classes: int = NUM_CLASSES

  @nn.compact
  def __call__(self, images, *, train, mask=None, graft=None):
    x = nn.Conv(4, (3, 3), strides=2)(images)
    x = layers.make_norm('batch')(x, train, mask)
    level_0 = jnp.mean(x, axis=(1, 2))
    x = layers.graft_at(0, nn.relu(x), graft)
    stage_0 = x
    pre = nn.Dense(8)(x.reshape(images.shape[0], -1))
    embedding = layers.graft_at(1, nn.relu(pre), graft)
    return {
      'logits': nn.Dense(self.num_classes)(embedding),
      'embedding': embedding,
      'projection': nn.Dense(8)(embedding),
      'features': [level_0, pre],
      'stages': [stage_0, embedding],  # FedMLB's branch points
    }


def make_data(num_examples=60, shape=(6, 6, 1), seed=0):
  rng = np.random.default_rng(seed)
  images = rng.integers(0, 256, (num_examples,) + shape).astype(np.uint8)
  labels = rng.integers(0, NUM_CLASSES, num_examples).astype(np.int32)
  return images, labels


def identity_preprocess():
  """uint8 -> float in [0, 1]: simple enough to re-derive in NumPy."""
  return augment.make_preprocess(np.zeros(1), np.ones(1))


def make_spec(
  algorithm,
  *,
  lr=0.1,
  optimizer='sgd',
  momentum=0.0,
  seed=0,
  **optimizer_kwargs,
):
  return engine.RoundSpec(
    algorithm,
    optimizers.make_client_optimizer(
      optimizer, momentum=momentum, **optimizer_kwargs
    ),
    optimizers.make_round_schedule(lr),
    identity_preprocess(),
    seed,
  )


INPUT_SHAPE = (1, 6, 6, 1)  # make_data's images


# One ModelFns per process: its jitted forward pass is traced once per
# input shape for every test that builds a program on it.
@functools.cache
def cnn(norm='none'):
  return models.make_model_fns(
    models.small_cnn.SmallCNN(
      num_classes=NUM_CLASSES, width=4, embedding_dim=8, norm=norm
    ),
    INPUT_SHAPE,
  )


@functools.cache
def all_outputs():
  return models.make_model_fns(AllOutputs(), INPUT_SHAPE)


@functools.cache
def linear():
  return models.make_model_fns(Linear(), INPUT_SHAPE)


def init_variables(model, images, seed=0):
  return model.init(
    jax.random.key(seed), identity_preprocess()(jnp.asarray(images[:2]), None)
  )


def cohort(
  partition,
  client_ids,
  *,
  num_slots,
  batch_size=8,
  epochs=1,
  steps=0,
  round_idx=0,
  num_steps=None,
):
  sizes = [len(p) for p in partition]
  s = num_steps or cohort_lib.num_local_steps(
    sizes, batch_size=batch_size, local_epochs=epochs, local_steps=steps
  )
  return cohort_lib.make_cohort(
    np.asarray(client_ids),
    partition,
    num_slots=num_slots,
    num_steps=s,
    batch_size=batch_size,
    local_epochs=epochs,
    local_steps=steps,
    seed=0,
    round_idx=round_idx,
  )


def dirichlet_federation(num_examples=96, num_clients=4):
  """``(images, labels, parts, DeviceData)``: label-skewed clients of
  unequal sizes (per-class Dirichlet 1.0), for whole-round tests."""
  images, labels = make_data(num_examples)
  parts = partition_lib.dirichlet(
    labels, num_clients, 1.0, seed=2, variant='per_class'
  )
  data = engine.DeviceData(jnp.asarray(images), jnp.asarray(labels))
  return images, labels, parts, data


def held_out(num_examples=12):
  """A tiny `contract.HeldOut` validation split (FedPPO's rewards), of
  other images than `make_data`'s training ones."""
  images, labels = make_data(num_examples, seed=7)
  return contract.HeldOut(images, labels, identity_preprocess())


def partition_facts(parts, labels):
  """The `RunFacts` a factory gets from a partition: the clients' class
  counts [N, K] (FedLC's calibration) and a held-out split (FedPPO's
  rewards)."""
  return contract.RunFacts(
    class_counts=partition_lib.class_counts(labels, parts, NUM_CLASSES),
    validation=held_out(),
  )


def round_cohorts(
  alg, parts, labels, rounds, *, batch_size=8, sampler='per_client'
):
  """One 4-slot cohort per entry of ``rounds`` (the clients of that round),
  one local epoch each, with the algorithm's own batch schedule."""
  sizes = [len(p) for p in parts]
  s = cohort_lib.num_local_steps(
    sizes, batch_size=batch_size, local_epochs=1, local_steps=0
  )
  return [
    cohort_lib.make_cohort(
      np.asarray(ids),
      parts,
      num_slots=4,
      num_steps=s,
      batch_size=batch_size,
      local_epochs=1,
      local_steps=0,
      seed=0,
      round_idx=r,
      labels=labels,
      batches_fn=alg.client_batches,
      cohort_batches_fn=alg.cohort_batches,
      sampler=sampler,
    )
    for r, ids in enumerate(rounds)
  ]


def client_context(
  server_state,
  *,
  client_row=(),
  local_state=(),
  key=None,
  client_id=0,
  slot=0,
  learning_rate=0.1,
  num_steps=1.0,
  num_examples=1.0,
):
  """One client's `engine.ClientContext` outside a round (step 0, no
  scan_batches), for calling an algorithm's hooks directly."""
  return engine.ClientContext(
    server_state=server_state,
    client_row=client_row,
    local_state=local_state,
    client_id=jnp.int32(client_id),
    slot=jnp.int32(slot),
    key=jax.random.key(0) if key is None else key,
    step=jnp.int32(0),
    learning_rate=jnp.float32(learning_rate),
    num_steps=jnp.float32(num_steps),
    num_examples=jnp.float32(num_examples),
    scan_batches=None,
  )


def executor_tolerance():
  """How closely two executors' results agree after a few rounds.

  On CPU the vmapped and per-client programs agree to ~1e-6. On a GPU they
  pick different convolution algorithms and reduction orders, even at
  'highest' precision: an H100 gave up to 3.4e-4 after two rounds with
  BatchNorm (FedU2), so executors are compared at 1e-3 there.
  """
  return 1e-5 if jax.default_backend() == 'cpu' else 1e-3


def max_abs_diff(a, b):
  """Largest |a - b| over the leaves (booleans as 0 / 1)."""
  return max(
    float(np.max(np.abs(np.asarray(x, np.float64) - np.asarray(y, np.float64))))
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b))
  )


def ref_softmax_regression_grad(w, b, images, labels, rows, real):
  """Float64 gradient (dW, db) of the masked mean softmax cross-entropy of
  `linear` (softmax regression on x / 255) on the examples ``rows``."""
  x = images[rows].reshape(len(rows), -1).astype(np.float64) / 255.0
  z = x @ w + b
  p = np.exp(z - z.max(1, keepdims=True))
  p /= p.sum(1, keepdims=True)
  p[np.arange(len(rows)), labels[rows]] -= 1.0
  g = p * real[:, None] / real.sum()
  return x.T @ g, g.sum(0)


def ref_softmax_regression_round(
  start, images, labels, cohort, *, lr, prox_beta=0.0, client_steps=None
):
  """One round of `linear` clients in float64 by hand: the size-weighted
  mean model update (list [dW, db]) of the cohort's real slots, each
  training softmax regression from ``start`` ([W, b]) with masked
  mean-gradient steps, plus ``prox_beta (w - start)`` (FedProx's and
  FedAGM's proximal term). Zeros when nobody joined. ``client_steps``, if
  given, replaces the plain SGD loop: ``(start, batches, grad_fn) -> [W,
  b]`` with ``batches`` the client's (rows, real) steps."""
  deltas, sizes = [], []
  for slot in np.flatnonzero(cohort.slot_mask):
    start64 = [np.array(t, np.float64) for t in start]
    batches = [
      (rows, real)
      for rows, real in zip(cohort.example_idx[slot], cohort.example_mask[slot])
      if real.any()
    ]

    def grad(w, b, rows, real):
      gw, gb = ref_softmax_regression_grad(w, b, images, labels, rows, real)
      return gw + prox_beta * (w - start64[0]), gb + prox_beta * (
        b - start64[1]
      )

    if client_steps is None:
      cw, cb = start64
      for rows, real in batches:
        gw, gb = grad(cw, cb, rows, real)
        cw, cb = cw - lr * gw, cb - lr * gb
    else:
      cw, cb = client_steps(start64, batches, grad)
    deltas.append([cw - start64[0], cb - start64[1]])
    sizes.append(cohort.num_examples[slot])
  if not deltas:
    return [np.zeros_like(np.asarray(t, np.float64)) for t in start]
  p_i = np.array(sizes) / np.sum(sizes)
  return [sum(p * d[k] for p, d in zip(p_i, deltas)) for k in range(2)]


def jit_client_loss_and_grad(alg, params, model_state, batch, ctx):
  """``((loss, aux), grads)`` of ``alg.client_loss`` w.r.t. params, as one
  jitted program (``ctx``, which holds functions, closed over): called
  eagerly a loss dispatches and compiles its ops one by one, which was most
  of such a test's time."""
  value_and_grad = jax.value_and_grad(alg.client_loss, has_aux=True)
  return jax.jit(lambda p, s, b: value_and_grad(p, s, b, ctx))(
    params, model_state, batch
  )


def repository_of(fixture):
  """The authors' repository a golden fixture names, once its commit is
  checked to be a full SHA (40 lowercase hex digits, as
  benchmarks/crosscheck/fixtures.py requires of every fixture)."""
  commit = str(fixture['commit'])
  assert re.fullmatch('[0-9a-f]{40}', commit), f'not a full SHA: {commit!r}'
  return str(fixture['repository'])
