r"""Steady-state speed of a federated round, per executor, vs PyTorch.

  python -m benchmarks.bench                       # small CNN, 10 and 100 clients
  python -m benchmarks.bench --clients=10,100 --local_steps=10 --batch_size=32 \
      --executors=host,vmap,chunked,sequential --pool=stride --torch
  python -m benchmarks.bench --model=fedquad_cnn --executors=host
  python -m benchmarks.bench --executors=host,vmap,torch_vmap,torch_vmap_compiled

PyTorch (benchmarks/torch_reference.py, the ``[bench]`` extra) runs on the device
JAX runs on (CUDA when JAX is on a GPU and torch sees one, else the CPU) in
up to three forms: ``torch``, the per-client loop of the reference
implementations (``--torch`` adds it, on by default); ``torch_vmap``, all
clients of a round at once with torch.func (vmap + grad over stacked
parameters, eager); ``torch_vmap_compiled``, that step in torch.compile
(added wherever ``torch_vmap`` is timed unless ``--notorch_compile``; once
per ``--torch_compile_modes``, e.g. ``default,max-autotune``). Every row's
time is compared with the loop and with the fastest PyTorch form.

The PyTorch rows are timed as a PyTorch engineer would time them
(`torch_reference.time_torch_rounds`): the same arithmetic as the JAX rows
(``--precision``: TF32 allowed on CUDA for 'default', float32 for
'highest', bf16 autocast with float32 weights for 'bf16', so a bf16 JAX row
is never compared with a float32 PyTorch one), ``cudnn.benchmark`` on CUDA,
channels-last where asked (``--torch_channels_last``, on CUDA by default),
and the batches of every round drawn before timing.

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

from absl import app, flags
import jax
import numpy as np

from benchmarks import machine, scaling, workload_flags
from fedjax_metric import engine, executors

FLAGS = flags.FLAGS


def define_flags():
  """This script's flags, defined only when it is the program (importing
  the module defines nothing: other tools define --out and --point too)."""
  flags.DEFINE_list('clients', ['10', '100'], 'Clients per round.')
  workload_flags.define(
    rounds=5, models=['small_cnn', 'fedquad_cnn'], unroll=True
  )
  flags.DEFINE_list(
    'executors',
    ['host', 'vmap', 'chunked'],
    'Executors to time: host, vmap, chunked, '
    'sequential; PyTorch: torch (the per-client '
    'loop), torch_vmap, torch_vmap_compiled.',
  )
  flags.DEFINE_integer('chunk_size', 10, 'Slots per chunk (chunked).')
  flags.DEFINE_boolean('torch', True, 'Also time the PyTorch loop.')
  flags.DEFINE_boolean(
    'torch_compile',
    True,
    'Where torch_vmap is timed, also time '
    'torch_vmap_compiled (its step in torch.compile).',
  )
  flags.DEFINE_list(
    'torch_compile_modes',
    ['default'],
    'torch.compile modes to time torch_vmap_compiled in, a row each: '
    'default, reduce-overhead, max-autotune, max-autotune-no-cudagraphs '
    '("best" picks the fastest).',
  )
  flags.DEFINE_enum(
    'torch_channels_last',
    'auto',
    ['auto', 'true', 'false'],
    'PyTorch models and images in channels-last memory format; auto: on '
    "CUDA (cuDNN's tensor-core convolutions prefer NHWC), not on the CPU.",
  )
  flags.DEFINE_integer(
    'torch_threads',
    None,
    'torch.set_num_threads for the PyTorch rows '
    "(default: torch's own, one per core).",
  )
  flags.DEFINE_string(
    'out', None, 'Markdown file (default benchmarks/<backend>.md).'
  )
  flags.DEFINE_string(
    'point',
    None,
    'Internal: time one "executor,clients" point (or '
    '"torch,clients") in this process and print it as JSON.',
  )


# Executor name -> torch_reference.time_torch_rounds variant.
TORCH_VARIANTS = {
  'torch': 'loop',
  'torch_vmap': 'vmap',
  'torch_vmap_compiled': 'vmap_compiled',
}
TORCH_LABELS = {
  'torch': 'pytorch loop',
  'torch_vmap': 'pytorch vmap',
  'torch_vmap_compiled': 'pytorch vmap + compile',
}
COMPILE_MODES = (
  'default',
  'reduce-overhead',
  'max-autotune',
  'max-autotune-no-cudagraphs',
)


def torch_form(name):
  """``(variant, compile mode)`` of a PyTorch row's name, None for a JAX
  executor: 'torch_vmap_compiled@max-autotune' -> ('vmap_compiled',
  'max-autotune'); the default mode is None."""
  base, _, mode = name.partition('@')
  if base not in TORCH_VARIANTS:
    return None
  return TORCH_VARIANTS[base], (mode or None)


def row_label(name):
  base, _, mode = name.partition('@')
  label = TORCH_LABELS.get(base, base)
  return f'{label} ({mode})' if mode else label


def time_jax(executor, num_clients, *, unroll):
  """-> dict(seconds per round, compile seconds, rounds, the convolution
  form and unrolling used) for one executor; ``unroll`` None: see --unroll."""
  h, w, c = (int(x) for x in FLAGS.image_shape)
  steps, batch = FLAGS.local_steps, FLAGS.batch_size
  choice = executors.choose_executor(executor, chunk_size=FLAGS.chunk_size)
  conv_impl, unroll = scaling.round_forms(
    FLAGS.model, FLAGS.conv_impl, choice, unroll
  )
  run = scaling.synthetic_run(
    'fedavg',
    FLAGS.model,
    pool=FLAGS.pool,
    image_shape=(h, w, c),
    num_clients=num_clients,
    examples_per_client=steps * batch,
    precision=FLAGS.precision,
    conv_impl=conv_impl,
  )
  data = jax.device_put(engine.DeviceData(run.images, run.labels))
  flops = scaling.client_step_flops(run, batch)
  round_fn = executors.make_round_fn(
    run.spec,
    data,
    executor=executor,
    chunk_size=FLAGS.chunk_size,
    steps_per_call=steps,
    unroll=unroll,
  )
  state, table = engine.init_state(run.algorithm, run.variables, num_clients)
  times = []
  for r in range(FLAGS.rounds + 1):
    cohort = jax.device_put(
      scaling.full_cohort(run, r, local_steps=steps, batch_size=batch)
    )
    start = time.perf_counter()
    state, table, metrics = round_fn(state, table, cohort)
    jax.block_until_ready((state, metrics))
    times.append(time.perf_counter() - start)
  median = statistics.median(times[1:])
  return {
    'median': median,
    'min': min(times[1:]),
    'max': max(times[1:]),
    'compile': times[0] - median,
    'step_flops': flops,
    'conv_impl': conv_impl,
    'unroll': unroll,
  }


# Dense tensor-core peaks in TFLOP/s (NVIDIA H100 / H200 SXM datasheets;
# 'default' is TF32, what XLA uses for float32 matmuls on these GPUs, and
# 'highest' is plain float32 on the CUDA cores).
PEAK_TFLOPS = {
  'H100': {'bf16': 989.4, 'default': 494.7, 'highest': 66.9},
  'H200': {'bf16': 989.4, 'default': 494.7, 'highest': 66.9},
}


def peak_tflops(device, precision):
  """The device's dense peak at ``precision``, or None if not tabled."""
  for name, peaks in PEAK_TFLOPS.items():
    if name in device:
      return peaks[precision]
  return None


