"""Exports of finished runs: a tidy table (CSV or Parquet) and marl-eval's JSON.

Tidy rows, one per algorithm/task/dataset/seed/step/metric, from each run's final.json and
metrics.jsonl:

    profile, domain, algo, task, dataset, seed, run_key, step, metric, value

`step` is the update round. Learning-curve metrics (`return_mean`, `score`, `train/<name>`) come
from metrics.jsonl at every evaluation point; the headline numbers come from final.json at the
last round with the prefix `final/` (`final/score`, `final/return_mean`, `final/return_std`,
`final/normalised_score`, `final/win_rate` where defined).

marl-eval (InstaDeep's `marl_eval`) reads one nested JSON dictionary:

    {env_name: {task_name: {algo_name: {"run_<seed>": {
        "step_<i>": {"step_count": <update>, "<metric>": [values...]},
        ...,
        "absolute_metrics": {"<metric>": [values...]}}}}}}

env_name is the task's domain (e.g. "mpe"); task_name is `<task>_<dataset>` because an
offline-RL "task" is an environment plus a dataset; algo_name is the algorithm. Each step_i is
an evaluation point (metric lists hold one value, the mean over the evaluation episodes, since
per-episode curve values are not stored); absolute_metrics holds the final evaluation's
per-episode returns (`return`) and the per-episode normalised scores (`normalised_score`) or
the win rate. Its data-processing utilities can then normalise and aggregate without glue code.
"""

from __future__ import annotations

import csv
import json
from pathlib import Path
from typing import Iterator

from plcql_bench.suite.core.errors import BenchError
from plcql_bench.suite.core.schema import Damaged, RunRecord, scan_records
from plcql_bench.suite.core.store import METRICS, METRICS_GZ, atomic_write_bytes, atomic_write_json, read_metrics_text

COLUMNS = ("profile", "domain", "algo", "task", "dataset", "seed", "run_key", "step", "metric", "value")


def finished_runs(results_dir: Path, profile: str | None = None,
                  damaged: list[Damaged] | None = None) -> Iterator[tuple[Path, RunRecord]]:
    """(run_dir, record) of every valid finished run (suite/core/schema.py), in a stable order; the
    files skipped as damaged are appended to ``damaged`` (those of ``profile``'s folder only)."""
    records, bad = scan_records(Path(results_dir))
    if damaged is not None:
        damaged.extend(d for d in bad if not profile or d.path.split("/", 1)[0] == profile)
    for rel, rec in records:
        if not profile or rec.profile == profile:
            yield Path(results_dir) / Path(rel).parent, rec


class _BadHistory(ValueError):
    """A metrics.jsonl that cannot be read; the message names the line."""


def _history(run_dir: Path) -> list[dict]:
    """A run's evaluation points from metrics.jsonl (or, in a published folder, metrics.jsonl.gz)."""
    try:
        text = read_metrics_text(run_dir / METRICS)
    except (OSError, UnicodeDecodeError) as exc:
        raise _BadHistory(f"unreadable: {type(exc).__name__}: {exc}") from None
    if text is None:
        return []
    lines = text.splitlines()
    out = []
    for i, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            point = json.loads(line)
        except json.JSONDecodeError as exc:
            raise _BadHistory(f"line {i}: invalid JSON ({exc.msg}; truncated?)") from None
        update = point.get("update") if isinstance(point, dict) else None
        if not isinstance(update, int) or isinstance(update, bool):
            raise _BadHistory(f"line {i}: not an evaluation point (an object with an integer 'update')")
        out.append(point)
    return out


