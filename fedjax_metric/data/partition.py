"""Host-side (NumPy only) partitioners that split a labelled dataset among FL clients.

Every partitioner takes a 1-D label array of length N and returns a list with one np.int64
index array per client; the arrays are pairwise disjoint and depend only on `seed`
(`np.random.default_rng(seed)`; the reference RNG streams -- np.random / torch global state --
cannot be reproduced bit-for-bit anyway, so only the procedures are reproduced). Classes are the
distinct label values present, in sorted order.

The four Dirichlet procedures below are kept apart on purpose; they produce different
client-size and label-skew statistics and are not interchangeable (docs/methods.md,
"Dirichlet label-skew partitions", describes each):
  'niid_bench'  NIID-Bench (Li, Diao, Chen and He, 'Federated Learning on Non-IID Data
                Silos: An Experimental Study', ICDE 2022) 'noniid-labeldir', as in the
                released github.com/Xtra-Computing/NIID-Bench utils.py `partition_data`
                (MOON ships the same function).
  'balanced'    FedRCL (Seo et al., 'Relaxed Contrastive Learning for Federated
                Learning', CVPR 2024): `cifar_dirichlet_balanced` of the released
                github.com/skynbe/FedRCL.
  'per_client'  FedAU (Wang and Ji, 'A Lightweight Method for Tackling Unknown
                Participation Statistics in Federated Averaging', ICLR 2024): the
                released github.com/IBM/fedau util/util.py `partition`.
  'per_class'   fedbox `split_dirichlet_label` as used by SSD / FedU2 (the released
                github.com/hc-fang/ssd, fedbox/utils/data/splitting.py).
This module must not import jax: it runs once on the host before training.
"""

import os

import numpy as np

VARIANTS = ('niid_bench', 'balanced', 'per_client', 'per_class')


def _check_inputs(labels, num_clients):
  """Returns labels as a 1-D array after the checks shared by all partitioners."""
  labels = np.asarray(labels)
  if labels.ndim != 1 or labels.size == 0:
    raise ValueError(
      f'labels must be a non-empty 1-D array, got shape {labels.shape}.'
    )
  # An int, not a whole float: the partitioners index and reshape with it.
  if (
    not isinstance(num_clients, (int, np.integer))
    or isinstance(num_clients, bool)
    or num_clients < 1
    or num_clients > labels.size
  ):
    raise ValueError(
      f'num_clients={num_clients!r} must be an int in [1, N] with N={labels.size} '
      'examples (no more clients than examples).'
    )
  return labels


def _class_indices(labels):
  """Per-class index arrays (ascending indices), classes in sorted label order."""
  _, inverse = np.unique(labels, return_inverse=True)
  order = np.argsort(inverse, kind='stable')
  counts = np.bincount(inverse)
  return [a.astype(np.int64) for a in np.split(order, np.cumsum(counts)[:-1])]


def _as_int64(parts):
  return [np.asarray(p, dtype=np.int64) for p in parts]


def iid(labels, num_clients, *, seed):
  """Shuffles all N indices and splits them into near-equal parts (sizes differ by <= 1)."""
  labels = _check_inputs(labels, num_clients)
  perm = np.random.default_rng(seed).permutation(labels.size)
  return _as_int64(np.array_split(perm, num_clients))


def _niid_bench_cuts(p, sizes, n_total, n_k):
  """Cut points for one class in NIID-Bench (`partition_data`); None if capped p is all 0.

  Args:
    p: [J] Dirichlet proportions over parties.
    sizes: [J] party sizes *before* this class is added.
    n_total: N, the dataset size; parties with size >= N / J get proportion 0 (the "balance" cap).
    n_k: number of examples of this class.
  Returns:
    [J - 1] int cut points `floor(cumsum(p) * n_k)[:-1]` (floor, not round, as in the reference).
  """
  p = p * (sizes < n_total / len(sizes))
  total = p.sum()
  # The cap never zeroes every party (sum(sizes) < N), but tiny alphas can underflow the surviving
  # entries to 0; the reference would then divide by zero, we reject the attempt instead.
  if not np.isfinite(total) or total <= 0:
    return None
  return (np.cumsum(p / total) * n_k).astype(int)[:-1]


