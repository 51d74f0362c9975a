"""Which evaluation a run performs: one `Evaluator` per protocol.

  * 'classification': test accuracy and loss of the global model's logits
    (and representation metrics of its embeddings when asked for).
  * 'one_class': per-class one-vs-rest AUROC of embedding models trained
    with one class per client (FedMetric, DeepSVDD, FedAwS, FedUV).
  * 'ssl': label-free training judged by downstream use of its encoder: a
    kNN monitor at every evaluation and, at the end of a run, a linear probe,
    semi-supervised fine-tuning, uniformity and effective rank.

An evaluator sees the whole state, ``(server_state, client_table)``, since
some methods keep what is evaluated outside the global model (DeepSVDD's
per-client models, FedAwS's class embeddings).
"""

from typing import Any, Callable, Dict, NamedTuple

from fedjax_metric.evaluation import classification

PROTOCOLS = ('classification', 'one_class', 'ssl')


class Evaluator(NamedTuple):
  """Attributes:
    every: ``(server_state, client_table) -> {name: float}``, at every
      evaluation of a run.
    final: ``(server_state, client_table) -> {name: float}``, once at the end
      of a run (slow downstream evaluations); may return ``{}``.
    headline: the metric the progress bar shows.
  """
  every: Callable[..., Dict[str, float]]
  final: Callable[..., Dict[str, float]]
  headline: str


def _nothing(server_state, client_table) -> Dict[str, Any]:
  del server_state, client_table
  return {}


def make_evaluator(config, *, model, preprocess, train, test,
                   clients) -> Evaluator:
  """The config's `Evaluator` (``config.eval_protocol``).

  Args:
    config: the run's config.
    model: `ModelFns`.
    preprocess: ``(uint8 images, key) -> float images``, no augmentation.
    train, test: `sources.ArrayDataset` splits.
    clients: the partition, per-client index arrays into ``train``.
  """
  protocol = config.eval_protocol
  if protocol == 'classification':
    evaluate = classification.make_evaluate_fn(
        model, preprocess, test.images, test.labels,
        batch_size=config.eval_batch_size,
        representation_examples=config.representation_examples,
        num_classes=test.num_classes)
    return Evaluator(lambda state, table: evaluate(state.variables), _nothing,
                     'test_accuracy')
  del train, clients
  raise ValueError(f'Unknown eval_protocol {protocol!r}; use one of '
                   f'{PROTOCOLS} (--config.eval_protocol).')
