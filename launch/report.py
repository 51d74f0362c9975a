r"""Plots from finished (or running) workdirs: accuracy curves and embeddings.

  python -m launch.report --workdirs=runs/a,runs/b --out=report.png
  python -m launch.report --embedding_workdir=runs/a --embedding_out=emb.png \
      --method=tsne

Curves: test accuracy against round for every workdir, from its metrics.jsonl.
Embedding (as FedQuad Fig. 3): the last checkpoint's global model, rebuilt from
the workdir's config.json, embeds up to --max_examples test examples; PCA or
t-SNE takes them to 2-D and the scatter is coloured by class.

Both plot functions are importable (`plot_curves`, `plot_embedding`) and draw
on a `matplotlib.figure.Figure` with the Agg canvas, so no global pyplot
backend is touched.
"""

import json
import os
import sys
from typing import Dict, List, Sequence, Tuple

from absl import app, flags, logging
import jax
import jax.numpy as jnp
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator
import numpy as np
import orbax.checkpoint as ocp

from fedjax_metric import assemble, config_io
from fedjax_metric import restore as restore_lib
from fedjax_metric.data import augment, sources
from fedjax_metric.evaluation import make_feature_fn

from . import cli

METHODS = ('pca', 'tsne')
_METHOD_NAMES = {'pca': 'PCA', 'tsne': 't-SNE'}


# ---------------------------------------------------------------------------
# Workdir reading.
# ---------------------------------------------------------------------------


def read_curve(workdir: str) -> Tuple[np.ndarray, np.ndarray]:
  """(rounds, test accuracies) from ``workdir/metrics.jsonl``, sorted by round."""
  path = os.path.join(workdir, 'metrics.jsonl')
  if not os.path.exists(path):
    raise FileNotFoundError(
      f'{path} not found: {workdir} has no evaluations yet (is it a workdir '
      'of launch.main, and has it finished its first eval_every rounds?).'
    )
  rows = []
  with open(path) as f:
    for line in f:
      if line.strip():
        row = json.loads(line)
        if 'round' in row and 'test_accuracy' in row:
          rows.append((row['round'], row['test_accuracy']))
  if not rows:
    raise ValueError(
      f'{path} has no lines with both "round" and "test_accuracy".'
    )
  rows.sort()
  rounds, accuracies = zip(*rows)
  return np.asarray(rounds), np.asarray(accuracies, np.float64)


def run_label(workdir: str) -> str:
  """'<algorithm> <basename>', or the basename alone without a config.json."""
  name = os.path.basename(os.path.normpath(workdir))
  path = os.path.join(workdir, 'config.json')
  if not os.path.exists(path):
    return name
  with open(path) as f:
    algorithm = json.load(f).get('algorithm', '')
  return f'{algorithm} {name}'.strip()


def save_figure(fig: Figure, out: str) -> str:
  directory = os.path.dirname(os.path.abspath(out))
  os.makedirs(directory, exist_ok=True)
  FigureCanvasAgg(fig).print_png(out)
  return out


# ---------------------------------------------------------------------------
# Curves.
# ---------------------------------------------------------------------------


def plot_curves(
  workdirs: Sequence[str], out: str, *, title: str = 'Test accuracy'
) -> str:
  """Test accuracy vs round for every workdir, one PNG; returns ``out``.

  Raises:
    ValueError: no workdirs.
    FileNotFoundError: a workdir without metrics.jsonl (named in the message).
  """
  workdirs = [w for w in workdirs if w]
  if not workdirs:
    raise ValueError('No workdirs given; pass --workdirs=runs/a,runs/b.')
  curves = [(run_label(w), *read_curve(w)) for w in workdirs]  # Fail early.
  fig = Figure(figsize=(7, 4.5), dpi=120)
  ax = fig.add_subplot()
  for label, rounds, accuracies in curves:
    ax.plot(
      rounds,
      accuracies,
      marker='o' if len(rounds) < 30 else None,
      markersize=3,
      label=f'{label} ({accuracies[-1]:.3f})',
    )
  ax.xaxis.set_major_locator(MaxNLocator(integer=True))
  ax.set_xlabel('round')
  ax.set_ylabel('test accuracy')
  ax.set_title(title)
  ax.grid(True, alpha=0.3)
  ax.legend(
    fontsize='small', title='run (final accuracy)', title_fontsize='small'
  )
  fig.tight_layout()
  return save_figure(fig, out)


