"""`suite/reference_score.py`: the official OMAR trained on this suite's CN data and scored by this suite.

The official checkout is not available here, so a stand-in with its interface (MATD3.init_from_env /
update / update_all_targets / step, utils.buffer.ReplayBuffer) checks the plumbing: the tier reaches
init_from_env, every update gets a minibatch of the dataset's own transitions, each agent updates once
per round, and the final line is the suite's normalised score of the stand-in's deterministic actors."""

from __future__ import annotations

import sys
import textwrap

import pytest
import torch

from plcql_bench.datasets.format import synthetic_dataset, write_dataset
from plcql_bench.suite.tasks import get_task

FAKE_MADDPG = '''
import torch
# the marker reference_speed checks for: cem_sampled_acs.view(-1, cem_sampled_acs.shape[-1])
SEEN = {"updates": [], "targets": 0, "init": None}

class MATD3:
    @classmethod
    def init_from_env(cls, env, env_id, data_type, **kw):
        self = cls()
        SEEN["init"] = (env_id, data_type, kw, len(env.action_space))
        self.cql_alpha, self.omar_coe = {"expert": 5.0}.get(data_type, 1.0), 1.0
        self.act_dim = env.action_space[0].shape[0]
        return self

    def prep_training(self, device="cpu"):
        pass

    def prep_rollouts(self, device="cpu"):
        pass

    def update(self, sample, agent_i):
        SEEN["updates"].append((agent_i, sample[0][agent_i].clone()))

    def update_all_targets(self):
        SEEN["targets"] += 1

    def step(self, observations, explore=False):
        return [torch.tanh(o[:, :self.act_dim]) for o in observations]
'''

FAKE_BUFFER = '''
import numpy as np
import torch

class ReplayBuffer:
    def __init__(self, max_steps, num_agents, obs_dims, ac_dims):
        self.num_agents = num_agents
        self.obs_buffs = [np.zeros((max_steps, d), np.float32) for d in obs_dims]
        self.next_obs_buffs = [np.zeros((max_steps, d), np.float32) for d in obs_dims]
        self.ac_buffs = [np.zeros((max_steps, d), np.float32) for d in ac_dims]
        self.rew_buffs = [np.zeros(max_steps, np.float32) for _ in range(num_agents)]
        self.done_buffs = [np.zeros(max_steps, np.float32) for _ in range(num_agents)]
        self.filled_i = 0

    def sample(self, N, to_gpu=False):
        inds = np.random.choice(np.arange(self.filled_i), size=min(N, self.filled_i), replace=False)
        pick = lambda bufs: [torch.Tensor(b[inds]) for b in bufs]
        return (pick(self.obs_buffs), pick(self.ac_buffs), pick(self.rew_buffs), pick(self.next_obs_buffs),
                pick(self.done_buffs))
'''


@pytest.fixture
def fake_official(tmp_path, monkeypatch):
    """A checkout-shaped folder; the torch globals the loader shims are restored afterwards."""
    root = tmp_path / "OMAR"
    (root / "algorithms").mkdir(parents=True)
    (root / "utils").mkdir()
    (root / "algorithms" / "maddpg.py").write_text(textwrap.dedent(FAKE_MADDPG))
    (root / "utils" / "__init__.py").write_text("")
    (root / "utils" / "buffer.py").write_text(textwrap.dedent(FAKE_BUFFER))
    monkeypatch.setattr(torch.Tensor, "cuda", torch.Tensor.cuda)
    monkeypatch.setattr(torch.cuda, "FloatTensor", torch.cuda.FloatTensor)
    monkeypatch.setattr(torch.distributions.Distribution, "_validate_args", torch.distributions.Distribution._validate_args)
    monkeypatch.setattr(sys, "path", list(sys.path))
    for name in ("utils", "utils.buffer"):
        monkeypatch.delitem(sys.modules, name, raising=False)
    yield root
    for name in ("utils", "utils.buffer"):
        sys.modules.pop(name, None)


def test_official_omar_trains_on_the_suites_data_and_is_scored_by_the_suite(tmp_path, fake_official, capsys,
                                                                             monkeypatch):
    from plcql_bench.suite import reference_score

    spec = get_task("mpe-cn").spec
    arrays, attrs = synthetic_dataset(spec, n_episodes=6, episode_len=5, seed=2)
    write_dataset(tmp_path / "data" / "smoke" / "mpe-cn" / "expert.h5", arrays, attrs)
    seen = {}
    real_loader = reference_score.load_official_omar

    def loader(path):
        MATD3, buffer = real_loader(path)
        seen["ref"] = MATD3.update.__globals__["SEEN"]  # the stand-in module's record
        return MATD3, buffer

    monkeypatch.setattr(reference_score, "load_official_omar", loader)
    reference_score.main(["--omar", str(fake_official), "--tier", "expert", "--profile", "smoke", "--data-dir",
                          str(tmp_path / "data"), "--rounds", "3", "--eval-every", "2", "--final-episodes", "2"])
    out = capsys.readouterr().out
    record = seen["ref"]
    env_id, tier, kw, n = record["init"]
    assert (env_id, tier, n) == ("simple_spread", "expert", spec.n_agents)
    assert kw["lr"] == 0.01 and kw["omar"] == 1 and kw["batch_size"] == 1024  # main.py's defaults, not our configs
    assert [i for i, _ in record["updates"]] == list(range(spec.n_agents)) * 3 and record["targets"] == 3
    rows = {tuple(r) for r in arrays["obs"][:, 1].round(5)}
    agent1 = record["updates"][1][1].numpy().round(5)
    assert all(tuple(r) in rows for r in agent1)  # agent 1's minibatch: the dataset's own observations of agent 1
    assert "cql_alpha 5.0" in out and "round 0:" in out and "round 2:" in out
    final = out.strip().splitlines()[-1]
    assert final.startswith("final (round 3, 2 episodes): normalised score ")
    float(final.rsplit(" ", 1)[1])


def test_reference_score_names_a_missing_dataset(tmp_path, fake_official):
    from plcql_bench.suite import reference_score

    with pytest.raises(SystemExit, match=r"expert\.h5: dataset not built \(plcql-bench datasets build mpe-cn expert"):
        reference_score.main(["--omar", str(fake_official), "--tier", "expert", "--profile", "smoke", "--data-dir",
                              str(tmp_path / "nothing")])
