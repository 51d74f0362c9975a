r"""QuadrupletFL (FedQuad's baseline): CE + beta * Chen et al.'s quadruplet loss.

Chen, Chen, Zhang and Huang, 'Beyond Triplet Loss: A Deep Quadruplet Network
for Person Re-identification', CVPR 2017, as a baseline of Goksu & Pugeault,
'FedQuad', arXiv:2509.04107, 2025 (docs/methods.md, FedQuad). Euclidean
distances by default; ``--config.algorithm_kwargs.squared=True`` squares them.

FedQuad's setting (fedjax_metric/settings.py fedquad_setting): CIFAR-10, 3-block CNN,
Adam 1e-3, batch 128, 5 local epochs, 20 rounds, all clients every round.

  python -m launch.main --config=configs/quadrupletfl.py --workdir=runs/quadrupletfl
  python -m launch.main --config=configs/quadrupletfl.py:clients=200,alpha=0.3 \
      --workdir=runs/quadrupletfl_c200
  python -m launch.main --config=configs/quadrupletfl.py:iid --workdir=runs/quadrupletfl_iid
  python -m launch.main --config=configs/quadrupletfl.py:central --workdir=runs/quadrupletfl_central
  python -m launch.main --config=configs/quadrupletfl.py:dataset=fashion_mnist \
      --workdir=runs/quadrupletfl_fmnist

Arguments: clients (10), alpha (0.5), iid, model (fedquad_cnn | small_cnn),
central (one client, IID: the
"Supervised (Non-FL)" rows), dataset, runlocal. Results:
docs/results/metric_learning.md.
"""

import ml_collections

from fedjax_metric import paper_settings as papers
from fedjax_metric import settings as common


def get_config(arg=None):
  arg = common.parse_arg(arg, **papers.FEDQUAD_ARGS)
  c = papers.fedquad_setting(arg)
  c.algorithm = 'quadrupletfl'
  c.algorithm_kwargs = ml_collections.ConfigDict(
    dict(beta=0.5, margin_1=1.0, margin_2=0.5, squared=False)
  )
  return common.finalize(c, arg)
