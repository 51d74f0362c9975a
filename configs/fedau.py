r"""FedAU (Wang & Ji, ICLR 2024) and the other aggregations of its code.

Wang & Ji, 'A Lightweight Method for Tackling Unknown Participation
Statistics in Federated Averaging', ICLR 2024 (docs/methods.md,
Heterogeneous participation), in PMFL's heterogeneous setting
(fedjax_metric/settings.py, participation_setting).
``aggregation=average_participating`` is FedAvg over the round's
participants (the FedAvg row of the results); ``known_prob`` divides by the
true p_n, ``average_all`` by N with weight 1. ``cutoff=K`` (0 = none, the
released default K = 100000; its README also runs K = 50).

  python -m launch.main --config=configs/fedau.py:pattern=bernoulli \
      --workdir=runs/hetero/bernoulli_fedau
  python -m launch.main --workdir=runs/hetero/markov_fedavg \
      --config=configs/fedau.py:pattern=markov,aggregation=average_participating

Arguments: pattern, aggregation, cutoff, normalize, rounds, eval_every,
width, dataset, runlocal. Results: docs/results/participation.md.
"""

import ml_collections

from fedjax_metric import paper_settings as papers
from fedjax_metric import settings as common


def get_config(arg=None):
  arg = common.parse_arg(
    arg, aggregation='adaptive', cutoff=0, **papers.PARTICIPATION_ARGS
  )
  c = papers.participation_setting(arg)
  c.algorithm = 'fedau'
  c.algorithm_kwargs = ml_collections.ConfigDict(
    {'aggregation': arg.aggregation, 'cutoff': arg.cutoff or None}
  )
  return common.finalize(c, arg)
