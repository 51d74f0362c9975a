r"""FedProx (Li et al. 2020): FedAvg + (mu/2)||w - w_global||^2 locally.

Li, Sahu, Zaheer, Sanjabi, Talwalkar and Smith, 'Federated Optimization in
Heterogeneous Networks', MLSys 2020, Eq. 2 (docs/methods.md, FedProx).
``setting=fedrcl`` / ``setting=fedquad`` put FedProx in those papers'
settings (fedjax_metric/settings.py), the FedProx row of FedRCL's Table 1. Neither
paper gives mu; 0.01 is used (the middle of FedProx's grid
{0.001, 0.01, 0.1, 1}).

  python -m launch.main --config=configs/fedprox.py --workdir=/tmp/fedprox \
      --config.algorithm_kwargs.mu=0.1
  python -m launch.main --config=configs/fedprox.py:setting=fedrcl,alpha=0.1 \
      --workdir=runs/fedprox_rcl

Results: docs/results/fedrcl.md.

Arguments: central, model (small_cnn | fedquad_cnn | resnet18 | moon_cnn),
dataset, runlocal.
"""

from fedjax_metric import paper_settings as papers
from fedjax_metric import settings as common


def get_config(arg=None):
  c, arg = papers.setting_config(arg)
  c.algorithm = 'fedprox'
  c.algorithm_kwargs.mu = 0.01
  return common.finalize(c, arg)
