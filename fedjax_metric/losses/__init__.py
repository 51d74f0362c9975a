"""Pure loss functions: per-example outputs [B], explicit masks, no reductions.

The caller reduces with `masked_mean`; that is the one place padded examples
are dropped, so every loss is padding-invariant by construction.
"""

from fedjax_metric.losses.basic import masked_mean, softmax_cross_entropy  # noqa: F401
