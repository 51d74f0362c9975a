r"""FedSCL (FedRCL's baseline): CE + multi-level supervised contrastive loss.

The baseline of Seo et al., 'Relaxed Contrastive Learning for Federated
Learning', CVPR 2024 (Table 3): FedRCL without its divergence penalty.
``form='code'`` (default) is the supervised pair of the authors' released
loss (github.com/skynbe/FedRCL, utils/loss.py), ``form='paper'`` their Eq. 2
(sum over positives), ``form='khosla'`` Khosla et al.'s mean over positives
(docs/methods.md, FedRCL and FedSCL).

FedRCL's setting (fedjax_metric/settings.py fedrcl_setting): CIFAR-10, ResNet-18 with
GroupNorm(2), 100 clients, 5 per round, balanced Dirichlet, SGD 0.1 x 0.998 per
round, grad clip 10, batch 50, 5 local epochs, 1000 rounds.

  python -m launch.main --config=configs/fedscl.py --workdir=runs/fedscl
  python -m launch.main --config=configs/fedscl.py:alpha=0.1 --workdir=runs/fedscl_a0.1
  python -m launch.main --config=configs/fedscl.py:dataset=fashion_mnist,model=small_cnn \
      --workdir=runs/fedscl_fmnist

Arguments: alpha (0.3), model (resnet18 | small_cnn), central, dataset,
runlocal. Results: docs/results/fedrcl.md.
"""

import ml_collections

from fedjax_metric import paper_settings as papers
from fedjax_metric import settings as common


def get_config(arg=None):
  arg = common.parse_arg(arg, **papers.FEDRCL_ARGS)
  c = papers.fedrcl_setting(arg)
  c.algorithm = 'fedscl'
  c.algorithm_kwargs = ml_collections.ConfigDict(
    dict(temperature=0.05, form='code')
  )
  return common.finalize(c, arg)
