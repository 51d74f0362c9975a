"""Evaluation of the global model on a held-out split."""

from fedjax_metric.evaluation.classification import make_evaluate_fn  # noqa: F401
from fedjax_metric.evaluation.representation import between_class_trace  # noqa: F401
from fedjax_metric.evaluation.representation import effective_rank  # noqa: F401
from fedjax_metric.evaluation.representation import make_feature_fn  # noqa: F401
from fedjax_metric.evaluation.representation import representation_metrics  # noqa: F401
from fedjax_metric.evaluation.representation import uniformity  # noqa: F401
from fedjax_metric.evaluation.representation import vci  # noqa: F401
from fedjax_metric.evaluation.representation import within_between_ratio  # noqa: F401
from fedjax_metric.evaluation.representation import within_class_trace  # noqa: F401
from fedjax_metric.evaluation.oneclass import auroc  # noqa: F401
from fedjax_metric.evaluation.oneclass import center_scores  # noqa: F401
from fedjax_metric.evaluation.oneclass import class_centers  # noqa: F401
from fedjax_metric.evaluation.oneclass import cosine_scores  # noqa: F401
from fedjax_metric.evaluation.oneclass import one_class_auroc  # noqa: F401
from fedjax_metric.evaluation.downstream import fine_tune  # noqa: F401
from fedjax_metric.evaluation.downstream import knn_accuracy  # noqa: F401
from fedjax_metric.evaluation.downstream import linear_probe  # noqa: F401
from fedjax_metric.evaluation.downstream import stratified_subset  # noqa: F401