def time_torch(name, clients):
  """Times one PyTorch form on the device JAX uses.

  Args:
    name: a PyTorch row's name (`torch_form`).
    clients: clients per round.

  Returns:
    dict(median, min, max seconds per round, compile = warm-up round minus
    median, device_mb = CUDA's peak allocated MiB or None, torch_device,
    torch_version, num_threads, load = 1-minute load averages before and
    after).
  """
  from benchmarks import torch_reference  # pylint: disable=g-import-not-at-top

  h, w, c = (int(x) for x in FLAGS.image_shape)
  load_before = os.getloadavg()[0]
  device = torch_reference.pick_device(jax.default_backend())
  variant, mode = torch_form(name)
  channels_last = (
    device.type == 'cuda'
    if FLAGS.torch_channels_last == 'auto'
    else FLAGS.torch_channels_last == 'true'
  )
  r = torch_reference.time_torch_rounds(
    clients_per_round=clients,
    local_steps=FLAGS.local_steps,
    batch_size=FLAGS.batch_size,
    image_shape=(h, w, c),
    pool=FLAGS.pool,
    model=FLAGS.model,
    num_rounds=FLAGS.rounds,
    warmup_rounds=1,
    lr=0.01,
    variant=variant,
    device=device,
    num_threads=FLAGS.torch_threads,
    precision=FLAGS.precision,
    channels_last=channels_last,
    compile_mode=mode,
  )
  return {
    'median': r['median'],
    'min': r['min'],
    'max': max(r['seconds_per_round']),
    'compile': r['warmup_seconds'][0] - r['median'],
    'device_mb': r['peak_device_mb'],
    'torch_device': r['device'],
    'torch_version': r['torch_version'],
    'num_threads': r['num_threads'],
    'load': [load_before, os.getloadavg()[0]],
    'channels_last': r['channels_last'],
    'cudnn_benchmark': r['cudnn_benchmark'],
  }


