"""The losses of FedRCL's Table 1 baselines, against NumPy loops.

FedNTD's not-true distillation (Lee, Jeong, Shin, Bae and Yun, NeurIPS
2022): KL(q~_g || q~_l), q~ the temperature softmax over the classes other
than the true one. FedLC's calibrated cross-entropy (Zhang et al., ICML
2022): CE of z_k - tau n_k^(-1/4). The baselines themselves (FedNTD,
FedDecorr, FedLC, FitNet, FedProc) are tested in tests/algorithms/.
"""

from algorithms.supervised_helpers import ref_calibrated_ce, ref_ntd
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fedjax_metric import losses


@pytest.mark.parametrize('tau', [1.0, 3.0])
def test_not_true_distillation_matches_numpy(tau):
  rng = np.random.default_rng(0)
  local, teacher = (rng.normal(size=(7, 5)) for _ in range(2))
  labels = np.array([0, 4, 2, 2, 1, 3, 0])
  got = losses.not_true_distillation(
    jnp.asarray(local, jnp.float32),
    jnp.asarray(teacher, jnp.float32),
    jnp.asarray(labels),
    tau,
  )
  np.testing.assert_allclose(
    got, ref_ntd(local, teacher, labels, tau), rtol=1e-5, atol=1e-6
  )


def test_the_true_class_and_the_teacher_get_no_gradient():
  rng = np.random.default_rng(1)
  local, teacher = (
    jnp.asarray(rng.normal(size=(4, 5)), jnp.float32) for _ in range(2)
  )
  labels = jnp.array([1, 0, 4, 2])
  d_local, d_teacher = jax.grad(
    lambda a, b: jnp.sum(losses.not_true_distillation(a, b, labels, 2.0)),
    argnums=(0, 1),
  )(local, teacher)
  np.testing.assert_array_equal(d_teacher, 0.0)
  np.testing.assert_array_equal(d_local[jnp.arange(4), labels], 0.0)
  # Equal not-true logits (the true one may differ): no divergence.
  same = losses.not_true_distillation(
    local, local.at[jnp.arange(4), labels].add(5.0), labels, 1.0
  )
  np.testing.assert_allclose(same, 0.0, atol=1e-6)


# ---------------------------------------------------------------------------
# FedLC (Zhang et al., ICML 2022): CE of z_k - tau n_k^(-1/4).
# ---------------------------------------------------------------------------


def test_calibrated_cross_entropy_matches_numpy_and_drops_absent_classes():
  rng = np.random.default_rng(5)
  logits = rng.normal(size=(6, 4))
  counts = np.array([40.0, 3.0, 0.0, 1.0])  # class 2: not on this client
  labels = np.array([0, 1, 3, 0, 3, 1])
  got = losses.calibrated_cross_entropy(
    jnp.asarray(logits, jnp.float32),
    jnp.asarray(labels),
    jnp.asarray(counts, jnp.float32),
    1.5,
  )
  want = ref_calibrated_ce(logits, labels, counts, 1.5)
  np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
  # The absent class leaves the softmax: its logit changes nothing.
  moved = logits.copy()
  moved[:, 2] += 50.0
  again = losses.calibrated_cross_entropy(
    jnp.asarray(moved, jnp.float32),
    jnp.asarray(labels),
    jnp.asarray(counts, jnp.float32),
    1.5,
  )
  np.testing.assert_allclose(again, got, rtol=1e-6)

  # A padding row labelled with an absent class: finite, and zero under the
  # mask with a zero gradient.
  def padded(z):
    per_example = losses.calibrated_cross_entropy(
      z, jnp.array([2, 0]), jnp.asarray(counts, jnp.float32), 1.5
    )
    return losses.masked_mean(per_example, jnp.array([False, True]))

  value, grad = jax.value_and_grad(padded)(jnp.asarray(logits[:2], jnp.float32))
  assert np.isfinite(float(value)) and np.isfinite(np.asarray(grad)).all()
  assert not np.asarray(grad[0]).any()
