"""A stop reaches the runs: `all` started the way shells start background jobs (SIGINT ignored)
still stops on SIGINT sent to it alone, and its run records 'interrupted' with its checkpoint."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

PROFILE = """
name: sigtest
description: interrupt test
datasets: {episodes: {default: 8}}
train: {updates: {default: 200000}, eval_every: 50, eval_episodes: 1, final_eval_episodes: 1, checkpoint_every: 50}
matrix: {algos: [bc], tasks: [mpe-cn], tiers: [random], seeds: [0]}
algo_overrides: {batch_size: 8, hidden: 8}
"""


def _wait_for(pred, seconds: float) -> bool:
    deadline = time.time() + seconds
    while time.time() < deadline:
        if pred():
            return True
        time.sleep(0.3)
    return False


@pytest.mark.parametrize("jobs", ["1", "2"])  # in process, and the worker pool
def test_sigint_stops_a_background_all(tmp_path, jobs):
    (tmp_path / "p.yaml").write_text(PROFILE)
    cmd = [sys.executable, "-m", "plcql_bench.suite.commands.main", "--data-dir", str(tmp_path / "data"),
           "--results-dir", str(tmp_path / "results"), "all", "--profile", str(tmp_path / "p.yaml"), "--jobs", jobs]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env={**os.environ, "OMP_NUM_THREADS": "1"},
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN))
    try:
        def checkpointed() -> bool:
            return any(tmp_path.joinpath("results").rglob("ckpt.pt"))
        assert _wait_for(checkpointed, 120), proc.communicate(timeout=5)[0] if proc.poll() is not None else "no checkpoint"
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    status = json.loads(next(tmp_path.joinpath("results").rglob("status.json")).read_text())
    assert status["status"] == "interrupted", status
    assert status["update"] == status["reached"] > 0, status  # the round finished and was checkpointed
    assert not any(tmp_path.joinpath("results").rglob("final.json"))
