"""`bench-speed --official-cfcql PATH` / `--official-omar PATH` (suite/runs/reference_speed.py): the official round
and ours, timed in alternation in one process, with the ratio, its interval and the stated differences.

The official checkouts are not part of this repository, so stand-ins with their interfaces (init_from_env /
MATD3(...), update, update_all_targets, utils.buffer.ReplayBuffer) check the plumbing: what one official round
calls (CFCQL: one full and four critic-only updates on five batches; OMAR: one update per agent, each on its own
batch), that both sides get the same shapes, and what the command prints. With PLCQL_OFFICIAL_CFCQL /
PLCQL_OFFICIAL_OMAR pointing at real checkouts, the last test runs the real code for two rounds."""

from __future__ import annotations

import os
import re
import sys

import pytest
from click.testing import CliRunner

from plcql_bench.suite.commands.main import cli

from official_fakes import undo_loader_shims, write_checkout

FAKE_AGENT = '''
import torch
# the marker reference_speed checks for: cem_sampled_acs.view(-1, cem_sampled_acs.shape[-1])
SEEN = {"updates": [], "targets": 0, "init": None, "batch_rows": []}

class {name}:
    def __init__(self, params=None, algs=None, **kw):
        SEEN["init"] = kw

    @classmethod
    def init_from_env(cls, env, env_id, data_type, **kw):
        self = cls()
        SEEN["init"] = dict(kw, env_id=env_id)
        return self

    def prep_training(self, device="cpu"):
        pass

    def update(self, sample, i, only_critic=False):
        SEEN["updates"].append((i, only_critic))
        SEEN["batch_rows"].append(len(sample[1][0]))

    def update_all_targets(self):
        SEEN["targets"] += 1
'''

FAKE_BUFFER = '''
import numpy as np
import torch

class ReplayBuffer:
    def __init__(self, max_steps, num_agents, obs_dims, ac_dims, is_mamujoco=False, state_dims=None):
        self.num_agents, self.is_mamujoco = num_agents, is_mamujoco
        self.obs_buffs = [np.zeros((max_steps, d)) for d in obs_dims]
        self.next_obs_buffs = [np.zeros((max_steps, d)) for d in obs_dims]
        self.ac_buffs = [np.zeros((max_steps, d)) for d in ac_dims]
        self.rew_buffs = [np.zeros(max_steps) for _ in range(num_agents)]
        self.done_buffs = [np.zeros(max_steps) for _ in range(num_agents)]
        if is_mamujoco:
            self.state_buffs = [np.zeros((max_steps, d)) for d in state_dims]
            self.next_state_buffs = [np.zeros((max_steps, d)) for d in state_dims]
        self.filled_i = 0

    def sample(self, N, to_gpu=False):
        inds = np.random.choice(np.arange(self.filled_i), size=N, replace=False)
        pick = lambda bufs: [torch.Tensor(b[inds]) for b in bufs]
        head = (pick(self.state_buffs),) if self.is_mamujoco else ()
        return head + (pick(self.obs_buffs), pick(self.ac_buffs), pick(self.rew_buffs))
'''

RATIO = re.compile(r"^# official (CFCQL|OMAR) vs ours, (\S+) \((.*)\), 1 torch thread\(s\), cpu clock, load average "
                   r"[\d.]+ [\d.]+ [\d.]+, (\d+) interleaved rounds: ours ([\d.]+) ms, official ([\d.]+) ms, median "
                   r"per-round ratio ours/official ([\d.]+) \(95% CI ([\d.]+)-([\d.]+)\)$", re.M)


@pytest.fixture
def fake_checkout(tmp_path, monkeypatch):
    """make(kind) -> a checkout-shaped folder with stand-ins; the torch globals the loaders shim are restored."""
    undo_loader_shims(monkeypatch)

    def make(kind: str):
        return write_checkout(tmp_path, kind, FAKE_AGENT, FAKE_BUFFER)

    yield make
    for mod in ("utils", "utils.buffer", "tensorboard_logger"):
        sys.modules.pop(mod, None)


def seen_by(pair) -> dict:
    """The stand-in agent module's record."""
    return type(pair.official_agent).update.__globals__["SEEN"]


@pytest.mark.parametrize("task, batch, hidden", [("mpe-cn", 1024, 64), ("mamujoco-halfcheetah-2x3", 256, 256)])
def test_an_official_cfcql_round_is_main_pys_on_our_shapes(fake_checkout, task, batch, hidden):
    from plcql_bench.suite.runs import reference_speed

    pair = reference_speed.make_pair("cfcql", fake_checkout("cfcql"), task, buffer_size=2000)
    seen = seen_by(pair)
    assert seen["init"]["batch_size"] == batch and seen["init"]["hidden_dim"] == hidden  # our config's sizes
    assert seen["init"]["env_id"] == reference_speed.OFFICIAL_TASKS["cfcql"][task]
    assert seen["init"]["no_log"] is True and seen["init"]["cf_cql"] is True
    pair.rounds["official"]()
    pair.rounds["official"]()
    # main.py's loop: one critic + actor update, then 4 critic-only ones, each on its own batch; then the targets
    assert [c for _, c in seen["updates"]] == [False, True, True, True, True] * 2 and seen["targets"] == 2
    assert seen["batch_rows"] == [batch] * 10
    assert pair.batches == {"ours": 5, "official": 5}


def test_an_official_omar_round_updates_each_agent_on_its_own_batch(fake_checkout):
    from plcql_bench.suite.runs import reference_speed

    pair = reference_speed.make_pair("omar", fake_checkout("omar"), "mpe-cn", buffer_size=2000)
    seen = seen_by(pair)
    pair.rounds["official"]()
    assert seen["updates"] == [(0, False), (1, False), (2, False)] and seen["targets"] == 1
    assert seen["init"]["batch_size"] == 1024 and seen["init"]["hidden_dim"] == 64
    assert pair.batches == {"ours": 1, "official": 3}
    assert any("ONE that all agents' updates share" in d for d in pair.differences)


