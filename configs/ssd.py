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
  python -m launch.main --config=configs/ssd.py:ablation=pd --workdir=runs/ssl/pd

``ablation=``: the rows of SSD's Tables 3-5 (`ABLATIONS`): ssd (default),
pd (FedAlignUniform + projector distillation), dsr (FedAlignUniform +
dimension-scaled regularisation), align_uniform (neither), mse (SSD with MSE
distillation), no_projector_dsr and no_projector (Table 4: the losses on the
representation, with and without DSR).

Results: docs/results/unsupervised.md.
"""

from fedjax_metric import paper_settings as papers
from fedjax_metric import settings as common

DEFAULTS = dict(
  dsr_weight=1.0,
  distill_weight=0.1,
  distill_temperature=0.5,
  scale=10.0,
  assign='client_id',
  uniform_weight=1.0,
)

# ``ablation=...``: the rows of SSD's ablation tables, as changes to SSD.
ABLATIONS = {
  'ssd': {},  # FedAlignUniform + DSR + PD (the method)
  'pd': dict(dsr_weight=0.0),  # Table 3: FedAlignUniform + PD
  'dsr': dict(distill_weight=0.0),  # Table 3: FedAlignUniform + DSR
  'align_uniform': dict(dsr_weight=0.0, distill_weight=0.0),  # the base
  'mse': dict(distill_method='mse'),  # Table 5: SSD (MSE)
  # Table 4, without the projector: the losses on the representation.
  'no_projector_dsr': dict(loss_on='embedding', distill_weight=0.0),
  'no_projector': dict(loss_on='embedding', distill_weight=0.0, dsr_weight=0.0),
}


def get_config(arg=None):
  ablation = common.peek_arg(arg, 'ablation', 'ssd')
  if ablation not in ABLATIONS:
    raise ValueError(
      f'ablation must be one of {sorted(ABLATIONS)}, got {ablation!r}.'
    )
  rest = ','.join(
    item
    for item in (arg or '').split(',')
    if item and item.partition('=')[0] != 'ablation'
  )
  return papers.ssl_config(
    rest or None,
    'ssd',
    drop_last_cross_silo=True,
    **dict(DEFAULTS, **ABLATIONS[ablation]),
  )
