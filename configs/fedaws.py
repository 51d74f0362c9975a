r"""FedAwS (Yu et al., 'Federated Learning with Only Positive Labels', ICML
2020): positive-only client loss, spreadout on the class embeddings.

The one-class setting (fedjax_metric/settings.py one_class_setting) with the
paper's SGD lr 0.1. Each client trains the network and its own class
embedding w_y with max(0, 0.9 - cos(g(x), w_y))^2; the server averages both
and takes a spreadout step (d = 1 - cos, margin 1: every pair with a
positive cosine is pushed apart) of size 10 x the local learning rate.

  python -m launch.main --config=configs/fedaws.py --workdir=runs/fedaws
  python -m launch.main --config=configs/fedaws.py:steps=10,rounds=300 --workdir=runs/fedaws_s10

Arguments: lr (0.1), spreadout_steps (1), lr_multiplier (10), and the
setting's dataset, clients_per_class, steps, rounds, eval_every, model,
runlocal; every other knob of algorithms/fedaws.py via
--config.algorithm_kwargs.<knob>.

Results, in the paper's protocol with tuned learning rates and several
seeds: docs/results/oneclass.md.
"""

import ml_collections

from fedjax_metric import paper_settings as papers
from fedjax_metric import settings as common


def get_config(arg=None):
  arg = common.parse_arg(
    arg, **papers.ONE_CLASS_ARGS, lr=0.1, spreadout_steps=1, lr_multiplier=10.0
  )
  c = papers.one_class_setting(arg)
  c.algorithm = 'fedaws'
  c.local.learning_rate = arg.lr
  c.algorithm_kwargs = ml_collections.ConfigDict(
    dict(
      positive_margin=0.9,
      positive_form='cosine',
      spreadout_distance='cosine',
      spreadout_margin=1.0,
      spreadout_reduction='sum',
      spreadout_steps_per_round=arg.spreadout_steps,
      lr_multiplier=arg.lr_multiplier,
    )
  )
  return common.finalize(c, arg)
