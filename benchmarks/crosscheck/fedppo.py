"""FedPPO's agent, reward and selection, run by the authors' own code.

Runs, UNCHANGED, github.com/zzy211/fedppo (Zhao, Li, Li, Yang and Xu,
'FedPPO: Reinforcement Learning-Based Client Selection for Federated
Learning with Heterogeneous Data', IEEE TCCN 2025):

  * src/ppo_server/ppo.py PPO (ActorCritic actor and critic MLPs, its Adam,
    PPO.select_n_actions / ActorCritic.n_act: K distinct clients by
    rejecting repeated categorical draws, PPO.remember, PPO.update: Monte
    Carlo returns with gamma 0.7, normalised, the clipped surrogate + 0.5
    MSE - 0.01 entropy, 5 full-batch Adam steps);
  * src/ppo_remove_main.py fed_env.reset / fed_env.step (the observation
    and the reward r_i = acc_i + acc_g dl_i / sum_j dl_j);

with the round loop of ppo_remove_main.py's ``__main__`` (its lines from
``select_n_actions`` to ``ppo_agent.update()``, including dl_i = max(l_i^prev -
l_i, 1e-5) and the update after rounds 0, 5, 10, ...) written out here,
because it is inline in the script, and federated training replaced by
fixed accuracies and losses. It writes an .npz fixture
(tests/test_golden_misc.py reads it):

  /path/to/torch-env/bin/python benchmarks/crosscheck/fedppo.py \\
      --repo=/path/to/fedppo --out=tests/golden/fedppo.npz

Fixture: the agent's initial weights; per round the observation, the
actor's probabilities and the critic's value on it, the drawn clients (in
draw order), their stored log-probabilities and rewards; the agent's
weights after the last update (``final/*``). The chain stores each round's
transitions by client index, the library's order (docs/methods.md,
FedPPO); at every update the same update is also run on a copy of the
agent with the round's transitions in the script's draw order, and the
copy of the first update is kept (``draw_order/*``) to measure what the
script's order changes. Last, the sampler alone: ``n_act`` run
SAMPLER_DRAWS times on a policy whose probabilities are set to SAMPLER_PROBS
(last actor layer: zero weights, bias log p), with the inclusion count of
every client and how often each was drawn first.

Stubs (no logic of the method is replaced):
  * federated training: each round's client accuracies, client losses and
    the global accuracy are fixed numbers from a seeded NumPy generator
    (the script measures them on the test set after local training).
  * imports: ppo_remove_main.py imports its dataset, model and noise code
    (models, utils, sampling: torchvision, keras, PIL), gym and tqdm at the
    top; none of that runs here, so they are empty stand-ins; gym's
    ``spaces.Discrete`` / ``spaces.Box`` are stand-ins that keep ``n`` and
    ``shape`` (all fed_env reads of them). ``done`` is the script's global
    (False, set before its loop).
  * args: options.args_parser with the command line below.

Settings that differ from the authors' defaults and why:
  * 6 clients, frac 0.5 (K = 3), 11 rounds (updates after rounds 0, 5 and
    10), one episode: small enough for an exact replay (defaults: 50
    clients, frac 0.2, 10 rounds).
  * no noisy clients, no clustering (clean_client_id = every client), as
    the library (and PMFL's setting) has no label noise.
  * transitions remembered by client index within a round (the script:
    draw order), see above.
  * dtype float32: PPO.remember and select_n_actions build float32 tensors
    (torch.FloatTensor), so the agent cannot run in float64 unchanged.
  * CPU device (ppo.py picks CUDA when available).

This script does not import fedjax_metric.
"""

import argparse
import copy
import importlib.machinery
import os
import subprocess
import sys
import types

import numpy as np

NUM_USERS = 6
FRAC = 0.5
ROUNDS = 11
SEED = 0
SAMPLER_PROBS = np.array([0.4, 0.25, 0.15, 0.1, 0.06, 0.04])
SAMPLER_DRAWS = 20000


def stub_module(name, **attrs):
  module = types.ModuleType(name)
  module.__spec__ = importlib.machinery.ModuleSpec(name, None)
  module.__dict__.update(attrs)
  return module


def install_stubs():
  """Stand-ins for the script's data, model and logging imports."""
  import torch._dynamo  # noqa: F401  (before the stand-ins exist)

  class Env:
    pass

  class Discrete:
    def __init__(self, n):
      self.n = n

  class Box:
    def __init__(self, low, high, shape=None, dtype=None):
      self.shape = shape

  spaces = stub_module('gym.spaces', Discrete=Discrete, Box=Box)
  sys.modules['gym'] = stub_module(
    'gym', Env=Env, spaces=spaces, logger=stub_module('gym.logger')
  )
  sys.modules['gym.spaces'] = spaces
  sys.modules['tqdm'] = stub_module('tqdm', tqdm=lambda x, *a, **k: x)
  unused = lambda *a, **k: None  # noqa: E731
  model_names = (
    'ResNet10Cifar',
    'ResNet50Cifar',
    'ResNet18Cifar',
    'CNNEmnist',
    'ResNet10Emnist',
    'LSTM',
    'TextClassificationModel',
  )
  sys.modules['models'] = stub_module(
    'models', **dict.fromkeys(model_names, unused)
  )
  sys.modules['utils'] = stub_module(
    'utils', get_dataset=unused, average_weights=unused, exp_details=unused
  )
  sys.modules['sampling'] = stub_module('sampling', add_noise=unused)