def measure_point(point, unroll):
  """Times one point in this process; adds its peak memory."""
  executor, clients = point.split(',')
  if torch_form(executor):
    return {
      **time_torch(executor, int(clients)),
      'rss_mb': machine.peak_rss_mb(),
    }
  else:
    with executors.matmul_precision(FLAGS.precision):
      result = time_jax(executor, int(clients), unroll=unroll)
  return {
    **result,
    'rss_mb': machine.peak_rss_mb(),
    'device_mb': machine.peak_device_mb(),
  }


def measure_in_child(point):
  """Runs `measure_point` in a fresh interpreter: per-point peak memory."""
  args = [f'--point={point}'] + [
    arg for arg in sys.argv[1:] if not arg.startswith('--point')
  ]
  child = machine.run_child('benchmarks.bench', args)
  if child.status != 'ok':
    raise RuntimeError(f'Benchmark point {point} {child.status}: {child.note}')
  return child.result


COLUMNS = [
  'clients/round',
  'executor',
  's/round (median)',
  'min-max',
  'client-steps/s',
  'TFLOP/s (% of peak)',
  'compile s',
  'peak RSS MB',
  'peak device MB',
  'vs PyTorch loop',
  'vs best PyTorch',
]


def ratio_cell(median, reference):
  """Time ratio to a PyTorch median: below 1 is faster than PyTorch."""
  return f'{median / reference:.2f}x' if reference else 'n/a'


def flops_cell(clients, r, peak):
  """Achieved TFLOP/s from XLA's count of a client step, and % of peak."""
  flops = r.get('step_flops')
  if flops is None or not np.isfinite(flops):
    return '-'
  tflops = clients * FLAGS.local_steps * flops / r['median'] / 1e12
  return f'{tflops:.3g}' + (f' ({100 * tflops / peak:.1f}%)' if peak else '')


def format_row(clients, name, r, loop_median, best_torch, peak=None):
  """One table row's cells; a PyTorch form that failed keeps its note.

  ``best_torch``: (label, median) of the fastest PyTorch form, or None.
  ``peak``: the device's TFLOP/s at the bench's precision, or None.
  """
  if r.get('failed'):
    return [
      clients,
      name,
      '-',
      '-',
      '-',
      '-',
      '-',
      '-',
      '-',
      '-',
      f'failed: {r["failed"]}',
    ]
  best = (
    ratio_cell(r['median'], best_torch[1]) + f' ({best_torch[0]})'
    if best_torch
    else 'n/a'
  )
  return [
    clients,
    name,
    f'{r["median"]:.3f}',
    f'{r["min"]:.3f}-{r["max"]:.3f}',
    f'{clients * FLAGS.local_steps / r["median"]:.0f}',
    flops_cell(clients, r, peak),
    '-' if r['compile'] is None else f'{r["compile"]:.1f}',
    f'{r["rss_mb"]:.0f}',
    '-' if r['device_mb'] is None else f'{r["device_mb"]:.0f}',
    ratio_cell(r['median'], loop_median),
    best,
  ]