def _niid_bench(class_idx, num_clients, alpha, rng, min_size, max_tries):
  """NIID-Bench / MOON 'noniid-labeldir' (NIID-Bench utils.py `partition_data`)."""
  n_total = sum(len(c) for c in class_idx)
  if min_size * num_clients > n_total:
    raise ValueError(
      f'min_size={min_size} cannot be reached: {num_clients} clients x {min_size} '
      f'> N={n_total}. Use fewer clients or a smaller min_size.'
    )
  for _ in range(max_tries):
    batches = [[] for _ in range(num_clients)]
    sizes = np.zeros(num_clients, dtype=np.int64)
    ok = True
    for idx in class_idx:
      idx_k = rng.permutation(
        idx
      )  # The reference reshuffles every class on every retry.
      p = rng.dirichlet(np.full(num_clients, alpha))
      cuts = _niid_bench_cuts(p, sizes, n_total, len(idx_k))
      if cuts is None:
        ok = False
        break
      for j, piece in enumerate(np.split(idx_k, cuts)):
        batches[j].append(piece)
        sizes[j] += len(piece)
    # Whole-partition resampling: any undersized party throws the entire attempt away.
    if ok and sizes.min() >= min_size:
      return [rng.permutation(np.concatenate(b)) for b in batches]
  raise ValueError(
    f'niid_bench: no partition with every client >= min_size={min_size} found in '
    f'max_tries={max_tries} attempts (alpha={alpha}, {num_clients} clients, '
    f'N={n_total}). Use a larger alpha, fewer clients or a smaller min_size.'
  )


def _weighted_sample(rng, weights, m):
  """Draws m distinct positions, successively with probability proportional to `weights`.

  Same law as `torch.multinomial(weights, m, replacement=False)`, computed with Gumbel top-k keys
  (log w + Gumbel noise). torch raises when fewer than m weights are positive; we instead take all
  positive-weight positions and fill the rest uniformly from the zero-weight ones (FedRCL's data
  never hits this; tiny shards or small alphas can).
  """
  pos = np.flatnonzero(weights > 0)
  if len(pos) <= m:
    rest = np.flatnonzero(weights <= 0)
    return np.concatenate([pos, rng.choice(rest, m - len(pos), replace=False)])
  keys = np.log(weights[pos]) + rng.gumbel(size=len(pos))
  return pos[np.argpartition(-keys, m - 1)[:m]]


def _balanced(labels, num_clients, alpha, rng):
  """FedRCL balanced Dirichlet (skynbe/FedRCL datasets `cifar_dirichlet_balanced`).

  Clients are filled one after another with exactly floor(N/J) examples each; the N mod J
  leftovers stay unassigned, as in the reference.
  """
  classes, inverse = np.unique(labels, return_inverse=True)
  per_client = labels.size // num_clients
  unassigned = np.ones(labels.size, dtype=bool)
  parts = []
  for _ in range(num_clients):
    q = rng.dirichlet(np.full(len(classes), alpha))
    remaining = np.flatnonzero(unassigned)
    chosen = remaining[_weighted_sample(rng, q[inverse[remaining]], per_client)]
    unassigned[chosen] = False
    parts.append(rng.permutation(chosen))
  return parts


