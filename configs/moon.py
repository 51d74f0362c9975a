r"""MOON (Li et al. 2021): CE + mu * model-contrastive loss.

Li, He and Song, 'Model-Contrastive Federated Learning', CVPR 2021. Every
backbone carries MOON's projection head (l1, ReLU, l2 to 256) with the
classifier on its output z, as the authors' released code builds its models
(github.com/QinbinLi/MOON, model.py ModelFedCon; docs/methods.md, MOON).
mu 5 and tau 0.5 everywhere: MOON's CIFAR-10 values (its README's example).

``setting`` picks the protocol:
  * '' (default): MOON's own CIFAR-10 setting with its simple CNN (released
    README and main.py): 10 parties, all every round, NIID-Bench Dirichlet
    0.5, SGD lr 0.01 momentum 0.9 weight decay 1e-5, batch 64, 10 local
    epochs, 100 rounds;
  * 'fedquad': FedQuad's protocol (fedjax_metric/settings.py fedquad_setting; its
    Section IV-A: "Adam ... 0.001 for all approaches", batch 128, 5 local
    epochs, 20 rounds), the row MOON of FedQuad's Tables I-IV;
  * 'fedrcl': FedRCL's protocol (fedrcl_setting: ResNet-18 GroupNorm, 100
    clients, 5 per round, SGD 0.1, ...), the row MOON of FedRCL's Table 1.

  python -m launch.main --config=configs/moon.py --workdir=runs/moon
  python -m launch.main --config=configs/moon.py:setting=fedquad,alpha=0.3 --workdir=runs/moon_fq
  python -m launch.main --config=configs/moon.py:setting=fedrcl,alpha=0.1 --workdir=runs/moon_rcl

Arguments: setting, and that setting's arguments (FedQuad's: clients, alpha,
iid, central, model; FedRCL's: alpha, central, model), dataset, runlocal.
Results: docs/results/metric_learning.md and
docs/results/fedrcl.md.
"""

import ml_collections

from fedjax_metric import paper_settings as papers
from fedjax_metric import settings as common

PROJECTION_DIM = 256  # MOON's out_dim (released main.py default).


def get_config(arg=None):
  setting = common.peek_arg(arg, 'setting')
  if setting == 'fedrcl':
    arg = common.parse_arg(arg, setting='', **papers.FEDRCL_ARGS)
    c = papers.fedrcl_setting(arg)
  elif setting in ('', 'fedquad'):
    arg = common.parse_arg(arg, setting='', **papers.FEDQUAD_ARGS)
    c = papers.fedquad_setting(arg)
  else:
    raise ValueError(
      f"setting must be '', 'fedquad' or 'fedrcl', got {setting!r}."
    )
  c.algorithm = 'moon'
  c.algorithm_kwargs = ml_collections.ConfigDict(dict(mu=5.0, temperature=0.5))
  if setting == '':
    if arg.model == 'fedquad_cnn':  # MOON's own model unless one is asked for.
      c.model = common.model_block('moon_cnn', norm='none')
    c.num_rounds = 100
    c.local.update(
      dict(
        epochs=10,
        batch_size=64,
        optimizer='sgd',
        learning_rate=0.01,
        momentum=0.9,
        weight_decay=1e-5,
      )
    )
  if c.model.name != 'moon_cnn':  # moon_cnn has its own head (out_dim).
    c.model.projection_dim = PROJECTION_DIM
  return common.finalize(c, arg)
