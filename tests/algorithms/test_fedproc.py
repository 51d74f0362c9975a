"""FedProc (Mu et al. 2021): prototypes and the prototypical contrastive
loss, against NumPy."""

import fl_fixtures as fx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fedjax_metric import algorithms, contract, engine, executors, optimizers
from fedjax_metric.algorithms import fedproc
from fedjax_metric.data import cohort as cohort_lib


def np_unit(x):
  norm = np.linalg.norm(x, axis=-1, keepdims=True)
  return x / np.maximum(norm, 1e-12)


def test_prototype_contrastive_loss_matches_numpy_with_an_unseen_class():
  rng = np.random.default_rng(7)
  z, prototypes = rng.normal(size=(5, 4)), rng.normal(size=(3, 4))
  prototypes[1] = 0.0  # a class no client has held yet
  labels = np.array([0, 2, 1, 0, 2])
  got = fedproc.prototype_contrastive_loss(
    jnp.asarray(z, jnp.float32),
    jnp.asarray(labels),
    jnp.asarray(prototypes, jnp.float32),
  )
  want = []
  for row, y in zip(np_unit(z), labels):
    scores = np_unit(prototypes) @ row  # the zero prototype scores 0
    want.append(np.log(np.exp(scores).sum()) - scores[y])
  np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_fedproc_prototypes_are_count_weighted_means_kept_when_unseen():
  """The linear fixture's 'embedding' is its input, so each round's
  prototypes are NumPy means of normalised inputs: after round 0 over both
  clients; after round 1 only client 0 trains, so class 2 (which client 0
  does not hold) keeps its round-0 prototype. Round 0 trains on CE alone
  (no prototypes yet): its loss is its CE."""
  images, labels = fx.make_data(60, seed=6)
  parts = [
    np.flatnonzero(labels <= 1)[:14],  # classes 0 and 1
    np.flatnonzero(labels >= 1)[:20],  # classes 1 and 2
  ]
  model = fx.linear()
  alg = algorithms.REGISTRY['fedproc'](
    model,
    server_optimizer=optimizers.make_server_optimizer('sgd'),
    run=contract.RunFacts(num_rounds=4),
  )
  cohorts = [
    cohort_lib.make_cohort(
      np.array(ids),
      parts,
      num_slots=2,
      num_steps=3,
      batch_size=8,
      local_epochs=1,
      local_steps=0,
      seed=0,
      round_idx=r,
    )
    for r, ids in enumerate([[0, 1], [0]])
  ]
  variables = fx.init_variables(model, images)
  state, table = engine.init_state(alg, variables, 2)
  data = engine.DeviceData(jnp.asarray(images), jnp.asarray(labels))
  round_fn = executors.make_round_fn(
    fx.make_spec(alg, lr=0.1), data, executor='vmap'
  )
  want = np.zeros((3, 36))
  for r, cohort in enumerate(cohorts):
    state, table, metrics = round_fn(state, table, cohort)
    sums, counts = np.zeros((3, 36)), np.zeros(3)
    for slot in np.flatnonzero(cohort.slot_mask):
      rows = cohort.example_idx[slot][cohort.example_mask[slot]]
      z = np_unit(images[rows].reshape(len(rows), -1) / 255.0)
      for row, y in zip(z, labels[rows]):
        sums[y] += row
        counts[y] += 1
    held = counts > 0
    want[held] = sums[held] / counts[held, None]
    np.testing.assert_allclose(state.extra, want, rtol=1e-5, atol=1e-6)
    if r == 0:
      assert float(metrics['train_loss_sum']) == pytest.approx(
        float(metrics['train_ce_sum']), rel=1e-6
      )
  assert not counts[2] and np.abs(want[2]).sum() > 0  # kept from round 0


def test_prototype_loss_gradient_is_finite_for_a_zero_representation():
  """An all-zero representation row (a dead ReLU layer, or padding) and an
  unseen class's zero prototype give finite gradients, not 0 * inf."""
  z = jnp.zeros((2, 4)).at[1].set(jnp.array([1.0, 2.0, 0.0, -1.0]))
  prototypes = jnp.zeros((3, 4)).at[0].set(jnp.ones(4))
  grad = jax.grad(
    lambda v: fedproc.prototype_contrastive_loss(
      v, jnp.array([0, 2]), prototypes
    ).sum()
  )(z)
  assert np.isfinite(np.asarray(grad)).all()
