r"""A million clients end to end: SCAFFOLD, 100 rounds, killed once, resumed.

  python -m benchmarks.scale_end_to_end --out=runs/scale_e2e

Three runs of the packaged SCAFFOLD config on Synthetic(1, 1) (logistic
regression, 1,000 clients a round, 10 local steps of 10, the vmap
executor), each a `launch.main` process:

  1. N = 10^6, the client table on disk, uninterrupted;
  2. the same, killed with SIGKILL after ``--kill_after`` seconds (mid-run,
     wherever it is), then run again with the same command to the end;
  3. N = 10^4 with the table on the device, for scale.

It reports each run's wall time, peak RSS (``/usr/bin/time``-free: the
child's ``ru_maxrss`` from `os.wait4`), final test accuracy, and whether the
killed-and-resumed run ended bit for bit where the uninterrupted one did
(server state and every written row of the table). Appends a markdown
section to ``--table`` (benchmarks/scale_cpu.md).
"""

import json
import os
import signal
import subprocess
import sys
import time

from absl import app, flags
import numpy as np


def define_flags():
  flags.DEFINE_string('out', None, 'Folder of the three workdirs.')
  flags.DEFINE_integer('num_clients', 1_000_000, 'N of the large runs.')
  flags.DEFINE_integer('small_clients', 10_000, 'N of the device-table run.')
  flags.DEFINE_integer('rounds', 100, 'Rounds.')
  flags.DEFINE_float('kill_after', 30.0, 'Seconds before the SIGKILL.')
  flags.DEFINE_string('table', 'benchmarks/scale_cpu.md', 'Markdown to append.')


def command(workdir, num_clients, placement, rounds):
  return [
    sys.executable,
    '-m',
    'launch.main',
    '--config=scaffold',
    f'--workdir={workdir}',
    '--config.dataset.name=synthetic',
    f'--config.num_clients={num_clients}',
    '--config.clients_per_round=1000',
    f'--config.num_rounds={rounds}',
    '--config.local.steps=10',
    '--config.local.batch_size=10',
    '--config.local.learning_rate=0.01',
    '--config.executor=vmap',
    '--config.eval_every=10',
    '--config.checkpoint_every=10',
    '--config.progress=False',
    f'--config.client_table.placement={placement}',
  ]


def run(argv, kill_after=None):
  """``(exit code, wall seconds, peak RSS GB, output)`` of one process."""
  start = time.time()
  process = subprocess.Popen(
    argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
  )
  if kill_after is not None:
    time.sleep(kill_after)
    process.send_signal(signal.SIGKILL)
  output = process.stdout.read()
  _, status, usage = os.wait4(process.pid, 0)
  process.returncode = os.waitstatus_to_exitcode(status)
  return (
    process.returncode,
    time.time() - start,
    usage.ru_maxrss * 1024 / 1024**3,
    output,
  )


def final(workdir):
  """Final metrics row, server state leaves and the table's written rows."""
  import orbax.checkpoint as ocp  # pylint: disable=g-import-not-at-top

  directory = os.path.abspath(os.path.join(workdir, 'checkpoints'))
  step = max(int(s) for s in os.listdir(directory) if s.isdigit())
  with ocp.StandardCheckpointer() as checkpointer:
    item = checkpointer.restore(os.path.join(directory, str(step), 'default'))
  with open(os.path.join(workdir, 'metrics.jsonl')) as f:
    last = [json.loads(line) for line in f][-1]
  leaves = [np.asarray(x) for x in _leaves(item['server_state'])]
  rows = None
  meta_path = os.path.join(workdir, 'client_table', 'meta.json')
  if os.path.exists(meta_path):
    with open(meta_path) as f:
      meta = json.load(f)
    written = np.unpackbits(
      np.asarray(item['client_table']['written']), count=meta['num_clients']
    ).astype(bool)
    rows = np.memmap(
      os.path.join(workdir, 'client_table', 'rows.bin'),
      np.uint8,
      mode='r',
      shape=(meta['num_clients'], meta['row_bytes']),
    )[written]
  return last, leaves, rows


def _leaves(tree):
  if isinstance(tree, dict):
    for key in sorted(tree):
      yield from _leaves(tree[key])
  elif isinstance(tree, (list, tuple)):
    for item in tree:
      yield from _leaves(item)
  else:
    yield tree


def main(argv):
  del argv
  f = flags.FLAGS
  os.makedirs(f.out, exist_ok=True)
  whole = os.path.join(f.out, 'million_whole')
  killed = os.path.join(f.out, 'million_killed')
  small = os.path.join(f.out, 'small_device')
  lines = []
  code, wall, rss, out = run(command(whole, f.num_clients, 'disk', f.rounds))
  assert code == 0, out[-3000:]
  lines.append(('uninterrupted', f.num_clients, 'disk', wall, rss, whole))
  code, wall_1, rss_1, out = run(
    command(killed, f.num_clients, 'disk', f.rounds), kill_after=f.kill_after
  )
  rounds_before = 0
  if os.path.exists(os.path.join(killed, 'metrics.jsonl')):
    with open(os.path.join(killed, 'metrics.jsonl')) as fh:
      rounds_before = max(json.loads(line)['round'] for line in fh)
  code, wall_2, rss_2, out = run(
    command(killed, f.num_clients, 'disk', f.rounds)
  )
  assert code == 0, out[-3000:]
  assert 'Resuming' in out, out[-2000:]
  lines.append(
    (
      f'killed after {f.kill_after:.0f} s (round {rounds_before} evaluated), '
      'resumed',
      f.num_clients,
      'disk',
      wall_1 + wall_2,
      max(rss_1, rss_2),
      killed,
    )
  )
  code, wall, rss, out = run(
    command(small, f.small_clients, 'device', f.rounds)
  )
  assert code == 0, out[-3000:]
  lines.append(('uninterrupted', f.small_clients, 'device', wall, rss, small))

  last_whole, state_whole, rows_whole = final(whole)
  last_killed, state_killed, rows_killed = final(killed)
  same = (
    all(np.array_equal(a, b) for a, b in zip(state_whole, state_killed))
    and np.array_equal(rows_whole, rows_killed)
    and last_whole['test_accuracy'] == last_killed['test_accuracy']
  )
  from fedjax_metric.launch import scale  # pylint: disable=g-import-not-at-top

  section = [
    f'### {time.strftime("%Y-%m-%d")}: SCAFFOLD end to end, '
    f'{scale.describe_device()}',
    '',
    '`python -m benchmarks.scale_end_to_end ' + ' '.join(sys.argv[1:]) + '`',
    '',
    '| run | N | table | wall s | peak RSS (GB) | test acc (round '
    f'{f.rounds}) |',
    '|---|---:|---|---:|---:|---:|',
  ]
  for name, n, placement, wall, rss, workdir in lines:
    last, _, _ = final(workdir)
    section.append(
      f'| {name} | {n:,} | {placement} | {wall:.0f} | {rss:.2f} | '
      f'{last["test_accuracy"]:.4f} |'
    )
  section += [
    '',
    'Killed and resumed run equal to the uninterrupted one, bit for bit '
    f'(server state, every written row, accuracy): {"yes" if same else "NO"}.',
    '',
  ]
  text = '\n'.join(section)
  with open(f.table, 'a') as fh:
    fh.write(text + '\n')
  print(text)


if __name__ == '__main__':
  define_flags()
  app.run(main)
