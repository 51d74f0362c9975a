"""launch/reproduce.py and launch/paper_tables.py: one command per paper table.

Every registered table is checked to resolve at both scales (each point's
config loads with its overrides) and to carry the paper's numbers for its
paper rows; the written table is checked against mean and sample std
computed here from hand-made workdirs; one tiny table is trained end to end
through launch.sweep's local backend; the command line is run as a user
runs it.
"""

import csv
import json
import os
import subprocess
import sys

import numpy as np
import pytest

from fedjax_metric import config_io
from launch import paper_tables, reproduce, sweep

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ALL_TABLES = sorted(paper_tables.TABLES)


@pytest.mark.parametrize('key', ALL_TABLES, ids=' '.join)
@pytest.mark.parametrize('scale', ['cpu', 'paper'])
def test_every_point_of_every_table_resolves(key, scale, tmp_path):
  table = paper_tables.TABLES[key]
  todo = reproduce.entries(table, scale, root=str(tmp_path), seeds=2)
  assert len(todo) == 2 * len(table.methods) * len(table.columns)
  assert len({e.point.workdir for e in todo}) == len(todo)
  for entry in todo[::2]:  # seed 0 of each (method, column)
    config = sweep.resolve(entry.point.spec, entry.point.overrides)
    assert config.seed == 0
  # Columns differ in what they set: their seed-0 configs are not equal.
  for method in table.methods:
    configs = [
      sweep.config_dict(sweep.resolve(e.point.spec, e.point.overrides))
      for e in todo
      if e.method == method.name and e.seed == 0
    ]
    assert len({json.dumps(c, sort_keys=True) for c in configs}) == len(
      configs
    ), method.name


@pytest.mark.parametrize('key', ALL_TABLES, ids=' '.join)
def test_paper_numbers_cover_the_paper_rows(key):
  table = paper_tables.TABLES[key]
  names = [m.name for m in table.methods]
  assert len(set(names)) == len(names)
  assert set(table.paper_values) == {
    m.name for m in table.methods if m.in_paper
  }
  for values in table.paper_values.values():
    assert len(values) == len(table.paper_columns)
    for value in values:
      float(value)  # Printed numbers, nothing else.


def test_scales_differ_where_the_paper_protocol_differs():
  rcl = paper_tables.TABLES[('fedrcl', 'table1')]
  cpu = sweep.resolve(
    reproduce.entries(rcl, 'cpu', root='r', seeds=1)[0].point.spec, {}
  )
  paper = sweep.resolve(
    reproduce.entries(rcl, 'paper', root='r', seeds=1)[0].point.spec, {}
  )
  assert (cpu.model.name, paper.model.name) == ('small_cnn', 'resnet18')
  assert paper.num_rounds == 1000
  metric = paper_tables.TABLES[('fedmetric', 'table2')]
  rates = {
    e.method: float(e.point.overrides['local.learning_rate'])
    for e in reproduce.entries(metric, 'paper', root='r', seeds=1)
  }
  assert set(rates.values()) == {0.1}  # The paper's lr for every method.


def test_fedrcl_500_round_scales_differ_only_in_the_model():
  """cpu500 and gpu500 are one protocol (Fashion-MNIST, alpha 0.1, 500
  rounds, checkpoints every 25) with the small CNN or the paper's
  ResNet-18; FedRCL contrasts the model's levels either way."""
  rcl = paper_tables.TABLES[('fedrcl', 'table1')]
  configs = {}
  for scale in ('cpu500', 'gpu500'):
    (entry,) = reproduce.entries(
      rcl,
      scale,
      root='r',
      seeds=1,
      methods=['FedRCL'],
      columns=['alpha = 0.1'],
    )
    configs[scale] = sweep.resolve(entry.point.spec, entry.point.overrides)
  cpu, gpu = configs['cpu500'], configs['gpu500']
  assert (cpu.model.name, gpu.model.name) == ('small_cnn', 'resnet18')
  assert gpu.model.norm == 'group'
  for config in (cpu, gpu):
    assert config.dataset.name == 'fashion_mnist'
    assert (config.num_rounds, config.checkpoint_every) == (500, 25)
    assert config.partition.alpha == 0.1
  flat_cpu = config_io.flatten(sweep.config_dict(cpu))
  flat_gpu = config_io.flatten(sweep.config_dict(gpu))
  differing = {
    k
    for k in flat_cpu.keys() | flat_gpu.keys()
    if flat_cpu.get(k) != flat_gpu.get(k)
  }
  assert differing and all(key.startswith('model.') for key in differing), (
    differing
  )


