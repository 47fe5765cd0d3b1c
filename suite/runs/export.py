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

marl-eval reads runs and steps in key order, so they are written in numeric order (step_0, step_1, ...,
step_10), absolute_metrics last; and its matrices need, per env, the same algorithms on every task, the
same seeds for every algorithm and the same steps in every run: `marl_eval_problems` says what an export
lacks, `marl_eval_cut` (`export --consistent`) cuts it to such a set. tests/test_export.py runs marl-eval's
own validation and aggregation on it. `--only` (select_runs) filters every format.
"""

from __future__ import annotations

import csv
import io
import json
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

from plcql_bench.suite.core.errors import BenchError
from plcql_bench.suite.core.schema import Damaged, RunRecord, scan_records
from plcql_bench.suite.core.store import METRICS, METRICS_GZ, atomic_write_bytes, read_metrics_text
from plcql_bench.suite.core.validate import did_you_mean

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


_ONLY_FIELD = {"algo": "algo", "task": "task", "tier": "dataset", "seed": "seed"}


def select_runs(results_dir: Path, profile: str | None = None, only: dict | None = None,
                damaged: list[Damaged] | None = None) -> list[tuple[Path, RunRecord]]:
    """The finished runs of ``profile`` (every profile when None) that match ``only``
    (suite/runs/matrix.py: parse_only, keys algo, task, tier, seed). A value that no run of the selection
    has is an error (a typo must not look like "no runs")."""
    runs = list(finished_runs(results_dir, profile, damaged))
    for key, wanted in (only or {}).items():
        field_name = _ONLY_FIELD[key]
        have = sorted({str(getattr(rec, field_name)) for _, rec in runs}, key=_natural)
        missing = [w for w in wanted if w not in have]
        if missing:
            raise BenchError(f"--only {key}={','.join(missing)}: no finished run has it "
                             f"({key}s: {', '.join(have) or 'none'}){did_you_mean(missing[0], have)}")
        runs = [(d, rec) for d, rec in runs if str(getattr(rec, field_name)) in wanted]
    return runs


def _natural(text: str) -> tuple:
    return (0, int(text), "") if text.isdigit() else (1, 0, text)


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


def tidy_rows(results_dir: Path, profile: str | None = None, damaged: list[Damaged] | None = None,
              only: dict | None = None) -> list[dict]:
    """The tidy rows; a run whose final.json or metrics.jsonl is damaged gives none (it is
    appended to ``damaged``)."""
    rows = []
    damaged = [] if damaged is None else damaged
    for run_dir, rec in select_runs(results_dir, profile, only, damaged):
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


def marl_eval(results_dir: Path, profile: str | None = None, damaged: list[Damaged] | None = None,
              only: dict | None = None, consistent: bool = False, notes: list[str] | None = None) -> dict:
    """marl-eval's raw-data dictionary of the selected runs, its keys in marl-eval's order (numeric
    runs and steps, absolute_metrics last). One run per (env, task, algo, seed): of two (another
    profile or config) the later finished is kept. ``consistent``: cut to what marl-eval's matrices
    need (marl_eval_cut). What was dropped, and why, is appended to ``notes``."""
    notes = [] if notes is None else notes
    runs = _unique_runs([_MarlRun.of(rec) for _, rec in select_runs(results_dir, profile, only, damaged)], notes)
    if consistent:
        runs = marl_eval_cut(runs, notes)
    out: dict = {}
    for r in sorted(runs, key=lambda r: (r.env, r.task, r.algo, r.seed)):
        out.setdefault(r.env, {}).setdefault(r.task, {}).setdefault(r.algo, {})[f"run_{r.seed}"] = _marl_run(r.rec)
    return out


@dataclass(frozen=True)
class _MarlRun:
    """A finished run as marl-eval places it: env (the domain), task (`<task>_<dataset>`), algo, seed."""

    env: str
    task: str
    algo: str
    seed: int
    rec: RunRecord

    @classmethod
    def of(cls, rec: RunRecord) -> "_MarlRun":
        return cls(rec.domain, f"{rec.task}_{rec.dataset}", rec.algo, rec.seed, rec)

    @property
    def steps(self) -> tuple[int, ...]:
        """Its evaluation steps: marl-eval's x axis is their index times one interval per env."""
        return tuple(int(p["update"]) for p in self.rec.curve)

    def label(self) -> str:
        return f"{self.algo}/{self.task}/seed {self.seed}"


