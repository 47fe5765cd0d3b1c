"""End-to-end: datasets -> all -> leaderboard through the real CLI, plus its error paths."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

TINY_PROFILE = """
name: tiny
description: test profile
datasets:
  episodes: {default: 8}
train:
  updates: {default: 4}
  eval_every: 2
  eval_episodes: 2
  final_eval_episodes: 3
  checkpoint_every: 2
matrix:
  algos: [bc, cfcql, plcql]
  tasks: [mpe-cn]
  tiers: [expert, random]
  seeds: [0, 1]
algo_overrides: {batch_size: 128}
"""


def cli(tmp: Path, *args: str, check: bool = True) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "plcql_bench.suite.commands.main", "--data-dir", str(tmp / "data"),
           "--results-dir", str(tmp / "results"), *args]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    if check and proc.returncode != 0:
        raise AssertionError(f"{cmd} failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}")
    return proc


@pytest.fixture(scope="module")
def sweep(tmp_path_factory):
    """One tiny 2-seed sweep shared by the tests below (it is the slow part)."""
    tmp = tmp_path_factory.mktemp("e2e")
    profile = tmp / "tiny.yaml"
    profile.write_text(TINY_PROFILE)
    first = cli(tmp, "all", "--profile", str(profile))
    return tmp, profile, first


def _finals(tmp: Path) -> list[dict]:
    return [json.loads(p.read_text()) for p in sorted((tmp / "results").rglob("final.json"))]


def test_all_runs_every_cell_and_writes_results(sweep):
    tmp, _, first = sweep
    finals = _finals(tmp)
    assert len(finals) == 3 * 2 * 2
    assert "trained 12, skipped 0 (done), failed 0" in first.stdout
    for r in finals:
        assert r["status"] == "done" and r["profile"] == "tiny"
        assert np.isfinite(r["score"]) and r["final_eval"]["episodes"] == 3
        assert [p["update"] for p in r["curve"]] == [0, 2, 4]
        assert len(r["dataset_sha256"]) == 64


def test_second_all_trains_nothing(sweep):
    tmp, profile, _ = sweep
    before = {p: p.stat().st_mtime_ns for p in (tmp / "results").rglob("final.json")}
    again = cli(tmp, "all", "--profile", str(profile))
    assert "trained 0, skipped 12 (done), failed 0" in again.stdout
    assert before == {p: p.stat().st_mtime_ns for p in (tmp / "results").rglob("final.json")}


def test_leaderboard_numbers_equal_result_files(sweep):
    tmp, _, _ = sweep
    cli(tmp, "leaderboard", "--out", str(tmp / "site"))
    html = (tmp / "site" / "index.html").read_text()
    groups: dict[tuple, list[float]] = {}
    for r in _finals(tmp):
        groups.setdefault((r["algo"], r["dataset"]), []).append(r["score"])
    for (algo, tier), scores in groups.items():
        mean, std = np.mean(scores), np.std(scores, ddof=1)
        assert f"{mean:.1f} ± {std:.1f}" in html, (algo, tier, mean, std)


def test_corrupt_dataset_fails_cleanly_and_keeps_results(sweep, tmp_path):
    tmp, profile, _ = sweep
    # Work on a copy so the shared sweep stays intact.
    import shutil

    shutil.copytree(tmp / "data", tmp_path / "data")
    shutil.copytree(tmp / "results", tmp_path / "results")
    h5 = tmp_path / "data" / "tiny" / "mpe-cn" / "random.h5"
    data = h5.read_bytes()
    h5.write_bytes(data[: len(data) // 2])
    snapshot = {p: p.read_bytes() for p in (tmp_path / "results").rglob("*") if p.is_file()}
    proc = cli(tmp_path, "run", "--algo", "bc", "--task", "mpe-cn", "--dataset", "random",
               "--seed", "7", "--profile", str(profile), check=False)
    assert proc.returncode == 2
    err = proc.stderr.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: ") and "random.h5" in err[0], proc.stderr
    after = {p: p.read_bytes() for p in (tmp_path / "results").rglob("*") if p.is_file()}
    assert after == snapshot


def test_a_recorded_dataset_whose_file_is_gone_is_built_again(sweep, tmp_path):
    """`datasets build` does not call a tier "already built" when the manifest records it but its file was
    deleted: it says so and builds it again, to the same sha256."""
    import shutil

    tmp, profile, _ = sweep
    shutil.copytree(tmp / "data", tmp_path / "data")
    entry = json.loads((tmp_path / "data" / "tiny" / "manifest.json").read_text())["mpe-cn/random"]
    (tmp_path / "data" / "tiny" / entry["file"]).unlink()
    built = cli(tmp_path, "datasets", "build", "mpe-cn", "random", "--profile", str(profile)).stdout
    assert "already built" not in built and f"{entry['file']} is missing: building it" in built
    again = json.loads((tmp_path / "data" / "tiny" / "manifest.json").read_text())["mpe-cn/random"]
    assert (tmp_path / "data" / "tiny" / entry["file"]).is_file() and again["sha256"] == entry["sha256"]


def test_stale_dataset_is_flagged_not_rebuilt(sweep, tmp_path):
    """A dataset whose recorded behaviour differs from what the code builds now is listed as
    stale and warned about by `all`, which still skips its finished runs (keyed by sha256)."""
    import shutil

    tmp, profile, _ = sweep
    shutil.copytree(tmp / "data", tmp_path / "data")
    shutil.copytree(tmp / "results", tmp_path / "results")
    man = tmp_path / "data" / "tiny" / "manifest.json"
    entries = json.loads(man.read_text())
    entries["mpe-cn/random"]["behaviour_policy_id"] = "an-older-recipe"
    man.write_text(json.dumps(entries))
    listed = cli(tmp_path, "datasets", "list", "--profile", str(profile)).stdout
    rows = {tuple(line.split()[:2]): line.split()[2] for line in listed.splitlines()[1:]}
    assert rows[("mpe-cn", "random")] == "stale" and rows[("mpe-cn", "expert")] == "built"
    built = cli(tmp_path, "datasets", "build", "mpe-cn", "random", "--profile", str(profile)).stdout
    assert "already built" in built and "STALE" in built and "an-older-recipe" in built
    again = cli(tmp_path, "all", "--profile", str(profile))
    assert "trained 0, skipped 12 (done)" in again.stdout
    warn = [ln for ln in again.stderr.splitlines() if ln.startswith("warning:")]
    assert len(warn) == 1 and "mpe-cn/random is stale" in warn[0] and "--force" in warn[0]


@pytest.mark.parametrize("args, needle", [
    (["run", "--algo", "bc", "--task", "mpe-nope", "--dataset", "expert"], "unknown task 'mpe-nope'"),
    (["run", "--algo", "nope", "--task", "mpe-cn", "--dataset", "expert"], "unknown algorithm 'nope'"),
    (["run", "--algo", "bc", "--task", "mpe-cn", "--dataset", "great"], "unknown dataset tier 'great'"),
    (["run", "--algo", "bc", "--task", "mpe-cn", "--tier", "great"], "unknown dataset tier 'great'"),  # today's name
    (["all", "--profile", "smoke", "--only", "tier=great"], "--only tier=great: not in profile 'smoke'"),
    (["datasets", "build", "mpe-nope", "expert"], "unknown task 'mpe-nope'"),
    (["datasets", "build", "mpe-cn", "great"], "unknown tier 'great'"),
    (["all", "--profile", "nope"], "unknown profile 'nope'"),
])
def test_bad_names_give_one_line_error(tmp_path, args, needle):
    proc = cli(tmp_path, *args, check=False)
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and needle in lines[0], proc.stderr


def test_version_all_lists_packages(tmp_path):
    out = cli(tmp_path, "version", "--all").stdout
    assert re.search(r"plcql-bench \d+\.\d+\.\d+", out)
    for name in ("torch", "numpy", "h5py", "mpe2", "git commit"):
        assert name in out


def test_kernels_option_is_recorded_outside_the_run_key(sweep, tmp_path):
    """`run --kernels` / `all --kernels` pick the kernels (over $PLCQL_KERNELS / $PLCQL_NATIVE); each run's
    final.json records the choice, and the run key, which names the result, is the same whichever ran."""
    import shutil

    tmp, profile, _ = sweep
    cell = ("--algo", "bc", "--task", "mpe-cn", "--tier", "random", "--seed", "0", "--profile", str(profile))
    recorded = {}
    for choice in ("plain", "fused"):
        root = tmp_path / choice
        shutil.copytree(tmp / "data", root / "data")
        if choice == "plain":
            cli(root, "run", *cell, "--kernels", choice)
        else:
            cli(root, "all", "--profile", str(profile), "--only", "algo=bc,tier=random,seed=0", "--kernels", choice)
        (final,) = list((root / "results").rglob("final.json"))
        rec = json.loads(final.read_text())
        recorded[choice] = (rec["hardware"]["kernels"]["choice"], final.parent.name)
    assert recorded["plain"][0] == "plain" and recorded["fused"][0] == "fused"
    assert recorded["plain"][1] == recorded["fused"][1]  # the run folder carries the run key
    bad = cli(tmp_path / "plain", "run", *cell, "--kernels", "fast", check=False)
    assert bad.returncode == 2 and "--kernels" in bad.stderr