def test_unknown_table_and_scale_are_one_clear_error():
  with pytest.raises(ValueError, match='known: fedmetric table2'):
    paper_tables.find('fedrcl', 'table9')
  table = paper_tables.find('FedRCL', 'Table 1')
  with pytest.raises(ValueError, match="no scale 'gpu'"):
    reproduce.entries(table, 'gpu', root='r', seeds=1)
  with pytest.raises(ValueError, match='--seeds'):
    reproduce.entries(table, 'cpu', root='r', seeds=0)
  with pytest.raises(ValueError, match=r"Unknown method\(s\) \['FedAvgg'\]"):
    reproduce.entries(table, 'cpu', root='r', seeds=1, methods=['FedAvgg'])


def test_methods_and_columns_select_a_part_of_the_table():
  table = paper_tables.TABLES[('pmfl', 'table1')]
  part = reproduce.entries(
    table,
    'cpu',
    root='r',
    seeds=3,
    methods=['FedAvg', 'FedHyper'],
    columns=['cyclic'],
  )
  assert sorted({(e.method, e.column) for e in part}) == [
    ('FedAvg', 'cyclic'),
    ('FedHyper', 'cyclic'),
  ]
  assert sorted(e.seed for e in part) == [0, 0, 1, 1, 2, 2]
  # The same points as the whole table's: a part's runs count for the whole.
  whole = {
    e.point.workdir for e in reproduce.entries(table, 'cpu', root='r', seeds=3)
  }
  assert {e.point.workdir for e in part} <= whole


def _fake_run(workdir, values, *, num_rounds, metric, seed=None):
  """A finished workdir whose ``metric`` is ``values`` at rounds 1..n."""
  os.makedirs(workdir, exist_ok=True)
  with open(os.path.join(workdir, 'config.json'), 'w') as f:
    json.dump({'num_rounds': num_rounds, 'seed': seed}, f)
  with open(os.path.join(workdir, 'metrics.jsonl'), 'w') as f:
    for i, v in enumerate(values, start=1):
      f.write(json.dumps({'round': i, metric: v}) + '\n')
  with open(os.path.join(workdir, 'summary.json'), 'w') as f:
    json.dump({'rounds_completed': num_rounds}, f)