def _per_client(class_idx, num_clients, alpha, rng):
  """FedAU `util/util.py::partition`: rows of a [J, C] matrix are client label mixes.

  Class c's (ascending, unshuffled) index list is cut sequentially: client n ends at
  round(count_c * sum_{m<=n} P[m, c] / sum_m P[m, c]). np.round (half-to-even) as in the reference.
  """
  dist = rng.dirichlet(
    np.full(len(class_idx), alpha), size=num_clients
  )  # [J, C]
  col_sum = dist.sum(axis=0)
  # A column can only sum to 0 by underflow; spread such a class uniformly rather than divide by 0.
  share = np.where(
    col_sum > 0,
    np.cumsum(dist, axis=0) / np.where(col_sum > 0, col_sum, 1),
    np.arange(1, num_clients + 1)[:, None] / num_clients,
  )
  parts = [[] for _ in range(num_clients)]
  for c, idx in enumerate(class_idx):
    ends = np.round(len(idx) * share[:, c]).astype(np.int64)
    ends[-1] = len(
      idx
    )  # Guard against float error in the last cumulative share.
    for n, piece in enumerate(np.split(idx, ends[:-1])):
      parts[n].append(piece)
  return [np.concatenate(p) for p in parts]


def _largest_remainder(total, ratios):
  """fedbox `_counts_from_ratios`: floor(total * r), leftover +1s to the largest remainders."""
  counts = total * ratios / ratios.sum()
  result = np.floor(counts).astype(np.int64)
  rest = total - result.sum()
  if rest > 0:
    result[np.argsort(counts - result)[-rest:]] += 1
  return result


def _per_class(class_idx, num_clients, alpha, rng):
  """fedbox `split_dirichlet_label` (SSD / FedU2 `split_dataset.py`); no min-size loop.

  Unlike NIID-Bench, counts use largest-remainder rounding so each class is fully assigned.
  """
  proportion = rng.dirichlet(
    np.full(num_clients, alpha), size=len(class_idx)
  )  # [C, J]
  parts = [[] for _ in range(num_clients)]
  for c, idx in enumerate(class_idx):
    counts = _largest_remainder(len(idx), proportion[c])
    for j, piece in enumerate(
      np.split(rng.permutation(idx), np.cumsum(counts)[:-1])
    ):
      parts[j].append(piece)
  return [np.concatenate(p) for p in parts]


def dirichlet(
  labels,
  num_clients,
  alpha,
  *,
  seed,
  variant='niid_bench',
  min_size=10,
  max_tries=1000,
):
  """Label-skewed Dirichlet partition; `variant` picks one of four reference procedures.

  Args:
    labels: [N] class labels.
    num_clients: J, number of clients.
    alpha: Dirichlet concentration (> 0, finite); smaller means more skew.
    seed: seed of `np.random.default_rng`.
    variant: 'niid_bench' (MOON / NIID-Bench, every example assigned, per-party cap at N/J and
      whole-partition resampling until every client has >= min_size examples), 'balanced'
      (FedRCL, every client exactly floor(N/J) examples), 'per_client' (FedAU) or 'per_class'
      (SSD / FedU2 via fedbox). See the private helpers for each procedure's details.
      'per_client' and 'per_class' can leave clients without examples (few
      examples per client, small alpha); 'niid_bench' with min_size 0 too.
    min_size: 'niid_bench' only; the reference hard-codes 10. 0 accepts the first draw.
    max_tries: 'niid_bench' only; attempts before giving up with a ValueError.
  Returns:
    J np.int64 index arrays.
  """
  labels = _check_inputs(labels, num_clients)
  if variant not in VARIANTS:
    raise ValueError(
      f'Unknown Dirichlet variant {variant!r}; valid variants: '
      f'{", ".join(VARIANTS)}.'
    )
  if not (np.isfinite(alpha) and alpha > 0):
    raise ValueError(
      f'alpha must be a finite positive number, got alpha={alpha}.'
    )
  rng = np.random.default_rng(seed)
  if variant == 'balanced':
    return _as_int64(_balanced(labels, num_clients, alpha, rng))
  class_idx = _class_indices(labels)
  if variant == 'per_client':
    return _as_int64(_per_client(class_idx, num_clients, alpha, rng))
  if variant == 'per_class':
    return _as_int64(_per_class(class_idx, num_clients, alpha, rng))
  if min_size < 0 or max_tries < 1:
    raise ValueError(
      f'Need min_size >= 0 and max_tries >= 1, got {min_size} and {max_tries}.'
    )
  return _as_int64(
    _niid_bench(class_idx, num_clients, alpha, rng, min_size, max_tries)
  )


