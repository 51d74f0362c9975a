"""FedDecorr (Shi et al., ICLR 2023), supervised: L = CE + lambda R(z), R
the mean squared off-diagonal entry of the batch's standardised correlation
matrix over n (the authors' code), against a NumPy re-derivation."""

import fl_fixtures as fx
import numpy as np
import pytest

from fedjax_metric import algorithms, optimizers

from .supervised_helpers import (
  linear_client_loss,
  linear_logits,
  ref_cross_entropy,
)


def ref_decorrelation_code(z):
  """FedDecorr's released regulariser, by hand: standardise each feature
  over the rows (unbiased variance, eps 1e-8), C = Z^T Z, mean of the
  squared off-diagonal entries, divided by n."""
  n, d = z.shape
  zs = (z - z.mean(0)) / np.sqrt(1e-8 + z.var(0, ddof=1))
  c = zs.T @ zs
  off = c[~np.eye(d, dtype=bool)]
  return np.sum(off**2) / (d * (d - 1)) / n


def test_feddecorr_supervised_is_ce_plus_lambda_decorrelation():
  images, labels = fx.make_data(8)
  model = fx.linear()  # 'embedding' is the flattened image
  variables = fx.init_variables(model, images, seed=1)
  alg = algorithms.REGISTRY['feddecorr_supervised'](
    model,
    server_optimizer=optimizers.make_server_optimizer('sgd'),
    decorr_weight=0.3,
  )
  mask = np.arange(8) < 6
  x = images.reshape(8, -1).astype(np.float64)
  x = x + np.random.default_rng(0).normal(size=x.shape)  # no constant column
  loss, aux = linear_client_loss(
    alg, variables, variables, x, images, labels, mask
  )
  ce = ref_cross_entropy(linear_logits(variables, x), labels, mask)
  decorr = ref_decorrelation_code(x[mask])
  assert float(aux['ce']) == pytest.approx(ce, rel=1e-5)
  assert float(aux['decorrelation']) == pytest.approx(decorr, rel=1e-4)
  assert float(loss) == pytest.approx(ce + 0.3 * decorr, rel=1e-5)
