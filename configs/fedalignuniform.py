r"""FedAlignUniform (Wang & Isola, ICML 2020, in FedAvg), SSD's base method.

The federated unsupervised setting of SSD (fedjax_metric/settings.py,
`ssl_setting`): Fashion-MNIST, Dirichlet(0.1) per-class split, small CNN
encoder + projector, SGD 0.1 / momentum 0.9 / weight decay 1e-4, batch 128,
aggregation weighted by local batches, 'ssl' evaluation.

  python -m launch.main --config=configs/fedalignuniform.py \
      --workdir=runs/ssl/fau_silo
  python -m launch.main --config=configs/fedalignuniform.py:clients=50,join=0.2 \
      --workdir=runs/ssl/fau_device
  python -m launch.main --config=configs/fedalignuniform.py:runlocal --workdir=/tmp/smoke
  python -m launch.evaluate --workdir=runs/ssl/fau_silo

Results: docs/results/unsupervised.md.
"""

from fedjax_metric import paper_settings as papers


def get_config(arg=None):
  return papers.ssl_config(
    arg, 'fedalignuniform', drop_last_cross_silo=True, uniform_weight=1.0
  )
