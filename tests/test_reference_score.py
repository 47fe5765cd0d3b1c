"""`suite/runs/reference_score.py`: the official OMAR / CFCQL / MACQL code trained on this suite's data and scored by
this suite.

The official checkouts are not available here, so stand-ins with their interfaces (init_from_env /
update / update_all_targets / step, utils.buffer.ReplayBuffer) check the plumbing: the tier reaches
init_from_env, every update gets a minibatch of the dataset's own transitions, a round is the official
main.py's (OMAR: one update per agent; CFCQL: one full and four critic-only updates), and the final line
is the suite's normalised score of the stand-in's deterministic actors."""

from __future__ import annotations

import sys

import pytest

from plcql_bench.datasets.format import synthetic_dataset, write_dataset
from plcql_bench.suite.envs.tasks import get_task

from official_fakes import undo_loader_shims, write_checkout

FAKE_AGENT = '''
import torch
# the marker reference_speed checks for: cem_sampled_acs.view(-1, cem_sampled_acs.shape[-1])
SEEN = {"updates": [], "targets": 0, "init": None}

class {name}:
    @classmethod
    def init_from_env(cls, env, env_id, data_type, **kw):
        self = cls()
        SEEN["init"] = (env_id, data_type, kw, len(env.action_space))
        self.cql_alpha = {"expert": 5.0}.get(data_type, 1.0)
        self.act_dim = env.action_space[0].shape[0]
        return self

    def prep_training(self, device="cpu"):
        pass

    def prep_rollouts(self, device="cpu"):
        pass

    def update(self, sample, i, only_critic=False):
        SEEN["updates"].append((i, only_critic, sample[0][1].clone()))

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


@pytest.fixture(params=["omar", "cfcql", "macql"])
def fake_official(request, tmp_path, monkeypatch):
    """(kind, a checkout-shaped folder: MACQL's is CFCQL's); the torch globals the loaders shim are restored
    afterwards."""
    kind = request.param
    root = write_checkout(tmp_path, kind, FAKE_AGENT, FAKE_BUFFER)
    undo_loader_shims(monkeypatch)
    yield kind, root
    for mod in ("utils", "utils.buffer", "tensorboard_logger"):
        sys.modules.pop(mod, None)


def run_recorded(monkeypatch, argv: list[str]) -> dict:
    """Run reference_score.main(argv); returns the stand-in agent module's record (SEEN)."""
    from plcql_bench.suite.runs import reference_score

    seen = {}
    real = reference_score.official_agent

    def recording(*args):
        agent, buffer = real(*args)
        seen["live"] = type(agent).update.__globals__["SEEN"]  # the stand-in module's record
        return agent, buffer

    monkeypatch.setattr(reference_score, "official_agent", recording)
    reference_score.main(argv)
    return seen["live"]


def test_the_official_code_trains_on_the_suites_data_and_is_scored_by_the_suite(tmp_path, fake_official, capsys,
                                                                                monkeypatch):
    kind, checkout = fake_official
    spec = get_task("mpe-cn").spec
    arrays, attrs = synthetic_dataset(spec, n_episodes=6, episode_len=5, seed=2)
    write_dataset(tmp_path / "data" / "smoke" / "mpe-cn" / "expert.h5", arrays, attrs)
    record = run_recorded(monkeypatch, [f"--{kind}", str(checkout), "--tier", "expert", "--profile", "smoke",
                                        "--data-dir", str(tmp_path / "data"), "--rounds", "3", "--eval-every", "2",
                                        "--final-episodes", "2", "--record-to", str(tmp_path / "official")])
    out = capsys.readouterr().out
    assert out.strip().endswith("not recorded: fewer rounds or final episodes than the profile's")
    assert not (tmp_path / "official").exists()  # a shortened run never stands for the official code's result
    env_id, tier, kw, n = record["init"]
    assert (env_id, tier, n) == ("simple_spread", "expert", spec.n_agents)
    assert kw["lr"] == 0.01 and kw["batch_size"] == 1024  # the official main.py's settings, not our configs
    calls = [(i, critic_only) for i, critic_only, _ in record["updates"]]
    if kind == "omar":  # one update per agent a round
        assert kw["omar"] == 1 and calls == [(i, False) for i in range(spec.n_agents)] * 3
    else:  # one full and four critic-only updates a round, at main.py's step counter; MACQL: CFCQL's code without cf_cql
        assert kw["cf_cql"] is (kind == "cfcql") and kw["cql"] is True
        assert calls == [(100 * r + j, j > 0) for r in range(3) for j in range(5)]
    assert record["targets"] == 3
    rows = {tuple(r) for r in arrays["obs"][:, 1].round(5)}
    assert all(tuple(r) in rows for r in record["updates"][1][2].numpy().round(5))  # agent 1's: the dataset's own
    assert "cql_alpha 5.0" in out and "round 0:" in out and "round 2:" in out
    final = out.strip().splitlines()[-2]
    assert final.startswith("final (round 3, 2 episodes): normalised score ")
    float(final.rsplit(" ", 1)[1])


def test_reference_score_names_a_missing_dataset(tmp_path, fake_official):
    from plcql_bench.suite.runs import reference_score

    kind, checkout = fake_official
    with pytest.raises(SystemExit, match=r"expert\.h5: dataset not built \(plcql-bench datasets build mpe-cn expert"):
        reference_score.main([f"--{kind}", str(checkout), "--tier", "expert", "--profile", "smoke", "--data-dir",
                              str(tmp_path / "nothing")])


@pytest.mark.parametrize("task, scenario", [("mpe-pp", "simple_tag"), ("mpe-world", "simple_world")])
def test_predator_prey_builds_the_official_agent_for_its_scenario_with_its_main_settings(tmp_path, fake_official, capsys,
                                                                                        monkeypatch, task, scenario):
    """mpe-pp and mpe-world: the official agent is built for simple_tag / simple_world (predators first, then
    their one prey), with main.py's lr for that scenario (CFCQL 0.001: only simple_spread overrides it; OMAR's
    default 0.01), trains on the dataset's transitions and is scored in the suite's task. At the profile's
    full budget the result is recorded as a check file the leaderboard reads (suite/core/official.py)."""
    from plcql_bench.suite.core import official
    kind, checkout = fake_official
    spec = get_task(task).spec
    arrays, attrs = synthetic_dataset(spec, n_episodes=6, episode_len=5, seed=3)
    sha = write_dataset(tmp_path / "data" / "smoke" / task / "random.h5", arrays, attrs)
    record = run_recorded(monkeypatch, [f"--{kind}", str(checkout), "--task", task, "--tier", "random",
                                        "--profile", "smoke", "--data-dir", str(tmp_path / "data"), "--eval-every", "8",
                                        "--seed", "4", "--record-to", str(tmp_path / "official")])
    out = capsys.readouterr().out
    env_id, tier, kw, n_env = record["init"]
    assert (env_id, tier, n_env) == (scenario, "random", spec.n_agents + 1)
    assert kw["lr"] == (0.01 if kind == "omar" else 0.001)
    rows = {tuple(r) for r in arrays["obs"][:, 1].round(5)}
    assert all(tuple(r) in rows for r in record["updates"][0][2].numpy().round(5))  # predators' own transitions
    assert f"on this suite's {task} random" in out
    lines = out.strip().splitlines()
    assert lines[-2].startswith("final (round 20, 10 episodes): normalised score ")  # smoke: 20 rounds, 10 episodes
    check = official.read_check(tmp_path / "official" / "smoke" / kind / task / "random" / "seed4.json")
    assert lines[-1] == f"recorded: {tmp_path / 'official' / 'smoke' / kind / task / 'random' / 'seed4.json'}"
    assert (check["code"], check["task"], check["tier"], check["seed"], check["rounds"]) == (kind, task, "random", 4, 20)
    assert check["dataset_sha256"] == sha and check["commit"] is None  # the stand-in is no git checkout
    assert [p["update"] for p in check["curve"]] == [0, 8, 16, 20]
    assert f"normalised score {check['score']:.1f}" in lines[-2] and check["curve"][-1]["score"] == check["score"]
    assert check["settings"]["lr"] == kw["lr"] and check["cql_alpha"] == 1.0
    assert check["settings"]["rewards"] == "team"  # the synthetic data has no per-agent rewards


def test_each_agents_official_buffer_holds_that_agents_own_reward():
    """The original datasets store one reward file per agent (OMAR's critic i learns from agent i's, CFCQL's
    central critic from agent 0's); on CN they differ at collisions. A v2 dataset's `agent_rewards` fill the
    official buffers so; a dataset with the team reward only gives it to every agent."""
    import numpy as np

    from plcql_bench.datasets.format import AGENT_REWARDS
    from plcql_bench.suite.runs.reference_score import buffer_rewards, fill_buffer

    buffer_module: dict = {}
    exec(FAKE_BUFFER, buffer_module)
    spec = get_task("mpe-cn").spec
    n, od, ad = spec.n_agents, spec.obs_dim, spec.act_dim
    arrays, _ = synthetic_dataset(spec, n_episodes=4, episode_len=5, seed=1)
    rb = fill_buffer(buffer_module["ReplayBuffer"], arrays, n, od, ad)
    assert buffer_rewards(arrays)[0] == "team"
    assert all(np.array_equal(rb.rew_buffs[i], arrays["rewards"]) for i in range(n))
    own = arrays["rewards"][:, None] + np.array([-5.0, 0.0, 5.0], np.float32)  # the team reward is their mean
    rb = fill_buffer(buffer_module["ReplayBuffer"], {**arrays, AGENT_REWARDS: own}, n, od, ad)
    assert buffer_rewards({**arrays, AGENT_REWARDS: own})[0] == "per-agent"
    for i in range(n):
        np.testing.assert_array_equal(rb.rew_buffs[i], own[:, i])
