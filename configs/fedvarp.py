r"""FedVarp (Jhunjhunwala et al., UAI 2022): stored updates as control variates.

Jhunjhunwala, Sharma, Nagarkatti and Joshi, 'FedVARP: Tackling the Variance
Due to Partial Client Participation in Federated Learning', UAI 2022, as in
FedAU's released code (docs/methods.md, Heterogeneous participation), in
PMFL's heterogeneous setting (fedjax_metric/settings.py, participation_setting). The
client table holds one stored update per client (250 x model size).

  python -m launch.main --config=configs/fedvarp.py:pattern=bernoulli \
      --workdir=runs/hetero/bernoulli_fedvarp

Arguments: pattern, normalize, rounds, eval_every, width, dataset, runlocal.
Results: docs/results/participation.md.
"""

from fedjax_metric import paper_settings as papers
from fedjax_metric import settings as common


def get_config(arg=None):
  arg = common.parse_arg(arg, **papers.PARTICIPATION_ARGS)
  c = papers.participation_setting(arg)
  c.algorithm = 'fedvarp'
  return common.finalize(c, arg)
