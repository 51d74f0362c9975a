r"""FedDecorr (Shi et al., ICLR 2023) as a federated unsupervised baseline.

FedAlignUniform's loss + 0.1 x decorrelation of the encoder features (our
unsupervised reading: FedDecorr's own code and FedU2's copy train supervised
cross-entropy), in SSD's setting (fedjax_metric/settings.py, `ssl_setting`).

  python -m launch.main --config=configs/feddecorr.py --workdir=runs/ssl/decorr_silo
  python -m launch.main --config=configs/feddecorr.py:clients=50,join=0.2 \
      --workdir=runs/ssl/decorr_device
  python -m launch.main --config=configs/feddecorr.py:runlocal --workdir=/tmp/smoke

Results: docs/results/unsupervised.md.
"""

from fedjax_metric import paper_settings as papers


def get_config(arg=None):
  return papers.ssl_config(
    arg,
    'feddecorr',
    drop_last_cross_silo=True,
    decorr_weight=0.1,
    base='align_uniform',
  )
