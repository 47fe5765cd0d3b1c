"""A stop (SIGINT/SIGTERM) during training: the round finishes, every run checkpoints at that round, even
between evaluation points, and resumes to the uninterrupted result, training metrics included."""

from __future__ import annotations

import json
import signal
from pathlib import Path

import pytest
from crash import signal_on_call
from unit_runs import profile_with_dataset

from plcql_bench.algorithms.common.stacked import SeedStack
from plcql_bench.suite.runs import runner
from plcql_bench.suite.core import stop
from plcql_bench.suite.runs.executors import restore_interrupts
from plcql_bench.suite.runs.runner import Cell, execute, plan_run
from plcql_bench.suite.runs.stacking import execute_stack

# Evaluations and checkpoints every 2 rounds: a stop in round 5 falls between them.
PROFILE = """
name: unit
description: graceful stop tests
datasets: {episodes: {default: 6}}
train: {updates: {default: 8}, eval_every: 2, eval_episodes: 2, final_eval_episodes: 2, checkpoint_every: 2}
matrix: {algos: [cfcql, plcql], tasks: [mpe-cn], tiers: [random], seeds: [0, 1]}
algo_overrides: {batch_size: 64}
"""


@pytest.fixture()
def setup(tmp_path: Path):
    return profile_with_dataset(tmp_path, PROFILE)


@pytest.fixture()
def handlers():
    """The suite's SIGINT/SIGTERM handlers, as the CLI installs them; the old ones put back afterwards."""
    saved = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    restore_interrupts()
    yield
    for s, h in saved.items():
        signal.signal(s, h)


def _plan(tmp: Path, profile, algo: str, results: str, seed: int = 0):
    return plan_run(Cell(algo, "mpe-cn", "random", seed), profile, tmp / "data", tmp / results)


def _metrics(plan) -> str:
    return (plan.run_dir / "metrics.jsonl").read_text()


# -- the decision ---------------------------------------------------------------------------------------

def test_outside_a_training_loop_a_signal_stops_at_once():
    with stop.at_round_end():
        pass  # a fresh state
    with pytest.raises(KeyboardInterrupt, match="signal 2"):
        stop.on_signal(2, now=1000.0)


def test_in_a_loop_the_first_signal_defers_repeats_are_ignored_a_later_one_stops():
    with stop.at_round_end():
        assert not stop.requested()
        stop.on_signal(2, now=100.0)  # deferred
        assert stop.requested()
        stop.on_signal(2, now=100.0 + stop.REPEAT_S / 2)  # the same stop again (group signal + forwarded)
        with pytest.raises(KeyboardInterrupt):
            stop.on_signal(15, now=100.0 + 2 * stop.REPEAT_S)  # impatience: now
    stop.on_signal(2, now=100.0 + 2 * stop.REPEAT_S + 0.1)  # a repeat while the loop's stop unwinds
    assert not stop.requested()  # no loop open
    with stop.at_round_end():  # the next loop starts clean
        assert not stop.requested()
        assert "round 7" in str(stop.stopped(7))


# -- a run -----------------------------------------------------------------------------------------------

@pytest.mark.parametrize("algo", ["cfcql", "plcql"])
@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_a_stop_mid_round_checkpoints_that_round_and_resumes_to_the_same_run(setup, handlers, monkeypatch,
                                                                                algo, signum):
    tmp, profile = setup
    whole_plan = _plan(tmp, profile, algo, "a")
    whole = execute(whole_plan, log=lambda *_: None)

    plan = _plan(tmp, profile, algo, "b")
    cls = runner.get_algorithm(algo)
    real = signal_on_call(monkeypatch, cls, "update", 5, signum)
    with pytest.raises(KeyboardInterrupt, match="end of round 5"):
        execute(plan, log=lambda *_: None)
    status = json.loads((plan.run_dir / "status.json").read_text())
    assert status["status"] == "interrupted" and status["update"] == 5 and status["reached"] == 5
    assert not plan.final_path.exists()
    monkeypatch.setattr(cls, "update", real)

    logs: list[str] = []
    resumed = execute(plan, log=logs.append)
    assert any("from update 5" in line for line in logs)
    for key in ("score", "final_eval", "curve"):
        assert resumed[key] == whole[key], key
    assert _metrics(plan) == _metrics(whole_plan)  # round 5's training metrics reached the point at 6


