r"""Deep SVDD per client (Ruff et al., 'Deep One-Class Classification', ICML
2018): the non-federated baseline of FedMetric's Table 2.

The one-class setting (fedjax_metric/settings.py one_class_setting), but every
client trains its own model (kept in the client table) and nothing is
averaged. Learning rate 0.001: the squared distance diverges at 0.1 (NaN
within 25 rounds here); Ruff et al. used Adam 1e-4 after autoencoder
pre-training, which gave the same AUROC here (0.857 vs 0.858 after 100
rounds of 10 steps).

  python -m launch.main --config=configs/deepsvdd.py --workdir=runs/deepsvdd
  python -m launch.main --config=configs/deepsvdd.py:steps=10,rounds=300 --workdir=runs/deepsvdd_s10

Arguments: eps (0.1, the center rule), lr (0.001), and the setting's
dataset, clients_per_class, steps, rounds, eval_every, model, runlocal.

Results, in the paper's protocol with tuned learning rates and several
seeds: docs/results/oneclass.md.
"""

import ml_collections

from fedjax_metric import paper_settings as papers
from fedjax_metric import settings as common


def get_config(arg=None):
  arg = common.parse_arg(arg, **papers.ONE_CLASS_ARGS, eps=0.1, lr=0.001)
  c = papers.one_class_setting(arg)
  c.algorithm = 'deepsvdd'
  c.local.learning_rate = arg.lr
  c.algorithm_kwargs = ml_collections.ConfigDict(dict(eps=arg.eps))
  return common.finalize(c, arg)
