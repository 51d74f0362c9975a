r"""FedAvg + FitNet (Romero et al. 2015): CE + a hint from the global model.

Romero, Ballas, Kahou, Chassang, Gatta and Bengio, 'FitNets: Hints for Thin
Deep Nets', ICLR 2015, as the 'FedAvg + FitNet' row of FedRCL's Table 1
(docs/methods.md, FitNet). ``setting=fedrcl`` / ``setting=fedquad`` put it in
those papers' settings (fedjax_metric/paper_settings.py). The hint layer is
the model's middle feature tap; beta = 1 (no published value: tune it; in
FedRCL's protocol on Fashion-MNIST with the small CNN, a validation split
chose 0.01, docs/results/fedrcl.md).

  python -m launch.main --config=configs/fitnet.py --workdir=/tmp/fitnet
  python -m launch.main --config=configs/fitnet.py:setting=fedrcl,alpha=0.1 \
      --workdir=runs/fitnet_rcl --config.algorithm_kwargs.beta=0.1

Arguments: setting, central, model (small_cnn | fedquad_cnn | resnet18 |
moon_cnn), dataset, runlocal, server (fedavg | fedavgm | fedagm |
fedhyper).
"""

from fedjax_metric import paper_settings as papers
from fedjax_metric import settings as common


def get_config(arg=None):
  c, arg = papers.setting_config(arg)
  c.algorithm = 'fitnet'
  c.algorithm_kwargs.beta = 1.0
  c.algorithm_kwargs.level = -1
  return common.finalize(c, arg)