def test_bench_speed_official_prints_the_paired_ratio_and_the_differences(fake_checkout, monkeypatch):
    """The command's output: one ratio line per task (medians, ratio inside its interval), the sampling line, and
    the differences; the pair is timed with the runner's process settings."""
    from plcql_bench.suite.runs import reference_speed

    monkeypatch.setattr(reference_speed, "make_pair", _small(reference_speed.make_pair))
    res = CliRunner().invoke(cli, ["bench-speed", "--official-cfcql", str(fake_checkout("cfcql")), "--task", "mpe-cn",
                                   "--rounds", "4", "--warmup", "1", "--threads", "1", "--clock", "cpu"])
    assert res.exit_code == 0, res.output
    (code, task, shapes, rounds, ours, official, ratio, lo, hi), = RATIO.findall(res.output)
    assert (code, task, rounds) == ("CFCQL", "mpe-cn", "4") and "batch 1024, hidden 64" in shapes
    assert float(ours) > 0 and float(official) > 0 and float(lo) <= float(ratio) <= float(hi)
    assert re.search(r"sampling one batch, interleaved: ours [\d.]+ ms, official [\d.]+ ms; per round \(5 vs 5 "
                     r"batches\)", res.output)
    differs = [line for line in res.output.splitlines() if line.startswith("#   differs: ")]
    assert [d.split(":")[1].strip() for d in differs] == ["sampling", "batches per round", "logging", "arithmetic"]


def _small(make_pair):
    """make_pair with a 2,000-transition buffer (the default 100k is slow to fill in a test)."""
    return lambda code, path, task_id, seed=0, buffer_size=0: make_pair(code, path, task_id, seed, 2000)


@pytest.mark.parametrize("args, message", [
    (["--official-cfcql", "{omar}"], "--official-cfcql: {omar}: not a thu-rllab/CFCQL checkout (no "
                                     "continuous/algorithms/maddpg_cc.py or continuous/utils/buffer.py)"),
    (["--official-omar", "{cfcql}"], "--official-omar: {cfcql}: not a ling-pan/OMAR checkout (no "
                                     "algorithms/maddpg.py or utils/buffer.py)"),
    (["--official-omar", "{omar}", "--task", "mpe-pp"], "--official-omar: --task mpe-pp: the official OMAR round "
                                                        "is timed on mpe-cn only"),
    # both codes at once: the OMAR option's task is refused before the CFCQL rounds are timed (nothing printed)
    (["--official-cfcql", "{cfcql}", "--official-omar", "{omar}", "--task", "mamujoco-halfcheetah-2x3"],
     "--official-omar: --task mamujoco-halfcheetah-2x3: the official OMAR round is timed on mpe-cn only"),
    (["--official-cfcql", "{cfcql}", "--device", "cuda"], "--device cuda: the official rounds are timed on the "
                                                          "CPU only (their CUDA shims)"),
])
def test_a_wrong_checkout_or_task_is_one_line_and_exit_2(fake_checkout, args, message, monkeypatch, capsys):
    from plcql_bench.suite.commands.main import main

    paths = {"omar": str(fake_checkout("omar")), "cfcql": str(fake_checkout("cfcql"))}
    monkeypatch.setattr(sys, "argv", ["plcql-bench", "bench-speed", *[a.format(**paths) for a in args], "--rounds", "2"])
    with pytest.raises(SystemExit) as stop:
        main()
    out = capsys.readouterr()
    assert stop.value.code == 2 and out.out == ""
    assert out.err.strip().splitlines() == [f"error: {message.format(**paths)}"]


@pytest.mark.skipif(not (os.environ.get("PLCQL_OFFICIAL_CFCQL") and os.environ.get("PLCQL_OFFICIAL_OMAR")),
                    reason="set PLCQL_OFFICIAL_CFCQL and PLCQL_OFFICIAL_OMAR to checkouts of the reference code")
@pytest.mark.parametrize("option, env, task", [("--official-cfcql", "PLCQL_OFFICIAL_CFCQL", "mpe-cn"),
                                               ("--official-cfcql", "PLCQL_OFFICIAL_CFCQL", "mamujoco-halfcheetah-2x3"),
                                               ("--official-omar", "PLCQL_OFFICIAL_OMAR", "mpe-cn")])
def test_the_real_official_code_runs_against_ours(option, env, task):
    res = CliRunner().invoke(cli, ["bench-speed", option, os.environ[env], "--task", task, "--rounds", "2",
                                   "--warmup", "1", "--threads", "1", "--clock", "cpu"])
    assert res.exit_code == 0, res.output
    assert len(RATIO.findall(res.output)) == 1


def test_each_checkout_loads_its_own_utils_package(fake_checkout):
    """Both reference codes name their helpers `utils`: timing CFCQL and then OMAR in one process (one
    bench-speed call with both options) must not hand OMAR the CFCQL checkout's buffer."""
    from plcql_bench.suite.runs import reference_speed

    cfcql, omar = fake_checkout("cfcql"), fake_checkout("omar")
    _, cfcql_buffer = reference_speed.load_official_cfcql(cfcql)
    _, omar_buffer = reference_speed.load_official_omar(omar)
    assert cfcql_buffer.sample.__code__.co_filename == str(cfcql / "continuous" / "utils" / "buffer.py")
    assert omar_buffer.sample.__code__.co_filename == str(omar / "utils" / "buffer.py")
