r"""FedQuad: CE + beta * l_quad* on sampled quadruplets.

Goksu & Pugeault, 'FedQuad: Federated Stochastic Quadruplet Learning to
Mitigate Data Heterogeneity', arXiv:2509.04107, 2025, Eq. 3 and Algorithm 1.
``squared`` picks Algorithm 1's squared distance (True) or Eq. 5's plain
distance (False); docs/methods.md, FedQuad, discusses both.

FedQuad's setting (configs/common.py fedquad_setting): CIFAR-10, 3-block CNN,
Adam 1e-3, batch 128, 5 local epochs, 20 rounds, all clients every round.

  python -m launch.main --config=configs/fedquad.py --workdir=runs/fedquad
  python -m launch.main --config=configs/fedquad.py:clients=200,alpha=0.3 --workdir=runs/fedquad_c200
  python -m launch.main --config=configs/fedquad.py:iid --workdir=runs/fedquad_iid
  python -m launch.main --config=configs/fedquad.py:central --workdir=runs/fedquad_central
  python -m launch.main --config=configs/fedquad.py:dataset=fashion_mnist --workdir=runs/fedquad_fmnist

Arguments: clients (10), alpha (0.5), iid, model (fedquad_cnn | small_cnn),
central (one client, IID: the
"Supervised (Non-FL)" rows), dataset, runlocal. Results: README.md.
"""

import ml_collections

from configs import common


def get_config(arg=None):
  arg = common.parse_arg(arg, **common.FEDQUAD_ARGS)
  c = common.fedquad_setting(arg)
  c.algorithm = 'fedquad'
  c.algorithm_kwargs = ml_collections.ConfigDict(dict(beta=0.5, margin_1=1.0, margin_2=0.5, squared=True))
  return common.finalize(c, arg)