def test_table_is_mean_and_sample_std_beside_the_papers_numbers(tmp_path):
  table = paper_tables.TABLES[('fedrcl', 'table5')]
  root = str(tmp_path)
  todo = reproduce.entries(table, 'cpu', root=root, seeds=3)
  rng = np.random.default_rng(0)
  finals = {}
  for entry in todo:
    if entry.method == 'FedRCL' and entry.seed == 0:
      # Not finished: the cell has n = 2. A first seed, not the last, so
      # pairing by position in a list would pair the wrong runs.
      continue
    curve = rng.uniform(0.3, 0.9, size=20)
    _fake_run(
      entry.point.workdir,
      curve,
      num_rounds=20,
      metric='test_accuracy',
      seed=entry.seed,
    )
    finals.setdefault(entry.method, {})[entry.seed] = curve
  result = reproduce.collect(table, 'cpu', todo)
  paths = reproduce.write_outputs(
    table, 'cpu', result, root=root, seeds=3, command='cmd'
  )
  assert sorted(os.path.basename(p) for p in paths) == [
    'curves.png',
    'table.csv',
    'table.md',
  ]
  text = open(os.path.join(root, 'table.md')).read()
  rows = {
    line.split(' | ')[0].strip('| '): line
    for line in text.splitlines()
    if line.startswith('| ')
  }

  def ema(curve):  # the paper's statistic, re-derived: weights 0.9^(T - t)
    w = 0.9 ** np.arange(len(curve))[::-1]
    return np.sum(w * curve) / np.sum(w)

  for method, curves in finals.items():
    values = 100 * np.array([ema(c) for c in curves.values()])
    expected = (
      f'{values.mean():.2f} ± {values.std(ddof=1):.2f} (n={len(values)})'
    )
    in_paper = {m.name: m.in_paper for m in table.methods}[method]
    name = method if in_paper else f'{method} (not in paper)'
    assert expected in rows[name], (expected, rows[name])
  assert '| 89.67 |' in rows['FedAGM + FedRCL']  # the paper's, beside ours
  assert 'Runs finished: 17 of 18.' in text
  with open(os.path.join(root, 'table.csv')) as f:
    lines = list(csv.DictReader(f))
  fedagm = next(r for r in lines if r['method'] == 'FedAGM')
  assert int(fedagm['n']) == 3
  np.testing.assert_allclose(
    [float(v) for v in fedagm['values'].split()],
    [100 * ema(c) for c in finals['FedAGM'].values()],
    rtol=1e-5,
  )
  # The paired section: the table's own pairs, seeds matched (FedRCL's
  # seed 0 is missing, so its pair has n = 2), the interval re-derived.
  paired = {
    line.split(' | ')[0].strip('| '): line
    for line in text.split('## Paired differences')[1].splitlines()
    if line.startswith('| ') and not line.startswith('| method - baseline')
  }
  assert sorted(paired) == sorted(f'{a} - {b}' for a, b in table.pairs)
  t_975 = {2: 12.706204736174705, 3: 4.302652729749464}
  for a, b in table.pairs:
    seeds = sorted(set(finals[a]) & set(finals[b]))
    n = len(seeds)
    d = 100 * np.array([ema(finals[a][s]) - ema(finals[b][s]) for s in seeds])
    half = t_975[n] * d.std(ddof=1) / np.sqrt(n)
    low, high = d.mean() - half, d.mean() + half
    # The seed only one side has is counted beside n, not silently dropped.
    unpaired = abs(len(finals[a]) - len(finals[b]))
    count = f'{n} ({unpaired} unpaired)' if unpaired else f'{n}'
    expected = f'| {count} | {d.mean():+.2f} [{low:+.2f}, {high:+.2f}] |'
    verdict = 'tie' if low <= 0 <= high else 'holds'
    assert expected in paired[f'{a} - {b}'], (expected, paired[f'{a} - {b}'])
    assert verdict in paired[f'{a} - {b}']


TINY = paper_tables.PaperTable(
  paper='tiny',
  table='t1',
  citation='A tiny table',
  caption='FedAvg on digits.',
  methods=(paper_tables.Method('FedAvg', 'fedavg:runlocal'),),
  columns=(paper_tables.Column('alpha = 0.5', 'partition.alpha=0.5'),),
  metrics=(('test_accuracy', 'accuracy'),),
  scales={
    'cpu': paper_tables.Scale(
      config_args='',
      overrides='num_rounds=2;eval_every=1;progress=false',
      readings=(('final', 'final'), ('best', 'best')),
      note='two rounds',
    )
  },
  paper_columns=('alpha = 0.5',),
  paper_values={'FedAvg': ('12.34',)},
  paper_note='somewhere',
)


def test_a_tiny_table_trains_then_resumes_as_finished(tmp_path):
  root = str(tmp_path / 'tiny')
  todo = reproduce.entries(TINY, 'cpu', root=root, seeds=2)
  kwargs = dict(
    backend='local', parallel=2, gpus=[], slurm='', retries=0, root=root
  )
  points = [e.point for e in todo]
  outcomes = sweep.train_points(points, **kwargs)
  assert sorted(outcomes.values()) == ['done', 'done']
  assert sorted(sweep.train_points(points, **kwargs).values()) == [
    'skipped',
    'skipped',
  ]
  result = reproduce.collect(TINY, 'cpu', todo)
  finals = []
  for entry in todo:
    with open(os.path.join(entry.point.workdir, 'summary.json')) as f:
      finals.append(100 * json.load(f)['test_accuracy'])
  cell = result.cells[('FedAvg', 'alpha = 0.5', 'test_accuracy', 'final')]
  np.testing.assert_allclose(
    sorted(100 * np.array(cell.values)), sorted(finals), rtol=1e-6
  )
  text = reproduce.format_markdown(TINY, 'cpu', result, seeds=2, command='c')
  assert '| method | final | best | paper: alpha = 0.5 |' in text
  assert '(n=2) | 12.34 |' in text
  assert 'Runs finished: 2 of 2.' in text


def _cli(*args):
  return subprocess.run(
    [sys.executable, '-m', 'launch.console', 'reproduce', *args],
    cwd=REPO,
    capture_output=True,
    text=True,
    env=dict(os.environ, JAX_PLATFORMS='cpu'),
  )


