r"""FedU2 (Liao et al., CVPR 2024): SimCLR + flexible uniform regulariser,
efficient unified aggregation (EUA), the 'even' local schedule.

In SSD's setting (fedjax_metric/settings.py, `ssl_setting`), with FedU2's own
knobs at its released defaults (tau 0.07, FUR weight 0.01, server step 8,
up to 10 local epochs for small clients).

  python -m launch.main --config=configs/fedu2.py --workdir=runs/ssl/fedu2_silo
  python -m launch.main --config=configs/fedu2.py:clients=50,join=0.2 \
      --workdir=runs/ssl/fedu2_device
  python -m launch.main --config=configs/fedu2.py:runlocal --workdir=/tmp/smoke

Results: docs/results/unsupervised.md.
"""

from fedjax_metric import paper_settings as papers


def get_config(arg=None):
  return papers.ssl_config(
    arg,
    'fedu2',
    temperature=0.07,
    fur_weight=0.01,
    aggregation='eua',
    server_lr=8.0,
  )