def shards(labels, num_clients, classes_per_client, *, seed):
  """Pathological non-IID split of McMahan et al. (2017, FedAvg): label-sorted shards.

  Sorts the indices by label (stable, so ascending index within a class), cuts them into
  J * classes_per_client equal shards and gives each client classes_per_client random shards.
  A client has at most classes_per_client classes only when every class size is a multiple of the
  shard size; otherwise a shard can straddle two classes, exactly as in the original.

  Raises:
    ValueError: if classes_per_client < 1 or N is not divisible by J * classes_per_client.
  """
  labels = _check_inputs(labels, num_clients)
  if int(classes_per_client) != classes_per_client or classes_per_client < 1:
    raise ValueError(
      f'classes_per_client must be a positive integer, got {classes_per_client}.'
    )
  num_shards = num_clients * classes_per_client
  if labels.size % num_shards:
    raise ValueError(
      f'N={labels.size} examples cannot be cut into num_clients * classes_per_client'
      f' = {num_shards} equal shards; N must be divisible by {num_shards}.'
    )
  sorted_idx = np.argsort(labels, kind='stable')
  pieces = np.split(sorted_idx, num_shards)
  # Client i gets the shards perm[i*k:(i+1)*k]: k distinct shards drawn without replacement.
  perm = (
    np.random.default_rng(seed).permutation(num_shards).reshape(num_clients, -1)
  )
  return _as_int64([np.concatenate([pieces[s] for s in row]) for row in perm])


def one_class(
  labels,
  num_clients=None,
  *,
  clients_per_class=None,
  allow_repeat=False,
  seed=0,
):
  """One class per client: the setting of FedAwS, FedUV and FedMetric.

  Yu et al., 'Federated Learning with Only Positive Labels', ICML 2020;
  Hosseini et al., 'Federated Learning of User Verification Models Without
  Sharing Embeddings', ICML 2021; Park, Hosseini and Yun, 'Federated
  Learning with Metric Loss', FL-ICML workshop 2021 (10 clients, one per
  MNIST / CIFAR-10 class).

  Classes are the distinct label values in sorted order, class #c the c-th.
  Client i always holds class #(i % C):
    * num_clients None (or C): client c holds all of class #c.
    * clients_per_class=k: J = k * C clients; class #c is held by clients
      c, c + C, ..., c + (k - 1) C, which split its shuffled examples into
      near-equal parts. Equal to ``num_clients=k * C, allow_repeat=True``.
    * num_clients=J > C with allow_repeat: the same layout, so class #c is
      shared by ceil or floor(J / C) clients.
  `one_class_labels` recovers each client's class. Each client's indices
  are shuffled with `seed`.

  Args:
    labels: [N] class labels.
    num_clients: J; None means C (or k * C with clients_per_class).
    clients_per_class: k >= 1, clients per class; num_clients, if given,
      must then be k * C.
    allow_repeat: allow num_clients > C without clients_per_class.
    seed: seed of `np.random.default_rng`.

  Returns:
    J np.int64 index arrays.

  Raises:
    ValueError: num_clients < C (some client would need two classes),
      num_clients > C without allow_repeat or clients_per_class,
      clients_per_class < 1, num_clients != clients_per_class * C, or a
      class with fewer examples than the clients that share it (a client
      would get no data).
  """
  labels = np.asarray(labels)
  class_idx = _class_indices(_check_inputs(labels, 1))
  num_classes = len(class_idx)
  if clients_per_class is not None:
    if int(clients_per_class) != clients_per_class or clients_per_class < 1:
      raise ValueError(
        f'clients_per_class must be an integer >= 1, got {clients_per_class}.'
      )
    total = int(clients_per_class) * num_classes
    if num_clients is not None and num_clients != total:
      raise ValueError(
        f'num_clients={num_clients} but {num_classes} classes x '
        f'clients_per_class={clients_per_class} = {total} clients; pass '
        f'num_clients=None or {total}.'
      )
    num_clients = total
    allow_repeat = True
  if num_clients is None:
    num_clients = num_classes
  _check_inputs(labels, num_clients)
  if num_clients < num_classes:
    raise ValueError(
      f'one_class needs num_clients >= num_classes: got num_clients='
      f'{num_clients} < {num_classes} classes, so some class would have '
      'no client.'
    )
  if num_clients > num_classes and not allow_repeat:
    raise ValueError(
      f'num_clients={num_clients} > {num_classes} classes: several '
      'clients must share a class; pass allow_repeat=True (or '
      'clients_per_class) to allow that.'
    )
  rng = np.random.default_rng(seed)
  parts = [None] * num_clients
  for c, idx in enumerate(class_idx):
    owners = np.arange(c, num_clients, num_classes)  # Clients i % C == c.
    if len(idx) < len(owners):
      raise ValueError(
        f'Class #{c} has {len(idx)} examples but '
        f'{len(owners)} clients share it, so a client would '
        'get no data.'
      )
    pieces = np.array_split(rng.permutation(idx), len(owners))
    for owner, piece in zip(owners, pieces):
      parts[owner] = piece
  return _as_int64(parts)


