r"""SupConFL (FedQuad's baseline): CE + beta * supervised contrastive loss.

Khosla et al., 'Supervised Contrastive Learning', NeurIPS 2020, Eq. 2, as a
baseline of Goksu & Pugeault, 'FedQuad', arXiv:2509.04107, 2025
(docs/methods.md, FedQuad).

FedQuad's setting (fedjax_metric/settings.py fedquad_setting): CIFAR-10, 3-block CNN,
Adam 1e-3, batch 128, 5 local epochs, 20 rounds, all clients every round.

  python -m launch.main --config=configs/supconfl.py --workdir=runs/supconfl
  python -m launch.main --config=configs/supconfl.py:clients=200,alpha=0.3 \
      --workdir=runs/supconfl_c200
  python -m launch.main --config=configs/supconfl.py:iid --workdir=runs/supconfl_iid
  python -m launch.main --config=configs/supconfl.py:central --workdir=runs/supconfl_central
  python -m launch.main --config=configs/supconfl.py:dataset=fashion_mnist \
      --workdir=runs/supconfl_fmnist

Arguments: clients (10), alpha (0.5), iid, model (fedquad_cnn | small_cnn),
central (one client, IID: the
"Supervised (Non-FL)" rows), dataset, runlocal. Results: docs/results/metric_learning.md.
"""

import ml_collections

from fedjax_metric import paper_settings as papers
from fedjax_metric import settings as common


def get_config(arg=None):
  arg = common.parse_arg(arg, **papers.FEDQUAD_ARGS)
  c = papers.fedquad_setting(arg)
  c.algorithm = 'supconfl'
  c.algorithm_kwargs = ml_collections.ConfigDict(
    dict(beta=0.5, temperature=0.07)
  )
  return common.finalize(c, arg)
