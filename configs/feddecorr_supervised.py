r"""FedDecorr (Shi et al. 2023) as proposed: CE + decorrelation of the
representations, a row of FedRCL's Table 1.

Shi et al., 'Towards Understanding and Mitigating
Dimensional Collapse in Heterogeneous Federated Learning', ICLR 2023
(docs/methods.md, FedDecorr). lambda = 0.1, the authors' released
coefficient. ``setting=fedrcl`` / ``setting=fedquad`` put it in those
papers' settings (fedjax_metric/paper_settings.py). configs/feddecorr.py is
its unsupervised use in SSD's comparison.

  python -m launch.main --config=configs/feddecorr_supervised.py --workdir=/tmp/fdc
  python -m launch.main \
      --config=configs/feddecorr_supervised.py:setting=fedrcl,alpha=0.1 \
      --workdir=runs/feddecorr_rcl

Arguments: setting, central, model (small_cnn | fedquad_cnn | resnet18 |
moon_cnn), dataset, runlocal.
"""

from fedjax_metric import paper_settings as papers
from fedjax_metric import settings as common


def get_config(arg=None):
  c, arg = papers.setting_config(arg)
  c.algorithm = 'feddecorr_supervised'
  c.algorithm_kwargs.decorr_weight = 0.1
  c.algorithm_kwargs.decorr_form = 'code'
  return common.finalize(c, arg)
