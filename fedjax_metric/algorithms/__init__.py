"""Algorithms by name: ``REGISTRY[name]`` is the `spec.AlgorithmSpec` its
module declares (typed options, the run inputs it reads, its build).

Options come from the config's ``algorithm_kwargs`` block and are checked
once, by the spec (validation.py calls it before anything runs); calling
a spec, ``REGISTRY[name](model, server_optimizer=..., **options)``, builds
the `engine.Algorithm`.
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

SPECS = {entry.name: entry for module in _MODULES for entry in module.SPECS}
REGISTRY = SPECS


DESCRIPTIONS = {name: entry.description for name, entry in REGISTRY.items()}


class _CallableModule(types.ModuleType):
  """Lets ``fedjax_metric.algorithms()`` list the algorithms although
  ``fedjax_metric.algorithms`` is this package (a submodule attribute would
  shadow a function of that name)."""

  def __call__(self) -> Dict[str, str]:
    """Every registered algorithm's name and a one-line description."""
    return dict(sorted(DESCRIPTIONS.items()))


sys.modules[__name__].__class__ = _CallableModule
