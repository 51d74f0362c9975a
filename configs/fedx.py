r"""FedX (Han et al., ECCV 2022): local and global contrastive and
relational (cross knowledge distillation) losses, in SSD's setting
(fedjax_metric/settings.py, `ssl_setting`).

  python -m launch.main --config=configs/fedx.py --workdir=runs/ssl/fedx_silo
  python -m launch.main --config=configs/fedx.py:clients=50,join=0.2 \
      --workdir=runs/ssl/fedx_device
  python -m launch.main --config=configs/fedx.py:runlocal --workdir=/tmp/smoke

Results: docs/results/unsupervised.md.
"""

from fedjax_metric import paper_settings as papers


def get_config(arg=None):
  return papers.ssl_config(arg, 'fedx', temperature=0.1)
