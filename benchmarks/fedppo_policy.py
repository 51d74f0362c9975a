r"""What a FedPPO run's agent learned (docs/results/participation.md).

For each finished fedppo workdir: its policy pi(. | s) over all N clients
at the last checkpoint's observation s, summarised as the policy's entropy
(against log N, the uniform policy's), the largest and smallest probability
times N, and the Spearman rank correlations of pi with the clients'
participation probabilities p_n (participation.json) and with their last
local accuracies s[1:] (p_n only under a participation pattern).

  python -m benchmarks.fedppo_policy runs/fedppo/fedppo_*/seed=*
"""

import json
import os

from absl import app
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp

from fedjax_metric.algorithms import fedppo_agent


def _ranks(x):
  return np.argsort(np.argsort(x))


def spearman(a, b):
  """Rank correlation (no tie correction: the values are continuous)."""
  return float(np.corrcoef(_ranks(a), _ranks(b))[0, 1])


def _layers(tree):
  """A checkpoint restored without a target holds lists as {'0': ...}."""
  if isinstance(tree, dict) and all(k.isdigit() for k in tree):
    return [tree[k] for k in sorted(tree, key=int)]
  return list(tree)


def server_extra(server_state):
  """The algorithm's extra of a `ServerState` restored without a target
  (a list, or a dict keyed by field name or position)."""
  if isinstance(server_state, (list, tuple)):
    return server_state[3]
  return server_state.get('extra', server_state.get('3'))


def policy_summary(workdir):
  """The summary of ``workdir``'s last checkpoint, as a dict."""
  directory = os.path.join(os.path.abspath(workdir), 'checkpoints')
  with ocp.CheckpointManager(directory) as manager:
    round_ = manager.latest_step()
    restored = manager.restore(round_)
  extra = server_extra(restored['server_state'])
  observation = np.asarray(extra['observation'])
  n = observation.shape[0] - 1
  log_probs = np.asarray(
    fedppo_agent.policy_log_probs(
      _layers(extra['agent']['actor']),
      jnp.asarray(observation),
      jnp.ones(n, bool),
    )
  )
  probs = np.exp(log_probs)
  # Written under a participation pattern only (not 'uniform').
  path = os.path.join(workdir, 'participation.json')
  participation = None
  if os.path.exists(path):
    with open(path) as f:
      participation = np.asarray(json.load(f)['probabilities'])
  return dict(
    round=int(round_),
    entropy=float(-(probs * log_probs).sum()),
    uniform_entropy=float(np.log(n)),
    max_times_n=float(probs.max() * n),
    min_times_n=float(probs.min() * n),
    spearman_participation=None
    if participation is None
    else spearman(probs, participation),
    spearman_last_accuracy=spearman(probs, observation[1:]),
  )


def main(argv):
  for workdir in argv[1:]:
    s = policy_summary(workdir)
    print(
      f'{workdir}: round {s["round"]}; entropy {s["entropy"]:.2f} '
      f'(uniform {s["uniform_entropy"]:.2f}); max / min probability x N '
      f'{s["max_times_n"]:.1f} / {s["min_times_n"]:.2f}; Spearman with '
      f'the last local accuracy {s["spearman_last_accuracy"]:+.2f}'
      + (
        ''
        if s['spearman_participation'] is None
        else f', with p_n {s["spearman_participation"]:+.2f}'
      )
    )


if __name__ == '__main__':
  app.run(main)
