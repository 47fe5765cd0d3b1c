"""`all` and its datasets: medium-replay builds from the committed checkpoint sequence on a fresh
data dir, and a dataset that cannot be built fails only its own cells (cause and fix in
status.json) while the others train."""

from __future__ import annotations

import json
from pathlib import Path

from click.testing import CliRunner

from plcql_bench.datasets import matd3
from plcql_bench.suite.cli import cli

PROFILE = """
name: dstest
description: datasets in all
datasets: {episodes: {default: 8}}
train: {updates: {default: 2}, eval_every: 2, eval_episodes: 1, final_eval_episodes: 2, checkpoint_every: 2}
matrix: {algos: [bc], tasks: [mpe-cn], tiers: [random, medium-replay], seeds: [0]}
algo_overrides: {batch_size: 32, hidden: 32}
"""


def _invoke(tmp: Path, *args: str):
    return CliRunner().invoke(cli, ["--data-dir", str(tmp / "data"), "--results-dir", str(tmp / "results"),
                                    *args], catch_exceptions=False)


def _profile(tmp: Path) -> str:
    (tmp / "p.yaml").write_text(PROFILE)
    return str(tmp / "p.yaml")


def test_medium_replay_builds_from_committed_checkpoints_and_trains(tmp_path, monkeypatch):
    monkeypatch.delenv(matd3.BEHAVIOUR_DIR_ENV, raising=False)  # the committed assets
    result = _invoke(tmp_path, "all", "--profile", _profile(tmp_path), "--only", "dataset=medium-replay")
    assert result.exit_code == 0, result.output
    assert "building dataset mpe-cn/medium-replay" in result.output
    assert "trained 1, skipped 0 (done), failed 0" in result.output
    entry = json.loads((tmp_path / "data" / "dstest" / "manifest.json").read_text())["mpe-cn/medium-replay"]
    assert entry["behaviour_policy_id"].startswith("matd3:mpe-cn/replay-rollout-to-120000@")
    assert entry["n_episodes"] == 8 and entry["n_transitions"] == 8 * 25
    final = json.loads(next((tmp_path / "results").rglob("final.json")).read_text())
    assert final["dataset"] == "medium-replay" and final["dataset_sha256"] == entry["sha256"]


def test_unbuildable_dataset_fails_only_its_cells(tmp_path, monkeypatch):
    # No MATD3 assets: random falls back to the uniform policy, medium-replay has no behaviour.
    monkeypatch.setenv(matd3.BEHAVIOUR_DIR_ENV, str(tmp_path / "no-assets"))
    result = _invoke(tmp_path, "all", "--profile", _profile(tmp_path))
    assert result.exit_code == 1, result.output
    assert "trained 1, skipped 0 (done), failed 1 (1 without their dataset)" in result.output
    assert "1 cell(s) failed: dataset mpe-cn/medium-replay could not be built" in result.output
    assert "datasets train-behaviour mpe-cn" in result.output  # the fix is named

    done = json.loads(next((tmp_path / "results").rglob("random/seed0-*/final.json")).read_text())
    assert done["status"] == "done"
    stand_in = next((tmp_path / "results").rglob("medium-replay/seed0-no-dataset"))
    status = json.loads((stand_in / "status.json").read_text())
    assert status["status"] == "failed" and "no trained MATD3 behaviour policy" in status["cause"]
    assert status["fix"].startswith("plcql-bench datasets train-behaviour mpe-cn")
    table = _invoke(tmp_path, "status").output
    assert "2 runs: done 1, failed 1" in table and "could not be built" in table

    # With the behaviour back, the next `all` builds it, trains the cell and drops the stand-in.
    monkeypatch.delenv(matd3.BEHAVIOUR_DIR_ENV)
    again = _invoke(tmp_path, "all", "--profile", _profile(tmp_path), "--only", "dataset=medium-replay")
    assert again.exit_code == 0, again.output
    assert "trained 1, skipped 0 (done), failed 0" in again.output
    assert not stand_in.exists()


def test_plan_names_the_fix_for_a_dataset_nothing_can_build(tmp_path, monkeypatch):
    monkeypatch.setenv(matd3.BEHAVIOUR_DIR_ENV, str(tmp_path / "no-assets"))
    out = _invoke(tmp_path, "plan", "--profile", _profile(tmp_path)).output
    lines = {line.split()[2]: line for line in out.splitlines() if line.startswith("bc ")}
    assert "dataset not built yet (all builds it)" in lines["random"]
    assert "cannot be built" in lines["medium-replay"] and "train-behaviour mpe-cn" in lines["medium-replay"]


def test_a_missing_extra_names_the_pip_extra():
    from plcql_bench.suite.preflight import diagnose

    p = diagnose("smax-2s3z", "medium", ModuleNotFoundError("No module named 'jax'"), "paper")
    assert "No module named 'jax'" in p.cause and "plcql-bench[smax]" in p.fix
    p = diagnose("mamujoco-halfcheetah-2x3", "expert", ModuleNotFoundError("No module named 'mujoco'"), "paper")
    assert "plcql-bench[mamujoco]" in p.fix
    p = diagnose("mpe-cn", "expert", RuntimeError("disk full"), "paper")
    assert p.cause == "RuntimeError: disk full" and "datasets build mpe-cn expert --profile paper" in p.fix


def test_every_continuous_task_commits_its_medium_replay_sequence():
    """MPE and Half-Cheetah medium-replay rebuild anywhere: each index names a checkpoint sequence
    (no local replay file) whose checkpoints are all committed."""
    root = Path(matd3.__file__).resolve().parent / "assets" / "behaviour"
    for task in ("mpe-cn", "mpe-pp", "mpe-world", "mamujoco-halfcheetah-2x3"):
        recipe = json.loads((root / task / "index.json").read_text())["medium_replay"]
        assert "file" not in recipe and recipe["parts"], task
        assert sum(p["episodes"] for p in recipe["parts"]) == recipe["episodes"], task
        for part in recipe["parts"]:
            if "checkpoint" in part:
                assert (root / task / part["checkpoint"]).is_file(), (task, part["checkpoint"])