# ---------------------------------------------------------------------------
# Embeddings.
# ---------------------------------------------------------------------------


def restore_global_variables(workdir: str):
  """(model variables, round) of the last orbax checkpoint in the workdir."""
  directory = os.path.abspath(os.path.join(workdir, 'checkpoints'))
  if not os.path.isdir(directory):
    raise FileNotFoundError(
      f'{directory} not found: the run has not saved a checkpoint yet.'
    )
  with ocp.CheckpointManager(directory) as manager:
    step = manager.latest_step()
    if step is None:
      raise FileNotFoundError(f'{directory} holds no checkpoint.')
    # No target: the raw pytree, whatever the algorithm's ServerState.extra.
    restored = manager.restore(step, args=ocp.args.StandardRestore())
  server_state = restored['server_state']
  # A NamedTuple comes back as a dict of its fields, or as a list in field
  # order (ServerState.variables is field 0), depending on the orbax version.
  if isinstance(server_state, dict):
    variables = server_state['variables']
  else:
    variables = server_state[0]
  return variables, step


def compute_embeddings(
  workdir: str, *, max_examples: int = 2000
) -> Dict[str, object]:
  """The last checkpoint's test embeddings.

  Returns:
    {'features': [n, D], 'labels': [n], 'num_classes', 'round', 'config'}.
  """
  config = config_io.load_config(workdir=workdir)
  data_dir = config.dataset.data_dir or None
  # The train split is needed for the input scaling the run evaluated with
  # (its channel statistics; 0..1 under the 'ssl' protocol).
  train_split = sources.load(config.dataset.name, 'train', data_dir)
  test_split = sources.load(config.dataset.name, 'test', data_dir)
  mean, std = restore_lib.input_scaling(config, train_split.images)
  preprocess = augment.make_preprocess(mean, std, 'none')
  model = assemble.build_model(config.model, train_split.num_classes)
  # Restoring without a target needs no template, but init checks that the
  # config still builds the architecture the checkpoint holds.
  template = model.init(
    jax.random.key(config.seed),
    preprocess(jnp.asarray(train_split.images[:1]), None),
  )
  variables, step = restore_global_variables(workdir)
  template_shapes = jax.tree.map(jnp.shape, template)
  restored_shapes = jax.tree.map(jnp.shape, variables)
  if template_shapes != restored_shapes:
    raise ValueError(
      f'The checkpoint in {workdir} does not match the model '
      f'that its config.json builds ({config.model}).'
    )
  feature_fn = make_feature_fn(
    model,
    preprocess,
    test_split.images,
    test_split.labels,
    batch_size=config.eval_batch_size,
    max_examples=max_examples,
  )
  features, labels = feature_fn(variables)
  return {
    'features': features,
    'labels': labels,
    'num_classes': train_split.num_classes,
    'round': step,
    'config': config,
  }


def pca_2d(features: np.ndarray) -> np.ndarray:
  """[n, D] -> [n, 2]: projection on the top two principal axes (SVD)."""
  x = np.asarray(features, np.float64)
  x = x - x.mean(axis=0)
  _, _, vt = np.linalg.svd(x, full_matrices=False)
  projected = x @ vt[:2].T
  if projected.shape[1] < 2:  # D = 1: nothing to project onto a second axis.
    projected = np.pad(projected, ((0, 0), (0, 2 - projected.shape[1])))
  return projected


def tsne_2d(features: np.ndarray, seed: int = 0) -> np.ndarray:
  """[n, D] -> [n, 2] with sklearn's t-SNE (PCA init, fixed seed)."""
  from sklearn.manifold import TSNE  # pylint: disable=g-import-not-at-top

  n = len(features)
  if n < 3:
    raise ValueError(f't-SNE needs at least 3 points, got {n}.')
  # sklearn requires perplexity < n; 30 is its default for large n.
  perplexity = float(min(30.0, (n - 1) / 3.0))
  return TSNE(
    n_components=2, perplexity=perplexity, init='pca', random_state=seed
  ).fit_transform(np.asarray(features, np.float64))


