"""FedRCL and its FedSCL baseline (Seo, Kim, Kim and Han, 'Relaxed Contrastive
Learning for Federated Learning', CVPR 2024).

FedRCL's local objective: ``CE + mean over feature levels of (l_scl + beta *
l_penalty)``, the relaxed supervised contrastive loss on the L2-normalised,
globally average-pooled, pre-ReLU features of every stage (the model's
'features' list; Sec. 4.4 and Algorithm 1 line 8). ``form='code'``
(default) is the authors' released loss (github.com/skynbe/FedRCL,
utils/loss.py CLLoss: hard positive, top-2 negatives, single-partner
penalty); ``form='paper'`` the paper's Eq. 5 (docs/methods.md, FedRCL).
FedSCL is the same without the penalty, in the same two forms (plus
Khosla et al.'s mean over positives as ``form='khosla'``).
The reference aggregates unweighted: use ``server.weighting='uniform'`` (the
configs do).

Slot replaced relative to FedAvg: ``client_loss``.
"""

from fedjax_metric import losses
from fedjax_metric.algorithms import fedavg
from fedjax_metric.contract import NO_RUN_FACTS, RunFacts


def _make(model, level_loss, server_optimizer, weighting):
  def multilevel(outputs, batch):
    if not outputs['features']:
      raise ValueError(
        "FedRCL and FedSCL contrast the model's feature levels "
        "(outputs['features']); this model has none. Use a model with "
        "feature taps (--config.model.name='small_cnn', 'resnet18', or "
        "'mlp' for vectors)."
      )
    return level_loss(outputs['features'], batch.labels, mask=batch.mask)

  return fedavg.build_with_term(
    model, multilevel, server_optimizer=server_optimizer, weighting=weighting
  )


def make_fedrcl(
  model,
  *,
  server_optimizer,
  run: RunFacts = NO_RUN_FACTS,
  weighting='uniform',
  temperature=0.05,
  threshold=0.7,
  beta=1.0,
  form='code',
):
  """FedRCL: defaults tau 0.05, threshold lambda 0.7, beta 1.

  The defaults are the authors' released configs/client/fedrcl.yaml
  (github.com/skynbe/FedRCL).
  """
  if form not in ('code', 'paper'):
    raise ValueError(f"form must be 'code' or 'paper', got {form!r}.")

  def level_loss(features, labels, mask):
    return losses.multilevel_relaxed_supcon_loss(
      features,
      labels,
      temperature=temperature,
      threshold=threshold,
      beta=beta,
      form=form,
      mask=mask,
    )

  return _make(model, level_loss, server_optimizer, weighting)


def make_fedscl(
  model,
  *,
  server_optimizer,
  run: RunFacts = NO_RUN_FACTS,
  weighting='uniform',
  temperature=0.05,
  form='code',
):
  """FedSCL: CE + mean over levels of a supervised contrastive loss.

  FedRCL without the divergence penalty (Seo et al., CVPR 2024, Table 3).
  ``form`` as in `losses.multilevel_supcon_loss`: 'code' (default; the
  released CLLoss's supervised pair, i.e. FedRCL's default form with beta
  0), 'paper' (Eq. 2: the sum over positives, i.e. FedRCL's 'paper' form
  with beta 0) or 'khosla' (Khosla et al.'s mean over positives).
  """
  if form not in losses.SCL_FORMS:
    raise ValueError(f'form must be one of {losses.SCL_FORMS}, got {form!r}.')

  def level_loss(features, labels, mask):
    return losses.multilevel_supcon_loss(
      features, labels, temperature=temperature, form=form, mask=mask
    )

  return _make(model, level_loss, server_optimizer, weighting)