def executor_names(executors, *, torch, torch_compile, compile_modes):
  """The rows to time: ``executors`` (--executors), plus the PyTorch loop
  (``torch``) and, where torch_vmap is timed, its compiled form
  (``torch_compile``), once per mode of ``compile_modes``
  ('torch_vmap_compiled@max-autotune'); each name once.

  Raises:
    app.UsageError: a mode torch.compile does not have.
  """
  unknown = sorted(set(compile_modes) - set(COMPILE_MODES))
  if unknown:
    raise app.UsageError(
      f'--torch_compile_modes: unknown {unknown}; choose from {COMPILE_MODES}.'
    )
  names = list(executors)
  if torch and 'torch' not in names:
    names.append('torch')
  if torch_compile and 'torch_vmap' in names:
    names.append('torch_vmap_compiled')
  compiled = [n for n in names if n == 'torch_vmap_compiled']
  names = [n for n in names if n != 'torch_vmap_compiled']
  if compiled:
    names += [
      'torch_vmap_compiled' + ('' if mode == 'default' else f'@{mode}')
      for mode in compile_modes
    ]
  return list(dict.fromkeys(names))


def torch_note(results, backend):
  """The table's PyTorch line: version, device, threads, what each form is."""
  done = [r for name, r in results if torch_form(name) and not r.get('failed')]
  if not done:
    return None
  first = done[0]
  device = first['torch_device']
  loads = [x for r in done for x in r['load']]
  threads = first['num_threads']
  # OpenMP's spin-waiting decides torch's speed on a loaded CPU: say if set.
  wait_policy = (
    f', OMP_WAIT_POLICY={os.environ["OMP_WAIT_POLICY"]}'
    if os.environ.get('OMP_WAIT_POLICY')
    else ''
  )
  why = (
    ' (this torch build sees no CUDA device)'
    if backend == 'gpu' and device == 'cpu'
    else ''
  )
  return (
    f'PyTorch: torch {first["torch_version"]} on {device}{why}, '
    f'{threads} CPU thread{"s" if threads > 1 else ""}{wait_policy}; '
    '1-minute load average '
    f'{min(loads):.1f}-{max(loads):.1f} on {os.cpu_count()} cores '
    'during these rows. pytorch loop = one client '
    'after the other (load_state_dict, SGD, FedAvg); pytorch vmap = all '
    'clients at once with torch.func (vmap(grad(functional_call)) over '
    'stacked parameters), eager; + compile = that step in torch.compile '
    '(compile s = warm-up round minus median; its mode in brackets where '
    'not the default). '
    f'Same arithmetic as the JAX rows: {TORCH_PRECISION[FLAGS.precision]}. '
    'Batches of every round drawn before timing; cudnn.benchmark '
    f'{"on" if first["cudnn_benchmark"] else "off (CPU)"}; channels-last '
    f'{"on" if first["channels_last"] else "off"}. Ratios are time ratios '
    '(below 1: faster than that PyTorch form); "best" is the fastest '
    'PyTorch form at that cohort size.'
  )


# What --precision means for the PyTorch rows (torch_reference.set_precision).
TORCH_PRECISION = {
  'default': 'TF32 allowed for matmuls and convolutions on CUDA (JAX uses '
  'TF32 for float32 there), float32 on the CPU',
  'highest': 'float32, TF32 off',
  'bf16': 'bf16 autocast for the forward pass, float32 weights',
}


def model_label():
  if FLAGS.model == 'small_cnn':
    return f'small_cnn ({FLAGS.pool})'
  return 'fedquad_cnn (64/128/256, BatchNorm)'


