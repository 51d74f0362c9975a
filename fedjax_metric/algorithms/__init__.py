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
  'fedalignuniform': lambda: fedalignuniform.make,
  'ssd': lambda: ssd.make,
  'fedu2': lambda: fedu2.make,
  'fedx': lambda: fedx.make,
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


_LEGACY_DESCRIPTIONS = {
  'fedavg': 'FedAvg (McMahan et al., 2017): local SGD, weighted averaging.',
  'fedprox': 'FedProx (Li et al., 2020): a proximal term mu/2 ||w - w_g||^2.',
  'scaffold': 'SCAFFOLD (Karimireddy et al., 2020): control variates.',
  'fedquad': 'FedQuad (2025): stochastic quadruplet loss + cross-entropy.',
  'quadrupletfl': 'QuadrupletFL: the quadruplet loss of Chen et al. (2017).',
  'tripletfl': 'TripletFL: triplet loss + cross-entropy.',
  'supconfl': 'SupConFL: supervised contrastive loss + cross-entropy.',
  'moon': 'MOON (Li et al., 2021): model-contrastive loss.',
  'feddecorr_supervised': 'FedDecorr (Shi et al., 2023) as proposed: '
  'cross-entropy + decorrelation of the representations.',
  'fedntd': "FedNTD (Lee et al., 2022): distillation of the global model's "
  'not-true class predictions.',
  'fedlc': 'FedLC (Zhang et al., 2022): cross-entropy on logits calibrated '
  "by the client's label counts.",
  'fitnet': 'FedAvg + FitNet (Romero et al., 2015): a hint loss to the '
  "global model's intermediate features.",
  'fedmlb': 'FedMLB (Kim et al., 2022): hybrid pathways through the '
  "global model's upper blocks, distilled into the local model.",
  'fedproc': 'FedProc (Mu et al., 2021): contrastive loss towards global '
  'class prototypes kept by the server.',
  'fedrcl': 'FedRCL (Seo et al., 2024): relaxed supervised contrastive loss.',
  'fedscl': 'FedSCL: supervised contrastive loss on multi-level features.',
  'fedmetric': 'FedMetric (Park et al., 2021): one class per client, proxy '
  'hyperspheres.',
  'deepsvdd': 'Deep SVDD (Ruff et al., 2018): one model per client.',
  'fedaws': 'FedAwS (Yu et al., 2020): server-side spreadout of class '
  'embeddings.',
  'feduv': 'FedUV (Hosseini et al., 2021): fixed error-correcting codewords.',
  'fedau': 'FedAU (Wang & Ji, 2024): weights from online participation '
  'intervals.',
  'mifa': "MIFA (Gu et al., 2021): every client's latest update, each round.",
  'fedvarp': 'FedVarp (Jhunjhunwala et al., 2022): stored updates as control '
  'variates.',
  'fedppo': 'FedPPO (Zhao et al., 2025): a PPO agent on the server picks '
  'the clients whose updates are averaged.',
  'pmfl': 'PMFL (Zhang et al., 2025): historical models in a contrastive '
  'term and the server.',
  'fedalignuniform': 'Alignment + uniformity (Wang & Isola, 2020), federated.',
  'ssd': 'SSD (Fang et al., 2025): dimension-scaled uniformity + projector '
  'distillation.',
  'feddecorr': 'FedDecorr (Shi et al., 2023): decorrelation regulariser.',
  'fedu2': 'FedU2 (Liao et al., 2024): flexible uniform regulariser and '
  'efficient aggregation.',
  'fedx': 'FedX (Han et al., 2022): local and global relational distillation.',
  'l_dawa': 'L-DAWA (Rehman et al., 2023): layer-wise divergence-aware '
  'weights.',
}


DESCRIPTIONS = {
  name: getattr(entry, 'description', '') or _LEGACY_DESCRIPTIONS[name]
  for name, entry in REGISTRY.items()
}


class _CallableModule(types.ModuleType):
  """Lets ``fedjax_metric.algorithms()`` list the algorithms although
  ``fedjax_metric.algorithms`` is this package (a submodule attribute would
  shadow a function of that name)."""

  def __call__(self) -> Dict[str, str]:
    """Every registered algorithm's name and a one-line description."""
    return dict(sorted(DESCRIPTIONS.items()))


sys.modules[__name__].__class__ = _CallableModule
