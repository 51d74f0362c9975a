"""FedQuad and its metric-learning baselines (QuadrupletFL), vs NumPy: the
client loss on sampled quadruplets, and FedQuad without l_ce (Table V) with
its config."""

import fl_fixtures as fx
import numpy as np
import pytest

from .metric_helpers import build, load_config, numpy_ce, one_step_loss


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
    # QuadrupletFL's second term only where its two negatives' classes differ.
    second_counts = (name == 'fedquad') | (
      labels[idx[0, 8:12]] != labels[idx[0, 12:]]
    )
    quad = np.maximum(d(a, p) - d(a, n1) + 1.0, 0) + second_counts * np.maximum(
      d(a, p) - second + 0.5, 0
    )
    valid = mask[0, 4:8]
    expected = (
      numpy_ce(variables, a, labels[idx[0, :4]]) + beta * quad[valid].mean()
    )
    np.testing.assert_allclose(got, expected, rtol=1e-5, err_msg=name)


def test_quadrupletfl_on_a_client_of_two_classes_keeps_the_triplet_term():
  """A client with one class besides the anchor's draws both negatives from
  it (the fallback): QuadrupletFL's second term, which compares two
  negatives of different classes (Chen et al., CVPR 2017), is left out, so
  the metric term is the triplet hinge; FedQuad's second term, d(a, n2),
  still applies."""
  images, labels = fx.make_data(40, seed=3)
  labels = np.where(np.arange(40) % 2 == 0, 0, 2).astype(np.int32)
  model = fx.linear()
  variables = fx.init_variables(model, images)
  for name in ('quadrupletfl', 'fedquad'):
    alg = build(name, model, beta=0.5)
    idx, mask = alg.client_batches(
      np.arange(40),
      labels,
      np.random.default_rng(4),
      num_steps=2,
      batch_size=5,
      local_epochs=1,
      local_steps=2,
    )
    assert (labels[idx[0, 10:15]] == labels[idx[0, 15:]]).all()
    x = images[idx[0]].reshape(20, -1).astype(np.float64) / 255.0
    a, p, n1, n2 = x[:5], x[5:10], x[10:15], x[15:]
    d = lambda u, v: np.sqrt(((u - v) ** 2).sum(1))
    metric = np.maximum(d(a, p) - d(a, n1) + 1.0, 0)
    if name == 'fedquad':
      metric = metric + np.maximum(d(a, p) - d(a, n2) + 0.5, 0)
    got = one_step_loss(alg, variables, images, labels, idx[0], mask[0])
    expected = numpy_ce(variables, a, labels[idx[0, :5]]) + 0.5 * metric.mean()
    np.testing.assert_allclose(got, expected, rtol=1e-5, err_msg=name)


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
