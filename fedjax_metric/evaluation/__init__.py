"""Evaluation of the global model on a held-out split."""

from fedjax_metric.evaluation.classification import make_evaluate_fn  # noqa: F401
from fedjax_metric.evaluation.downstream import (
  knn_accuracy,  # noqa: F401
  linear_probe,  # noqa: F401
)
from fedjax_metric.evaluation.oneclass import (
  auroc,  # noqa: F401
  center_scores,  # noqa: F401
  class_centers,  # noqa: F401
  cosine_scores,  # noqa: F401
  one_class_auroc,  # noqa: F401
)
from fedjax_metric.evaluation.representation import (
  between_class_trace,  # noqa: F401
  effective_rank,  # noqa: F401
  make_feature_fn,  # noqa: F401
  representation_metrics,  # noqa: F401
  uniformity,  # noqa: F401
  vci,  # noqa: F401
  within_between_ratio,  # noqa: F401
  within_class_trace,  # noqa: F401
)
from fedjax_metric.evaluation.semi_supervised import (
  fine_tune,  # noqa: F401
  stratified_subset,  # noqa: F401
)
