r"""TripletFL (FedQuad's baseline): CE + beta * margin triplet loss.

The hinge [d(a, p) - d(a, n) + margin]_+ (Schroff et al., 'FaceNet', CVPR
2015; FedQuad cites Hoffer and Ailon, SIMBAD 2015, for triplets), as a
baseline of Goksu & Pugeault, 'FedQuad', arXiv:2509.04107, 2025
(docs/methods.md, FedQuad). Euclidean distances by default;
``--config.algorithm_kwargs.squared=True`` squares them.

FedQuad's setting (fedjax_metric/settings.py fedquad_setting): CIFAR-10, 3-block CNN,
Adam 1e-3, batch 128, 5 local epochs, 20 rounds, all clients every round.

  python -m launch.main --config=configs/tripletfl.py --workdir=runs/tripletfl
  python -m launch.main --config=configs/tripletfl.py:clients=200,alpha=0.3 \
      --workdir=runs/tripletfl_c200
  python -m launch.main --config=configs/tripletfl.py:iid --workdir=runs/tripletfl_iid
  python -m launch.main --config=configs/tripletfl.py:central --workdir=runs/tripletfl_central
  python -m launch.main --config=configs/tripletfl.py:dataset=fashion_mnist \
      --workdir=runs/tripletfl_fmnist

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
  c.algorithm = 'tripletfl'
  c.algorithm_kwargs = ml_collections.ConfigDict(
    dict(beta=0.5, margin=1.0, squared=False)
  )
  return common.finalize(c, arg)
