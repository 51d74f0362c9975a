r"""FedUV (Hosseini et al., 'Federated Learning of User Verification Models
Without Sharing Embeddings', ICML 2021): fixed codewords, positive-only loss.

The one-class setting (fedjax_metric/settings.py one_class_setting) with the
paper's SGD lr 0.1. Class c owns codeword v_c (Hadamard rows 1..10 of the
32 x 32 Sylvester matrix for LeNet's 32-d embedding: minimum Hamming
distance 16, logged as codeword_min_distance in summary.json); clients
minimise max(0, 1 - cos(g(x), v_c)).

  python -m launch.main --config=configs/feduv.py --workdir=runs/feduv
  python -m launch.main --config=configs/feduv.py:steps=10,rounds=300 --workdir=runs/feduv_s10

Arguments: lr (0.1), codewords (auto | hadamard | random), squared, and the
setting's dataset, clients_per_class, steps, rounds, eval_every, model,
runlocal.

Results, in the paper's protocol with tuned learning rates and several
seeds: docs/results/oneclass.md.
"""

import ml_collections

from fedjax_metric import paper_settings as papers
from fedjax_metric import settings as common


def get_config(arg=None):
  arg = common.parse_arg(
    arg, **papers.ONE_CLASS_ARGS, lr=0.1, codewords='auto', squared=False
  )
  c = papers.one_class_setting(arg)
  c.algorithm = 'feduv'
  c.local.learning_rate = arg.lr
  c.algorithm_kwargs = ml_collections.ConfigDict(
    dict(codeword_kind=arg.codewords, squared=arg.squared)
  )
  return common.finalize(c, arg)
