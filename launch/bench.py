r"""Steady-state speed of a federated round, per executor, vs a PyTorch loop.

  python -m launch.bench                       # small CNN, 10 and 100 clients
  python -m launch.bench --clients=10,100 --local_steps=10 --batch_size=32 \
      --executors=host,vmap,chunked,sequential --pool=stride --torch
  python -m launch.bench --model=fedquad_cnn --executors=host

Each configuration: FedAvg, every client takes exactly ``local_steps`` SGD
steps of ``batch_size`` on synthetic 28x28x1 data; one warm-up round (its time
minus the median is reported as compile time), then the median of
``--rounds`` timed rounds. Every (executor, clients) point and the PyTorch
loop run in a fresh child process, so the peak host RSS (and, on GPU, XLA's
peak device bytes) belong to that point alone. The table is printed and
appended to benchmarks/<device>.md with the machine named.
"""

import os
import statistics
import sys
import time

from absl import app
from absl import flags
import jax
import numpy as np

from fedjax_metric import engine, executors, train
from fedjax_metric.data import cohort as cohort_lib
from launch import machine
from launch import scaling

_CLIENTS = flags.DEFINE_list('clients', ['10', '100'], 'Clients per round.')
_STEPS = flags.DEFINE_integer('local_steps', 10, 'Local steps per client.')
_BATCH = flags.DEFINE_integer('batch_size', 32, 'Batch size.')
_IMAGE = flags.DEFINE_list('image_shape', ['28', '28', '1'], 'H,W,C.')
_MODEL = flags.DEFINE_enum('model', 'small_cnn', ['small_cnn', 'fedquad_cnn'],
                          'Model (fedquad_cnn: 64/128/256 channels, BatchNorm).')
_POOL = flags.DEFINE_string('pool', 'stride', 'small_cnn pool: stride|avg|max.')
_EXECUTORS = flags.DEFINE_list('executors', ['host', 'vmap', 'chunked'],
                               'Executors to time: host, vmap, chunked, '
                               'sequential.')
_CHUNK = flags.DEFINE_integer('chunk_size', 10, 'Slots per chunk (chunked).')
_UNROLL = flags.DEFINE_boolean(
    'unroll', None, 'Unroll local steps in vmap/chunked (default: on CPU).')
_ROUNDS = flags.DEFINE_integer('rounds', 5, 'Timed rounds after warm-up.')
_CONV = flags.DEFINE_enum('conv_impl', 'xla', ['xla', 'patches'],
                          'Convolution form (models.layers.make_conv).')
_PRECISION = flags.DEFINE_enum('precision', 'default',
                               ['default', 'highest', 'bf16'],
                               'Matmul precision (config.precision).')
_TORCH = flags.DEFINE_boolean('torch', True, 'Also time the PyTorch loop.')
_OUT = flags.DEFINE_string('out', None, 'Markdown file (default '
                           'benchmarks/<backend>.md).')
_POINT = flags.DEFINE_string(
    'point', None, 'Internal: time one "executor,clients" point (or '
    '"torch,clients") in this process and print it as JSON.')


def time_jax(executor, num_clients, *, unroll):
  """-> dict(seconds per round, compile seconds, rounds) for one executor."""
  h, w, c = (int(x) for x in _IMAGE.value)
  steps, batch = _STEPS.value, _BATCH.value
  run = scaling.synthetic_run('fedavg', _MODEL.value, pool=_POOL.value,
                              image_shape=(h, w, c), num_clients=num_clients,
                              examples_per_client=steps * batch,
                              precision=_PRECISION.value,
                              conv_impl=_CONV.value)
  data = jax.device_put(engine.DeviceData(run.images, run.labels))
  round_fn = executors.make_round_fn(
      run.spec, data, executor=executor, chunk_size=_CHUNK.value,
      steps_per_call=steps, unroll=unroll)
  state, table = engine.init_state(run.algorithm, run.variables, num_clients)
  times = []
  for r in range(_ROUNDS.value + 1):
    cohort = cohort_lib.make_cohort(
        np.arange(num_clients), run.partition, num_slots=num_clients,
        num_steps=steps, batch_size=batch, local_epochs=1, local_steps=steps,
        seed=0, round_idx=r)
    cohort = jax.device_put(cohort)
    start = time.perf_counter()
    state, table, metrics = round_fn(state, table, cohort)
    jax.block_until_ready((state, metrics))
    times.append(time.perf_counter() - start)
  median = statistics.median(times[1:])
  return {'median': median, 'min': min(times[1:]), 'max': max(times[1:]),
          'compile': times[0] - median}


