"""Runner: run identity, resume from a checkpoint, failure records, profile overrides."""

from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from crash import interrupt_on_call
from unit_runs import profile_with_dataset

from plcql_bench.algorithms.base import get_algorithm, make_config
from plcql_bench.suite.runs import runner
from plcql_bench.suite.core.errors import BenchError
from plcql_bench.suite.envs import protocol
from plcql_bench.suite.envs.tasks import get_task
from plcql_bench.suite.runs.runner import Cell, execute, plan_run

PROFILE = """
name: unit
description: runner unit tests
datasets: {episodes: {default: 6}}
train: {updates: {default: 6}, eval_every: 2, eval_episodes: 2, final_eval_episodes: 2, checkpoint_every: 2}
matrix: {algos: [cfcql], tasks: [mpe-cn], tiers: [random], seeds: [0]}
algo_overrides: {batch_size: 64, teacher_rounds: 5}  # teacher_rounds: MADTKD only
"""


@pytest.fixture()
def setup(tmp_path: Path):
    return profile_with_dataset(tmp_path, PROFILE)


def _plan(tmp: Path, profile, algo="cfcql", seed=0, results="results", **over):
    return plan_run(Cell(algo, "mpe-cn", "random", seed), profile, tmp / "data", tmp / results, over)


def test_profile_overrides_apply_only_to_known_fields(setup):
    tmp, profile = setup
    assert _plan(tmp, profile).config.batch_size == 64
    assert _plan(tmp, profile, batch_size=32).config.batch_size == 32  # --set beats the profile


def test_run_key_depends_on_content(setup):
    tmp, profile = setup
    base = _plan(tmp, profile)
    assert base.run_key == _plan(tmp, profile).run_key
    assert base.run_key != _plan(tmp, profile, seed=1).run_key
    assert base.run_key != _plan(tmp, profile, lr=0.5).run_key
    assert base.run_dir != _plan(tmp, profile, lr=0.5).run_dir


def test_unknown_config_field_is_a_user_error(setup):
    tmp, profile = setup
    with pytest.raises(BenchError, match="unknown config field"):
        _plan(tmp, profile, learning_rate_typo=1)


def test_resume_from_checkpoint_equals_uninterrupted_run(setup, monkeypatch):
    tmp, profile = setup
    whole = execute(_plan(tmp, profile, results="a"), log=lambda *_: None)

    plan = _plan(tmp, profile, results="b")
    real_update = interrupt_on_call(monkeypatch, runner.get_algorithm("cfcql"), "update", 5)
    with pytest.raises(KeyboardInterrupt):
        execute(plan, log=lambda *_: None)
    assert not plan.final_path.exists()
    status = json.loads((plan.run_dir / "status.json").read_text())
    assert status["status"] == "interrupted" and "simulated crash" in status["error"]
    monkeypatch.setattr(runner.get_algorithm("cfcql"), "update", real_update)

    logs: list[str] = []
    resumed = execute(plan, log=logs.append)
    assert any("from update 4" in line for line in logs)
    for key in ("score", "final_eval", "curve"):
        assert resumed[key] == whole[key], key


def test_corrupt_dataset_leaves_no_run_directory(setup):
    tmp, profile = setup
    plan = _plan(tmp, profile)
    plan.dataset_path.write_bytes(plan.dataset_path.read_bytes()[:100])
    with pytest.raises(Exception, match="random.h5"):
        execute(plan, log=lambda *_: None)
    assert not plan.run_dir.exists()


def test_final_json_records_the_kernels_outside_the_run_key(setup, monkeypatch):
    """The kernel choice (PLCQL_KERNELS, PLCQL_NATIVE) is in final.json's hardware record; the run key, which
    names the result, is the same whichever form ran."""
    tmp, profile = setup
    choices, keys = {}, set()
    for results, env in (("a", {}), ("b", {"PLCQL_KERNELS": "plain"}), ("c", {"PLCQL_NATIVE": "0"})):
        for name in ("PLCQL_KERNELS", "PLCQL_NATIVE"):
            monkeypatch.delenv(name, raising=False)
        for name, value in env.items():
            monkeypatch.setenv(name, value)
        plan = _plan(tmp, profile, results=results)
        logs: list[str] = []
        out = execute(plan, log=logs.append)
        choices[results] = out["hardware"]["kernels"]["choice"]
        assert json.loads(plan.final_path.read_text())["hardware"]["kernels"] == out["hardware"]["kernels"]
        assert any(f"kernels {choices[results]}" in line for line in logs)
        keys.add(plan.run_key)
    assert choices == {"a": "native", "b": "plain", "c": "fused"} and len(keys) == 1


