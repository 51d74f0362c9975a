"""Pure loss functions: per-example outputs [B], explicit masks, no reductions.

The caller reduces with `masked_mean`; that is the one place padded examples
are dropped, so every loss is padding-invariant by construction.
"""

from fedjax_metric.losses.basic import (  # noqa: F401
  branch_distillation,
  calibrated_cross_entropy,
  masked_mean,
  not_true_distillation,
  softmax_cross_entropy,
)
from fedjax_metric.losses.metric import (  # noqa: F401
  SCL_FORMS,
  fedquad_loss,
  moon_contrastive_loss,
  multilevel_relaxed_supcon_loss,
  multilevel_supcon_loss,
  quadruplet_loss,
  relaxed_supcon_loss,
  supcon_loss,
  triplet_loss,
)
from fedjax_metric.losses.oneclass import (  # noqa: F401
  deepsvdd_center,
  deepsvdd_loss,
  fedaws_positive_loss,
  fedmetric_loss,
  feduv_loss,
  spreadout_regularizer,
)
from fedjax_metric.losses.participation import (  # noqa: F401
  pmfl_contrastive_loss,
)
from fedjax_metric.losses.unsupervised import (  # noqa: F401
  alignment_loss,
  decorrelation_loss,
  dsr_loss,
  fedu2_uniform_regularizer,
  nt_xent_loss,
  projector_distillation_loss,
  relational_loss,
  tangent_sliced_wasserstein,
  uniformity_loss,
)
