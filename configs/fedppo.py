r"""FedPPO (Zhao et al., 2025) in PMFL's heterogeneous setting.

Zhao, Li, Li, Yang and Xu, 'FedPPO: Reinforcement Learning-Based Client
Selection for Federated Learning with Heterogeneous Data', IEEE TCCN 2025, as
the FedPPO row of PMFL's Table I (fedjax_metric/algorithms/fedppo.py;
docs/methods.md, FedPPO): a PPO agent on the server keeps half of each
round's available clients (``select_fraction``) and learns from rewards made
of validation accuracies. The rewards' accuracies are measured on 256
examples of a 2% validation split held out of the training set (the
released code uses the test set), so the clients share 98% of the training
examples the other rows of the table partition.

  python -m launch.main --config=configs/fedppo.py:pattern=bernoulli \
      --workdir=runs/hetero/bernoulli_fedppo

Arguments: pattern, normalize, rounds, eval_every, width, dataset, runlocal,
select_fraction. Results: docs/results/participation.md.
"""

import ml_collections

from fedjax_metric import paper_settings as papers
from fedjax_metric import settings as common


def get_config(arg=None):
  arg = common.parse_arg(arg, select_fraction=0.5, **papers.PARTICIPATION_ARGS)
  c = papers.participation_setting(arg)
  c.dataset.validation_fraction = 0.02
  c.algorithm = 'fedppo'
  c.algorithm_kwargs = ml_collections.ConfigDict(
    {
      'select_fraction': arg.select_fraction,
      'reward_examples': 256,
      'update_every': 5,
      # 'random': the ablation (the same number drawn uniformly).
      'selection': 'ppo',
    }
  )
  return common.finalize(c, arg)
