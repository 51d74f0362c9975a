r"""FedMLB (Kim, Kim and Han 2022): hybrid pathways through the global model.

Kim, Kim and Han, 'Multi-Level Branched Regularization for Federated
Learning', ICML 2022 (docs/methods.md, FedMLB). ``setting=fedrcl`` /
``setting=fedquad`` put it in those papers' settings
(fedjax_metric/paper_settings.py): the FedMLB row of FedRCL's Table 1.
lambda_1 = lambda_2 = 1 and tau = 1, the authors' released configuration.
Needs a model with branch points: small_cnn (3) or resnet18 (5).

  python -m launch.main --config=configs/fedmlb.py --workdir=/tmp/fedmlb
  python -m launch.main --config=configs/fedmlb.py:setting=fedrcl,alpha=0.1 \
      --workdir=runs/fedmlb_rcl

Arguments: setting, central, model (small_cnn | resnet18), dataset,
runlocal, server (fedavg | fedavgm | fedagm |
fedhyper).
"""

from fedjax_metric import paper_settings as papers
from fedjax_metric import settings as common


def get_config(arg=None):
  c, arg = papers.setting_config(arg)
  c.algorithm = 'fedmlb'
  c.algorithm_kwargs.ce_weight = 1.0
  c.algorithm_kwargs.kl_weight = 1.0
  c.algorithm_kwargs.temperature = 1.0
  return common.finalize(c, arg)
