r"""MOON (Li et al. 2021): CE + mu * model-contrastive loss.

Li, He and Song, 'Model-Contrastive Federated Learning', CVPR 2021. MOON's
CIFAR-10 setting with its simple CNN (the authors' released code,
github.com/QinbinLi/MOON, README and main.py; docs/methods.md, MOON): 10
parties, all every round, NIID-Bench Dirichlet 0.5, SGD lr 0.01 momentum 0.9
weight decay 1e-5, batch 64, 10 local epochs, mu 5, tau 0.5, 100 rounds, a
projection head of 256 with the classifier on it.

  python -m launch.main --config=configs/moon.py --workdir=runs/moon
  python -m launch.main --config=configs/moon.py:dataset=fashion_mnist --workdir=runs/moon_fmnist

Arguments: clients (10), alpha (0.5), iid, central, model, dataset, runlocal.
"""

import ml_collections

from configs import common


def get_config(arg=None):
  arg = common.parse_arg(arg, **common.FEDQUAD_ARGS)
  c = common.fedquad_setting(arg)
  c.algorithm = 'moon'
  c.algorithm_kwargs = ml_collections.ConfigDict(dict(mu=5.0, temperature=0.5))
  if arg.model == 'fedquad_cnn':  # MOON's own model unless one is asked for.
    c.model = common.model_block('moon_cnn', norm='none')
  c.num_rounds = 100
  c.local.update(dict(epochs=10, batch_size=64, optimizer='sgd',
                      learning_rate=0.01, momentum=0.9, weight_decay=1e-5))
  return common.finalize(c, arg)
