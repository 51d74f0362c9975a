"""Algorithms by name. Each entry: ``make(model, *, server_optimizer, **kwargs)``.

Keyword arguments come from the config's ``algorithm_kwargs`` block; an
unknown keyword is an error (see train.build_algorithm).
"""

from fedjax_metric.algorithms import fedavg, fedprox, fedquad, fedrcl, moon
from fedjax_metric.algorithms import scaffold

REGISTRY = {
    'fedavg': fedavg.make,
    'fedprox': fedprox.make,
    'fedquad': fedquad.make_fedquad,
    'quadrupletfl': fedquad.make_quadrupletfl,
    'tripletfl': fedquad.make_tripletfl,
    'supconfl': fedquad.make_supconfl,
    'moon': moon.make,
    'fedrcl': fedrcl.make_fedrcl,
    'fedscl': fedrcl.make_fedscl,
    'scaffold': scaffold.make,
}
