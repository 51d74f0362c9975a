r"""SSD: Soft Separation and Distillation (Fang et al., ICCV 2025).

FedAlignUniform + dimension-scaled regularisation (gamma = 1, alpha = 10,
m = floor(D / K) directions of a random rotation per client, assigned by
client id; ``--config.algorithm_kwargs.assign=position`` is the released
code's by-position assignment) + projector distillation (KL, T = 0.5,
delta = 0.1), in SSD's setting (fedjax_metric/settings.py, `ssl_setting`).

  python -m launch.main --config=configs/ssd.py --workdir=runs/ssl/ssd_silo
  python -m launch.main --config=configs/ssd.py:clients=50,join=0.2 \
      --workdir=runs/ssl/ssd_device
  python -m launch.main --config=configs/ssd.py:runlocal --workdir=/tmp/smoke
  python -m launch.evaluate --workdir=runs/ssl/ssd_silo

Results: docs/results/unsupervised.md.
"""

from fedjax_metric import paper_settings as papers


def get_config(arg=None):
  return papers.ssl_config(
    arg,
    'ssd',
    drop_last_cross_silo=True,
    dsr_weight=1.0,
    distill_weight=0.1,
    distill_temperature=0.5,
    scale=10.0,
    assign='client_id',
    uniform_weight=1.0,
  )
