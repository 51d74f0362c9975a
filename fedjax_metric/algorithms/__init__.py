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

REGISTRY = {
  'fedavg': fedavg.make,
  'fedprox': fedprox.make,
  'fedquad': fedquad.make_fedquad,
  'quadrupletfl': fedquad.make_quadrupletfl,
  'tripletfl': fedquad.make_tripletfl,
  'supconfl': fedquad.make_supconfl,
  'moon': moon.make,
  'fedntd': fedntd.make,
  'fedlc': fedlc.make,
  'fitnet': fitnet.make,
  'fedmlb': fedmlb.make,
  'fedproc': fedproc.make,
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
  'fedppo': fedppo.make,
  'pmfl': pmfl.make,
  'fedalignuniform': fedalignuniform.make,
  'ssd': ssd.make,
  'feddecorr': feddecorr.make,
  'feddecorr_supervised': feddecorr.make_supervised,
  'fedu2': fedu2.make,
  'fedx': fedx.make,
  'l_dawa': l_dawa.make,
}

# One line per algorithm: the paper and what the method changes
# (`fedjax_metric.algorithms()`; docs/methods.md has the equations).
DESCRIPTIONS = {
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


class _CallableModule(types.ModuleType):
  """Lets ``fedjax_metric.algorithms()`` list the algorithms although
  ``fedjax_metric.algorithms`` is this package (a submodule attribute would
  shadow a function of that name)."""

  def __call__(self) -> Dict[str, str]:
    """Every registered algorithm's name and a one-line description."""
    return dict(sorted(DESCRIPTIONS.items()))


sys.modules[__name__].__class__ = _CallableModule
