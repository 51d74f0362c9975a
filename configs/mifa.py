r"""MIFA (Gu et al., NeurIPS 2021): every client's latest update, every round.

Gu, Huang, Zhang and Huang, 'Fast Federated Learning in the Presence of
Arbitrary Device Unavailability', NeurIPS 2021, as in FedAU's released code
(docs/methods.md, Heterogeneous participation), in PMFL's heterogeneous setting
(fedjax_metric/settings.py, participation_setting). The client table holds one
stored update per client (250 x model size).

  python -m launch.main --config=configs/mifa.py:pattern=bernoulli \
      --workdir=runs/hetero/bernoulli_mifa

Arguments: pattern, normalize, rounds, eval_every, width, dataset, runlocal.
Results: docs/results/participation.md.
"""

from fedjax_metric import paper_settings as papers
from fedjax_metric import settings as common


def get_config(arg=None):
  arg = common.parse_arg(arg, **papers.PARTICIPATION_ARGS)
  c = papers.participation_setting(arg)
  c.algorithm = 'mifa'
  return common.finalize(c, arg)
