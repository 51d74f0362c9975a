r"""FedQuad: CE + beta * l_quad* on sampled quadruplets.

Goksu & Pugeault, 'FedQuad: Federated Stochastic Quadruplet Learning to
Mitigate Data Heterogeneity', arXiv:2509.04107, 2025, Eq. 3, Eq. 5 and
Algorithm 1. ``squared=False`` (default) is Eq. 5's Euclidean distance,
``--config.algorithm_kwargs.squared=True`` Algorithm 1's squared distance;
docs/methods.md, FedQuad, discusses both.

FedQuad's setting (fedjax_metric/settings.py fedquad_setting): CIFAR-10, 3-block CNN,
Adam 1e-3, batch 128, 5 local epochs, 20 rounds, all clients every round.

  python -m launch.main --config=configs/fedquad.py --workdir=runs/fedquad
  python -m launch.main --config=configs/fedquad.py:clients=200,alpha=0.3 \
      --workdir=runs/fedquad_c200
  python -m launch.main --config=configs/fedquad.py:iid --workdir=runs/fedquad_iid
  python -m launch.main --config=configs/fedquad.py:central --workdir=runs/fedquad_central
  python -m launch.main --config=configs/fedquad.py:dataset=fashion_mnist \
      --workdir=runs/fedquad_fmnist
  python -m launch.main --config=configs/fedquad.py:iid,no_ce --workdir=runs/fedquad_no_ce

Arguments: clients (10), alpha (0.5), iid, model (fedquad_cnn | small_cnn),
central (one client, IID: the "Supervised (Non-FL)" rows), no_ce (Table V's
"without l_ce": the metric loss alone, judged by a kNN classifier and a
linear probe on the embeddings, eval_protocol 'embedding_knn'), dataset,
runlocal. Results (multi-seed, Fashion-MNIST, CPU): docs/results/metric_learning.md.
"""

import ml_collections

from fedjax_metric import paper_settings as papers
from fedjax_metric import settings as common


def get_config(arg=None):
  arg = common.parse_arg(arg, no_ce=False, **papers.FEDQUAD_ARGS)
  c = papers.fedquad_setting(arg)
  c.algorithm = 'fedquad'
  c.algorithm_kwargs = ml_collections.ConfigDict(
    dict(
      beta=0.5,
      margin_1=1.0,
      margin_2=0.5,
      squared=False,
      cross_entropy=not arg.no_ce,
    )
  )
  if arg.no_ce:
    c.eval_protocol = 'embedding_knn'
  return common.finalize(c, arg)
