r"""Tables and plots of the one-class runs (docs/results/oneclass.md).

Reads the workdirs that the README's commands write under a root
(runs/oneclass by default):

  s<seed>_<method>     method in deepsvdd, pos, proxy, true, fedaws, feduv
  lam<lambda>_<mode>   mode in proxy, true (the lambda sweep, seed 0);
                       s0_proxy / s0_true are links to lam0.3_<mode>
  scale<s>_proxy_r100  the s sweep (seed 0, lambda 0.3, 100 rounds; the
                       plot reads every s, 0 and 1.5 included, at round
                       SCALE_ROUND)

and prints the markdown tables; writes the lambda sweep, the s sweep and the
AUROC-vs-round curves as PNGs.

  python -m benchmarks.oneclass_report --root=runs/oneclass --out=docs/results
"""

import glob
import json
import os
import re

from absl import app, flags
import numpy as np

_ROOT = flags.DEFINE_string('root', 'runs/oneclass', 'Workdirs root.')
_OUT = flags.DEFINE_string('out', 'docs/results', 'Where PNGs go.')
_SEEDS = flags.DEFINE_integer(
  'untrained_seeds',
  3,
  'Seeds of the untrained-network reference (0: '
  'skip it; it loads Fashion-MNIST).',
)

METHODS = [
  ('deepsvdd', 'DeepSVDD'),
  ('pos', 'FedMetric pos'),
  ('proxy', 'FedMetric pos+neg(proxy)'),
  ('true', 'FedMetric pos+neg(true)'),
  ('fedaws', 'FedAwS'),
  ('feduv', 'FedUV'),
]
# Park, Hosseini and Yun, FL-ICML workshop 2021, Table 2 (mean AUROC, %).
PAPER = {
  'MNIST': [94.8, 99.4, 99.6, 99.6, 99.6, 99.7],
  'CIFAR-10': [64.8, 94.0, 94.2, 94.4, 94.1, 87.2],
}
# The main table's FedMetric runs use lambda = 0.3 (the best of the lambda
# sweep) and the proxy default s = 1.5; s0_<mode> is lam0.3_<mode>.
MAIN_LAM = 0.3
DEFAULT_SCALE = 1.5
# The s sweep ran 100 rounds, so every point of its plot is read there.
SCALE_ROUND = 100


def read(workdir):
  """(summary dict or None, list of metric rows)."""
  rows = []
  path = os.path.join(workdir, 'metrics.jsonl')
  if os.path.exists(path):
    with open(path) as f:
      rows = [json.loads(line) for line in f if line.strip()]
  summary = None
  path = os.path.join(workdir, 'summary.json')
  if os.path.exists(path):
    with open(path) as f:
      summary = json.load(f)
  return summary, rows


def final_auroc(workdir):
  summary, _ = read(workdir)
  return None if summary is None else 100.0 * summary['auroc_mean']


def auroc_at(workdir, round_):
  """Mean AUROC (%) logged at ``round_``, or None."""
  _, rows = read(workdir)
  for row in rows:
    if row.get('round') == round_ and 'auroc_mean' in row:
      return 100.0 * row['auroc_mean']
  return None


def seeds_of(root, method):
  found = {}
  for wd in glob.glob(os.path.join(root, f's*_{method}')):
    m = re.fullmatch(r's(\d+)_' + method, os.path.basename(wd))
    value = final_auroc(wd) if m else None
    if value is not None:
      found[int(m.group(1))] = value
  return found


def main_table(root):
  lines = [
    '| method | Fashion-MNIST (ours), mean AUROC % | seeds | '
    'MNIST (paper) | CIFAR-10 (paper) |',
    '|---|---|---|---|---|',
  ]
  means = {}
  for i, (key, name) in enumerate(METHODS):
    values = seeds_of(root, key)
    if values:
      v = np.array(list(values.values()))
      means[key] = v.mean()
      ours = (
        f'{v.mean():.1f} +- {v.std(ddof=1):.1f}'
        if len(v) > 1
        else f'{v.mean():.1f}'
      )
      per_seed = ', '.join(f'{values[s]:.1f}' for s in sorted(values))
    else:
      ours, per_seed = 'not run', ''
    lines.append(
      f'| {name} | {ours} | {per_seed} | {PAPER["MNIST"][i]} | '
      f'{PAPER["CIFAR-10"][i]} |'
    )
  return '\n'.join(lines), means