def main(argv):
  del argv
  if FLAGS.point and torch_form(FLAGS.point.split(',')[0]):
    # This process asks JAX only for its backend's name; on a GPU, JAX's
    # default preallocation would hold most of the memory torch needs.
    os.environ.setdefault('XLA_PYTHON_CLIENT_PREALLOCATE', 'false')
  if FLAGS.point:
    machine.print_result(measure_point(FLAGS.point, FLAGS.unroll))
    return
  # The parent never starts a backend itself (see machine.describe_backend).
  described = machine.describe_backend()
  backend = described['backend']
  peak = peak_tflops(described['device'], FLAGS.precision)
  rows, measured = [], []
  names = executor_names(
    FLAGS.executors,
    torch=FLAGS.torch,
    torch_compile=FLAGS.torch_compile,
    compile_modes=FLAGS.torch_compile_modes,
  )
  for clients in (int(c) for c in FLAGS.clients):
    results = {}
    for name in names:
      try:
        r = results[name] = measure_in_child(f'{name},{clients}')
      except RuntimeError as e:
        if not torch_form(name):
          raise
        # A PyTorch form that does not run here (say torch.compile without
        # a working C++ compiler) gets a row that says so.
        results[name] = {'failed': str(e)[:300]}
        print(f'{name:>10} C={clients:<5} failed: {e}', flush=True)
        continue
      print(
        f'{name:>10} C={clients:<5} {r["median"]:.3f} s/round '
        f'(min {r["min"]:.3f}, max {r["max"]:.3f}), compile '
        f'{r["compile"]} s, {clients * FLAGS.local_steps / r["median"]:.0f} '
        f'client-steps/s, peak RSS {r["rss_mb"]:.0f} MB, device '
        f'{r["device_mb"]} MB',
        flush=True,
      )
    measured += results.items()
    torch_done = {
      name: r['median']
      for name, r in results.items()
      if torch_form(name) and not r.get('failed')
    }
    loop_median = torch_done.get('torch')
    best_torch = None
    if torch_done:
      best = min(torch_done, key=torch_done.get)
      best_torch = (row_label(best), torch_done[best])
    for name, r in results.items():
      rows.append(
        format_row(
          clients,
          row_label(name),
          r,
          loop_median,
          best_torch,
          peak,
        )
      )

  forms = ', '.join(
    sorted(
      {
        f'{name} {r["conv_impl"] or "-"}{" unrolled" if r["unroll"] else ""}'
        for name, r in measured
        if 'conv_impl' in r
      }
    )
  )
  notes = [
    f'Device: {described["device"]} ({backend}); jax {jax.__version__}; '
    f'median of {FLAGS.rounds} rounds after 1 warm-up; convolutions and '
    f'unrolled local steps: {forms}. '
    "Each row ran in its own process: peak RSS is that row's; device MB is "
    "XLA's peak on device 0 (not reported on CPU, where it is host memory). "
    "TFLOP/s = clients x local steps x XLA's FLOP count of one client "
    'step (cost analysis of forward + backward + update) / s per round; '
    + (
      f"% of the device's dense {FLAGS.precision} peak ({peak} TFLOP/s)."
      if peak
      else 'no peak tabled for this device.'
    ),
    f'Command: `python -m benchmarks.bench --model={FLAGS.model} '
    f'--clients={",".join(FLAGS.clients)} --local_steps={FLAGS.local_steps} '
    f'--batch_size={FLAGS.batch_size} --image_shape={",".join(FLAGS.image_shape)} '
    f'--pool={FLAGS.pool} --executors={",".join(FLAGS.executors)} '
    f'--chunk_size={FLAGS.chunk_size} --precision={FLAGS.precision} '
    f'--conv_impl={FLAGS.conv_impl} --torch={FLAGS.torch} '
    + ('' if FLAGS.unroll is None else f'--unroll={FLAGS.unroll} ')
    + f'--torch_compile={FLAGS.torch_compile} '
    + f'--torch_compile_modes={",".join(FLAGS.torch_compile_modes)} '
    + f'--torch_channels_last={FLAGS.torch_channels_last}'
    + (f' --torch_threads={FLAGS.torch_threads}' if FLAGS.torch_threads else '')
    + '`',
  ]
  pytorch = torch_note(measured, backend)
  if pytorch:
    notes.insert(1, pytorch)
  table = machine.markdown_section(
    f'{model_label()}, {"x".join(FLAGS.image_shape)}, {FLAGS.local_steps} local steps '
    f'of {FLAGS.batch_size}, FedAvg',
    notes,
    COLUMNS,
    rows,
  )
  print(table)
  machine.append_markdown(
    FLAGS.out or os.path.join('benchmarks', f'{backend}.md'),
    table,
    title=f'Benchmarks on {backend}',
    script='benchmarks/bench.py',
  )


if __name__ == '__main__':
  define_flags()
  app.run(main)
