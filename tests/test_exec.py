"""`all` at scale: --jobs (spawned workers, run.log, no CUDA in the parent), failure isolation,
--rerun-failed, --force, --executor ray on a local Ray, and SIGKILL mid-training then resume."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from plcql_bench.datasets.build import build_dataset
from plcql_bench.suite.commands.main import cli
from plcql_bench.suite.core.errors import BenchError
from plcql_bench.suite.runs.executors import default_jobs

# sample_action_class "0-1-1" passes the config schema but CFCQL refuses it at its first update (BC
# has no such field): a real failure inside training, in a worker process, that must not stop the BC runs.
PROFILE = """
name: exec
description: executor tests
datasets: {episodes: {default: 6}}
train: {updates: {default: 2}, eval_every: 2, eval_episodes: 1, final_eval_episodes: 2, checkpoint_every: 2}
matrix: {algos: [bc, cfcql], tasks: [mpe-cn], tiers: [random], seeds: [0, 1]}
algo_overrides: {batch_size: 32, hidden: 32, sample_action_class: "0-1-1"}
"""


def _invoke(tmp: Path, *args: str, results: str = "results"):
    return CliRunner().invoke(cli, ["--data-dir", str(tmp / "data"), "--results-dir", str(tmp / results),
                                    *args], catch_exceptions=False)


def _finals(root: Path) -> dict:
    return {(r["algo"], r["seed"]): r for r in
            (json.loads(p.read_text()) for p in sorted(root.rglob("final.json")))}


@pytest.fixture(scope="module")
def sweep(tmp_path_factory):
    """`all --jobs 2 --device auto` in this process with every CUDA entry point booby-trapped:
    the parent must schedule without touching CUDA; the runs happen in spawned workers."""
    import torch

    tmp = tmp_path_factory.mktemp("exec")
    (tmp / "exec.yaml").write_text(PROFILE)
    build_dataset("mpe-cn", "random", 6, tmp / "data" / "exec", profile="exec")

    def boom(*_a, **_k):
        raise AssertionError("the parent process touched CUDA")

    mp = pytest.MonkeyPatch()
    for name in ("is_available", "device_count", "init", "_lazy_init", "current_device", "set_device"):
        mp.setattr(torch.cuda, name, boom)
    try:
        result = _invoke(tmp, "all", "--profile", str(tmp / "exec.yaml"), "--jobs", "2", "--device", "auto")
    finally:
        mp.undo()
    assert not torch.cuda.is_initialized()
    return tmp, result


def test_jobs_isolate_failures_and_log_per_run(sweep):
    tmp, result = sweep
    assert result.exit_code == 1, result.output  # a run failed -> nonzero
    assert "trained 2, skipped 0 (done), failed 2" in result.output
    assert "run/s" not in result.output and "%|" not in result.output  # no bar when piped
    finals = _finals(tmp / "results")
    assert sorted(finals) == [("bc", 0), ("bc", 1)]
    run_dirs = sorted(p.parent for p in (tmp / "results").rglob("config.json"))
    assert len(run_dirs) == 4
    pids = set()
    for run_dir in run_dirs:
        log = (run_dir / "run.log").read_text()
        assert "start " in log and "torch threads 1" in log  # the default, whatever --jobs
        pids.add(int(log.split(" pid ")[1].split()[0]))
        status = json.loads((run_dir / "status.json").read_text())
        if "/cfcql/" in str(run_dir):
            assert status["status"] == "failed" and "ValueError" in status["error"]
            assert "Traceback" in status["traceback"] and "_train_and_evaluate" in status["traceback"]
            assert "failed: ValueError" in log
        else:
            assert status["status"] == "done" and "done bc" in log
    assert os.getpid() not in pids  # trained in workers, not in the parent


def test_second_all_skips_failed_unless_rerun_failed(sweep):
    tmp, _ = sweep
    profile = str(tmp / "exec.yaml")
    again = _invoke(tmp, "all", "--profile", profile)
    assert again.exit_code == 1
    assert "trained 0, skipped 2 (done), failed 0, failed earlier and skipped 2" in again.output
    assert "--rerun-failed" in again.output
    rerun = _invoke(tmp, "all", "--profile", profile, "--rerun-failed", "--only", "algo=cfcql,seed=0")
    assert rerun.exit_code == 1 and "failed 1" in rerun.output
    log = next((tmp / "results").rglob("cfcql/mpe-cn/random/seed0-*/run.log")).read_text()
    assert log.count("start cfcql") == 2


def test_force_retrains_finished_runs_identically(sweep):
    tmp, _ = sweep
    before = _finals(tmp / "results")[("bc", 0)]
    forced = _invoke(tmp, "all", "--profile", str(tmp / "exec.yaml"), "--force", "--jobs", "2",
                     "--only", "algo=bc", "--only", "seed=0")
    assert "trained 1," in forced.output, forced.output
    after = _finals(tmp / "results")[("bc", 0)]
    assert after["finished_at"] >= before["finished_at"] and after["run_key"] == before["run_key"]
    for key in ("score", "final_eval", "curve"):
        assert after[key] == before[key], key


def test_ray_executor_on_local_ray_matches_local_pool(sweep):
    pytest.importorskip("ray")
    tmp, _ = sweep
    result = _invoke(tmp, "all", "--profile", str(tmp / "exec.yaml"), "--executor", "ray", "--jobs", "2",
                     "--only", "algo=bc", results="ray_results")
    assert result.exit_code == 0, result.output
    assert "trained 2, skipped 0 (done), failed 0" in result.output
    ray_finals, pool_finals = _finals(tmp / "ray_results"), _finals(tmp / "results")
    assert sorted(ray_finals) == [("bc", 0), ("bc", 1)]
    for key, rec in ray_finals.items():
        for field in ("run_key", "score", "final_eval", "curve"):
            assert rec[field] == pool_finals[key][field], (key, field)
    for log in (tmp / "ray_results").rglob("run.log"):
        assert "start bc" in log.read_text()


def test_bad_device_shard_and_filter_are_user_errors(tmp_path, monkeypatch):
    (tmp_path / "exec.yaml").write_text(PROFILE)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    for extra, needle in ((["--device", "cuda"], "no GPU visible"), (["--shard", "2/2"], "--shard '2/2'"),
                          (["--only", "algo=nope"], "--only algo=nope"), (["--only", "seed"], "expected key=value")):
        with pytest.raises(BenchError, match=needle):
            _invoke(tmp_path, "all", "--profile", str(tmp_path / "exec.yaml"), *extra)


# ----------------------------------------------------------------------------- SIGKILL
KILL_PROFILE = """
name: kill
description: SIGKILL mid-training
datasets: {episodes: {default: 6}}
train: {updates: {default: 10}, eval_every: 2, eval_episodes: 1, final_eval_episodes: 2, checkpoint_every: 2}
matrix: {algos: [cfcql], tasks: [mpe-cn], tiers: [random], seeds: [3]}
algo_overrides: {batch_size: 16, hidden: 16, n_sampled_actions: 2}
"""


def _all_proc(tmp: Path, results: str) -> list[str]:
    return [sys.executable, "-m", "plcql_bench.suite.commands.main", "--data-dir", str(tmp / "data"),
            "--results-dir", str(tmp / results), "all", "--profile", str(tmp / "kill.yaml")]


def test_sigkill_mid_training_then_all_equals_uninterrupted_run(tmp_path):
    (tmp_path / "kill.yaml").write_text(KILL_PROFILE)
    build_dataset("mpe-cn", "random", 6, tmp_path / "data" / "kill", profile="kill")
    quiet = {"stdout": subprocess.DEVNULL, "stderr": subprocess.DEVNULL}
    whole = subprocess.Popen(_all_proc(tmp_path, "a"), **quiet)  # uninterrupted, alongside
    victim = subprocess.Popen(_all_proc(tmp_path, "b"), **quiet)
    killed_at, deadline = None, time.time() + 240
    while time.time() < deadline and victim.poll() is None:
        status = list((tmp_path / "b").rglob("status.json"))
        try:
            update = json.loads(status[0].read_text()).get("update", 0) if status else 0
        except ValueError:  # pragma: no cover - status.json is replaced atomically
            raise AssertionError("status.json was read half-written")
        if 4 <= update < 10:
            os.kill(victim.pid, signal.SIGKILL)
            killed_at = update
            break
        time.sleep(0.02)
    victim.wait()
    assert killed_at is not None, "the run finished (or never started) before it could be killed"
    assert victim.returncode == -signal.SIGKILL
    run_dir = next((tmp_path / "b").rglob("status.json")).parent
    assert not (run_dir / "final.json").exists() and (run_dir / "ckpt.pt").exists()

    resumed = subprocess.run(_all_proc(tmp_path, "b"), capture_output=True, text=True, timeout=300)
    assert resumed.returncode == 0, resumed.stderr
    assert "resuming cfcql" in resumed.stdout and "trained 1" in resumed.stdout
    assert whole.wait(timeout=300) == 0
    a_dir = next((tmp_path / "a").rglob("final.json")).parent
    a, b = (json.loads((d / "final.json").read_text()) for d in (a_dir, run_dir))
    for key in ("run_key", "score", "final_eval", "curve"):
        assert a[key] == b[key], key  # bitwise: floats compare exactly
    assert (a_dir / "metrics.jsonl").read_bytes() == (run_dir / "metrics.jsonl").read_bytes()
    assert not list(run_dir.glob(".*.tmp"))


def test_gpu_slots_and_device_resolution_without_cuda(monkeypatch):
    from plcql_bench.suite.runs.executors import _device_slots, resolve_device

    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1")
    assert resolve_device("auto") == ("cuda", 2) and resolve_device("cpu") == ("cpu", 0)
    assert _device_slots("cuda", 2, 2, 0) == ["cuda:0", "cuda:1", "cuda:0", "cuda:1"]  # --per-gpu 2
    assert _device_slots("cuda", 2, 3, 4) == ["cuda:0", "cuda:1", "cuda:0", "cuda:1"]  # capped by --jobs
    assert _device_slots("cpu", 0, 1, 3) == ["cpu"] * 3
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    assert resolve_device("auto") == ("cpu", 0)


def test_progress_bar_only_on_a_terminal(monkeypatch):
    import io

    from plcql_bench.suite.commands import runs as cli_mod

    monkeypatch.setattr(sys, "stdout", io.StringIO())
    assert cli_mod._Progress(3, "all").bar is None  # piped: no bar
    tty = io.StringIO()
    tty.isatty = lambda: True
    monkeypatch.setattr(sys, "stdout", tty)
    bar = cli_mod._Progress(3, "all")
    assert bar.bar is not None
    bar.step()
    bar.close()
    assert "1/3" in tty.getvalue() and "<" in tty.getvalue()  # count and ETA


def test_default_jobs_fill_the_cores_with_one_thread_each(monkeypatch):
    monkeypatch.setattr("plcql_bench.suite.runs.executors.cpu_count", lambda: 8)
    assert default_jobs("cpu", 0, 1, "local", None) == 8
    assert default_jobs("cuda", 2, 3, "local", None) == 6  # GPUs x --per-gpu
    assert default_jobs("cpu", 0, 1, "ray", "auto") == 0  # the cluster schedules


def test_threads_option_sets_torch_threads_in_process(tmp_path):
    """One job (here: --only one cell) runs in this process with --threads torch threads."""
    import torch

    (tmp_path / "exec.yaml").write_text(PROFILE)
    build_dataset("mpe-cn", "random", 6, tmp_path / "data" / "exec", profile="exec")
    before = torch.get_num_threads()
    try:
        for threads in (2, 1):
            result = _invoke(tmp_path, "all", "--profile", str(tmp_path / "exec.yaml"), "--only", "algo=bc,seed=0",
                             "--threads", str(threads), "--force")
            assert result.exit_code == 0, result.output
            log = next((tmp_path / "results").rglob("run.log")).read_text()
            assert f"torch threads {threads}" in log.split("start bc")[-1].splitlines()[0]
    finally:
        torch.set_num_threads(before)
