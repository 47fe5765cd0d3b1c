"""`all` and its datasets: medium-replay builds from the committed checkpoint sequence on a fresh
data dir, and a dataset that cannot be built fails only its own cells (cause and fix in
status.json) while the others train."""

from __future__ import annotations

import json
from pathlib import Path

from click.testing import CliRunner

from plcql_bench.datasets import matd3
from plcql_bench.suite.commands.main import cli

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
    assert "built dataset mpe-cn/medium-replay in " in result.output  # the build's end is said too
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
    from plcql_bench.suite.runs.preflight import diagnose

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


def test_a_missing_dataset_is_built_just_before_its_first_cell_trains(tmp_path, monkeypatch):
    """`all` does not build every missing dataset up front: the first cell trains before the second
    cell's dataset is built, so a long queue starts training at once."""
    monkeypatch.delenv(matd3.BEHAVIOUR_DIR_ENV, raising=False)
    result = _invoke(tmp_path, "all", "--profile", _profile(tmp_path), "--jobs", "1")
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert "2 dataset(s) not built yet: each is built just before its first cell trains" in lines
    order = [i for i, line in enumerate(lines)
             if line.startswith("building dataset") or (line.startswith("bc ") and ": score " in line)]
    kinds = [lines[i].split()[0] for i in order]
    assert kinds == ["building", "bc", "building", "bc"], lines  # built, trained, built, trained
    again = _invoke(tmp_path, "all", "--profile", _profile(tmp_path), "--jobs", "1")
    assert "building dataset" not in again.output and "skipped 2 (done)" in again.output


