r"""Many small rounds: whole runs timed, one round per call vs R per call.

  python -m benchmarks.rounds_bench                  # the default cases below
  python -m benchmarks.rounds_bench --cases=fedmetric_1step_scan --rounds_scale=0.1

A case is a config and overrides, run by `experiment.run` in a fresh child process
into a temporary workdir with one evaluation at the end (the FedMetric
protocol case evaluates every 500 rounds, as a user would). Reported: the
seconds of training (the run's wall time minus its evaluations; compilation
included, as a user pays it), rounds per second, and for the one-step cases
the arithmetic bound of one round: the FLOPs of XLA's cost analysis of the
compiled one-round program over this machine's measured matmul rate. The
table is printed and appended to benchmarks/<device>_rounds.md.

"before" is what a run did before rounds could share a program: one call per
round (``rounds_per_call=1``) with the CPU's default executor (``host``, a
Python loop over clients). "after" runs R rounds per call (``rounds_per_call
=0``: R divides the evaluation and checkpoint cadence) in one program,
clients in sequence (``sequential``) or side by side (``vmap``).
"""

import json
import os
import sys
import tempfile
import time

from absl import app, flags
import jax
import jax.numpy as jnp
import numpy as np

from benchmarks import machine

FLAGS = flags.FLAGS


def define_flags():
  """This script's flags, defined only when it is the program: bench.py
  defines --out and --point too, and tests import both modules."""
  flags.DEFINE_list('cases', None, 'Case names (default: all).')
  flags.DEFINE_float(
    'rounds_scale', 1.0, "Multiply every case's rounds (quick checks)."
  )
  flags.DEFINE_string(
    'out',
    '',
    'Markdown log (default benchmarks/<device>_rounds.md; "-": none).',
  )
  flags.DEFINE_string('point', '', 'Internal: run one case (JSON).')


FEDMETRIC = 'configs/fedmetric.py'
# FedAvg with 10 clients of one local step, all of them every round.
FEDAVG_10 = dict(num_clients=10, clients_per_round=10, checkpoint_every=10000)


def _case(config, arg, rounds, steps, executor, rounds_per_call, **overrides):
  return dict(
    config=config,
    arg=arg,
    rounds=rounds,
    steps=steps,
    executor=executor,
    rounds_per_call=rounds_per_call,
    overrides=overrides,
  )


CASES = {
  # FedMetric (one class per client, 10 clients, LeNet, batch 16).
  'fedmetric_1step_before': _case(FEDMETRIC, '', 2000, 1, 'host', 1),
  'fedmetric_10step_before': _case(FEDMETRIC, '', 200, 10, 'host', 1),
  'fedmetric_1step_scan': _case(FEDMETRIC, '', 2000, 1, 'sequential', 0),
  'fedmetric_10step_scan': _case(FEDMETRIC, '', 200, 10, 'sequential', 0),
  'fedmetric_1step_scan_vmap': _case(FEDMETRIC, '', 2000, 1, 'vmap', 0),
  'fedavg_1step_before': _case(
    'configs/fedavg.py', '', 2000, 1, 'host', 1, **FEDAVG_10
  ),
  'fedavg_1step_scan': _case(
    'configs/fedavg.py', '', 2000, 1, 'sequential', 0, **FEDAVG_10
  ),
  'fedavg_1step_scan_vmap': _case(
    'configs/fedavg.py', '', 2000, 1, 'vmap', 0, **FEDAVG_10
  ),
  # The paper's protocol end to end: 10,000 rounds, evaluated every 500.
  'fedmetric_protocol': _case(
    FEDMETRIC, 'eval_every=500', 10000, 1, 'sequential', 0
  ),
  # The same with the clients side by side: the form meant for GPUs.
  'fedmetric_protocol_vmap': _case(
    FEDMETRIC, 'eval_every=500', 10000, 1, 'vmap', 0
  ),
}


def _load_config(case, rounds):
  import importlib  # pylint: disable=g-import-not-at-top

  module = importlib.import_module(
    case['config'].removesuffix('.py').replace('/', '.')
  )
  config = module.get_config(case['arg'] or None)
  config.unlock()
  config.num_rounds = rounds
  if 'eval_every' not in case['arg']:
    config.eval_every = rounds
  config.checkpoint_every = max(config.eval_every, config.checkpoint_every)
  config.local.steps = case['steps']
  config.executor = case['executor']
  config.rounds_per_call = case['rounds_per_call']
  config.progress = False
  config.plot_partition = False
  for key, value in case['overrides'].items():
    config[key] = value
  return config


def measured_peaks():
  """(matmul FLOP/s, memory bytes/s) this process attains on its device:
  a 2048^2 float32 matmul and a 256 MiB elementwise add, median of 5."""

  def median_seconds(fn, *args):
    jax.block_until_ready(fn(*args))
    times = []
    for _ in range(5):
      start = time.perf_counter()
      jax.block_until_ready(fn(*args))
      times.append(time.perf_counter() - start)
    return float(np.median(times))

  a = jnp.ones((2048, 2048), jnp.float32)
  flops = 2 * 2048**3 / median_seconds(jax.jit(jnp.matmul), a, a)
  x = jnp.ones((64 * 1024**2,), jnp.float32)
  bandwidth = 3 * x.nbytes / median_seconds(jax.jit(lambda v: v + 1.0), x)
  return flops, bandwidth