def time_torch(clients):
  from launch import torch_reference  # pylint: disable=g-import-not-at-top
  h, w, c = (int(x) for x in _IMAGE.value)
  r = torch_reference.time_torch_rounds(
      clients_per_round=clients, local_steps=_STEPS.value,
      batch_size=_BATCH.value, image_shape=(h, w, c), pool=_POOL.value,
      model=_MODEL.value, num_rounds=_ROUNDS.value, warmup_rounds=1, lr=0.01)
  return {'median': r['median'], 'min': r['min'],
          'max': max(r['seconds_per_round']), 'compile': None,
          'note': f'torch {r["torch_version"]}, {r["num_threads"]} threads'}


def measure_point(point, unroll):
  """Times one point in this process; adds its peak memory."""
  executor, clients = point.split(',')
  if executor == 'torch':
    result = time_torch(int(clients))
  else:
    with train.matmul_precision(_PRECISION.value):
      result = time_jax(executor, int(clients), unroll=unroll)
  return {**result, 'rss_mb': machine.peak_rss_mb(),
          'device_mb': machine.peak_device_mb()}


def measure_in_child(point):
  """Runs `measure_point` in a fresh interpreter: per-point peak memory."""
  args = [f'--point={point}'] + [
      arg for arg in sys.argv[1:] if not arg.startswith('--point')]
  child = machine.run_child('launch.bench', args)
  if child.status != 'ok':
    raise RuntimeError(f'Benchmark point {point} {child.status}: {child.note}')
  return child.result


COLUMNS = ['clients/round', 'executor', 's/round (median)', 'min-max',
           'client-steps/s', 'compile s', 'peak RSS MB', 'peak device MB',
           'vs PyTorch']


def format_row(clients, name, r, torch_median):
  """One table row's cells."""
  ratio = f'{r["median"] / torch_median:.2f}x' if torch_median else 'n/a'
  return [clients, name, f'{r["median"]:.3f}', f'{r["min"]:.3f}-{r["max"]:.3f}',
          f'{clients * _STEPS.value / r["median"]:.0f}',
          '-' if r['compile'] is None else f'{r["compile"]:.1f}',
          f'{r["rss_mb"]:.0f}',
          '-' if r['device_mb'] is None else f'{r["device_mb"]:.0f}', ratio]


def model_label():
  if _MODEL.value == 'small_cnn':
    return f'small_cnn ({_POOL.value})'
  return 'fedquad_cnn (64/128/256, BatchNorm)'


def main(argv):
  del argv
  backend = jax.default_backend()
  unroll = _UNROLL.value if _UNROLL.value is not None else backend == 'cpu'
  if _POINT.value:
    machine.print_result(measure_point(_POINT.value, unroll))
    return
  rows = []
  for clients in (int(c) for c in _CLIENTS.value):
    results = {}
    names = list(_EXECUTORS.value) + (['torch'] if _TORCH.value else [])
    for name in names:
      r = results[name] = measure_in_child(f'{name},{clients}')
      print(f'{name:>10} C={clients:<5} {r["median"]:.3f} s/round '
            f'(min {r["min"]:.3f}, max {r["max"]:.3f}), compile '
            f'{r["compile"]} s, {clients * _STEPS.value / r["median"]:.0f} '
            f'client-steps/s, peak RSS {r["rss_mb"]:.0f} MB, device '
            f'{r["device_mb"]} MB', flush=True)
    torch_median = results['torch']['median'] if 'torch' in results else None
    for name, r in results.items():
      label = f'pytorch loop ({r["note"]})' if name == 'torch' else name
      rows.append(format_row(clients, label, r, torch_median))

  notes = [
      f'Device: {machine.device_name()} ({backend}); jax {jax.__version__}; '
      f'median of {_ROUNDS.value} rounds after 1 warm-up; unroll={unroll}. '
      "Each row ran in its own process: peak RSS is that row's; device MB is "
      "XLA's peak on device 0 (not reported on CPU, where it is host memory).",
      f'Command: `python -m launch.bench --model={_MODEL.value} '
      f'--clients={",".join(_CLIENTS.value)} --local_steps={_STEPS.value} '
      f'--batch_size={_BATCH.value} --image_shape={",".join(_IMAGE.value)} '
      f'--pool={_POOL.value} --executors={",".join(_EXECUTORS.value)} '
      f'--chunk_size={_CHUNK.value} --precision={_PRECISION.value} '
      f'--conv_impl={_CONV.value}`',
  ]
  table = machine.markdown_section(
      f'{model_label()}, {"x".join(_IMAGE.value)}, {_STEPS.value} local steps '
      f'of {_BATCH.value}, FedAvg', notes, COLUMNS, rows)
  print(table)
  machine.append_markdown(
      _OUT.value or os.path.join('benchmarks', f'{backend}.md'), table,
      title=f'Benchmarks on {backend}', script='launch/bench.py')


if __name__ == '__main__':
  app.run(main)