def flat_params(net):
  return {k: v.detach().numpy().copy() for k, v in net.state_dict().items()}


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument('--repo', required=True)
  parser.add_argument('--out', default='tests/golden/fedppo.npz')
  parser.add_argument(
    '--commit', default='', help="the checkout's commit, if not a git tree"
  )
  flags = parser.parse_args()

  import torch

  torch.set_num_threads(1)
  install_stubs()
  sys.path.insert(0, os.path.join(flags.repo, 'src'))
  argv = sys.argv
  sys.argv = [
    'ppo_remove_main.py',
    '--num_users',
    str(NUM_USERS),
    '--frac',
    str(FRAC),
    '--epochs',
    str(ROUNDS),
    '--cluster_method',
    'no',
  ]
  try:
    import options
    import ppo_remove_main as script
    from ppo_server.ppo import PPO

    args = options.args_parser()
    script.done = False  # the script's global, set before its loop
    torch.manual_seed(SEED)
    env = script.fed_env(list(range(NUM_USERS)))
    agent = PPO(
      args=args,
      state_dim=env.observation_space.shape[0],
      action_dim=env.action_space.n,
      lr_actor=0.001,
      lr_critic=0.001,
      gamma=0.7,
      K_epochs=5,
      eps_clip=0.2,
      has_continuous_action_space=False,
    )
  finally:
    sys.argv = argv

  rng = np.random.default_rng(SEED)
  client_acc = rng.uniform(0.2, 0.9, size=(ROUNDS, NUM_USERS)).astype(
    np.float32
  )
  # Losses that mostly fall, sometimes rise (dl clipped at 1e-5).
  client_loss = (
    2.0 * np.exp(-0.15 * np.arange(ROUNDS))[:, None]
    + rng.normal(scale=0.3, size=(ROUNDS, NUM_USERS))
  ).astype(np.float32)
  global_acc = np.linspace(0.3, 0.8, ROUNDS).astype(np.float32)
  global_acc += rng.normal(scale=0.02, size=ROUNDS).astype(np.float32)

  initial = {
    'actor': flat_params(agent.policy.actor),
    'critic': flat_params(agent.policy.critic),
  }
  k = int(np.ceil(NUM_USERS * FRAC))
  rec = {
    'observation': np.zeros((ROUNDS, NUM_USERS + 1)),
    'probs': np.zeros((ROUNDS, NUM_USERS)),
    'value': np.zeros(ROUNDS),
    'drawn': np.zeros((ROUNDS, k), np.int64),
    'log_prob': np.zeros((ROUNDS, k)),
    'reward': np.zeros((ROUNDS, k)),
    'loss_decrease': np.zeros((ROUNDS, k)),
  }
  updates, draw_order = [], []

  observation = env.reset()
  client_mean_loss_list = [0 for _ in range(NUM_USERS)]
  for epoch in range(ROUNDS):
    # --- ppo_remove_main.py's round, training stubbed ---
    action_list, action_logprob_list, state_val_list = agent.select_n_actions(
      observation
    )
    action_return = [action.item() for action in action_list]
    client_acc_update = []
    client_deta_loss_update = []
    last_mean_loss_list = copy.deepcopy(client_mean_loss_list)
    for idx in action_return:
      loss = float(client_loss[epoch, idx])
      client_mean_loss_list[idx] = copy.deepcopy(loss)
      deta_loss = max(last_mean_loss_list[idx] - copy.deepcopy(loss), 1e-5)
      client_deta_loss_update.append(deta_loss)
      client_acc_update.append(float(client_acc[epoch, idx]))
    test_acc = float(global_acc[epoch])
    with torch.no_grad():
      state = torch.FloatTensor(observation)
      rec['probs'][epoch] = agent.policy_old.actor(state).numpy()
    rec['observation'][epoch] = observation
    rec['value'][epoch] = state_val_list[0].item()
    rec['drawn'][epoch] = action_return
    rec['log_prob'][epoch] = [p.item() for p in action_logprob_list]
    rec['loss_decrease'][epoch] = client_deta_loss_update
    observation_, reward_list, done, info = env.step(
      action_return,
      client_acc_update,
      global_acc=test_acc,
      client_deta_loss_update=client_deta_loss_update,
    )
    rec['reward'][epoch] = reward_list
    # The script remembers in draw order; the chain here by client index
    # (the library's order), the draw order on a copy below.
    by_index = np.argsort(action_return, kind='stable')
    for index in by_index:
      agent.remember(
        observation,
        action_list[index],
        action_logprob_list[index],
        state_val_list[index],
        reward_list[index],
        done,
      )
    if epoch % 5 == 0:
      other = copy.deepcopy(agent)
      # Reorder this segment's transitions to the script's draw order.
      buffer = other.buffer
      start = 0
      for r in range(0 if epoch == 0 else epoch - 4, epoch + 1):
        order = np.argsort(np.argsort(rec['drawn'][r], kind='stable'))
        for name in ('states', 'actions', 'logprobs', 'rewards'):
          seg = getattr(buffer, name)[start : start + k]
          getattr(buffer, name)[start : start + k] = [seg[i] for i in order]
        seg = buffer.state_values[start : start + k]
        buffer.state_values[start : start + k] = [seg[i] for i in order]
        start += k
      assert start == len(buffer.rewards)
      other.update()
      draw_order.append(
        {
          'actor': flat_params(other.policy.actor),
          'critic': flat_params(other.policy.critic),
        }
      )
      agent.update()
      updates.append(
        {
          'actor': flat_params(agent.policy.actor),
          'critic': flat_params(agent.policy.critic),
        }
      )
    observation = observation_

  # The sampler alone, on fixed probabilities.
  torch.manual_seed(SEED + 1)
  sampler = PPO(
    args=args,
    state_dim=NUM_USERS + 1,
    action_dim=NUM_USERS,
    lr_actor=0.001,
    lr_critic=0.001,
    gamma=0.7,
    K_epochs=5,
    eps_clip=0.2,
    has_continuous_action_space=False,
  )
  last = sampler.policy_old.actor[4]
  with torch.no_grad():
    last.weight.zero_()
    last.bias.copy_(torch.log(torch.as_tensor(SAMPLER_PROBS)))
  state = np.zeros(NUM_USERS + 1)
  inclusion = np.zeros(NUM_USERS, np.int64)
  first = np.zeros(NUM_USERS, np.int64)
  for _ in range(SAMPLER_DRAWS):
    actions, _, _ = sampler.select_n_actions(state)
    drawn = [a.item() for a in actions]
    assert len(set(drawn)) == k
    inclusion[drawn] += 1
    first[drawn[0]] += 1
  with torch.no_grad():
    sampler_probs = sampler.policy_old.actor(torch.FloatTensor(state)).numpy()

  out = {
    'repository': np.asarray('zzy211/fedppo'),
    'commit': np.asarray(flags.commit or git_commit(flags.repo)),
    'function': np.asarray(
      'src/ppo_server/ppo.py:PPO.select_n_actions,ActorCritic.n_act,'
      'PPO.remember,PPO.update; src/ppo_remove_main.py:fed_env.reset,'
      'fed_env.step'
    ),
    'num_users': np.int64(NUM_USERS),
    'frac': np.float64(FRAC),
    'k': np.int64(k),
    'rounds': np.int64(ROUNDS),
    'update_every': np.int64(5),
    'gamma': np.float64(0.7),
    'eps_clip': np.float64(0.2),
    'k_epochs': np.int64(5),
    'lr': np.float64(0.001),
    'client_acc': client_acc,
    'client_loss': client_loss,
    'global_acc': global_acc,
    'sampler_set_probs': SAMPLER_PROBS,
    'sampler_probs': sampler_probs,
    'sampler_draws': np.int64(SAMPLER_DRAWS),
    'sampler_inclusion': inclusion,
    'sampler_first': first,
  }
  for name, value in rec.items():
    out[name] = value
  # Full weights: initial, after the last update, and the draw-order copy
  # of the first update (the per-round probabilities and values pin the
  # agent between updates; the whole set would exceed 200 KB).
  saved = {
    'initial': initial,
    'final': updates[-1],
    'draw_order': draw_order[0],
  }
  for label, nets in saved.items():
    for net in ('actor', 'critic'):
      for key, value in nets[net].items():
        out[f'{label}/{net}/{key}'] = value
  out['num_updates'] = np.int64(len(updates))
  os.makedirs(os.path.dirname(os.path.abspath(flags.out)), exist_ok=True)
  np.savez_compressed(flags.out, **out)
  print(f'wrote {flags.out} ({os.path.getsize(flags.out)} bytes)')
  print('drawn', rec['drawn'].tolist())
  print('rewards', rec['reward'].round(4).tolist())
  print('inclusion', inclusion / SAMPLER_DRAWS, 'first', first / SAMPLER_DRAWS)


def git_commit(repo):
  commit = subprocess.check_output(
    ['git', '-C', repo, 'rev-parse', 'HEAD'], text=True
  ).strip()
  assert len(commit) == 40, commit
  return commit


if __name__ == '__main__':
  main()