def one_round_cost(captured):
  """XLA's cost analysis of one round in the vmapped single program
  (FLOPs, bytes accessed), for the shapes the run used."""
  from fedjax_metric import executors  # pylint: disable=g-import-not-at-top

  spec, data, shapes = captured
  round_fn = executors.make_single_program_round_fn(spec, data, unroll=True)
  compiled = round_fn.jitted.lower(*shapes, data).compile()
  cost = compiled.cost_analysis()
  cost = cost[0] if isinstance(cost, (list, tuple)) else cost
  return float(cost.get('flops', 0.0)), float(cost.get('bytes accessed', 0.0))


def measure_point(case):
  """Runs one case in this process; returns its timings."""
  from fedjax_metric import executors, experiment  # pylint: disable=g-import-not-at-top

  config = _load_config(case, case['rounds'])
  captured = []
  make_rounds_fn = executors.make_rounds_fn

  def recording(spec, data, **kwargs):
    rounds_fn = make_rounds_fn(spec, data, **kwargs)

    def wrapped(state, table, cohorts, *rest):
      if not captured:
        shapes = jax.tree.map(
          lambda x: jax.ShapeDtypeStruct(np.shape(x), x.dtype),
          (state, table, cohorts[0]),
        )
        captured.append((spec, data, shapes))
      return rounds_fn(state, table, cohorts, *rest)

    return wrapped

  executors.make_rounds_fn = recording
  with tempfile.TemporaryDirectory() as workdir:
    start = time.perf_counter()
    summary = experiment.run(config, workdir)
    wall = time.perf_counter() - start
    with open(os.path.join(workdir, 'metrics.jsonl')) as f:
      rows = [json.loads(line) for line in f]
  executors.make_rounds_fn = make_rounds_fn
  eval_seconds = sum(r['eval_seconds'] for r in rows)
  train_seconds = rows[-1]['wall_time'] - eval_seconds
  result = dict(
    rounds=config.num_rounds,
    steps=case['steps'],
    executor=summary['executor'],
    rounds_per_call=summary['rounds_per_call'],
    train_seconds=train_seconds,
    eval_seconds=eval_seconds,
    run_seconds=wall,
    headline=summary['headline'],
    headline_value=summary[summary['headline']],
  )
  if case['steps'] == 1 and captured:
    flops, bytes_accessed = one_round_cost(captured[0])
    peak_flops, bandwidth = measured_peaks()
    result.update(
      flops=flops,
      bytes=bytes_accessed,
      peak_flops=peak_flops,
      bandwidth=bandwidth,
      bound_ms=1e3 * flops / peak_flops,
    )
  return result


def main(argv):
  del argv
  if FLAGS.point:
    machine.print_result(measure_point(json.loads(FLAGS.point)))
    return
  described = machine.describe_backend()
  names = FLAGS.cases or list(CASES)
  unknown = sorted(set(names) - set(CASES))
  if unknown:
    raise app.UsageError(f'Unknown cases {unknown}; choose from {list(CASES)}.')
  rows = []
  measured = None
  for name in names:
    case = dict(CASES[name])
    case['rounds'] = max(1, int(case['rounds'] * FLAGS.rounds_scale))
    child = machine.run_child(
      'benchmarks.rounds_bench', [f'--point={json.dumps(case)}']
    )
    if child.status != 'ok':
      rows.append([name, child.status, child.note] + ['-'] * 7)
      print(name, child.status, child.note, flush=True)
      continue
    r = child.result
    if 'peak_flops' in r:
      measured = r
    per_round = r['train_seconds'] / r['rounds']
    bound = (
      f'{r["bound_ms"]:.2f} ms ({r["flops"] / 1e6:.0f} MFLOP; XLA counts '
      f'{r["bytes"] / 1e6:.0f} MB accessed)'
      if 'bound_ms' in r
      else '-'
    )
    row = [
      name,
      f'{r["rounds"]} x {r["steps"]}',
      f'{r["executor"]}, R={r["rounds_per_call"]}',
      f'{r["train_seconds"]:.1f}',
      f'{1e3 * per_round:.1f}',
      f'{1 / per_round:.1f}',
      f'{r["eval_seconds"]:.1f}',
      f'{r["run_seconds"]:.1f}',
      bound,
      f'{r["headline"]} {r["headline_value"]:.4f}',
    ]
    rows.append(row)
    print(' | '.join(row), flush=True)
  columns = [
    'case',
    'rounds x steps',
    'executor',
    'train s',
    'ms / round',
    'rounds / s',
    'eval s',
    'process s',
    'bound / round',
    'result',
  ]
  peaks = ''
  if measured:
    peaks = (
      f' Measured here: {measured["peak_flops"] / 1e9:.0f} GFLOP/s '
      f'(2048^2 matmul), {measured["bandwidth"] / 1e9:.1f} GB/s.'
    )
  notes = [
    f'Device: {described["device"]} ({described["backend"]}).',
    "train s: the run's wall time minus its evaluations, compilation "
    'included; process s: the child process from start to exit. The '
    'machine should be otherwise idle.',
    "bound: the arithmetic bound of a round, the FLOPs of XLA's cost "
    "analysis of one vmapped round over the measured matmul rate (XLA's "
    'bytes-accessed count charges each gather its whole operand, the '
    'training set, so it bounds nothing).' + peaks,
    f'Command: python -m benchmarks.rounds_bench {" ".join(sys.argv[1:])}',
  ]
  section = machine.markdown_section('many small rounds', notes, columns, rows)
  print(section)
  out = FLAGS.out or os.path.join(
    machine.REPO_ROOT, 'benchmarks', f'{described["backend"]}_rounds.md'
  )
  if out != '-':
    machine.append_markdown(
      out,
      section,
      title='Many small rounds (benchmarks/rounds_bench.py)',
      script='benchmarks/rounds_bench.py',
    )


if __name__ == '__main__':
  define_flags()
  app.run(main)
