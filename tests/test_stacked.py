"""Seed stacks (algorithms/common/stacked.py, suite/runs/stacking.py, `all --stack S`): S seeds trained in one
process as stacked models give each seed its separate run's result, and the store keeps each seed a run
of its own.

Tolerance. A stacked seed differs from its separate run only in float summation order (batched matmuls
over seeds x members instead of members; per-seed clipping norms summed in another order). After a few
rounds in float32 that is ~1e-6 relative on the parameters (Adam divides each step by sqrt(v), so a
parameter with a near-zero gradient can move by up to lr x (relative error of its gradient)); we allow
rtol 1e-4 and atol 1e-5 on parameters and metrics, against the separate runs with the same (plain)
kernels. The fused kernels' own distance to the plain ones is tests/test_speed_equivalence.py's.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from crash import interrupt_on_call
from unit_runs import profile_with_dataset
import torch

from plcql_bench.algorithms.base import load_all, make_config
from plcql_bench.algorithms.common import kernels, rng
from plcql_bench.algorithms.common.speed import SyntheticBuffer
from plcql_bench.algorithms.common.stacked import SeedStack, stackable
from plcql_bench.suite.core.spec import TaskSpec
from plcql_bench.suite.runs.runner import Cell, execute, plan_run
from plcql_bench.suite.runs.stacking import execute_stack, stack_groups

torch.set_num_threads(1)

SPEC = TaskSpec("mpe-cn", "mpe", n_agents=3, obs_dim=6, state_dim=10, act_dim=2, discrete=False,
                episode_limit=25, tiers=("random",))
TINY = {"batch_size": 32, "hidden": 16}
SEEDS = (0, 1, 2)
TOL = {"rtol": 1e-4, "atol": 1e-5}


def _separate_and_stacked(name: str, rounds: int = 3, **over):
    cls = load_all()[name]
    cfg = make_config(cls, {**TINY, **over})
    with kernels.fused_kernels(False):
        separate = []
        for s in SEEDS:
            algo, buf = cls(SPEC, cfg, s), SyntheticBuffer(SPEC, 400, seed=10 + s)
            separate.append((algo, [algo.update(buf) for _ in range(rounds)]))
        stacked = [cls(SPEC, cfg, s) for s in SEEDS]
        stack = SeedStack(stacked)
        bufs = [SyntheticBuffer(SPEC, 400, seed=10 + s) for s in SEEDS]
        metrics = [stack.update(bufs) for _ in range(rounds)]
        stack.sync()
    return separate, stacked, metrics


@pytest.mark.parametrize("name, over", [
    ("cfcql", {}),
    ("cfcql", {"sample_action_class": "1-1-1", "other_action_jitter": 1e-3}),  # the HalfCheetah branch
    ("plcql", {}),
    ("plcql", {"replace_with": "target", "par_updates": "first-batch", "value_steps": 2}),
    ("plcql-uniform", {"par_reward": "lcb"}),
    ("plcql", {"critic_clip": "joint"}),  # the default is per-member
    ("macql", {}),
    ("spacql", {}),
])
def test_stacked_seeds_equal_their_separate_runs(name, over):
    separate, stacked, metrics = _separate_and_stacked(name, **over)
    for s, ((ref, ref_metrics), algo) in enumerate(zip(separate, stacked)):
        assert algo.rounds == ref.rounds == 3
        ref_sd, sd = ref.state_dict(), algo.state_dict()
        for key in ref.modules():  # parameters and buffers (the actors' running input statistics) of every net
            for p, (pname, q) in zip(ref_sd[key].values(), sd[key].items()):
                torch.testing.assert_close(q, p, **TOL, msg=f"seed {s} {key}.{pname}")
        for key in ref.optimisers():  # Adam moments and step counts
            for st_ref, st in zip(ref_sd[key]["state"].values(), sd[key]["state"].values()):
                for k in st_ref:
                    torch.testing.assert_close(st[k], st_ref[k], **TOL, msg=f"seed {s} {key} {k}")
        assert torch.equal(ref.gen.get_state(), algo.gen.get_state())  # the same draws, in the same number
        for r, ref_round in enumerate(ref_metrics):
            assert metrics[r][s].keys() == ref_round.keys()
            for k, v in ref_round.items():
                assert metrics[r][s][k] == pytest.approx(v, rel=TOL["rtol"], abs=TOL["atol"]), (s, r, k)


def test_seeds_of_a_stack_differ_and_resume_into_a_stack():
    """Seeds are not mixed: different seeds end with different parameters; a stack rebuilt from synced runs
    (their state_dicts, as a resume loads them) goes on exactly as the stack it came from."""
    cls = load_all()["plcql"]
    cfg = make_config(cls, TINY)
    algos = [cls(SPEC, cfg, s) for s in SEEDS]
    bufs = [SyntheticBuffer(SPEC, 400, seed=10 + s) for s in SEEDS]
    stack = SeedStack(algos)
    stack.update(bufs)
    stack.sync()
    copies = [cls(SPEC, cfg, s) for s in SEEDS]
    for c, a in zip(copies, algos):
        c.load_state_dict(a.state_dict())
    buf_states = [b.g.get_state() for b in bufs]
    going_on = stack.update(bufs)
    for b, st in zip(bufs, buf_states):
        b.g.set_state(st)
    resumed = SeedStack(copies).update(bufs)
    assert going_on == resumed
    w = [a.critic.l1.weight for a in algos]
    assert not torch.equal(w[0], w[1]) and not torch.equal(w[1], w[2])


def test_rng_draws_per_seed_equal_plain_draws():
    gens = [torch.Generator().manual_seed(s) for s in SEEDS]
    refs = [torch.Generator().manual_seed(s) for s in SEEDS]
    probs = torch.softmax(torch.randn(3, 5, 4), -1)

    def one_seed(p):
        return rng.rand(seeded, 2, 3), rng.randn(seeded, 4), rng.categorical(seeded, p)

    seeded = rng.SeedGenerators(gens)
    u, n, k = torch.func.vmap(one_seed)(probs)
    for s, g in enumerate(refs):
        assert torch.equal(u[s], rng.rand(g, 2, 3))
        assert torch.equal(n[s], rng.randn(g, 4))
        assert torch.equal(k[s], rng.categorical(g, probs[s]))


def test_stackable_is_the_continuous_cfcql_family():
    reg = load_all()
    assert all(stackable(reg[n]) for n in ("cfcql", "macql", "spacql", "plcql", "plcql-k1"))
    from plcql_bench.algorithms.base import get_algorithm

    assert not stackable(reg["bc"]) and not stackable(reg["omar"])
    assert not stackable(get_algorithm("plcql", discrete=True))

    class OwnRound(reg["cfcql"]):  # a round the stack does not know is refused, not stacked wrongly
        def update(self, sample):
            return super().update(sample)

    assert not stackable(OwnRound)
    with pytest.raises(ValueError, match="no stacked round"):
        SeedStack([OwnRound(SPEC, make_config(OwnRound, TINY), 0)])


# -- the store: one run per seed -------------------------------------------------------------------------

PROFILE = """
name: unit
description: seed stacks
datasets: {episodes: {default: 6}}
train: {updates: {default: 6}, eval_every: 2, eval_episodes: 2, final_eval_episodes: 2, checkpoint_every: 2}
matrix: {algos: [cfcql, bc], tasks: [mpe-cn], tiers: [random], seeds: [0, 1, 2]}
algo_overrides: {batch_size: 64}
"""


@pytest.fixture()
def setup(tmp_path: Path):
    return profile_with_dataset(tmp_path, PROFILE)


def _plans(tmp: Path, profile, results: str, seeds=SEEDS, algo="cfcql"):
    return [plan_run(Cell(algo, "mpe-cn", "random", s), profile, tmp / "data", tmp / results) for s in seeds]


def _quiet(n):
    return [lambda *_: None] * n


def _close_results(a: dict, b: dict) -> None:
    assert a["run_key"] == b["run_key"] and a["seed"] == b["seed"]
    assert [p["update"] for p in a["curve"]] == [p["update"] for p in b["curve"]]
    for p, q in zip(a["curve"], b["curve"]):
        assert p["return_mean"] == pytest.approx(q["return_mean"], rel=1e-4)
    assert a["score"] == pytest.approx(b["score"], rel=1e-3, abs=1e-3)


def test_stack_writes_one_run_per_seed_equal_to_separate_runs(setup):
    tmp, profile = setup
    with kernels.fused_kernels(False):
        separate = [execute(p, log=lambda *_: None) for p in _plans(tmp, profile, "a")]
    plans = _plans(tmp, profile, "b")
    outcomes = execute_stack(plans, logs=_quiet(3))
    assert [o["state"] for o in outcomes] == ["trained"] * 3
    for plan, sep_plan, ref in zip(plans, _plans(tmp, profile, "a"), separate):
        assert plan.is_done()  # a valid final.json of this very run (its own key)
        assert plan.run_key == ref["run_key"]  # stacking is not part of the key
        assert plan.run_dir.relative_to(tmp / "b") == sep_plan.run_dir.relative_to(tmp / "a")
        _close_results(json.loads(plan.final_path.read_text()), ref)
        lines = (plan.run_dir / "metrics.jsonl").read_text().splitlines()
        assert [json.loads(x)["update"] for x in lines] == [0, 2, 4, 6]
    assert len({p.run_dir for p in plans}) == 3


def _interrupt_stack_at_update_4(tmp: Path, profile, results: str, monkeypatch) -> list:
    plans = _plans(tmp, profile, results)
    real = interrupt_on_call(monkeypatch, SeedStack, "update", 5)
    with pytest.raises(KeyboardInterrupt):
        execute_stack(plans, logs=_quiet(3))
    monkeypatch.setattr(SeedStack, "update", real)
    for plan in plans:
        status = json.loads((plan.run_dir / "status.json").read_text())
        assert status["status"] == "interrupted" and status["update"] == 4 and status["reached"] == 4
        assert not plan.final_path.exists()
    return plans


def test_interrupted_stack_resumes_to_the_uninterrupted_result(setup, monkeypatch):
    """Resumed as the same stack, each seed ends bitwise as the uninterrupted stack (same shapes, same
    summation order). Resumed as a separate run, a seed is close to it but not bitwise: a stack of another
    size may take another matmul kernel (CI once saw a 2e-10 relative difference), hence _close_results."""
    tmp, profile = setup
    whole = [o["result"] for o in execute_stack(_plans(tmp, profile, "a"), logs=_quiet(3))]
    plans = _interrupt_stack_at_update_4(tmp, profile, "b", monkeypatch)
    outcomes = execute_stack(plans, logs=_quiet(3))
    assert [o["state"] for o in outcomes] == ["trained"] * 3
    for a, o, plan in zip(whole, outcomes, plans):
        b = o["result"]
        assert a["score"] == b["score"] and a["curve"] == b["curve"]
        assert (plan.run_dir / "metrics.jsonl").read_text() == \
            (tmp / "a" / plan.run_dir.relative_to(tmp / "b") / "metrics.jsonl").read_text()
    alone_plans = _interrupt_stack_at_update_4(tmp, profile, "c", monkeypatch)
    with kernels.fused_kernels(False):  # a stacked run's checkpoint resumes as a separate run as well
        alone = execute(alone_plans[0], log=lambda *_: None)
    _close_results(alone, whole[0])
    outcomes = execute_stack(alone_plans, logs=_quiet(3))  # the rest resume as a smaller stack
    assert [o["state"] for o in outcomes] == ["skipped", "trained", "trained"]
    for a, o in list(zip(whole, outcomes))[1:]:
        _close_results(o["result"], a)


def test_finished_seeds_skipped_and_seeds_at_different_rounds(setup, monkeypatch):
    """Seed 0 done, seed 1 interrupted at its checkpoint of round 2, seed 2 not started: seed 0 is skipped,
    seeds 1 and 2 train (one stack per round reached) and each ends as its separate run."""
    tmp, profile = setup
    with kernels.fused_kernels(False):
        separate = [execute(p, log=lambda *_: None) for p in _plans(tmp, profile, "a")]
        plans = _plans(tmp, profile, "b")
        execute(plans[0], log=lambda *_: None)
        cls = load_all()["cfcql"]
        real = interrupt_on_call(monkeypatch, cls, "update", 3)
        with pytest.raises(KeyboardInterrupt):
            execute(plans[1], log=lambda *_: None)
        monkeypatch.setattr(cls, "update", real)
    done_before = plans[0].final_path.read_text()
    logs = {s: [] for s in SEEDS}
    outcomes = execute_stack(plans, logs=[logs[s].append for s in SEEDS])
    assert [o["state"] for o in outcomes] == ["skipped", "trained", "trained"]
    assert plans[0].final_path.read_text() == done_before and not logs[0]
    assert any("resuming" in line and "update 2" in line for line in logs[1])
    for plan, ref in zip(plans, separate):
        _close_results(json.loads(plan.final_path.read_text()), ref)


def test_stack_groups_keep_other_algorithms_alone(setup):
    _, profile = setup
    cells = [Cell(a, "mpe-cn", "random", s) for a in ("cfcql", "bc") for s in (0, 1, 2, 3)]
    groups = stack_groups(cells, 3)
    assert [[c.seed for c in g] for g in groups] == [[0, 1, 2], [3], [0], [1], [2], [3]]
    assert [g[0].algo for g in groups] == ["cfcql", "cfcql", "bc", "bc", "bc", "bc"]
    assert stack_groups(cells, 1) == [[c] for c in cells]


def test_all_with_stack_trains_each_seed_as_its_own_run(setup):
    from click.testing import CliRunner

    from plcql_bench.suite.commands.main import cli

    tmp, profile = setup
    args = ["--data-dir", str(tmp / "data"), "--results-dir", str(tmp / "results"), "all", "--profile",
            str(tmp / "p.yaml"), "--jobs", "1", "--stack", "3", "--only", "algo=cfcql", "--only", "seed=0,1,2"]
    res = CliRunner().invoke(cli, args)
    assert res.exit_code == 0, res.output
    assert "trained 3" in res.output
    assert "note: --stack 3 on a CPU" in res.output  # said, and the runs still train
    for plan in _plans(tmp, profile, "results"):
        assert plan.is_done()
        assert "stacked with seeds 0, 1, 2" in (plan.run_dir / "run.log").read_text()
    again = CliRunner().invoke(cli, args)
    assert again.exit_code == 0 and "skipped 3 (done)" in again.output


def test_a_seed_that_cannot_start_fails_alone(setup, monkeypatch):
    """Seed 1's construction raises: its status says failed (as a separate run's would), seed 0, already
    started, says interrupted (resumable), and nothing is recorded as done."""
    tmp, profile = setup
    plans = _plans(tmp, profile, "b", seeds=(0, 1))
    cls = load_all()["cfcql"]
    real_init = cls.__init__

    def init_fails_for_seed_1(self, spec, config, seed, device="cpu"):
        if seed == 1:
            raise ValueError("simulated bad seed")
        real_init(self, spec, config, seed, device)

    monkeypatch.setattr(cls, "__init__", init_fails_for_seed_1)
    with pytest.raises(ValueError, match="simulated bad seed"):
        execute_stack(plans, logs=_quiet(2))
    states = [json.loads((p.run_dir / "status.json").read_text())["status"] for p in plans]
    assert states == ["interrupted", "failed"]
    assert not any(p.final_path.exists() for p in plans)


def test_a_stacked_run_records_its_evaluation_seconds_with_the_final_one(setup, monkeypatch):
    """Each seed of a stack counts its own evaluations in train.eval_s, the final evaluation included."""
    import time

    from plcql_bench.suite.runs import runner

    tmp, profile = setup
    real = runner.evaluate_policy
    monkeypatch.setattr(runner, "evaluate_policy", lambda *a: (time.sleep(0.1), real(*a))[1])
    execute_stack(_plans(tmp, profile, "b"), logs=_quiet(3))
    for plan in _plans(tmp, profile, "b"):
        train = json.loads(plan.final_path.read_text())["train"]
        assert 5 * 0.1 <= train["eval_s"] < train["wall_clock_s"]  # updates 0, 2, 4, 6 and the final one
