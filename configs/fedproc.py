r"""FedProc (Mu et al. 2021): contrastive loss towards global class prototypes.

Mu, Shen, Cheng, Geng, Fu, Zhang and Zhang, 'FedProc: Prototypical
Contrastive Federated Learning on Non-IID Data' (docs/methods.md, FedProc).
``setting=fedrcl`` / ``setting=fedquad`` put it in those papers' settings
(fedjax_metric/paper_settings.py): the FedProc row of FedRCL's Table 1. The
prototypes live in the representation the classifier reads ('embedding').

  python -m launch.main --config=configs/fedproc.py --workdir=/tmp/fedproc
  python -m launch.main --config=configs/fedproc.py:setting=fedrcl,alpha=0.1 \
      --workdir=runs/fedproc_rcl

Arguments: setting, central, model (small_cnn | fedquad_cnn | resnet18 |
moon_cnn), dataset, runlocal, server (fedavg | fedavgm | fedagm |
fedhyper).
"""

from fedjax_metric import paper_settings as papers
from fedjax_metric import settings as common


def get_config(arg=None):
  c, arg = papers.setting_config(arg)
  c.algorithm = 'fedproc'
  c.algorithm_kwargs.feature = 'embedding'
  return common.finalize(c, arg)
