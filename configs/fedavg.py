r"""FedAvg (McMahan et al. 2017) with the small CNN.

  python -m launch.main --config=configs/fedavg.py --workdir=/tmp/fedavg
  python -m launch.main --config=configs/fedavg.py:dataset=fashion_mnist \
      --config.partition.alpha=0.1 --workdir=/tmp/fedavg_fmnist
  python -m launch.main --config=configs/fedavg.py:runlocal --workdir=/tmp/smoke

Defaults: digits (the embedded dataset), 10 clients all taking part,
Dirichlet(0.5) NIID-Bench partition, 1 local epoch of SGD(0.05), batch 32,
20 rounds. Results: README.md, "Results".
"""

from configs import common


def get_config(arg=None):
  arg = common.parse_arg(arg, runlocal=False, dataset='')
  c = common.base_config()
  c.algorithm = 'fedavg'
  return common.finalize(c, arg)
