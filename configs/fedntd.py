r"""FedNTD (Lee et al. 2022): CE + not-true distillation from the global model.

Lee, Jeong, Shin, Bae and Yun, 'Preservation of the Global Knowledge by
Not-True Distillation in Federated Learning', NeurIPS 2022 (docs/methods.md,
FedNTD). ``setting=fedrcl`` / ``setting=fedquad`` put it in those papers'
settings (fedjax_metric/paper_settings.py): the FedNTD row of FedRCL's
Table 1. tau = 1 and beta = 1, the authors' released configuration.

  python -m launch.main --config=configs/fedntd.py --workdir=/tmp/fedntd
  python -m launch.main --config=configs/fedntd.py:setting=fedrcl,alpha=0.1 \
      --workdir=runs/fedntd_rcl --config.algorithm_kwargs.beta=0.3

Arguments: setting, central, model (small_cnn | fedquad_cnn | resnet18 |
moon_cnn), dataset, runlocal.
"""

from fedjax_metric import paper_settings as papers
from fedjax_metric import settings as common


def get_config(arg=None):
  c, arg = papers.setting_config(arg)
  c.algorithm = 'fedntd'
  c.algorithm_kwargs.beta = 1.0
  c.algorithm_kwargs.temperature = 1.0
  return common.finalize(c, arg)