def tidy_rows(results_dir: Path, profile: str | None = None, damaged: list[Damaged] | None = None) -> list[dict]:
    """The tidy rows; a run whose final.json or metrics.jsonl is damaged gives none (it is
    appended to ``damaged``)."""
    rows = []
    damaged = [] if damaged is None else damaged
    for run_dir, rec in finished_runs(results_dir, profile, damaged):
        base = {"profile": rec.profile, "domain": rec.domain, "algo": rec.algo, "task": rec.task,
                "dataset": rec.dataset, "seed": rec.seed, "run_key": rec.run_key}
        try:
            history = _history(run_dir)
        except _BadHistory as exc:
            name = METRICS if (run_dir / METRICS).exists() else METRICS_GZ
            damaged.append(Damaged((run_dir / name).relative_to(results_dir).as_posix(), str(exc)))
            continue
        history = history or [{"update": p["update"], "return_mean": p["return_mean"],
                                         "score": p["score"]} for p in rec.curve]
        for point in history:
            for metric, value in sorted(point.items()):
                if metric == "update" or not isinstance(value, (int, float)) or isinstance(value, bool):
                    continue
                rows.append({**base, "step": int(point["update"]), "metric": metric, "value": float(value)})
        final = rec.final_eval
        last = int(rec.train["updates"])
        finals = {"final/score": rec.score, "final/return_mean": final.get("return_mean"),
                  "final/return_std": final.get("return_std"),
                  "final/normalised_score": final.get("normalised_score"),
                  "final/win_rate": final.get("win_rate")}
        for metric, value in finals.items():
            if value is not None:
                rows.append({**base, "step": last, "metric": metric, "value": float(value)})
    return rows


def marl_eval(results_dir: Path, profile: str | None = None, damaged: list[Damaged] | None = None) -> dict:
    out: dict = {}
    for run_dir, rec in finished_runs(results_dir, profile, damaged):
        env = rec.domain
        task = f"{rec.task}_{rec.dataset}"
        run: dict = {}
        for i, point in enumerate(rec.curve):
            entry = {"step_count": int(point["update"]), "return": [float(point["return_mean"])]}
            if point.get("score") is not None:
                entry[_score_metric(rec)] = [float(point["score"])]
            run[f"step_{i}"] = entry
        final = rec.final_eval
        returns = final.get("episode_returns") or [final["return_mean"]]
        absolute = {"return": [float(r) for r in returns]}
        if rec.is_win_rate and final.get("win_rate") is not None:
            absolute["win_rate"] = [float(final["win_rate"])]
        elif final.get("normalised_score") is not None:
            absolute["normalised_score"] = _episode_scores(final, returns)
        run["absolute_metrics"] = absolute
        out.setdefault(env, {}).setdefault(task, {}).setdefault(rec.algo, {})[f"run_{rec.seed}"] = run
    return out


def _score_metric(rec: RunRecord) -> str:
    return "normalised_score" if rec.score_name == "normalised" else rec.score_name


def _episode_scores(final: dict, returns: list[float]) -> list[float]:
    """Per-episode normalised scores. The score is affine in the return, so the two recorded
    (mean return, mean score) pairs fix it only with the reference returns; final.json stores
    them per episode when available, else the mean score is repeated once."""
    if "episode_scores" in final:
        return [float(s) for s in final["episode_scores"]]
    return [float(final["normalised_score"])]


def export(results_dir: Path, out: Path, fmt: str, profile: str | None = None,
           damaged: list[Damaged] | None = None) -> int:
    """Write the export of every healthy finished run; returns the number of rows (tidy) or runs
    (marl-eval). Damaged runs are left out and appended to ``damaged``."""
    out = Path(out)
    if fmt == "marl-eval":
        data = marl_eval(results_dir, profile, damaged)
        atomic_write_json(out, data)
        return sum(len(runs) for tasks in data.values() for algos in tasks.values() for runs in algos.values())
    rows = tidy_rows(results_dir, profile, damaged)
    if fmt == "csv":
        import io

        buf = io.StringIO()
        writer = csv.DictWriter(buf, fieldnames=COLUMNS, lineterminator="\n")
        writer.writeheader()
        writer.writerows(rows)
        atomic_write_bytes(out, buf.getvalue().encode())
    elif fmt == "parquet":
        try:
            import pyarrow as pa
            import pyarrow.parquet as pq
        except ImportError:
            raise BenchError("--format parquet needs pyarrow: pip install 'plcql-bench[export]'") from None
        table = pa.Table.from_pylist(rows, schema=pa.schema([
            ("profile", pa.string()), ("domain", pa.string()), ("algo", pa.string()), ("task", pa.string()),
            ("dataset", pa.string()), ("seed", pa.int64()), ("run_key", pa.string()), ("step", pa.int64()),
            ("metric", pa.string()), ("value", pa.float64())]))
        buf = pa.BufferOutputStream()
        pq.write_table(table, buf)
        atomic_write_bytes(out, buf.getvalue().to_pybytes())  # as csv: the target named in any error, no temp left
    else:
        raise BenchError(f"--format {fmt!r}: expected csv, parquet or marl-eval")
    return len(rows)
