"""Checks across algorithms: the registry, and bad hyperparameters refused by
name. Each algorithm's own tests are in tests/algorithms/ (test_<name>.py for
fedjax_metric/algorithms/<name>.py); every registered algorithm through the
executors is tests/test_registry.py."""

from algorithms.metric_helpers import build
import fl_fixtures as fx
import pytest

from fedjax_metric import algorithms, optimizers
from fedjax_metric.algorithms import fedavg


def test_registry_and_bad_hyperparameters():
  assert {'fedavg', 'fedprox'} <= set(algorithms.REGISTRY)
  server = optimizers.make_server_optimizer('sgd')
  with pytest.raises(ValueError, match='mu'):
    algorithms.REGISTRY['fedprox'](fx.linear(), server_optimizer=server, mu=-1)
  with pytest.raises(ValueError, match='weighting'):
    fedavg.build(fx.linear(), server_optimizer=server, weighting='by_loss')


def test_bad_hyperparameters_are_errors():
  model = fx.linear()
  with pytest.raises(ValueError, match='beta'):
    build('fedquad', model, beta=-1.0)
  with pytest.raises(ValueError, match='form'):
    build('fedrcl', model, form='blog')
  with pytest.raises(ValueError, match='temperature'):
    build('moon', model, temperature=0.0)