def test_a_stop_in_the_last_round_resumes_straight_to_the_final_evaluation(setup, handlers, monkeypatch):
    tmp, profile = setup
    whole = execute(_plan(tmp, profile, "cfcql", "a"), log=lambda *_: None)
    plan = _plan(tmp, profile, "cfcql", "b")
    cls = runner.get_algorithm("cfcql")
    real = signal_on_call(monkeypatch, cls, "update", 8)
    with pytest.raises(KeyboardInterrupt, match="end of round 8"):
        execute(plan, log=lambda *_: None)
    monkeypatch.setattr(cls, "update", real)
    resumed = execute(plan, log=lambda *_: None)
    assert resumed["score"] == whole["score"] and resumed["curve"] == whole["curve"]


# -- a seed stack ------------------------------------------------------------------------------------------

def test_a_stop_mid_round_checkpoints_every_seed_of_a_stack(setup, handlers, monkeypatch):
    tmp, profile = setup
    whole_plans = [_plan(tmp, profile, "cfcql", "a", s) for s in (0, 1)]
    whole = [o["result"] for o in execute_stack(whole_plans, logs=[lambda *_: None] * 2)]
    plans = [_plan(tmp, profile, "cfcql", "b", s) for s in (0, 1)]
    real = signal_on_call(monkeypatch, SeedStack, "update", 3)
    with pytest.raises(KeyboardInterrupt, match="end of round 3"):
        execute_stack(plans, logs=[lambda *_: None] * 2)
    for plan in plans:
        status = json.loads((plan.run_dir / "status.json").read_text())
        assert status["status"] == "interrupted" and status["update"] == 3 and status["reached"] == 3
    monkeypatch.setattr(SeedStack, "update", real)
    outcomes = execute_stack(plans, logs=[lambda *_: None] * 2)
    for a, o, plan, whole_plan in zip(whole, outcomes, plans, whole_plans):
        assert o["state"] == "trained"
        assert o["result"]["score"] == a["score"] and o["result"]["curve"] == a["curve"]
        assert _metrics(plan) == _metrics(whole_plan)


def test_a_resumed_runs_outcome_line_gives_its_whole_training_time(setup, handlers, monkeypatch):
    """`all` prints a run's seconds in this process; a resumed run's line adds its training time in all, the
    part before the checkpoint included (here 5 rounds slowed to 0.4 s each)."""
    import time

    from plcql_bench.suite.commands.runs import outcome_line
    from plcql_bench.suite.runs.executors import Job, run_job

    tmp, profile = setup
    plan = _plan(tmp, profile, "cfcql", "b")
    cls = runner.get_algorithm("cfcql")
    real = cls.update

    def slow(self, *args, **kwargs):
        time.sleep(0.4)
        return real(self, *args, **kwargs)

    monkeypatch.setattr(cls, "update", slow)
    signal_on_call(monkeypatch, cls, "update", 5)
    with pytest.raises(KeyboardInterrupt, match="end of round 5"):
        execute(plan, log=lambda *_: None)
    monkeypatch.setattr(cls, "update", real)
    out = run_job(Job(plan.cell, profile, tmp / "data", tmp / "b"))
    assert out["state"] == "trained", out["error"]
    assert out["resumed"] and out["run_seconds"] > 2.0
    assert outcome_line(out).endswith(f"({out['seconds']:.1f}s; resumed, {out['run_seconds']:.1f}s training in all)")
    fresh = run_job(Job(plan.cell, profile, tmp / "data", tmp / "c"))
    # A fresh run's training time is this process's alone (no wall-clock bound: the machine may be loaded).
    assert fresh["state"] == "trained" and not fresh["resumed"] and fresh["run_seconds"] <= fresh["seconds"]
    assert outcome_line(fresh).endswith(f"({fresh['seconds']:.1f}s)")
