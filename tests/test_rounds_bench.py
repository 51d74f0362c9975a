"""benchmarks/rounds_bench.py: every case names a config that trains.

The timings themselves are machine measurements (benchmarks/cpu_rounds.md),
not tested; what is tested is that a case fails here and not on the GPU
machine, where the time to find out is scarce."""

import pytest

from benchmarks import rounds_bench
from fedjax_metric import validation
from fedjax_metric.data import catalog


@pytest.mark.parametrize('name', sorted(rounds_bench.CASES))
def test_every_case_builds_a_valid_config(name):
  case = rounds_bench.CASES[name]
  config = rounds_bench._load_config(case, case['rounds'])  # pylint: disable=protected-access
  try:
    validation.validate(config)
  except catalog.DatasetNotFoundError as e:
    # A machine without the case's data files (the GPU image has none).
    pytest.skip(f'{config.dataset.name} not on this machine: {e}')
  assert config.num_rounds == case['rounds']
  assert config.local.steps == case['steps']
  assert config.executor == case['executor']


def test_the_protocol_cases_evaluate_every_500_rounds_over_10000():
  """FedMetric's protocol (Park, Hosseini and Yun, 'Federated Learning with
  Metric Loss', 2021: 10,000 rounds of one local step),
  with each executor: sequential for CPUs, vmap for GPUs."""
  for name, executor in (
    ('fedmetric_protocol', 'sequential'),
    ('fedmetric_protocol_vmap', 'vmap'),
  ):
    case = rounds_bench.CASES[name]
    config = rounds_bench._load_config(case, case['rounds'])  # pylint: disable=protected-access
    assert (config.num_rounds, config.eval_every, config.executor) == (
      10000,
      500,
      executor,
    )


def test_a_vmapped_case_runs_and_reports_its_round_cost():
  """measure_point end to end on a tiny vmapped case (digits, built in): the
  run, the executor's rounds function it wraps to record the round's shapes
  (a signature change there broke the GPU session's run), and XLA's cost of
  one round."""
  case = dict(rounds_bench.CASES['fedavg_1step_scan_vmap'], rounds=2)
  result = rounds_bench.measure_point(case)
  assert result['rounds'] == 2 and result['executor'] == 'vmap'
  assert result['train_seconds'] > 0
  assert result['flops'] > 0 and result['bound_ms'] > 0
