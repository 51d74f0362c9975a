r"""FedHyper (Wang, Wang and Li, ICLR 2024) in PMFL's heterogeneous setting.

Wang, Wang and Li, 'FedHyper: A Universal and Robust Learning Rate Scheduler
for Federated Learning with Hypergradient Descent', ICLR 2024, as the
FedHyper row of PMFL's Table I: FedAvg over the round's participants
(FedAU's ``average_participating``) whose global learning rate is adapted
every round by FedHyper-G's hypergradient step
(`optimizers.fedhyper_global`), from eta_g = 1 within the authors' bounds
[0.2, 5], and whose clients adapt their local rate after every step
(FedHyper-CL, `algorithms/fedhyper.py`; docs/methods.md).
``--config.server.fedhyper_local=False`` is FedHyper-G alone. Any other
config takes the same with ``--config.server.optimizer=fedhyper
--config.server.fedhyper_local=True`` (the supervised ones:
``:server=fedhyper``).

  python -m launch.main --config=configs/fedhyper.py:pattern=bernoulli \
      --workdir=runs/hetero/bernoulli_fedhyper

Arguments: pattern, normalize, rounds, eval_every, width, dataset, runlocal.
Results: docs/results/participation.md.
"""

import ml_collections

from fedjax_metric import paper_settings as papers
from fedjax_metric import settings as common


def get_config(arg=None):
  arg = common.parse_arg(arg, **papers.PARTICIPATION_ARGS)
  c = papers.participation_setting(arg)
  c.algorithm = 'fedau'
  c.algorithm_kwargs = ml_collections.ConfigDict(
    {'aggregation': 'average_participating', 'cutoff': None}
  )
  common.apply_server_method(c, 'fedhyper')
  return common.finalize(c, arg)
