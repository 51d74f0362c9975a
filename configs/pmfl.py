r"""PMFL (Zhang et al., 2025): historical local models in a model-contrastive
term, adaptive aggregation weights, historical global models.

Zhang et al., 'Towards Performance-Enhanced Model-Contrastive Federated
Learning using Historical Information in Heterogeneous Scenarios', preprint,
2025 (docs/methods.md, Heterogeneous participation), in its heterogeneous
setting (fedjax_metric/settings.py, participation_setting) with Section V-C's defaults:
lambda = 0.5, tau = 0.5, local buffer N = 5, global buffer H = 3, cutoff
C = 50, eta_g = 1. The client table holds 5 buffered models per client and
the previous local model (250 x 6 x model size).

  python -m launch.main --config=configs/pmfl.py:pattern=bernoulli \
      --workdir=runs/hetero/bernoulli_pmfl
  python -m launch.main --config=configs/pmfl.py:pattern=bernoulli,cutoff=200 \
      --workdir=runs/hetero/bernoulli_pmfl_c200

Arguments: pattern, cutoff, threshold (previous | current | start),
normalize, rounds, eval_every, width, dataset, runlocal. Results:
docs/results/participation.md.
"""

import ml_collections

from fedjax_metric import paper_settings as papers
from fedjax_metric import settings as common


def get_config(arg=None):
  arg = common.parse_arg(
    arg, cutoff=50, threshold='previous', **papers.PARTICIPATION_ARGS
  )
  c = papers.participation_setting(arg)
  c.algorithm = 'pmfl'
  c.algorithm_kwargs = ml_collections.ConfigDict(
    {
      'contrastive_weight': 0.5,
      'temperature': 0.5,
      'buffer_size': 5,
      'threshold': arg.threshold,
      'cutoff': arg.cutoff or None,
      'history_size': 3,
      'normalize': 'num_clients',
      # Ablation (not in the paper): undo the step the history mixing
      # takes away (pmfl.mixing_step_factor).
      'mixing_compensation': False,
    }
  )
  return common.finalize(c, arg)