def natural(client_ids, num_clients=None, *, seed=0):
  """One client per writer: the natural partition of data that names them.

  Flower Datasets' `NaturalIdPartitioner` convention: the examples whose
  client id (e.g. the FEMNIST writer, `ArrayDataset.client_ids`) is the
  same form one client. Client j holds the j-th distinct id in sorted
  order, its examples in ascending index order; ``client_ids[part[0]]``
  is a client's writer.

  Args:
    client_ids: [N] integer writer id of each example.
    num_clients: None for every writer; J below their number keeps J
      writers drawn uniformly without replacement (`seed`), still in id
      order; the other writers' examples belong to no client.
    seed: seed of `np.random.default_rng`, for the subset only.

  Returns:
    One np.int64 index array per client.

  Raises:
    ValueError: client_ids empty, not 1-D or not integers; num_clients not
      an integer >= 1 or more than the writers.
  """
  ids = np.asarray(client_ids)
  if ids.ndim != 1 or ids.size == 0 or ids.dtype.kind not in 'iu':
    raise ValueError(
      'client_ids must be a non-empty 1-D integer array (one writer id per '
      f'example), got {ids.dtype} of shape {ids.shape}.'
    )
  _, inverse = np.unique(ids, return_inverse=True)
  counts = np.bincount(inverse)
  order = np.argsort(inverse, kind='stable')
  parts = np.split(order, np.cumsum(counts)[:-1])
  if num_clients is None:
    return _as_int64(parts)
  writers = len(parts)
  if int(num_clients) != num_clients or not 1 <= num_clients <= writers:
    raise ValueError(
      f'num_clients={num_clients} but the data has {writers} writers; a '
      f'natural partition takes 1 to {writers} of them (None: all).'
    )
  rng = np.random.default_rng(seed)
  chosen = np.sort(rng.choice(writers, int(num_clients), replace=False))
  return _as_int64([parts[i] for i in chosen])


def one_class_labels(partition, labels):
  """The single class (label value) of each client of a one-class partition.

  Args:
    partition: list of J index arrays, e.g. from `one_class`.
    labels: [N] labels the indices point into.

  Returns:
    [J] array of label values (labels' dtype), entry j the label that every
    example of client j carries.

  Raises:
    ValueError: a client has no example or holds two or more classes.
  """
  labels = np.asarray(labels)
  classes = []
  for j, idx in enumerate(partition):
    held = np.unique(labels[np.asarray(idx, dtype=np.int64)])
    if held.size != 1:
      raise ValueError(
        f'Client {j} holds {held.size} classes '
        f'({held.tolist()[:5]}); a one-class partition needs '
        'exactly one per client.'
      )
    classes.append(held[0])
  return np.asarray(classes, dtype=labels.dtype)


