"""Algorithms by name. Each entry: ``make(model, *, server_optimizer, **kwargs)``.

Keyword arguments come from the config's ``algorithm_kwargs`` block; an
unknown keyword is an error (see train.build_algorithm).
"""

from fedjax_metric.algorithms import (
  deepsvdd,
  fedalignuniform,
  fedau,
  fedavg,
  fedaws,
  feddecorr,
  fedmetric,
  fedprox,
  fedquad,
  fedrcl,
  fedu2,
  feduv,
  fedvarp,
  fedx,
  l_dawa,
  mifa,
  moon,
  pmfl,
  scaffold,
  ssd,
)

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
  'fedmetric': fedmetric.make,
  'deepsvdd': deepsvdd.make,
  'fedaws': fedaws.make,
  'feduv': feduv.make,
  'fedau': fedau.make,
  'mifa': mifa.make,
  'fedvarp': fedvarp.make,
  'pmfl': pmfl.make,
  'fedalignuniform': fedalignuniform.make,
  'ssd': ssd.make,
  'feddecorr': feddecorr.make,
  'fedu2': fedu2.make,
  'fedx': fedx.make,
  'l_dawa': l_dawa.make,
}
