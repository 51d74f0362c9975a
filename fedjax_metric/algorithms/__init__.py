"""Algorithms by name. Each entry: ``make(model, *, server_optimizer, **kwargs)``.

Keyword arguments come from the config's ``algorithm_kwargs`` block; an
unknown keyword is an error (see train.build_algorithm).
"""

from fedjax_metric.algorithms import fedavg, fedprox

REGISTRY = {
    'fedavg': fedavg.make,
    'fedprox': fedprox.make,
}