def project_2d(features: np.ndarray, method: str, seed: int = 0) -> np.ndarray:
  if method == 'pca':
    return pca_2d(features)
  if method == 'tsne':
    return tsne_2d(features, seed)
  raise ValueError(f'Unknown method {method!r}; use one of {METHODS}.')


def plot_embedding(
  workdir: str, out: str, method: str = 'pca', *, max_examples: int = 2000
) -> str:
  """Scatter of the global model's 2-D test embeddings, by class; returns out."""
  if method not in METHODS:
    raise ValueError(f'Unknown method {method!r}; use one of {METHODS}.')
  emb = compute_embeddings(workdir, max_examples=max_examples)
  points = project_2d(emb['features'], method, seed=emb['config'].seed)
  labels = emb['labels']
  num_classes = emb['num_classes']
  fig = Figure(figsize=(6, 5.5), dpi=120)
  ax = fig.add_subplot()
  cmap = (
    'tab10'
    if num_classes <= 10
    else ('tab20' if num_classes <= 20 else 'nipy_spectral')
  )
  scatter = ax.scatter(
    points[:, 0],
    points[:, 1],
    c=labels,
    cmap=cmap,
    vmin=-0.5,
    vmax=num_classes - 0.5,
    s=8,
    alpha=0.8,
    linewidths=0,
  )
  if num_classes <= 20:
    handles = [
      ax.scatter(
        [], [], color=scatter.cmap(scatter.norm(c)), s=20, label=str(c)
      )
      for c in np.unique(labels)
    ]
    ax.legend(
      handles=handles,
      title='class',
      fontsize='small',
      title_fontsize='small',
      loc='best',
      markerscale=1.0,
    )
  else:
    fig.colorbar(scatter, ax=ax, label='class')
  ax.set_title(
    f'{run_label(workdir)}, round {emb["round"]}: {_METHOD_NAMES[method]} '
    f'of {len(labels)} test embeddings',
    fontsize='medium',
  )
  ax.set_xticks([])
  ax.set_yticks([])
  fig.tight_layout()
  return save_figure(fig, out)


# ---------------------------------------------------------------------------
# Command line.
# ---------------------------------------------------------------------------

_WORKDIRS = flags.DEFINE_list(
  'workdirs', [], 'Workdirs whose test accuracy curves go into one plot.'
)
_OUT = flags.DEFINE_string('out', 'report.png', 'PNG for the curves.')
_EMBEDDING_WORKDIR = flags.DEFINE_string(
  'embedding_workdir', None, 'Workdir whose last checkpoint is embedded.'
)
_EMBEDDING_OUT = flags.DEFINE_string(
  'embedding_out', 'embedding.png', 'PNG for the embedding plot.'
)
_METHOD = flags.DEFINE_enum(
  'method', 'pca', list(METHODS), '2-D projection of the embeddings.'
)
_MAX_EXAMPLES = flags.DEFINE_integer(
  'max_examples', 2000, 'Test examples to embed.'
)


@cli.one_line_errors
def main(argv: List[str]):
  if len(argv) > 1:
    raise app.UsageError(f'Unexpected arguments: {argv[1:]}')
  if not _WORKDIRS.value and not _EMBEDDING_WORKDIR.value:
    raise app.UsageError(
      'Pass --workdirs (curves) and/or --embedding_workdir (embedding plot).'
    )
  if not flags.FLAGS['verbosity'].present:
    logging.set_verbosity(logging.WARNING)  # orbax is chatty at INFO.
  if _WORKDIRS.value:
    print(f'wrote {plot_curves(_WORKDIRS.value, _OUT.value)}')
  if _EMBEDDING_WORKDIR.value:
    path = plot_embedding(
      _EMBEDDING_WORKDIR.value,
      _EMBEDDING_OUT.value,
      _METHOD.value,
      max_examples=_MAX_EXAMPLES.value,
    )
    print(f'wrote {path}')


if __name__ == '__main__':
  cli.define_verbose()
  app.run(main, flags_parser=cli.flags_parser(sys.modules[__name__]))
