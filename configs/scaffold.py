r"""SCAFFOLD (Karimireddy et al., ICML 2020), option II control variates.

Default: FedAvg's digits setting (fedjax_metric/settings.py) with the paper's
unweighted averaging and plain local SGD, for which the control-variate
correction is exact.

  python -m launch.main --config=configs/scaffold.py --workdir=/tmp/scaffold
  python -m launch.main --config=configs/scaffold.py:dataset=fashion_mnist \
      --config.num_clients=100 --config.clients_per_round=10 \
      --workdir=/tmp/scaffold_fmnist

Arguments: central, model (small_cnn | fedquad_cnn | resnet18 | moon_cnn),
dataset, runlocal.
"""

from fedjax_metric import settings as common


def get_config(arg=None):
  arg = common.parse_arg(arg, **common.BASE_ARGS)
  c = common.base_setting(arg)
  c.algorithm = 'scaffold'
  c.server.weighting = 'uniform'
  return common.finalize(c, arg)
