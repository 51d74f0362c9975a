"""Algorithms by name. Each entry: ``make(model, *, server_optimizer, **kwargs)``.

Keyword arguments come from the config's ``algorithm_kwargs`` block; an
unknown keyword is an error (see assemble.build_algorithm).
"""

import sys
import types
from typing import Dict

from fedjax_metric.algorithms import (
  deepsvdd,
  fedalignuniform,
  fedau,
  fedavg,
  fedaws,
  feddecorr,
  fedlc,
  fedmetric,
  fedmlb,
  fedntd,
  fedppo,
  fedproc,
  fedprox,
  fedquad,
  fedrcl,
  fedu2,
  feduv,
  fedvarp,
  fedx,
  fitnet,
  l_dawa,
  mifa,
  moon,
  pmfl,
  scaffold,
  ssd,
)

# The modules that register algorithms; each declares ``SPECS``, one
# `spec.AlgorithmSpec` per registered name (algorithms/spec.py).
_MODULES = (
  fedavg,
  fedprox,
  scaffold,
  fedquad,
  moon,
  fedntd,
  fedlc,
  fitnet,
  fedmlb,
  fedproc,
  fedrcl,
  feddecorr,
  fedmetric,
  deepsvdd,
  fedaws,
  feduv,
  fedau,
  mifa,
  fedvarp,
  fedppo,
  pmfl,
  fedalignuniform,
  ssd,
  fedu2,
  fedx,
  l_dawa,
)

# Modules not yet converted to SPECS (name -> legacy factory).
_LEGACY = {
  'fedquad': lambda: fedquad.make_fedquad,
  'quadrupletfl': lambda: fedquad.make_quadrupletfl,
  'tripletfl': lambda: fedquad.make_tripletfl,
  'supconfl': lambda: fedquad.make_supconfl,
  'fedntd': lambda: fedntd.make,
  'fedlc': lambda: fedlc.make,
  'fitnet': lambda: fitnet.make,
  'fedmlb': lambda: fedmlb.make,
  'fedproc': lambda: fedproc.make,
  'fedrcl': lambda: fedrcl.make_fedrcl,
  'fedscl': lambda: fedrcl.make_fedscl,
  'scaffold': lambda: scaffold.make,
  'fedmetric': lambda: fedmetric.make,
  'deepsvdd': lambda: deepsvdd.make,
  'fedaws': lambda: fedaws.make,
  'feduv': lambda: feduv.make,
  'fedau': lambda: fedau.make,
  'mifa': lambda: mifa.make,
  'fedvarp': lambda: fedvarp.make,
  'fedppo': lambda: fedppo.make,
  'pmfl': lambda: pmfl.make,
  'fedalignuniform': lambda: fedalignuniform.make,
  'ssd': lambda: ssd.make,
  'feddecorr': lambda: feddecorr.make,
  'feddecorr_supervised': lambda: feddecorr.make_supervised,
  'fedu2': lambda: fedu2.make,
  'fedx': lambda: fedx.make,
  'l_dawa': lambda: l_dawa.make,
}

SPECS = {
  spec.name: spec
  for module in _MODULES
  for spec in getattr(module, 'SPECS', ())
}
REGISTRY = {
  **{name: factory() for name, factory in _LEGACY.items() if name not in SPECS},
  **SPECS,
}


def make(name: str, model, **kwargs):
  """The registered algorithm ``name`` (`spec.AlgorithmSpec.__call__`:
  ``server_optimizer=``, ``weighting=``, ``run=`` and its options)."""
  if name not in REGISTRY:
    raise ValueError(
      f'Unknown algorithm {name!r}; registered: {sorted(REGISTRY)}.'
    )
  return REGISTRY[name](model, **kwargs)


class _CallableModule(types.ModuleType):
  """Lets ``fedjax_metric.algorithms()`` list the algorithms although
  ``fedjax_metric.algorithms`` is this package (a submodule attribute would
  shadow a function of that name)."""

  def __call__(self) -> Dict[str, str]:
    """Every registered algorithm's name and a one-line description."""
    return dict(sorted(DESCRIPTIONS.items()))


sys.modules[__name__].__class__ = _CallableModule
