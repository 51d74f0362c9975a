r"""FedRCL: CE + multi-level relaxed supervised contrastive loss.

Seo, Kim, Kim and Han, 'Relaxed Contrastive Learning for Federated Learning',
CVPR 2024, Eq. 5 and Algorithm 1. ``form='code'`` is the authors' released
loss (github.com/skynbe/FedRCL), ``form='paper'`` Eq. 5 (docs/methods.md,
FedRCL).

FedRCL's setting (fedjax_metric/settings.py fedrcl_setting): CIFAR-10, ResNet-18 with
GroupNorm(2), 100 clients, 5 per round, balanced Dirichlet, SGD 0.1 x 0.998 per
round, grad clip 10, batch 50, 5 local epochs, 1000 rounds.

  python -m launch.main --config=configs/fedrcl.py --workdir=runs/fedrcl
  python -m launch.main --config=configs/fedrcl.py:alpha=0.1 --workdir=runs/fedrcl_a0.1
  python -m launch.main --config=configs/fedrcl.py:dataset=fashion_mnist,model=small_cnn \
      --workdir=runs/fedrcl_fmnist

Arguments: alpha (0.3), model (resnet18 | small_cnn), central, dataset,
runlocal. Results: docs/results/fedrcl.md.
"""

import ml_collections

from fedjax_metric import paper_settings as papers
from fedjax_metric import settings as common


def get_config(arg=None):
  arg = common.parse_arg(arg, **papers.FEDRCL_ARGS)
  c = papers.fedrcl_setting(arg)
  c.algorithm = 'fedrcl'
  c.algorithm_kwargs = ml_collections.ConfigDict(
    dict(temperature=0.05, threshold=0.7, beta=1.0, form='code')
  )
  return common.finalize(c, arg)