def per_class_table(root):
  lines = [
    '| method | ' + ' | '.join(str(c) for c in range(10)) + ' |',
    '|---|' + '---|' * 10,
  ]
  for key, name in METHODS:
    wds = [
      wd
      for wd in glob.glob(os.path.join(root, f's*_{key}'))
      if read(wd)[0] is not None
    ]
    if not wds:
      continue
    per = (
      np.array(
        [[read(wd)[0][f'auroc_class_{c}'] for c in range(10)] for wd in wds]
      ).mean(0)
      * 100
    )
    lines.append(f'| {name} | ' + ' | '.join(f'{v:.1f}' for v in per) + ' |')
  return '\n'.join(lines)


def sweep(root, pattern, default_dir):
  """{value: auroc} from workdirs matching pattern (one group: the value)."""
  points = {}
  for wd in glob.glob(os.path.join(root, '*')):
    m = re.fullmatch(pattern, os.path.basename(wd))
    if m and final_auroc(wd) is not None:
      points[float(m.group(1))] = final_auroc(wd)
  return points


def plot_sweeps(root, out):
  from matplotlib.backends.backend_agg import FigureCanvasAgg  # pylint: disable=g-import-not-at-top
  from matplotlib.figure import Figure  # pylint: disable=g-import-not-at-top

  pos = seeds_of(root, 'pos').get(0)
  lam = {
    mode: sweep(root, r'lam([\d.]+)_' + mode, None)
    for mode in ('proxy', 'true')
  }
  fig = Figure(figsize=(5, 3.4))
  ax = fig.add_subplot()
  for mode, style in (('proxy', 'o-'), ('true', 's-')):
    if lam[mode]:
      xs = sorted(lam[mode])
      ax.plot(xs, [lam[mode][x] for x in xs], style, label=f'pos+neg({mode})')
  if pos is not None:
    ax.axhline(pos, color='gray', ls='--', label='pos only')
  ax.set_xlabel('lambda (weight of l_neg)')
  ax.set_ylabel('mean AUROC (%)')
  ax.set_title('FedMetric, Fashion-MNIST: lambda (paper Fig. 2)')
  ax.legend(fontsize=8)
  fig.tight_layout()
  FigureCanvasAgg(fig).print_png(os.path.join(out, 'oneclass_lambda.png'))

  scale = {}
  for wd in glob.glob(os.path.join(root, 'scale*_proxy_r100')):
    m = re.fullmatch(r'scale([\d.]+)_proxy_r100', os.path.basename(wd))
    value = auroc_at(wd, SCALE_ROUND)
    if m and value is not None:
      scale[float(m.group(1))] = value
  for key, s in (('proxy', DEFAULT_SCALE), ('true', 0.0)):
    # s = 0 is the true-center variant.
    value = auroc_at(os.path.join(root, f's0_{key}'), SCALE_ROUND)
    if value is not None:
      scale[s] = value
  fig = Figure(figsize=(5, 3.4))
  ax = fig.add_subplot()
  xs = sorted(scale)
  ax.plot(
    xs,
    [scale[x] for x in xs],
    'o-',
    label='pos+neg(proxy); s = 0 is pos+neg(true)',
  )
  pos_at = auroc_at(os.path.join(root, 's0_pos'), SCALE_ROUND)
  if pos_at is not None:
    ax.axhline(pos_at, color='gray', ls='--', label='pos only')
  ax.set_xlabel('s (proxy distance D = s R)')
  ax.set_ylabel('mean AUROC (%)')
  ax.set_title(
    f'FedMetric, Fashion-MNIST: s (paper Fig. 3), '
    f'lambda={MAIN_LAM}, round {SCALE_ROUND}',
    fontsize=9,
  )
  ax.legend(fontsize=8)
  fig.tight_layout()
  FigureCanvasAgg(fig).print_png(os.path.join(out, 'oneclass_scale.png'))
  return lam, scale


