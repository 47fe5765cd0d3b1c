"""Crash-safety check: random SIGKILLs during a parallel sweep lose or corrupt nothing.

    python ci/sigkill_sweep.py [--kills 20] [--jobs 2] [--seed 0] [--keep DIR]

1. A reference sweep (8 runs: bc and cfcql x 4 seeds, `all --jobs N`) runs uninterrupted.
2. The same sweep runs again in another results folder while this script SIGKILLs, at random
   moments, either one worker process (a crashed run) or the whole `all` process group (a
   crashed node). After every kill it checks that every JSON file in the results parses and every
   ckpt.pt loads, then restarts `all` when the parent died.
3. After the last kill `all` finishes the sweep. Every run must be done, every final result
   must equal the reference bitwise (score, final evaluation, curve, metrics.jsonl), and no temp
   file may be left over.

Prints one line per kill and a summary; exit status 0 when nothing is corrupt or lost.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

PROFILE = """
name: sigkill
description: crash-safety sweep
datasets: {episodes: {default: 6}}
train: {updates: {default: 12}, eval_every: 2, eval_episodes: 1, final_eval_episodes: 2, checkpoint_every: 2}
matrix: {algos: [bc, cfcql], tasks: [mpe-cn], tiers: [random], seeds: [0, 1, 2, 3]}
algo_overrides: {batch_size: 16, hidden: 16, n_sampled_actions: 2}
"""


def all_cmd(tmp: Path, results: str, jobs: int) -> list[str]:
    return [sys.executable, "-m", "plcql_bench.suite.commands.main", "--data-dir", str(tmp / "data"),
            "--results-dir", str(tmp / results), "all", "--profile", str(tmp / "sigkill.yaml"),
            "--jobs", str(jobs)]


def children(pid: int) -> list[int]:
    try:
        text = Path(f"/proc/{pid}/task/{pid}/children").read_text()
    except OSError:
        return []
    return [int(p) for p in text.split()]


def workers(pid: int) -> list[int]:
    out = []
    for child in children(pid):
        try:
            cmd = Path(f"/proc/{child}/cmdline").read_bytes()
        except OSError:
            continue
        if b"spawn_main" in cmd:
            out.append(child)
    return out


def check_files(root: Path) -> list[str]:
    """Every JSON file parses, every checkpoint loads; returns the problems found."""
    import torch

    bad = []
    for path in root.rglob("*"):
        if not path.is_file() or path.name.endswith(".tmp"):
            continue
        try:
            if path.suffix == ".json":
                json.loads(path.read_text())
            elif path.name == "metrics.jsonl":
                [json.loads(line) for line in path.read_text().splitlines()]
            elif path.name == "ckpt.pt":
                torch.load(path, map_location="cpu", weights_only=False)
        except Exception as exc:  # noqa: BLE001 - any failure is a finding
            bad.append(f"{path}: {type(exc).__name__}: {exc}")
    return bad


def finals(root: Path) -> dict:
    out = {}
    for path in root.rglob("final.json"):
        rec = json.loads(path.read_text())
        out[(rec["algo"], rec["seed"])] = (rec, (path.parent / "metrics.jsonl").read_bytes())
    return out


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--kills", type=int, default=20)
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--keep", type=Path, default=None, help="work in this folder and keep it")
    args = ap.parse_args()
    rng = random.Random(args.seed)
    tmp = args.keep or Path(tempfile.mkdtemp(prefix="plcql-sigkill-"))
    tmp.mkdir(parents=True, exist_ok=True)
    (tmp / "sigkill.yaml").write_text(PROFILE)

    t0 = time.time()
    ref = subprocess.run(all_cmd(tmp, "reference", args.jobs), capture_output=True, text=True)
    if ref.returncode:
        print(ref.stdout, ref.stderr)
        return 1
    sweep_s = time.time() - t0
    print(f"reference sweep: 8 runs in {sweep_s:.1f}s")

    root = tmp / "results"
    kills = {"worker": 0, "node": 0}
    problems: list[str] = []
    restarts = 0
    proc = None
    while sum(kills.values()) < args.kills:
        if proc is None or proc.poll() is not None:
            if proc is not None and proc.returncode == 0 and len(finals(root)) == 8:
                # The sweep finished between kills: start it over on a fresh folder so that
                # every kill hits live training.
                root = tmp / f"results{restarts}"
            proc = subprocess.Popen(all_cmd(tmp, root.name, args.jobs), stdout=subprocess.DEVNULL,
                                    stderr=subprocess.DEVNULL, start_new_session=True)
            restarts += 1
        # Wait until training is under way (a run.log written since this start; start-up costs
        # seconds), then strike at a random moment.
        started = time.time()
        while proc.poll() is None and not any(p.stat().st_mtime > started for p in root.rglob("run.log")):
            time.sleep(0.05)
        time.sleep(rng.uniform(0.0, 6.0))
        if proc.poll() is not None:
            continue
        live = workers(proc.pid)
        if live and rng.random() < 0.5:
            victim = rng.choice(live)
            os.kill(victim, signal.SIGKILL)
            kind = "worker"
        else:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            kind = "node"
        kills[kind] += 1
        found = check_files(root)
        problems += found
        print(f"kill {sum(kills.values()):2d}: {kind:<6} t={time.time() - t0:6.1f}s  "
              f"{root.name}: done {len(finals(root))}/8, checkpoints {len(list(root.rglob('ckpt.pt')))}, "
              f"corrupt files {len(found)}")
    if proc.poll() is None:
        proc.wait()
    # Finish every sweep folder that was hit and compare it with the reference.
    reference = finals(tmp / "reference")
    lost = 0
    for folder in sorted(p for p in tmp.iterdir() if p.name.startswith("results")):
        done = subprocess.run(all_cmd(tmp, folder.name, args.jobs), capture_output=True, text=True)
        got = finals(folder)
        problems += check_files(folder)
        leftovers = [str(p) for p in folder.rglob(".*.tmp")]
        problems += [f"left-over temp file {p}" for p in leftovers]
        if done.returncode or len(got) != 8:
            lost += 8 - len(got)
            problems.append(f"{folder.name}: all exited {done.returncode}, {len(got)}/8 done")
        for key, (rec, metrics) in got.items():
            want, want_metrics = reference[key]
            for field in ("run_key", "score", "final_eval", "curve"):
                if rec[field] != want[field]:
                    problems.append(f"{folder.name} {key}: {field} differs from the uninterrupted run")
            if metrics != want_metrics:
                problems.append(f"{folder.name} {key}: metrics.jsonl differs from the uninterrupted run")
        print(f"{folder.name}: {len(got)}/8 runs done after the final `all`")
    resumes = sum(p.read_text().count("resuming ") for p in tmp.glob("results*/**/run.log"))
    print(f"summary: {sum(kills.values())} SIGKILLs ({kills['worker']} worker, {kills['node']} whole sweep), "
          f"{resumes} resumes from a checkpoint, {lost} lost result files, "
          f"{len(problems)} problems (corrupt or different files)")
    for p in problems:
        print("  ", p)
    return 1 if problems or lost else 0


if __name__ == "__main__":
    sys.exit(main())
