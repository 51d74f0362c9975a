r"""FedProx (Li et al. 2020): FedAvg + (mu/2)||w - w_global||^2 locally.

Li, Sahu, Zaheer, Sanjabi, Talwalkar and Smith, 'Federated Optimization in
Heterogeneous Networks', MLSys 2020, Eq. 2 (docs/methods.md, FedProx).

  python -m launch.main --config=configs/fedprox.py --workdir=/tmp/fedprox \
      --config.algorithm_kwargs.mu=0.1
"""

from configs import common


def get_config(arg=None):
  arg = common.parse_arg(arg, runlocal=False, dataset='')
  c = common.base_config()
  c.algorithm = 'fedprox'
  c.algorithm_kwargs.mu = 0.01
  return common.finalize(c, arg)
