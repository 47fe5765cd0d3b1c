"""Runner-level crash/resume for discrete-action runs (SMAX, episode batches, recurrent acting): a run
interrupted after a checkpoint and resumed ends bitwise equal to an uninterrupted one (score, final
evaluation, learning curve and metrics.jsonl). The continuous counterpart is tests/test_runner.py."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from crash import interrupt_on_call
from unit_runs import profile_with_dataset
import torch

from plcql_bench.suite.runs import runner
from plcql_bench.suite.runs.runner import Cell, execute, plan_run

pytest.importorskip("jaxmarl")

PROFILE = """
name: discreteresume
description: discrete crash/resume test
datasets: {episodes: {default: 8}}
train: {updates: {default: 6}, eval_every: 2, eval_episodes: 2, final_eval_episodes: 2, checkpoint_every: 2}
matrix: {algos: [bc, madtkd], tasks: [smax-2s3z], tiers: [medium], seeds: [0]}
algo_overrides: {batch_episodes: 4, hidden: 16, embed: 16, teacher_rounds: 3}
"""


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    
    tmp = tmp_path_factory.mktemp("discrete_resume")
    return profile_with_dataset(tmp, PROFILE, "smax-2s3z", "medium", 8)


def _plan(tmp: Path, profile, algo: str, results: str):
    return plan_run(Cell(algo, "smax-2s3z", "medium", 0), profile, tmp / "data", tmp / results)


@pytest.mark.parametrize("algo", ["bc", "madtkd"])
def test_discrete_resume_equals_uninterrupted_run(setup, monkeypatch, algo):
    tmp, profile = setup
    whole_plan = _plan(tmp, profile, algo, f"{algo}-a")
    whole = execute(whole_plan, log=lambda *_: None)
    assert whole["score_name"] == "win_rate" and [p["update"] for p in whole["curve"]] == [0, 2, 4, 6]

    plan = _plan(tmp, profile, algo, f"{algo}-b")
    assert plan.run_key == whole_plan.run_key
    cls = runner.get_algorithm(algo, discrete=True)
    assert cls.discrete is True and cls.batch_kind == "episodes"
    real_update = interrupt_on_call(monkeypatch, cls, "update", 5)  # after the checkpoint at update 4
    with pytest.raises(KeyboardInterrupt):
        execute(plan, log=lambda *_: None)
    assert not plan.final_path.exists() and (plan.run_dir / "ckpt.pt").exists()
    status = json.loads((plan.run_dir / "status.json").read_text())
    assert status["status"] == "interrupted" and "simulated crash" in status["error"]
    assert torch.load(plan.run_dir / "ckpt.pt", weights_only=False)["state"]["update"] == 4
    monkeypatch.setattr(cls, "update", real_update)

    logs: list[str] = []
    resumed = execute(plan, log=logs.append)
    assert any("from update 4" in line for line in logs)
    for key in ("score", "final_eval", "curve", "config", "run_key"):
        assert resumed[key] == whole[key], key
    a = (whole_plan.run_dir / "metrics.jsonl").read_bytes()
    assert a == (plan.run_dir / "metrics.jsonl").read_bytes()
    assert len(a.splitlines()) == 4 and b"train/" in a
