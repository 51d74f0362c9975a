"""fedjax_metric.evaluation.statistics against hand computations."""

import math

import pytest

from fedjax_metric.evaluation import statistics


def test_debiased_ema_by_hand():
  # w = 0.9: m1 = 0.1 * 0.5 = 0.05, EMA1 = 0.05 / 0.1 = 0.5;
  # m2 = 0.9 * 0.05 + 0.1 * 0.7 = 0.115, EMA2 = 0.115 / 0.19;
  # m3 = 0.9 * 0.115 + 0.1 * 0.6 = 0.1635, EMA3 = 0.1635 / 0.271.
  assert statistics.debiased_ema([0.5], 0.9) == pytest.approx(0.5)
  assert statistics.debiased_ema([0.5, 0.7], 0.9) == pytest.approx(0.115 / 0.19)
  assert statistics.debiased_ema([0.5, 0.7, 0.6], 0.9) == pytest.approx(
    0.1635 / 0.271
  )
  assert statistics.debiased_ema([0.5, 0.7, 0.6], 0.0) == pytest.approx(0.6)


def test_debiased_ema_of_a_constant_is_the_constant_and_skips_nan():
  assert statistics.debiased_ema([0.8] * 50, 0.9) == pytest.approx(0.8)
  assert statistics.debiased_ema([0.5, math.nan, 0.7], 0.9) == pytest.approx(
    0.115 / 0.19
  )
  assert math.isnan(statistics.debiased_ema([], 0.9))
  with pytest.raises(ValueError, match=r'\[0, 1\)'):
    statistics.debiased_ema([0.5], 1.0)


def test_best_mean_by_hand():
  values = [0.1, 0.9, 0.3, 0.8, 0.7, 0.2, 0.6]
  assert statistics.best_mean(values, 5) == pytest.approx(
    (0.9 + 0.8 + 0.7 + 0.6 + 0.3) / 5
  )
  assert statistics.best_mean(values[:2], 5) == pytest.approx(0.5)
  assert statistics.best_mean([0.4, math.inf, math.nan], 5) == 0.4
  assert math.isnan(statistics.best_mean([], 5))
  with pytest.raises(ValueError, match='k must be'):
    statistics.best_mean(values, 0)


def test_headline_statistics_names():
  got = statistics.headline_statistics(
    [0.5, 0.7], 'test_accuracy', ema_weight=0.9, top_k=5
  )
  assert got == {
    'test_accuracy_ema': pytest.approx(0.115 / 0.19),
    'test_accuracy_top5_mean': pytest.approx(0.6),
  }


def test_ema_series_repeats_its_point_over_a_skipped_value():
  series = statistics.debiased_ema_series([math.nan, 0.5, math.nan, 0.7], 0.9)
  assert math.isnan(series[0])
  assert series[1:3].tolist() == pytest.approx([0.5, 0.5])
  assert series[3] == pytest.approx(0.115 / 0.19)