def class_counts(labels, partition, num_classes=None):
  """Per-client label histogram.

  Args:
    labels: [N] non-negative integer labels; column c counts label value c.
    partition: list of J index arrays.
    num_classes: C; defaults to max(labels) + 1.
  Returns:
    [J, C] np.int64 counts.
  """
  labels = np.asarray(labels)
  if labels.size and (
    labels.min() < 0 or not np.issubdtype(labels.dtype, np.integer)
  ):
    raise ValueError('class_counts needs non-negative integer labels.')
  if num_classes is None:
    num_classes = int(labels.max()) + 1 if labels.size else 0
  elif labels.size and labels.max() >= num_classes:
    raise ValueError(
      f'Label {labels.max()} does not fit num_classes={num_classes}.'
    )
  counts = np.zeros((len(partition), num_classes), dtype=np.int64)
  for j, idx in enumerate(partition):
    counts[j] = np.bincount(
      labels[np.asarray(idx, dtype=np.int64)], minlength=num_classes
    )
  return counts


def plot_class_counts(counts, path, *, title=None, annotate_max_cells=400):
  """Saves a client x class heatmap of `counts` ([J, C]) as PNG, like FedQuad's Fig. 4.

  Uses `matplotlib.figure.Figure` with the Agg canvas directly, so the global pyplot backend is
  never touched. Cell values are written in when J * C <= annotate_max_cells. Returns `path`.
  """
  from matplotlib.backends.backend_agg import FigureCanvasAgg  # pylint: disable=g-import-not-at-top
  from matplotlib.figure import Figure  # pylint: disable=g-import-not-at-top

  counts = np.asarray(counts)
  num_clients, num_classes = counts.shape
  fig = Figure(
    figsize=(min(2 + 0.45 * num_classes, 20), min(1.5 + 0.3 * num_clients, 20))
  )
  FigureCanvasAgg(fig)
  ax = fig.add_subplot(1, 1, 1)
  image = ax.imshow(
    counts, aspect='auto', cmap='viridis', interpolation='nearest'
  )
  fig.colorbar(image, ax=ax, label='examples')
  ax.set_xlabel('class')
  ax.set_ylabel('client')
  if title:
    ax.set_title(title)
  if counts.size <= annotate_max_cells:
    threshold = counts.max() / 2 if counts.size else 0
    for (j, c), v in np.ndenumerate(counts):
      # Dark text on bright cells, light text on dark cells.
      ax.text(
        c,
        j,
        str(v),
        ha='center',
        va='center',
        fontsize=7,
        color='black' if v > threshold else 'white',
      )
  directory = os.path.dirname(os.fspath(path))
  if directory:
    os.makedirs(directory, exist_ok=True)
  fig.tight_layout()
  fig.savefig(path, dpi=100, format='png')
  return path


def summarize(partition, labels):
  """Plain-Python summary of a partition for logs (JSON-serialisable)."""
  labels = np.asarray(labels)
  sizes = np.array([len(p) for p in partition], dtype=np.int64)
  num_classes = [
    len(np.unique(labels[np.asarray(p, dtype=np.int64)])) for p in partition
  ]
  return {
    'num_clients': len(partition),
    'num_examples': int(sizes.sum()),
    'min_size': int(sizes.min()),
    'median_size': float(np.median(sizes)),
    'max_size': int(sizes.max()),
    'mean_classes_per_client': float(np.mean(num_classes)),
  }


def label(p) -> str:
  """A partition config block (``config.partition``) in a few words, for
  plot titles: 'dirichlet niid_bench, alpha=0.1'."""
  if p.method == 'dirichlet':
    return f'dirichlet {p.variant}, alpha={p.alpha}'
  if p.method == 'shards':
    return f'shards, {p.classes_per_client} classes per client'
  if p.method == 'quantity':
    if p.size_distribution == 'power_law':
      return f'quantity, power law exponent={p.power_law_exponent}'
    return f'quantity, dirichlet alpha={p.alpha}'
  return p.method
