"""FedNTD (Lee, Jeong, Shin, Bae and Yun, NeurIPS 2022): L = CE + beta
KL(q~_g || q~_l), q~ the temperature softmax over the classes other than
the true one, against a NumPy re-derivation."""

import fl_fixtures as fx
import numpy as np
import pytest

from fedjax_metric import algorithms, optimizers

from .supervised_helpers import (
  linear_client_loss,
  linear_logits,
  ref_cross_entropy,
  ref_ntd,
)


def test_client_loss_is_ce_plus_beta_ntd_against_the_global_model():
  images, labels = fx.make_data(8)
  model = fx.linear()
  global_vars = fx.init_variables(model, images, seed=0)
  local_vars = fx.init_variables(model, images, seed=1)
  alg = algorithms.REGISTRY['fedntd'](
    model,
    server_optimizer=optimizers.make_server_optimizer('sgd'),
    beta=0.7,
    temperature=2.0,
  )
  mask = np.arange(8) < 6  # two padded examples
  x = images.reshape(8, -1).astype(np.float64)
  loss, aux = linear_client_loss(
    alg, local_vars, global_vars, x, images, labels, mask
  )
  local, teacher = linear_logits(local_vars, x), linear_logits(global_vars, x)
  ce = ref_cross_entropy(local, labels, mask)
  # tau^2 times the KL, as the authors' NTD_Loss (fedntd.ntd_term).
  ntd = 2.0**2 * ref_ntd(local, teacher, labels, 2.0)[mask].mean()
  assert float(aux['ce']) == pytest.approx(ce, rel=1e-5)
  assert float(aux['ntd']) == pytest.approx(ntd, rel=1e-4, abs=1e-7)
  assert float(loss) == pytest.approx(ce + 0.7 * ntd, rel=1e-5)


@pytest.mark.parametrize(
  'kwargs, match', [({'beta': -1.0}, 'beta'), ({'temperature': 0.0}, 'temp')]
)
def test_bad_options_are_named(kwargs, match):
  with pytest.raises(ValueError, match=match):
    algorithms.REGISTRY['fedntd'](
      fx.linear(),
      server_optimizer=optimizers.make_server_optimizer('sgd'),
      **kwargs,
    )