def untrained_auroc(
  seed, center_examples=1000, validation_fraction=0.0, dataset='fashion_mnist'
):
  """Mean AUROC (%) of the untrained LeNet scored by class centers: what
  the 'center' score gives before any training (seed's initialisation, the
  same partition and preprocessing of ``dataset`` as the runs, with
  ``validation_fraction`` of each class held out of the training set as
  they hold it out)."""
  # pylint: disable=g-import-not-at-top
  import jax
  import jax.numpy as jnp

  from fedjax_metric import assemble, engine
  from fedjax_metric.configs import fedmetric
  from fedjax_metric.data import augment, sources
  from fedjax_metric.evaluation import oneclass

  # pylint: enable=g-import-not-at-top
  config = fedmetric.get_config(f'steps=10,dataset={dataset}')
  train_set = sources.load(dataset, 'train')
  test_set = sources.load(dataset, 'test')
  train_set, _ = sources.hold_out(train_set, validation_fraction)
  clients = assemble.make_partition(config, train_set.labels)
  mean, std = augment.channel_stats(train_set.images)
  preprocess = augment.make_preprocess(mean, std, 'none')
  model = assemble.build_model(
    config.model, train_set.num_classes, train_set.images.shape[1:]
  )
  variables = model.init(
    jax.random.key(seed), preprocess(jnp.asarray(train_set.images[:1]), None)
  )
  evaluate = oneclass.make_one_class_evaluator(
    model,
    preprocess,
    train_set,
    test_set,
    clients,
    score='center',
    center_examples=center_examples,
  )
  state = engine.ServerState(variables, (), jnp.zeros((), jnp.int32), ())
  return 100.0 * evaluate(state, ())['auroc_mean']


def plot_curves(root, out, seed=0, untrained=None):
  from matplotlib.backends.backend_agg import FigureCanvasAgg  # pylint: disable=g-import-not-at-top
  from matplotlib.figure import Figure  # pylint: disable=g-import-not-at-top

  fig = Figure(figsize=(5.5, 3.6))
  ax = fig.add_subplot()
  for key, name in METHODS:
    _, rows = read(os.path.join(root, f's{seed}_{key}'))
    if rows:
      ax.plot(
        [r['round'] for r in rows],
        [100 * r['auroc_mean'] for r in rows],
        'o-',
        ms=3,
        label=name,
      )
  if untrained is not None:
    ax.axhline(
      untrained,
      color='black',
      ls=':',
      lw=1,
      label='untrained LeNet, class centers',
    )
  ax.set_xlabel('round (10 local steps of 16 per client)')
  ax.set_ylabel('mean AUROC (%)')
  ax.set_title(f'Fashion-MNIST, 10 clients, one class each (seed {seed})')
  ax.legend(fontsize=7, loc='center right')
  fig.tight_layout()
  FigureCanvasAgg(fig).print_png(os.path.join(out, 'oneclass_curves.png'))


def main(argv):
  del argv
  root, out = _ROOT.value, _OUT.value
  os.makedirs(out, exist_ok=True)
  table, _ = main_table(root)
  print(table)
  print()
  print(per_class_table(root))
  lam, scale = plot_sweeps(root, out)
  print(
    '\nlambda sweep:',
    {m: {k: round(v, 1) for k, v in sorted(p.items())} for m, p in lam.items()},
  )
  print('s sweep:', {k: round(v, 1) for k, v in sorted(scale.items())})
  untrained = [untrained_auroc(seed) for seed in range(_SEEDS.value)]
  print(
    'untrained LeNet, class centers, seeds 0..:',
    [round(u, 1) for u in untrained],
  )
  plot_curves(root, out, untrained=untrained[0] if untrained else None)


if __name__ == '__main__':
  app.run(main)
