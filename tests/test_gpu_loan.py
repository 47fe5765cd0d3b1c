"""ci/gpu_loan.sh's two modes that move partial runs between this machine and a loan: `--pack-partial`
(what a loan carries) and `--take-back` (what comes back must never roll back a run trained further here)."""

from __future__ import annotations

import json
import subprocess
import tarfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "ci" / "gpu_loan.sh"


def _run_dir(root: Path, rel: str, *, status: str = "interrupted", reached: int = 0, ckpt: bool = True,
             final: bool = False) -> Path:
    d = root / rel
    d.mkdir(parents=True)
    (d / "config.json").write_text(json.dumps({"rel": rel}))
    (d / "status.json").write_text(json.dumps({"status": "done" if final else status, "reached": reached}))
    if ckpt:
        (d / "ckpt.pt").write_bytes(f"ckpt of {rel} at {reached}".encode())
    if final:
        (d / "final.json").write_text(json.dumps({"score": 1.0}))
    return d


def _bash(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(SCRIPT), *args], capture_output=True, text=True, timeout=120,
                          env=env, cwd=ROOT)


def _loan_files(tmp: Path, runs: Path) -> Path:
    """runs.tgz (every run's small files) and ckpt.tgz.part* (the checkpoints), as a loan packs them."""
    files = tmp / "files"
    files.mkdir()
    with tarfile.open(files / "runs.tgz", "w:gz") as tar:
        for f in sorted(runs.rglob("*")):
            if f.is_file() and f.name != "ckpt.pt":
                tar.add(f, arcname=str(f.relative_to(runs)))
    ckpts = tmp / "ckpt.tgz"
    with tarfile.open(ckpts, "w:gz") as tar:
        for f in sorted(runs.rglob("ckpt.pt")):
            tar.add(f, arcname=str(f.relative_to(runs)))
    data = ckpts.read_bytes()
    half = len(data) // 2
    (files / "ckpt.tgz.partaa").write_bytes(data[:half])
    (files / "ckpt.tgz.partab").write_bytes(data[half:])
    return files


def test_take_back_moves_runs_that_are_ahead_and_keeps_those_trained_further_here(tmp_path):
    loan, home = tmp_path / "loan", tmp_path / "home"
    _run_dir(loan, "paper/a/t/d/seed0-aaa", final=True, ckpt=False)
    _run_dir(loan, "paper/b/t/d/seed0-bbb", reached=500)
    _run_dir(loan, "paper/c/t/d/seed0-ccc", reached=300)
    _run_dir(loan, "paper/d/t/d/seed0-ddd", reached=200, ckpt=False)  # its checkpoint did not come back
    _run_dir(home, "paper/b/t/d/seed0-bbb", reached=800)  # trained further here meanwhile
    _run_dir(home, "paper/c/t/d/seed0-ccc", reached=100)
    files = _loan_files(tmp_path, loan)

    done = _bash("--take-back", str(files), str(home))
    assert done.returncode == 0, done.stderr
    assert (home / "paper/a/t/d/seed0-aaa/final.json").exists()
    b = json.loads((home / "paper/b/t/d/seed0-bbb/status.json").read_text())
    assert b["reached"] == 800 and (home / "paper/b/t/d/seed0-bbb/ckpt.pt").read_bytes().endswith(b"800")
    c = json.loads((home / "paper/c/t/d/seed0-ccc/status.json").read_text())
    assert c["reached"] == 300 and (home / "paper/c/t/d/seed0-ccc/ckpt.pt").read_bytes().endswith(b"300")
    assert not (home / "paper/d/t/d/seed0-ddd").exists()
    assert "took back 2 run(s)" in done.stdout


def test_take_back_fails_on_a_missing_archive(tmp_path):
    done = _bash("--take-back", str(tmp_path / "nothing"), str(tmp_path / "home"))
    assert done.returncode != 0


def test_pack_partial_carries_interrupted_runs_most_rounds_first(tmp_path):
    results = tmp_path / "results"
    _run_dir(results, "paper/x/t/d/seed0-111", reached=100)
    _run_dir(results, "paper/x/t/d/seed1-222", reached=900)
    _run_dir(results, "paper/x/t/d/seed2-333", status="running", reached=950)  # training here now
    _run_dir(results, "paper/x/t/d/seed3-444", final=True)
    _run_dir(results, "paper/y/t/d/seed0-555", reached=700)  # not selected
    carry = tmp_path / "carry"
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "CARRY_DIR": str(carry)}

    done = _bash("--pack-partial", str(results), "/x/", env=env)
    assert done.returncode == 0, done.stdout + done.stderr
    listed = (carry / "runs.txt").read_text().split()
    assert listed == ["paper/x/t/d/seed1-222", "paper/x/t/d/seed0-111"]
    with tarfile.open(carry / "ckpt.tgz") as tar:
        names = tar.getnames()
    assert "paper/x/t/d/seed1-222/ckpt.pt" in names and not any("seed2-333" in n or "/y/" in n for n in names)


def test_pack_partial_with_nothing_to_carry_exits_nonzero(tmp_path):
    results = tmp_path / "results"
    _run_dir(results, "paper/x/t/d/seed3-444", final=True)
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "CARRY_DIR": str(tmp_path / "carry")}
    done = _bash("--pack-partial", str(results), env=env)
    assert done.returncode == 2 and "no interrupted run" in done.stdout


@pytest.mark.parametrize("mode", ["--take-back", "--pack-partial"])
def test_modes_need_their_arguments(mode):
    assert _bash(mode).returncode != 0


def test_a_loan_with_an_unknown_profile_stops_with_one_line_before_training(tmp_path):
    import os
    import sys
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}",
           "PROFILE": str(tmp_path / "nope.yaml"), "DEVICE": "cpu", "OUT": str(tmp_path / "out"),
           "RESULTS": str(tmp_path / "results"), "DATA": str(tmp_path / "data")}
    done = _bash(env=env)
    assert done.returncode == 2
    assert "PROFILE: unknown profile" in done.stderr and "nope.yaml" in done.stderr
    assert not any((tmp_path / "results").rglob("*"))  # nothing adopted, built or trained
