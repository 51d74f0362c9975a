r"""L-DAWA (Rehman et al., ICCV 2023): SimCLR clients, layer-wise
divergence-aware aggregation (after 3 FedAvg warm-up rounds), in SSD's
setting (fedjax_metric/settings.py, `ssl_setting`).

  python -m launch.main --config=configs/l_dawa.py --workdir=runs/ssl/ldawa_silo
  python -m launch.main --config=configs/l_dawa.py:clients=50,join=0.2 \
      --workdir=runs/ssl/ldawa_device
  python -m launch.main --config=configs/l_dawa.py:runlocal --workdir=/tmp/smoke

Results: docs/results/unsupervised.md.
"""

from fedjax_metric import paper_settings as papers


def get_config(arg=None):
  return papers.ssl_config(
    arg, 'l_dawa', scope='layer', warmup_rounds=3, temperature=0.07
  )
