r"""FedLC (Zhang et al. 2022): cross-entropy on logits calibrated by the
client's label counts.

Zhang, Li, Li, Zhang, Wang and Wu, 'Federated Learning with Label
Distribution Skew via Logits Calibration', ICML 2022 (docs/methods.md,
FedLC). ``setting=fedrcl`` / ``setting=fedquad`` put it in those papers'
settings (fedjax_metric/paper_settings.py): the FedLC row of FedRCL's
Table 1. tau = 1, the value of the authors' framework.

  python -m launch.main --config=configs/fedlc.py --workdir=/tmp/fedlc
  python -m launch.main --config=configs/fedlc.py:setting=fedrcl,alpha=0.1 \
      --workdir=runs/fedlc_rcl

Arguments: setting, central, model (small_cnn | fedquad_cnn | resnet18 |
moon_cnn), dataset, runlocal, server (fedavg | fedavgm | fedagm |
fedhyper).
"""

from fedjax_metric import paper_settings as papers
from fedjax_metric import settings as common


def get_config(arg=None):
  c, arg = papers.setting_config(arg)
  c.algorithm = 'fedlc'
  c.algorithm_kwargs.tau = 1.0
  return common.finalize(c, arg)
