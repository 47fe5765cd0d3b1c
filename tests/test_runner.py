"""Runner: run identity, resume from a checkpoint, failure records, profile overrides."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from crash import interrupt_on_call
from unit_runs import profile_with_dataset

from plcql_bench.suite.runs import runner
from plcql_bench.suite.core.errors import BenchError
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
