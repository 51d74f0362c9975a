"""FedPPO's server round (fedppo_server): its selection and rewards against
NumPy re-derivations of the released code's rules (github.com/zzy211/fedppo,
ppo_remove_main.py)."""

import jax
import jax.numpy as jnp
import numpy as np

from fedjax_metric.algorithms import fedppo_server

from .fedppo_helpers import _np_softmax


def test_selection_draws_distinct_clients_as_the_codes_rejection_sampling():
  """The code draws from one categorical until it has k distinct clients;
  the Gumbel-top-k draw must include each client as often (20,000 draws
  each, NumPy against JAX), pick exactly k, and never an unavailable one."""
  logits = np.array([2.0, 0.5, -1.0, 1.0, 0.0, 3.0], np.float32)
  available = np.array([True, True, True, True, True, False])
  k, draws = 3, 20_000
  p = _np_softmax(logits[available])
  ids = np.flatnonzero(available)
  rng = np.random.default_rng(0)
  counts = np.zeros(len(logits))
  for _ in range(draws):
    chosen = set()
    while len(chosen) < k:
      chosen.add(int(ids[rng.choice(len(ids), p=p)]))
    counts[list(chosen)] += 1
  log_probs = jnp.asarray(logits) - jax.nn.logsumexp(logits[available])
  keys = jax.random.split(jax.random.key(1), draws)
  picked = np.asarray(
    jax.vmap(fedppo_server.sample_without_replacement, (None, None, None, 0))(
      log_probs, jnp.asarray(available), k, keys
    )
  )
  assert (picked.sum(axis=1) == k).all()
  assert not picked[:, ~available].any()
  np.testing.assert_allclose(picked.mean(axis=0), counts / draws, atol=0.02)


def test_rewards_by_hand():
  """r_i = acc_i + acc_g * dl_i / sum_j dl_j, dl_i = max(l_prev - l, 1e-5);
  a first selection (l_prev = 0) and a loss that rose both give 1e-5."""
  r = fedppo_server.rewards(
    accuracy=jnp.array([0.5, 0.8, 0.2, 0.9]),
    global_accuracy=jnp.float32(0.6),
    loss=jnp.array([1.0, 2.0, 1.0, 3.0]),
    previous_loss=jnp.array([1.5, 0.0, 0.5, 2.0]),
    selected=jnp.array([True, True, False, True]),
  )
  total = 0.5 + 1e-5 + 1e-5
  expected = [
    0.5 + 0.6 * 0.5 / total,
    0.8 + 0.6 * 1e-5 / total,
    0.0,
    0.9 + 0.6 * 1e-5 / total,
  ]
  np.testing.assert_allclose(np.asarray(r), expected, rtol=1e-6)