def _slow_evaluations(monkeypatch, seconds: float) -> list:
    """runner.evaluate_policy made `seconds` slower; returns the episode counts it is called with."""
    calls, real = [], runner.evaluate_policy

    def slow(task, algo, dataset, episodes):
        calls.append(episodes)
        time.sleep(seconds)
        return real(task, algo, dataset, episodes)

    monkeypatch.setattr(runner, "evaluate_policy", slow)
    return calls


def test_a_run_records_its_evaluation_seconds(setup, monkeypatch):
    """final.json's train.eval_s: the seconds of every evaluation point and of the final evaluation (what the
    campaign's evaluation share is read from); the evaluation points are inside train_s."""
    tmp, profile = setup
    calls = _slow_evaluations(monkeypatch, 0.2)
    result = execute(_plan(tmp, profile), log=lambda *_: None)
    train = result["train"]
    assert calls == [2, 2, 2, 2, 2]  # updates 0, 2, 4, 6 and the final evaluation
    assert 5 * 0.2 <= train["eval_s"] < train["wall_clock_s"]
    assert train["train_s"] >= 4 * 0.2  # the evaluation points are part of the training loop's time


def test_a_run_resumed_from_a_checkpoint_without_eval_seconds_records_none(setup, monkeypatch):
    """A checkpoint written before eval_s was counted: the resumed run cannot know its earlier evaluations'
    time, so it records no eval_s rather than a part of it."""
    tmp, profile = setup
    plan = _plan(tmp, profile)
    real = runner._checkpoint

    def old_style(plan_, algo, sampler, state, pending):  # a checkpoint as older suites wrote it
        real(plan_, algo, sampler, {k: v for k, v in state.items() if k != "eval_s"}, pending)
        raise KeyboardInterrupt

    monkeypatch.setattr(runner, "_checkpoint", old_style)
    with pytest.raises(KeyboardInterrupt):
        execute(plan, log=lambda *_: None)
    monkeypatch.setattr(runner, "_checkpoint", real)
    assert "eval_s" not in torch.load(plan.run_dir / "ckpt.pt", weights_only=False)["state"]
    result = execute(_plan(tmp, profile), log=lambda *_: None)
    assert result["train"]["updates"] == 6 and "eval_s" not in result["train"]


@pytest.mark.parametrize("algo", ["bc", "cfcql", "iql"])
def test_evaluation_in_evaluation_mode_once_gives_the_per_step_switchs_returns(algo, monkeypatch):
    """runner.evaluate_policy puts the actors in evaluation mode once for the whole evaluation instead of at
    every act(): the same episodes and seeds give bitwise the same returns as act() switching it per step, and
    the actors' training mode is restored after it (also when the evaluation fails)."""
    task = get_task("mpe-cn")
    cls = get_algorithm(algo)
    torch.manual_seed(0)
    model = cls(task.spec, make_config(cls, {}), 0, "cpu")
    with torch.no_grad():  # running statistics unlike the fresh ones, so the mode matters
        model.actors.mlp.norm.running_mean.add_(0.5)
    dataset = type("D", (), {"attrs": {}})()
    per_step = protocol.rollout_returns(task, lambda s: model.act(s.obs, s.avail), protocol.eval_seeds(6))["returns"]
    assert model.actors.training
    once = runner.evaluate_policy(task, model, dataset, 6)["episode_returns"]
    assert model.actors.training
    assert once == [float(r) for r in per_step]
    in_training_mode = protocol.rollout_returns(task, lambda s: model.actors(torch.as_tensor(s.obs)).clamp(-1, 1)
                                                .detach().numpy(), protocol.eval_seeds(6))["returns"]
    assert not np.array_equal(in_training_mode, per_step)  # the mode changes the actions: the check can fail

    def broken(*a, **k):
        raise RuntimeError("env died")

    monkeypatch.setattr(protocol, "rollout_returns", broken)
    with pytest.raises(RuntimeError):
        runner.evaluate_policy(task, model, dataset, 6)
    assert model.actors.training
