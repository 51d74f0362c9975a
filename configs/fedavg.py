r"""FedAvg (McMahan et al. 2017).

McMahan, Moore, Ramage, Hampson and Aguera y Arcas, 'Communication-Efficient
Learning of Deep Networks from Decentralized Data', AISTATS 2017, Algorithm 1
(docs/methods.md, FedAvg).

Default: the small CNN on digits (the embedded dataset), 10 clients all taking
part, Dirichlet(0.5) NIID-Bench partition, 1 local epoch of SGD(0.05), batch 32,
20 rounds. ``setting=fedquad`` / ``setting=fedrcl`` put FedAvg in those papers'
settings (fedjax_metric/settings.py), the baseline rows of their tables.

  python -m launch.main --config=configs/fedavg.py --workdir=/tmp/fedavg
  python -m launch.main --config=configs/fedavg.py:dataset=fashion_mnist \
      --config.partition.alpha=0.1 --workdir=/tmp/fedavg_fmnist
  python -m launch.main --config=configs/fedavg.py:setting=fedquad,alpha=0.3 --workdir=/tmp/fa
  python -m launch.main --config=configs/fedavg.py:runlocal --workdir=/tmp/smoke
  python -m launch.main --config=configs/fedavg.py:central --workdir=/tmp/central

Arguments without ``setting``: central, model (small_cnn | fedquad_cnn |
resnet18 | moon_cnn), dataset, runlocal; with it, that setting's arguments.

Results: docs/results/fedavg.md.
"""

from fedjax_metric import paper_settings as papers
from fedjax_metric import settings as common


def get_config(arg=None):
  c, arg = papers.setting_config(arg)
  c.algorithm = 'fedavg'
  return common.finalize(c, arg)
