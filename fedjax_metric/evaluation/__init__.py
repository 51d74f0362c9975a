"""Evaluation of the global model on a held-out split."""

from fedjax_metric.evaluation.classification import make_evaluate_fn  # noqa: F401
