"""Fixed prey: loading OMAR's pretrained_adv_model.pt layout, numpy forward, shipped files."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from plcql_bench.suite.envs import mpe, prey


class OmarLikeMLP(nn.Module):
    """Written here from OMAR's utils/networks.py MLPNetwork (policy, continuous): the attribute
    names are what fix the state-dict keys, so they are spelled out independently of prey.py."""

    def __init__(self, input_dim: int, out_dim: int = 2, hidden_dim: int = 64):
        super().__init__()
        self.in_fn = nn.BatchNorm1d(input_dim)
        self.fc1 = nn.Linear(input_dim, hidden_dim)
        self.fc2 = nn.Linear(hidden_dim, hidden_dim)
        self.fc3 = nn.Linear(hidden_dim, out_dim)

    def forward(self, x):
        h = F.relu(self.fc1(self.in_fn(x)))
        return torch.tanh(self.fc3(F.relu(self.fc2(h))))


def _agent_entry(obs_dim: int, critic_in: int, seed: int) -> tuple[dict, nn.Module]:
    """One agent_params entry as OMAR/maddpg-pytorch's get_params() writes it."""
    torch.manual_seed(seed)
    policy = OmarLikeMLP(obs_dim)
    policy.in_fn.running_mean.uniform_(-1, 1)  # non-trivial BatchNorm statistics
    policy.in_fn.running_var.uniform_(0.5, 2.0)
    policy.in_fn.weight.data.uniform_(0.5, 1.5)
    policy.eval()
    critic = OmarLikeMLP(critic_in, out_dim=1)
    opt = torch.optim.Adam(policy.parameters(), lr=0.01)
    entry = {"policy": policy.state_dict(), "critic": critic.state_dict(),
             "target_policy": policy.state_dict(), "target_critic": critic.state_dict(),
             "policy_optimizer": opt.state_dict(), "critic_optimizer": opt.state_dict()}
    return entry, policy


@pytest.fixture()
def omar_file(tmp_path):
    """A fake pretrained_adv_model.pt: 3 predators (obs 16) then the prey (obs 14)."""
    entries, nets = [], []
    for i, dim in enumerate([16, 16, 16, 14]):
        entry, net = _agent_entry(dim, critic_in=62 + 8, seed=i)
        entries.append(entry)
        nets.append(net)
    init = {"gamma": 0.95, "tau": 0.01, "lr": 0.01, "hidden_dim": 64,
            "alg_types": ["MADDPG"] * 4, "discrete_action": False,
            "agent_init_params": [{"num_in_pol": 16, "num_out_pol": 2}] * 4}
    path = tmp_path / "pretrained_adv_model.pt"
    torch.save({"init_dict": init, "agent_params": entries}, path)
    return path, nets


def test_loads_omar_layout_and_matches_torch(omar_file):
    path, nets = omar_file
    policy = prey.load_prey(path)  # default: the last entry is the prey
    assert policy.obs_dim == 14 and policy.act_dim == 2
    obs = np.random.default_rng(0).normal(0, 1, (33, 14)).astype(np.float32)
    with torch.no_grad():
        want = nets[3](torch.from_numpy(obs)).numpy()
    got = policy(obs)
    assert got.dtype == np.float32 and got.shape == (33, 2)
    np.testing.assert_allclose(got, want, atol=1e-5)
    np.testing.assert_allclose(prey.load_prey(path, prey_index=3)(obs), got)
    assert prey.load_prey(path, prey_index=0).obs_dim == 16


def test_rejects_other_layouts(tmp_path):
    bad = tmp_path / "bad.pt"
    torch.save({"policy": {}}, bad)
    with pytest.raises(ValueError):
        prey.load_prey(bad)
    torch.save({"agent_params": [{"policy": {"fc1.weight": torch.zeros(2, 2)}}]}, bad)
    with pytest.raises(ValueError):
        prey.load_prey(bad)


def test_prey_path_override_is_used(omar_file):
    path, _ = omar_file
    task = mpe.make_task("mpe-pp", prey_path=path)
    assert task.spec.env_versions()["prey"].startswith("pretrained_adv_model.pt:sha256=")
    env = task.make_env(2)
    assert env.prey.source.startswith("pretrained_adv_model.pt")
    env.reset(np.arange(2))
    env.step(np.zeros((2, 3, 2), np.float32))


@pytest.mark.parametrize("task_id,obs_dim", [("mpe-pp", 14), ("mpe-world", 22)])
def test_shipped_prey_files(task_id, obs_dim):
    path = prey.default_prey_path(task_id)
    policy = prey.load_prey(path)
    assert policy.obs_dim == obs_dim and policy.act_dim == 2
    blob = torch.load(path, weights_only=True)
    assert len(blob["agent_params"]) == 4 and "OMAR" in blob["meta"]["note"]
    # the env's default prey is this file, and its actions are in range
    env = mpe.make_task(task_id).make_env(8)
    step = env.reset(np.arange(8))
    act = env.prey(step.state[:, 3 * env.spec.obs_dim:])
    assert act.shape == (8, 2) and np.abs(act).max() <= 1.0
    # it runs away: a prey with predators on its left moves right
    obs = step.state[:1, 3 * env.spec.obs_dim:].copy()
    obs[0, :4] = [0, 0, 0, 0]
    others = 8 if task_id == "mpe-pp" else 14
    obs[0, others:others + 6] = [-0.3, 0.05, -0.3, -0.05, -0.35, 0.0]
    assert policy(obs)[0, 0] > 0.3
