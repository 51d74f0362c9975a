"""SSD's scaling matrices S_k (Fang et al., ICCV 2025, Eq. 6; Algorithm 1,
line 4) and which one each client of a round uses.

Fang et al., 'Soft Separation and Distillation: Toward Global Uniformity in
Federated Unsupervised Learning', ICCV 2025, as in the authors' released
code (github.com/hc-fang/ssd, methods/fedalignuniform/server.py). The
server draws the K matrices once, before training (`scaling_matrices`, kept
in the server extra, [K, D, D]); a client's DSR term (`losses.dsr_loss`,
Eq. 7) reads its own (`pick_scaling`).
"""

import jax.numpy as jnp
import numpy as np

COHORT_ASSIGNMENTS = ('position', 'client_id')


def _random_orthogonal(rng, dim):
  """Haar-random orthogonal [dim, dim]: QR of a Gaussian, R's signs removed.

  Without the sign fix the columns' signs follow LAPACK's convention and Q is
  not exactly Haar; either way S S^T is unchanged by column signs.
  """
  q, r = np.linalg.qr(rng.standard_normal((dim, dim)))
  signs = np.sign(np.diag(r))
  return q * np.where(signs == 0, 1.0, signs)


def scaling_matrices(
  num_clients,
  dim,
  *,
  scale=10.0,
  seed=0,
  directions_per_client=None,
  random_basis=True,
):
  """The K clients' DSR scaling matrices S_k (SSD Eq. 6; Algorithm 1, line 4).

  As ``FedAlignUniformServer.fit`` with ``subspace_mode='fixed'`` in the
  authors' released code (github.com/hc-fang/ssd,
  methods/fedalignuniform/server.py): one random orthonormal basis Q shared
  by all clients, one random permutation ``perm`` of the D basis directions,
  and client k's direction set ``perm[k m : (k + 1) m]``. S_k is Q with those
  columns multiplied by sqrt(scale), so

    S_k S_k^T = Q D_k Q^T,   D_k = diag(scale on k's m directions, 1 else):

  eigenvalue ``scale`` on an m-dimensional subspace, 1 on its complement, and
  the scaled subspaces of different clients are mutually orthogonal. The
  paper speaks of scaling 'dimensions' (Eq. 6: d_i,k = alpha on S_k);
  ``random_basis=False`` gives that reading, Q = I (canonical axes).

  m = ``directions_per_client``, by default floor(D / K) as the paper states
  (the released script hard-codes m = 10). When K m > D the later clients get
  a partial or an empty set, as the released code's slicing does; a client
  with none has S_k S_k^T = I, so its DSR target is z itself and its loss 0.
  The released code draws scale ~ U[low, high] per client with low = high =
  10; a fixed ``scale`` is that case.

  Args:
    num_clients: K >= 1.
    dim: D, the embedding width (512 in SSD).
    scale: the factor alpha on the chosen directions (10 in SSD).
    seed: NumPy seed; the same seed gives the same matrices.
    directions_per_client: m; None means floor(D / K).
    random_basis: random rotation Q (released code) or canonical axes.

  Returns:
    float32 [K, D, D]; S_k = result[k].
  """
  if num_clients < 1 or dim < 1:
    raise ValueError(
      f'need num_clients >= 1 and dim >= 1, got {num_clients}, {dim}'
    )
  m = (
    dim // num_clients
    if directions_per_client is None
    else int(directions_per_client)
  )
  if m < 0:
    raise ValueError(f'directions_per_client must be >= 0, got {m}')
  rng = np.random.default_rng(seed)
  basis = _random_orthogonal(rng, dim) if random_basis else np.eye(dim)
  perm = rng.permutation(dim)
  out = np.repeat(basis[None], num_clients, axis=0)
  for k in range(num_clients):
    chosen = perm[k * m : (k + 1) * m]
    out[k][:, chosen] *= np.sqrt(scale)
  return out.astype(np.float32)


def cohort_scaling(scalings, client_ids, *, assign='position'):
  """The scaling matrices of one round's cohort, [C, D, D].

  assign='position' (the authors' released code,
  github.com/hc-fang/ssd, methods/fedalignuniform/server.py): the i-th
  sampled client gets slot i, whatever its id. With full participation the
  order is fixed and slot = client id; with partial participation only slots
  0..C-1 are ever used and a client's directions change from round to round.
  assign='client_id' (the paper's description, Algorithm 1): client k always
  gets S_k.

  Args:
    scalings: [K, D, D] from `scaling_matrices`.
    client_ids: [C] int ids of the round's cohort (C <= K); jittable.
    assign: 'position' or 'client_id'.

  Returns:
    [C, D, D].
  """
  client_ids = jnp.asarray(client_ids)
  if assign == 'position':
    if client_ids.shape[0] > scalings.shape[0]:
      raise ValueError(
        f'cohort of {client_ids.shape[0]} exceeds the {scalings.shape[0]} slots'
      )
    return jnp.asarray(scalings)[: client_ids.shape[0]]
  if assign == 'client_id':
    return jnp.take(jnp.asarray(scalings), client_ids, axis=0)
  raise ValueError(
    f'assign must be one of {COHORT_ASSIGNMENTS}, got {assign!r}'
  )


def pick_scaling(scalings, ctx, assign):
  """The client's [D, D] scaling matrix: row ctx.client_id ('client_id', the
  paper's Algorithm 1) or ctx.slot ('position', the released code; see
  `cohort_scaling`). Padding slots (ids >= K) read a clipped row; they
  train on no example."""
  index = ctx.client_id if assign == 'client_id' else ctx.slot
  return jnp.take(scalings, index, axis=0, mode='clip')