def _unique_runs(runs: list[_MarlRun], notes: list[str]) -> list[_MarlRun]:
    """One run per marl-eval key (env, task, algo, run_<seed>): the later finished (then its run key)."""
    best: dict[tuple, _MarlRun] = {}
    for r in sorted(runs, key=lambda r: (r.rec.finished_at, r.rec.run_key)):
        key = (r.env, r.task, r.algo, r.seed)
        if key in best:
            old = best[key].rec
            notes.append(f"dropped {r.label()} run {old.run_key[:10]} ({old.profile}): a later run of the same "
                         f"seed ({r.rec.run_key[:10]}, {r.rec.profile}) is exported")
        best[key] = r
    return list(best.values())


def marl_eval_cut(runs: list[_MarlRun], notes: list[str]) -> list[_MarlRun]:
    """The largest simple cut marl-eval's matrices accept, per env: every task with the same
    evaluation steps (the schedule most runs share), the algorithms every kept task has, and the
    seeds every kept (task, algorithm) has. Each drop is appended to ``notes``."""
    kept = []
    for env in sorted({r.env for r in runs}):
        group = [r for r in runs if r.env == env]
        schedules = Counter(r.steps for r in group)
        steps = max(schedules, key=lambda s: (schedules[s], len(s), s))
        for task in sorted({r.task for r in group if r.steps != steps}):
            off = sorted({len(r.steps) for r in group if r.task == task and r.steps != steps})
            notes.append(f"dropped {env}/{task} runs with {', '.join(map(str, off))} evaluation steps "
                         f"(kept: {len(steps)} steps, {steps[0]}..{steps[-1]})")
        group = [r for r in group if r.steps == steps]
        tasks = sorted({r.task for r in group})
        algos = set.intersection(*({r.algo for r in group if r.task == t} for t in tasks))
        for algo in sorted({r.algo for r in group} - algos):
            missing = [t for t in tasks if not any(r.algo == algo and r.task == t for r in group)]
            notes.append(f"dropped {env} algorithm {algo}: no runs on {', '.join(missing)}")
        group = [r for r in group if r.algo in algos]
        seeds = set.intersection(*({r.seed for r in group if (r.task, r.algo) == ta}
                                   for ta in {(r.task, r.algo) for r in group})) if group else set()
        if not seeds:
            notes.append(f"dropped every {env} run: no algorithm runs on all of its tasks with a common seed")
            continue
        extra = sorted({(r.algo, r.seed) for r in group if r.seed not in seeds})
        if extra:
            notes.append(f"dropped {env} seeds not run by every algorithm on every task: "
                         + ", ".join(f"{a} seed {s}" for a, s in extra))
        kept += [r for r in group if r.seed in seeds]
    return kept


def marl_eval_problems(data: dict) -> list[str]:
    """Why marl-eval's matrices (create_matrices_for_rliable) would fail on ``data``, per env:
    its tasks must share the algorithms, every algorithm the same run names, every run the same
    steps. Empty when they would not."""
    problems = []
    for env, tasks in data.items():
        algos = {frozenset(a) for a in tasks.values()}
        runs = {frozenset(r) for a in tasks.values() for r in a.values()}
        steps = {frozenset(s) for a in tasks.values() for r in a.values() for s in r.values()}
        if len(algos) > 1:
            problems.append(f"{env}: the tasks have different algorithms")
        if len(runs) > 1:
            problems.append(f"{env}: the algorithms have different seeds")
        if len(steps) > 1:
            problems.append(f"{env}: the runs have different evaluation steps")
    return problems


def _marl_run(rec: RunRecord) -> dict:
    """One run's entry: step_0..step_<n-1> in step order, then absolute_metrics."""
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
    return run


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
           damaged: list[Damaged] | None = None, only: dict | None = None, consistent: bool = False,
           notes: list[str] | None = None) -> int:
    """Write the export of every healthy finished run of the selection; returns the number of rows
    (tidy) or runs (marl-eval). Damaged runs are left out and appended to ``damaged``; what the
    marl-eval export dropped, or why marl-eval would reject it, to ``notes``."""
    out = Path(out)
    if consistent and fmt != "marl-eval":
        raise BenchError("--consistent cuts a marl-eval export (use it with --format marl-eval)")
    if fmt == "marl-eval":
        notes = [] if notes is None else notes
        data = marl_eval(results_dir, profile, damaged, only, consistent, notes)
        notes += [f"marl-eval would reject this export: {p} (--consistent cuts it)" for p in marl_eval_problems(data)]
        # Insertion order is marl-eval's order (it reads steps in key order), so keys are not sorted.
        atomic_write_bytes(out, (json.dumps(data, indent=1) + "\n").encode())
        return sum(len(runs) for tasks in data.values() for algos in tasks.values() for runs in algos.values())
    rows = tidy_rows(results_dir, profile, damaged, only)
    if fmt == "csv":
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
