"""Result files for the leaderboard tests, written as the runner writes them: a consistent
final.json (score = final evaluation, run key = hash of the identity, run directory named by seed
and key) plus metrics.jsonl, optionally with the PAR diagnostics keys (diag/*)."""

from __future__ import annotations

import json
import math
from datetime import datetime, timezone
from pathlib import Path

from plcql_bench.suite.core.schema import run_key_of

NOW = datetime(2026, 11, 26, 12, 0, 0, tzinfo=timezone.utc)
SHA = "ab" * 32


def curve_for(score: float, points: int = 12, every: int = 10) -> list[dict]:
    """A rising learning curve ending at ``score`` (return_mean = score, so OMAR's scale differs)."""
    return [{"update": i * every, "return_mean": score * (i + 1) / points, "score": score * (i + 1) / points}
            for i in range(points)]


def final_record(algo: str, task: str, tier: str, seed: int, score: float, *, profile: str = "paper",
                 curve: list | None = None, commit: str = "0123456789abcdef0123456789abcdef01234567",
                 updates: int = 110, sha: str = SHA, config: dict | None = None, **extra) -> dict:
    win = task.startswith(("smax", "smac"))
    budget = {"eval_episodes": 10, "eval_every": 10, "final_eval_episodes": 100, "updates": updates}
    ident = {"algo": algo, "config": config if config is not None else {"lr": 0.001}, "task": task, "dataset": tier, "dataset_sha256": sha,
             "seed": seed, "profile": profile, "budget": budget, "protocol_version": 1}
    returns = [score - 1.0, score + 1.0]
    rec = {
        **ident, "run_key": run_key_of(ident), "schema_version": 1, "status": "done", "domain": task.split("-")[0],
        "score_name": "win_rate" if win else "normalised", "score": score,
        "final_eval": {"episodes": 100, "return_mean": score, "return_std": 1.0, "episode_returns": returns,
                       "normalised_score": None if win else score, "win_rate": score if win else None},
        "curve": curve if curve is not None else curve_for(score),
        "train": {"updates": updates, "wall_clock_s": 12.5, "train_s": 10.0, "updates_per_s": updates / 10.0},
        "versions": {"plcql-bench": "0.1.0", "torch": "2.13.0+cpu", "mpe2": "1.1.1", "episode_limit": "25"},
        "image": {}, "git_commit": commit, "finished_at": "2026-11-25T23:10:00+00:00",
    }
    rec.update(extra)
    return rec


def run_dir(root: Path, rec: dict) -> Path:
    return Path(root) / rec["profile"] / rec["algo"] / rec["task"] / rec["dataset"] / f"seed{rec['seed']}-{rec['run_key'][:10]}"


def diag_lines(curve: list[dict], n: int, collapse_to: int | None = None, seed: int = 0) -> str:
    """metrics.jsonl with diag/* at every evaluation point: p drifts to k = collapse_to (or stays
    uniform), Q1 grows with k, u with k, w = 1 - u/10, r_par = w * Q1."""
    lines = []
    for i, p in enumerate(curve):
        frac = i / max(len(curve) - 1, 1)
        probs = [1.0 / n] * n
        if collapse_to is not None:
            probs = [(1 - frac) / n + (frac if k + 1 == collapse_to else 0.0) for k in range(n)]
        rec = {"update": p["update"], "score": p["score"], "return_mean": p["return_mean"]}
        ent = -sum(q * math.log(q) for q in probs if q > 0)
        for k in range(1, n + 1):
            q1, u = 5.0 + k + 0.1 * seed, 0.5 * k
            w = 1 - u / 10
            rec.update({f"diag/q1_k{k}": q1, f"diag/u_k{k}": u, f"diag/w_k{k}": w, f"diag/rpar_k{k}": w * q1,
                        f"diag/p_k{k}": probs[k - 1]})
        rec["diag/par_entropy"] = ent
        lines.append(json.dumps(rec))
    return "\n".join(lines) + "\n"


def write_run(root: Path, algo: str, task: str, tier: str, seed: int, score: float, *, diag_n: int | None = None,
              collapse_to: int | None = None, metrics: str | None = None, **kw) -> Path:
    """Write one run; returns its directory."""
    rec = final_record(algo, task, tier, seed, score, **kw)
    d = run_dir(root, rec)
    d.mkdir(parents=True, exist_ok=True)
    (d / "final.json").write_text(json.dumps(rec, indent=1, sort_keys=True), encoding="utf-8")
    (d / "config.json").write_text(json.dumps({k: rec[k] for k in ("algo", "task", "dataset", "seed", "profile", "run_key")}))
    if diag_n is not None:
        (d / "metrics.jsonl").write_text(diag_lines(rec["curve"], diag_n, collapse_to, seed), encoding="utf-8")
    elif metrics is not None:
        (d / "metrics.jsonl").write_text(metrics, encoding="utf-8")
    return d


def write_failed(root: Path, algo: str, task: str, tier: str, seed: int, error: str, *, profile: str = "paper",
                 status: str | None = None) -> Path:
    """A run directory without final.json; ``status`` overrides status.json's raw text."""
    d = Path(root) / profile / algo / task / tier / f"seed{seed}-dead{seed:06d}"
    d.mkdir(parents=True, exist_ok=True)
    (d / "config.json").write_text(json.dumps({"algo": algo, "task": task, "dataset": tier, "seed": seed, "profile": profile}))
    (d / "status.json").write_text(status if status is not None else json.dumps({"status": "failed", "error": error}))
    return d