def test_command_line_lists_dry_runs_and_refuses_in_one_line(tmp_path):
  listed = _cli('--list')
  assert listed.returncode == 0, listed.stderr
  for paper, table in ALL_TABLES:
    assert f'{paper} {table}:' in listed.stdout
  dry = _cli('fedrcl', 'table5', '--seeds=2', f'--root={tmp_path}', '--dry_run')
  assert dry.returncode == 0, dry.stderr
  lines = dry.stdout.strip().splitlines()
  assert len(lines) == 6 * 2 and all(x.startswith('todo ') for x in lines)
  assert not os.listdir(tmp_path)  # A dry run writes nothing.
  bad = _cli('fedrcl', 'table9')
  assert bad.returncode == 1
  assert bad.stderr.strip().startswith('error: No table')
  assert len(bad.stderr.strip().splitlines()) == 1


def test_a_missing_dataset_stops_the_table_before_any_run(tmp_path):
  table = paper_tables.TABLES[('fedrcl', 'table1')]  # paper scale: CIFAR-10
  empty = tmp_path / 'no_data'
  empty.mkdir()
  todo = reproduce.entries(
    table,
    'paper',
    root=str(tmp_path / 'runs'),
    seeds=1,
    extra=f'dataset.data_dir={empty}',
  )
  with pytest.raises(
    FileNotFoundError,
    match=r"FedAvg \(alpha = 0.1\) trains on 'cifar10'.*--set='dataset.data_dir",
  ):
    reproduce.check_datasets(todo)
  assert not (tmp_path / 'runs').exists()
  # The CPU scale's datasets: Fashion-MNIST (Debian's package) and digits.
  if os.path.isdir('/usr/share/datasets/fashion-mnist'):
    ssd_ood = paper_tables.TABLES[('ssd', 'table2')]
    reproduce.check_datasets(
      reproduce.entries(ssd_ood, 'cpu', root='r', seeds=1)
    )


def test_slurm_backend_submits_every_unfinished_point_as_one_array(
  monkeypatch, tmp_path
):
  """The SLURM wiring of launch.sweep.train_points, which reproduce and
  `launch.sweep run` share, with a stand-in executor (the task itself, a
  real point under submitit's local executor, is tests/test_sweep_slurm.py's)."""
  made, submitted, caches = [], [], []

  class Job:
    job_id = '1'

    def result(self):
      return 'ok'

  class Executor:
    def batch(self):
      import contextlib  # pylint: disable=g-import-not-at-top

      return contextlib.nullcontext()

    def submit(self, fn, workdir, cache_dir):
      assert os.path.exists(os.path.join(workdir, sweep.POINT_FILE))
      submitted.append(workdir)
      caches.append(cache_dir)
      return Job()

  def make_executor(folder, parameters):
    made.append((folder, parameters))
    return Executor()

  monkeypatch.setattr(sweep.sweep_slurm, 'make_executor', make_executor)
  root = str(tmp_path)
  monkeypatch.delenv('JAX_COMPILATION_CACHE_DIR', raising=False)
  todo = reproduce.entries(TINY, 'cpu', root=root, seeds=3)
  _fake_run(  # seed 0 finished already: not submitted again
    todo[0].point.workdir, [0.5, 0.6], num_rounds=2, metric='test_accuracy'
  )
  with open(os.path.join(todo[0].point.workdir, 'config.json'), 'w') as f:
    json.dump(
      sweep.config_dict(
        sweep.resolve(todo[0].point.spec, todo[0].point.overrides)
      ),
      f,
    )
  outcomes = sweep.train_points(
    [e.point for e in todo],
    backend='slurm',
    parallel=1,
    gpus=[],
    slurm='partition=gpu,timeout_min=60',
    retries=0,
    root=root,
  )
  assert made == [
    (os.path.join(root, 'slurm', '%j'), {'partition': 'gpu', 'timeout_min': 60})
  ]
  assert sorted(submitted) == sorted(e.point.workdir for e in todo[1:])
  # The tasks share one compilation cache, the root's.
  assert caches == [os.path.join(root, 'jax_cache')] * 2
  assert outcomes[todo[0].point.workdir] == 'skipped'
  assert all(outcomes[e.point.workdir] == 'done' for e in todo[1:])
