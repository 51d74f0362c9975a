"""One-class evaluation vs scikit-learn, hand computations and NumPy loops."""

import jax
import numpy as np
import pytest
from sklearn.metrics import roc_auc_score

from fedjax_metric import evaluation

TOL = dict(rtol=1e-5, atol=1e-5)


def test_auroc_hand_computation_with_ties():
  # Positives 0.8, 0.4, 0.4; negatives 0.4, 0.1. Pairs (pos > neg = 1,
  # tie = 1/2): 0.8 beats both (2); each 0.4 ties 0.4 (1/2) and beats 0.1
  # (1): 2 + 1.5 + 1.5 = 5 of 6 pairs.
  scores = [0.8, 0.4, 0.4, 0.4, 0.1]
  is_pos = [True, True, True, False, False]
  assert evaluation.auroc(scores, is_pos) == pytest.approx(5 / 6)
  assert evaluation.auroc([1.0, 0.0], [True, False]) == 1.0
  assert evaluation.auroc([1.0, 0.0], [False, True]) == 0.0
  assert evaluation.auroc([3.0, 3.0, 3.0], [True, False, False]) == 0.5


def _pairwise_auroc(scores, is_pos):
  """The definition: mean over (pos, neg) pairs of 1[s_p > s_n] + 1/2 tie."""
  pos = [s for s, p in zip(scores, is_pos) if p]
  neg = [s for s, p in zip(scores, is_pos) if not p]
  total = sum(
    1.0 if a > b else 0.5 if a == b else 0.0 for a in pos for b in neg
  )
  return total / (len(pos) * len(neg))


@pytest.mark.parametrize('seed', [0, 1, 2])
def test_auroc_matches_sklearn_and_pairs_with_many_ties(seed):
  rng = np.random.default_rng(seed)
  n = 300
  is_pos = rng.random(n) < 0.3
  # Few distinct values: most scores are tied; positives slightly higher.
  scores = rng.integers(0, 6, size=n) + is_pos * rng.integers(0, 2, size=n)
  got = evaluation.auroc(scores.astype(np.float32), is_pos)
  assert got == pytest.approx(roc_auc_score(is_pos, scores), abs=1e-12)
  assert got == pytest.approx(_pairwise_auroc(scores, is_pos), abs=1e-12)
  assert 0.5 < got < 1.0


def test_auroc_errors():
  with pytest.raises(ValueError, match='positives and negatives'):
    evaluation.auroc([0.1, 0.2], [True, True])
  with pytest.raises(ValueError, match='positives and negatives'):
    evaluation.auroc([0.1, 0.2], [False, False])
  with pytest.raises(ValueError, match='NaN'):
    evaluation.auroc([np.nan, 0.2], [True, False])
  with pytest.raises(ValueError, match='same length'):
    evaluation.auroc([0.1, 0.2, 0.3], [True, False])


def test_one_class_auroc_matches_sklearn_per_class():
  rng = np.random.default_rng(3)
  n, c = 200, 4
  labels = rng.integers(0, c, size=n)
  scores = rng.normal(size=(n, c))
  scores[np.arange(n), labels] += 1.0  # Informative, not perfect.
  scores = np.round(scores, 1)  # Ties.
  got = evaluation.one_class_auroc(scores, labels)
  assert got.shape == (c,) and got.dtype == np.float64
  want = [roc_auc_score(labels == k, scores[:, k]) for k in range(c)]
  np.testing.assert_allclose(got, want, atol=1e-12)
  # Permuting the classes' columns breaks it: the column / class pairing
  # matters.
  assert not np.allclose(
    evaluation.one_class_auroc(scores[:, ::-1], labels), want
  )


def test_one_class_auroc_missing_class_is_an_error():
  with pytest.raises(ValueError, match='positives and negatives'):
    evaluation.one_class_auroc(np.zeros((3, 3)), np.array([0, 1, 1]))


def test_center_and_cosine_scores_match_numpy():
  rng = np.random.default_rng(4)
  e = rng.normal(size=(6, 3)).astype(np.float32)
  w = rng.normal(size=(4, 3)).astype(np.float32)
  e[2] = w[1]  # Zero distance, cosine 1.
  e[3] = 0.0  # Zero embedding: cosine 0.
  with jax.default_matmul_precision('highest'):
    dist = np.asarray(evaluation.center_scores(e, w))
    dist2 = np.asarray(evaluation.center_scores(e, w, squared=True))
    cos = np.asarray(evaluation.cosine_scores(e, w))
  assert dist.shape == dist2.shape == cos.shape == (6, 4)
  for i in range(6):
    for k in range(4):
      diff = [float(a) - float(b) for a, b in zip(e[i], w[k])]
      d = np.sqrt(sum(x * x for x in diff))
      dot = sum(float(a) * float(b) for a, b in zip(e[i], w[k]))
      norms = np.sqrt(
        sum(float(a) ** 2 for a in e[i]) * sum(float(b) ** 2 for b in w[k])
      )
      assert dist[i, k] == pytest.approx(-d, abs=1e-5)
      assert dist2[i, k] == pytest.approx(-d * d, abs=1e-5)
      assert cos[i, k] == pytest.approx(dot / max(norms, 1e-8), abs=1e-5)
  assert dist[2, 1] == 0.0 and cos[2, 1] == pytest.approx(1.0)


def test_class_centers_match_numpy_loop():
  rng = np.random.default_rng(5)
  e = rng.normal(size=(10, 3)).astype(np.float32)
  labels = np.array([0, 2, 2, 0, 1, 2, 0, 1, 2, 2])
  mask = np.array([1, 1, 0, 1, 1, 1, 1, 0, 1, 1], bool)
  got = np.asarray(evaluation.class_centers(e, labels, 4, mask=mask))
  assert got.shape == (4, 3)
  for k in range(4):
    rows = [e[i] for i in range(10) if labels[i] == k and mask[i]]
    want = (
      np.zeros(3)
      if not rows
      else [sum(float(r[d]) for r in rows) / len(rows) for d in range(3)]
    )
    np.testing.assert_allclose(got[k], want, **TOL)
  unmasked = np.asarray(evaluation.class_centers(e, labels, 3))
  np.testing.assert_allclose(unmasked[1], e[[4, 7]].mean(axis=0), **TOL)


def test_center_scores_end_to_end_auroc():
  # Well separated clusters around their class centers give AUROC 1.
  rng = np.random.default_rng(6)
  centers = np.eye(3, dtype=np.float32) * 10
  labels = np.repeat(np.arange(3), 20)
  e = centers[labels] + rng.normal(size=(60, 3)).astype(np.float32)
  est = evaluation.class_centers(e, labels, 3)
  scores = evaluation.center_scores(e, est)
  np.testing.assert_allclose(evaluation.one_class_auroc(scores, labels), 1.0)
