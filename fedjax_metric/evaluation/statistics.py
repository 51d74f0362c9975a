"""Statistics of a run's evaluations that papers report instead of the last
value, logged with every evaluation row so that a table can be read off a
run (metrics.jsonl, TensorBoard, summary.json).

* ``<headline>_ema``: the exponential moving average of the headline metric
  over the evaluations so far, with TensorBoard's debiasing (the smoothing
  of its scalar charts, and of Weights & Biases' "exponential moving
  average"). Seo et al., 'Relaxed Contrastive Learning for Federated
  Learning', CVPR 2024, Table 1: "accuracies at the target round are based
  on the exponential moving average results with parameter 0.9". Their
  released trainer logs the raw accuracy to W&B at every evaluation, so the
  average is the chart's smoothing over evaluations; to match the paper,
  evaluate every round (``eval_every=1``).
* ``<headline>_top<k>_mean``: the mean of the k best evaluations so far (all
  of them while there are fewer than k). Zhang et al., PMFL (Table I):
  "the average of the top-5 accuracy values".

Both are functions of the list of evaluations, which metrics.jsonl holds
(truncated to the restored checkpoint on resume), so a resumed run logs the
same values as an uninterrupted one.
"""

import math
from typing import Dict, Sequence

import numpy as np


def debiased_ema_series(values: Sequence[float], weight: float) -> np.ndarray:
  """TensorBoard's smoothed curve of ``values``, one point per value::

    m_0 = 0,  m_t = w m_{t-1} + (1 - w) v_t,  EMA_t = m_t / (1 - w^n_t)

  with n_t the number of finite values among v_1..v_t: a weighted mean of
  them with weights w^(t - i), so EMA_1 = v_1 (not pulled towards 0), and
  w = 0 gives the values themselves. A non-finite value is skipped, as
  TensorBoard does (its point repeats the previous one; NaN before any
  finite value).

  Args:
    values: the evaluations in order, [T].
    weight: w in [0, 1).

  Returns:
    [T] float64.
  """
  if not 0.0 <= weight < 1.0:
    raise ValueError(f'The EMA weight must lie in [0, 1), got {weight}.')
  moment, count, out = 0.0, 0, []
  for value in values:
    if math.isfinite(value):
      moment = weight * moment + (1.0 - weight) * value
      count += 1
    out.append(moment / (1.0 - weight**count) if count else math.nan)
  return np.asarray(out, np.float64)


def debiased_ema(values: Sequence[float], weight: float) -> float:
  """The last point of `debiased_ema_series` (NaN for no values)."""
  series = debiased_ema_series(values, weight)
  return float(series[-1]) if len(series) else math.nan


def best_mean(values: Sequence[float], k: int) -> float:
  """Mean of the ``k`` largest finite ``values`` (of all when fewer); NaN
  when none is finite."""
  if k < 1:
    raise ValueError(f'k must be >= 1, got {k}.')
  finite = sorted((v for v in values if math.isfinite(v)), reverse=True)
  if not finite:
    return math.nan
  best = finite[:k]
  return sum(best) / len(best)


def headline_statistics(
  history: Sequence[float], headline: str, *, ema_weight: float, top_k: int
) -> Dict[str, float]:
  """``{'<headline>_ema': ..., '<headline>_top<k>_mean': ...}`` of the
  headline metric's evaluations so far, the current one last."""
  return {
    f'{headline}_ema': debiased_ema(history, ema_weight),
    f'{headline}_top{top_k}_mean': best_mean(history, top_k),
  }