def test_ensure_dataset_builds_once_under_its_lock_and_remembers_a_failure_per_all(tmp_path):
    """Several workers that need the same missing dataset: one builds it, the others wait and find it.
    A build that fails is not tried again by the same `all` (its token), but is by the next one."""
    import threading
    import time

    from plcql_bench.datasets import manifest
    from plcql_bench.suite.runs import preflight
    from plcql_bench.suite.runs.profiles import load_profile

    prof = load_profile(_profile(tmp_path))
    root = tmp_path / "data" / prof.data_profile
    calls = []

    def fake_build(task, tier, episodes, data_root, profile, **_):
        calls.append((task, tier))
        time.sleep(0.3)  # the other thread reaches the lock meanwhile
        (data_root / task).mkdir(parents=True, exist_ok=True)
        (data_root / task / f"{tier}.h5").write_bytes(b"0")
        manifest.record(data_root, {"task_id": task, "quality": tier, "file": f"{task}/{tier}.h5", "sha256": "0" * 64,
                                    "size_bytes": 1, "format_version": 1, "n_transitions": 1, "n_episodes": 1})

    problems = []
    threads = [threading.Thread(target=lambda: problems.append(
        preflight.ensure_dataset("mpe-cn", "random", prof, root, "t1", lambda *a, **k: None, build=fake_build)))
        for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert calls == [("mpe-cn", "random")] and problems == [None, None, None]

    def broken(task, tier, episodes, data_root, profile, **_):
        calls.append((task, tier))
        raise RuntimeError("no simulator")

    first = preflight.ensure_dataset("mpe-cn", "expert", prof, root, "t1", lambda *a, **k: None, build=broken)
    second = preflight.ensure_dataset("mpe-cn", "expert", prof, root, "t1", lambda *a, **k: None, build=broken)
    assert calls.count(("mpe-cn", "expert")) == 1  # the same `all`: not built again
    assert first == second and "no simulator" in first.cause and "datasets build mpe-cn expert" in first.fix
    preflight.forget_build_failures(root, "t1")
    assert preflight.ensure_dataset("mpe-cn", "expert", prof, root, "t2", lambda *a, **k: None, build=broken) == first
    assert calls.count(("mpe-cn", "expert")) == 2  # a later `all` tries again


def test_workers_build_missing_datasets_and_an_unbuildable_one_fails_only_its_cells(tmp_path, monkeypatch):
    """With a pool of workers (spawned processes) the jobs build the missing datasets themselves: two
    seeds on one missing tier train on one build of it, and the tier nothing can build fails its two
    cells with their stand-ins (cause and fix)."""
    monkeypatch.setenv(matd3.BEHAVIOUR_DIR_ENV, str(tmp_path / "no-assets"))  # random: uniform; medium-replay: none
    (tmp_path / "p.yaml").write_text(PROFILE.replace("seeds: [0]", "seeds: [0, 1]"))
    result = _invoke(tmp_path, "all", "--profile", str(tmp_path / "p.yaml"), "--jobs", "2")
    assert result.exit_code == 1, result.output
    assert "trained 2, skipped 0 (done), failed 2 (2 without their dataset)" in result.output
    assert "2 cell(s) failed: dataset mpe-cn/medium-replay could not be built" in result.output
    data = tmp_path / "data" / "dstest"
    entries = json.loads((data / "manifest.json").read_text())
    assert list(entries) == ["mpe-cn/random"]
    finals = [json.loads(f.read_text()) for f in (tmp_path / "results").rglob("final.json")]
    assert sorted(f["seed"] for f in finals) == [0, 1]
    assert {f["dataset_sha256"] for f in finals} == {entries["mpe-cn/random"]["sha256"]}
    stand_ins = sorted((tmp_path / "results").rglob("medium-replay/seed*-no-dataset/status.json"))
    assert len(stand_ins) == 2
    assert all("train-behaviour mpe-cn" in json.loads(s.read_text())["fix"] for s in stand_ins)
    assert not list((data / ".build-failed").glob("*.json"))  # this `all`'s failure records are dropped


def test_a_recorded_dataset_whose_file_is_gone_is_listed_missing_and_all_builds_it_again(tmp_path, monkeypatch):
    """The manifest outlives a deleted dataset file: `datasets list` says "missing" (not "built") with the
    command that fixes it, and `all` builds the file again (the same sha256, so the done run stays done)."""
    monkeypatch.delenv(matd3.BEHAVIOUR_DIR_ENV, raising=False)
    profile = _profile(tmp_path)
    first = _invoke(tmp_path, "all", "--profile", profile, "--only", "dataset=random")
    assert first.exit_code == 0 and "trained 1" in first.output, first.output
    manifest_file = tmp_path / "data" / "dstest" / "manifest.json"
    entry = json.loads(manifest_file.read_text())["mpe-cn/random"]
    (tmp_path / "data" / "dstest" / entry["file"]).unlink()

    listed = _invoke(tmp_path, "datasets", "list", "--profile", profile)
    row = next(line for line in listed.output.splitlines() if line.split()[:2] == ["mpe-cn", "random"])
    assert row.split()[2] == "missing" and "datasets build mpe-cn random --profile dstest" in row, row

    again = _invoke(tmp_path, "all", "--profile", profile, "--only", "dataset=random")
    assert again.exit_code == 0, again.output
    assert f"{entry['file']} is missing: it is built again" in again.output
    assert "built dataset mpe-cn/random" in again.output and "skipped 1 (done)" in again.output
    rebuilt = json.loads(manifest_file.read_text())["mpe-cn/random"]
    assert (tmp_path / "data" / "dstest" / entry["file"]).is_file() and rebuilt["sha256"] == entry["sha256"]


def test_a_build_that_is_not_its_committed_cards_dataset_is_said_when_built_and_on_every_all(tmp_path, monkeypatch):
    """A fresh machine that builds a tier whose committed card records other reference returns (CN random,
    2026-12-06) is told so as the build ends, before its cells train, and again by every later `all`."""
    from plcql_bench.datasets import cards, manifest
    from plcql_bench.suite.runs import preflight
    from plcql_bench.suite.runs.profiles import load_profile

    prof = load_profile(_profile(tmp_path))
    root = tmp_path / "data" / prof.data_profile
    monkeypatch.setattr(cards, "CARDS_DIR", tmp_path / "cards")
    said: list[str] = []
    assert preflight.ensure_dataset("mpe-cn", "random", prof, root, "t1", lambda line, **_: said.append(line)) is None
    assert not any(s.startswith("warning:") for s in said)  # no committed card: nothing to differ from
    entry = manifest.lookup(root, "mpe-cn", "random")
    card = tmp_path / "cards" / prof.data_profile / "mpe-cn" / "random.json"
    card.parent.mkdir(parents=True)
    card.write_text(json.dumps({**entry, "sha256": "c" * 64, "ref_return_expert": entry["ref_return_expert"] + 40}))
    (root / "manifest.json").unlink()  # built again on this "fresh machine"
    said.clear()
    assert preflight.ensure_dataset("mpe-cn", "random", prof, root, "t2", lambda line, **_: said.append(line)) is None
    assert said[-1].startswith("warning: dataset mpe-cn/random, just built, is not its committed card's dataset: "
                               f"sha256 {entry['sha256'][:12]}, the card's cccccccccccc (reference returns expert ")
    again = _invoke(tmp_path, "all", "--profile", _profile(tmp_path), "--only", "tier=random")
    assert again.exit_code == 0
    assert "warning: dataset mpe-cn/random is stale (reference returns expert " in again.output
    rebuilt = _invoke(tmp_path, "datasets", "build", "mpe-cn", "random", "--profile", _profile(tmp_path), "--force")
    assert rebuilt.exit_code == 0 and "warning: mpe-cn/random, just built, is not its committed card's dataset: " \
        f"sha256 {entry['sha256'][:12]}, the card's cccccccccccc (reference returns expert " in rebuilt.output
