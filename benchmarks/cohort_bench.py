r"""Host time of building a round's cohort, per sampler.

  python -m benchmarks.cohort_bench                  # 1,000 and 10,000 clients
  python -m benchmarks.cohort_bench --clients=10000 --algorithms=fedavg,fedquad \
      --local_steps=10 --batch_size=32 --examples_per_client=64

The host draws each round's batches (`data.cohort.make_cohort`, with the
algorithm's own schedule: FedQuad's quadruplets, the self-supervised
methods' two-view schedules) while the device trains the previous round
(experiment.py prefetches it in a thread). With thousands of clients per round
this host work can be as long as the round itself. This script times it
alone, for the two samplers (``config.cohort_sampler``): ``per_client``, a
NumPy generator per client in a Python loop, and ``vectorized``, the whole
cohort from counter-based draws. Federation: benchmarks.scaling's synthetic one
(every client ``examples_per_client`` examples of 10 random classes), all
clients in the round, every client ``local_steps`` steps of ``batch_size``
(``--local_steps=0``: ``--local_epochs`` epochs instead). Each row: the median
(and min-max) of ``--repeats`` builds after one untimed build, in this
process. The table is printed and appended to benchmarks/cohort_cpu.md.
"""

import os
import statistics
import sys
import time

from absl import app, flags
import numpy as np

from benchmarks import machine, scaling
from fedjax_metric import algorithms, models, optimizers
from fedjax_metric.data import cohort as cohort_lib


def time_builds(build, repeats):
  """Seconds of ``repeats`` calls of ``build`` after an untimed one."""
  build()
  times = []
  for _ in range(repeats):
    start = time.perf_counter()
    build()
    times.append(time.perf_counter() - start)
  return times


def measure(
  algorithm_name,
  num_clients,
  *,
  examples_per_client=16,
  local_steps=1,
  local_epochs=1,
  batch_size=4,
  repeats=5,
):
  """{sampler: [seconds of each timed build]} for one algorithm and size."""
  _, labels, partition = scaling.synthetic_federation(
    num_clients, examples_per_client, (1, 1, 1)
  )
  model = models.build('small_cnn', scaling.NUM_CLASSES, (28, 28, 1))
  algorithm = algorithms.REGISTRY[algorithm_name](
    model, server_optimizer=optimizers.make_server_optimizer('sgd')
  )
  shape = dict(
    num_steps=cohort_lib.num_local_steps(
      [len(p) for p in partition],
      batch_size=batch_size,
      local_epochs=local_epochs,
      local_steps=local_steps,
    ),
    batch_size=batch_size,
    local_epochs=local_epochs,
    local_steps=local_steps,
  )
  times = {}
  for sampler in cohort_lib.SAMPLERS:

    def build(sampler=sampler):
      return cohort_lib.make_cohort(
        np.arange(num_clients),
        partition,
        num_slots=num_clients,
        seed=0,
        round_idx=1,
        labels=labels,
        batches_fn=algorithm.client_batches,
        cohort_batches_fn=algorithm.cohort_batches,
        sampler=sampler,
        **shape,
      )

    times[sampler] = time_builds(build, repeats)
  return times


def format_row(algorithm_name, num_clients, times):
  per_client = statistics.median(times['per_client'])
  vectorized = statistics.median(times['vectorized'])
  spread = lambda t: f'{min(t):.4f}-{max(t):.4f}'
  return [
    algorithm_name,
    f'{num_clients:,}',
    f'{per_client:.4f}',
    spread(times['per_client']),
    f'{vectorized:.4f}',
    spread(times['vectorized']),
    f'{per_client / vectorized:.1f}x',
  ]


def define_flags():
  """This script's flags, defined only when it is the program (as
  benchmarks/scaling.py's, which they would clash with)."""
  flags.DEFINE_list('clients', ['1000', '10000'], 'Clients per round.')
  flags.DEFINE_list(
    'algorithms',
    ['fedavg', 'fedquad', 'ssd', 'fedx'],
    'Registered algorithms.',
  )
  flags.DEFINE_integer(
    'examples_per_client', 16, 'Synthetic examples each client holds.'
  )
  flags.DEFINE_integer(
    'local_steps', 1, 'Local steps per client (0: local_epochs epochs).'
  )
  flags.DEFINE_integer('local_epochs', 1, 'Local epochs when local_steps is 0.')
  flags.DEFINE_integer('batch_size', 4, 'Batch size.')
  flags.DEFINE_integer('repeats', 5, 'Timed builds per point.')
  flags.DEFINE_string(
    'out', os.path.join('benchmarks', 'cohort_cpu.md'), 'Markdown log.'
  )


def main(argv):
  del argv
  f = flags.FLAGS
  scaling.check_algorithms(f.algorithms)
  work = dict(
    examples_per_client=f.examples_per_client,
    local_steps=f.local_steps,
    local_epochs=f.local_epochs,
    batch_size=f.batch_size,
    repeats=f.repeats,
  )
  rows = []
  for name in f.algorithms:
    for clients in (int(c) for c in f.clients):
      rows.append(format_row(name, clients, measure(name, clients, **work)))
      print(' | '.join(rows[-1]), flush=True)
  count, unit = (
    (f.local_steps, 'step') if f.local_steps else (f.local_epochs, 'epoch')
  )
  section = machine.markdown_section(
    f'cohort building: {count} local {unit}{"s" if count != 1 else ""} '
    f'of {f.batch_size}, {f.examples_per_client} examples per client',
    [
      f'Host: {machine.cpu_name()}; median of {f.repeats} builds '
      'after one untimed build, one process.',
      f'Command: `{" ".join(["python -m benchmarks.cohort_bench", *sys.argv[1:]])}`',
    ],
    [
      'algorithm',
      'clients/round',
      'per_client s',
      'min-max',
      'vectorized s',
      'min-max',
      'speed-up',
    ],
    rows,
  )
  machine.append_markdown(
    f.out,
    section,
    title='Host-side cohort building',
    script='benchmarks/cohort_bench.py',
  )
  print(section)


if __name__ == '__main__':
  define_flags()
  app.run(main)
