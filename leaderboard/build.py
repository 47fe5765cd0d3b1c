"""Build the static leaderboard site from finished runs.

    python -m plcql_bench.leaderboard.build --results results/ --out site/ [--data data/]

``build_site`` scans ``results_dir`` recursively for ``final.json`` files (one per finished run,
written by the runner), aggregates them per (task, tier, algorithm, profile), and writes

* ``out_dir/index.html``   — a self-contained page (CSS inlined, no external requests);
* ``out_dir/results.json`` — the aggregated cells, skipped files and provenance;
* ``out_dir/results.csv``  — the aggregated cells, one row each.

Every number on the page that is not labelled "paper (reported)" is computed from the result
files. Invalid files never stop the build: they are listed on the page with the reason.
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import math
import sys
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import yaml
from jinja2 import Environment, FileSystemLoader, StrictUndefined, select_autoescape
from markupsafe import Markup

from plcql_bench.leaderboard.stats import best_in_row, cell_stats, ties_with_best

__all__ = [
    "RESULT_SCHEMA_VERSION",
    "RunResult",
    "Skipped",
    "build_site",
    "load_results",
    "aggregate",
    "load_paper_results",
    "paper_value",
    "format_score",
    "main",
]

RESULT_SCHEMA_VERSION = 1  # the final.json schema this builder understands
OUTPUT_SCHEMA_VERSION = 1  # of results.json / results.csv

HERE = Path(__file__).resolve().parent
TEMPLATES_DIR = HERE / "templates"
PAPER_RESULTS = HERE / "paper_results.yaml"

SCORE_NAMES = ("normalised", "win_rate")

# Quality tiers in the paper's order (same as plcql_bench.suite.tasks; kept local so the
# leaderboard has no dependency on the env registry).
CONTINUOUS_TIERS = ("expert", "medium", "medium-replay", "random")
SMAC_TIERS = ("medium", "medium-replay", "expert", "mixed")
SMAC_DOMAINS = ("smax", "smac")

DOMAIN_ORDER = ("mpe", "mamujoco", "smax", "smac")
DOMAIN_LABELS = {"mpe": "MPE", "mamujoco": "MaMuJoCo", "smax": "SMAX", "smac": "SMAC (StarCraft II)"}

# The profile whose budgets follow the paper; preferred when breaking majority-profile ties.
PAPER_PROFILE = "paper"


# --------------------------------------------------------------------------------------------
# Loading
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class RunResult:
    """One finished run, as read from its final.json (only the fields the leaderboard uses)."""

    path: str  # relative to results_dir, POSIX separators
    algo: str
    task: str
    domain: str
    dataset: str
    seed: int
    profile: str
    score_name: str
    score: float
    protocol_version: int | None = None
    schema_version: int = RESULT_SCHEMA_VERSION
    run_key: str = ""
    dataset_sha256: str = ""
    git_commit: str = ""
    finished_at: str = ""
    versions: dict[str, str] = field(default_factory=dict, compare=False)
    image: dict[str, str] = field(default_factory=dict, compare=False)
    # Learning curve ((update, score), ...) and measured update rounds per second (plots only).
    curve: tuple = field(default=(), compare=False)
    updates_per_s: float | None = field(default=None, compare=False)

    @property
    def variant(self) -> tuple[str, int | None]:
        """Runs are only ever aggregated or compared within one (profile, protocol version)."""
        return (self.profile, self.protocol_version)


@dataclass(frozen=True)
class Skipped:
    path: str
    reason: str


class _Invalid(Exception):
    pass


def _req_str(raw: dict, key: str) -> str:
    v = raw.get(key)
    if not isinstance(v, str) or not v.strip():
        raise _Invalid(f"missing or empty string field {key!r}")
    return v


def _opt_str(raw: dict, key: str) -> str:
    v = raw.get(key)
    return v if isinstance(v, str) else ""


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def parse_result(raw: Any, path: str) -> RunResult:
    """Validate one decoded final.json; raises ``ValueError`` with a one-line reason."""
    try:
        return _parse_result(raw, path)
    except _Invalid as exc:
        raise ValueError(str(exc)) from None


def _parse_result(raw: Any, path: str) -> RunResult:
    if not isinstance(raw, dict):
        raise _Invalid(f"top level is {type(raw).__name__}, not an object")
    status = raw.get("status")
    if status != "done":
        raise _Invalid(f"status is {status!r}, not 'done'")
    schema = raw.get("schema_version")
    if schema != RESULT_SCHEMA_VERSION:
        raise _Invalid(f"unsupported schema_version {schema!r} (this build reads {RESULT_SCHEMA_VERSION})")
    algo, task, dataset, profile = (_req_str(raw, k) for k in ("algo", "task", "dataset", "profile"))
    domain = raw.get("domain")
    if domain is None:
        domain = task.split("-", 1)[0]
    elif not isinstance(domain, str) or not domain.strip():
        raise _Invalid("field 'domain' is not a non-empty string")
    seed = raw.get("seed")
    if not _is_int(seed):
        raise _Invalid(f"seed {seed!r} is not an integer")
    score_name = raw.get("score_name")
    if score_name is None:
        score_name = "win_rate" if domain in SMAC_DOMAINS else "normalised"
    if score_name not in SCORE_NAMES:
        raise _Invalid(f"unknown score_name {score_name!r} (expected one of {', '.join(SCORE_NAMES)})")
    score = raw.get("score")
    if isinstance(score, bool) or not isinstance(score, (int, float)) or not math.isfinite(score):
        raise _Invalid(f"score {score!r} is not a finite number")
    if score_name == "win_rate" and not 0.0 <= score <= 1.0:
        raise _Invalid(f"win_rate score {score!r} is outside [0, 1]")
    protocol = raw.get("protocol_version")
    if protocol is not None and not _is_int(protocol):
        raise _Invalid(f"protocol_version {protocol!r} is not an integer")
    versions_raw = raw.get("versions")
    versions = (
        {str(k): str(v) for k, v in versions_raw.items() if v is not None}
        if isinstance(versions_raw, dict)
        else {}
    )
    curve = []
    for point in raw.get("curve") or []:
        if not isinstance(point, dict):
            continue
        u, v = point.get("update"), point.get("score")
        if _is_int(u) and isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v):
            curve.append((int(u), float(v)))
    train = raw.get("train") if isinstance(raw.get("train"), dict) else {}
    ups = train.get("updates_per_s")
    ups = float(ups) if isinstance(ups, (int, float)) and not isinstance(ups, bool) and math.isfinite(ups) and ups > 0 else None
    image_raw = raw.get("image")
    image = (
        {str(k): str(v) for k, v in image_raw.items() if v is not None} if isinstance(image_raw, dict) else {}
    )
    return RunResult(
        path=path,
        algo=algo,
        task=task,
        domain=domain,
        dataset=dataset,
        seed=int(seed),
        profile=profile,
        score_name=score_name,
        score=float(score),
        protocol_version=protocol,
        schema_version=schema,
        run_key=_opt_str(raw, "run_key"),
        dataset_sha256=_opt_str(raw, "dataset_sha256"),
        git_commit=_opt_str(raw, "git_commit"),
        finished_at=_opt_str(raw, "finished_at"),
        versions=versions,
        image=image,
        curve=tuple(curve),
        updates_per_s=ups,
    )


def load_results(results_dir: Path) -> tuple[list[RunResult], list[Skipped]]:
    """Read every ``final.json`` under ``results_dir``. Returns (valid runs, skipped files).

    A file is skipped (never fatal) when it cannot be read or decoded, is not a finished run
    (status != "done"), fails validation, or repeats the seed of another run in the same cell;
    for duplicates the run with the later ``finished_at`` (then the later path) is kept."""
    results_dir = Path(results_dir)
    runs: list[RunResult] = []
    skipped: list[Skipped] = []
    for file in sorted(results_dir.rglob("final.json")):
        if not file.is_file():
            continue
        rel = file.relative_to(results_dir).as_posix()
        try:
            raw = json.loads(file.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError) as exc:
            skipped.append(Skipped(rel, f"unreadable: {type(exc).__name__}: {exc}"))
            continue
        except json.JSONDecodeError as exc:
            skipped.append(Skipped(rel, f"invalid JSON: {exc}"))
            continue
        try:
            runs.append(_parse_result(raw, rel))
        except _Invalid as exc:
            skipped.append(Skipped(rel, str(exc)))

    # One run per (cell, seed).
    by_seed: dict[tuple, list[RunResult]] = defaultdict(list)
    for r in runs:
        by_seed[(r.domain, r.task, r.dataset, r.algo, r.score_name, r.variant, r.seed)].append(r)
    kept: list[RunResult] = []
    for group in by_seed.values():
        group.sort(key=lambda r: (r.finished_at, r.path))
        winner = group[-1]
        kept.append(winner)
        for loser in group[:-1]:
            skipped.append(
                Skipped(loser.path, f"duplicate of seed {loser.seed} in the same cell; kept {winner.path}")
            )
    kept = _newest_dataset_build(kept, skipped)
    kept.sort(key=lambda r: r.path)
    skipped.sort(key=lambda s: s.path)
    return kept, skipped


def _newest_dataset_build(runs: list[RunResult], skipped: list[Skipped]) -> list[RunResult]:
    """Keep, per (profile, task, dataset), only the runs on the dataset build (sha256) of the most
    recently finished run, so a rebuilt tier never averages runs on two different datasets; the
    others are skipped with the reason. Runs that do not record a sha are kept."""
    newest: dict[tuple, RunResult] = {}
    for r in runs:
        key = (r.profile, r.task, r.dataset)
        if r.dataset_sha256 and (key not in newest or (r.finished_at, r.path) > (newest[key].finished_at, newest[key].path)):
            newest[key] = r
    kept = []
    for r in runs:
        ref = newest.get((r.profile, r.task, r.dataset))
        if ref is not None and r.dataset_sha256 and r.dataset_sha256 != ref.dataset_sha256:
            skipped.append(Skipped(r.path, f"trained on an older build of {r.task}/{r.dataset} "
                                           f"(sha256 {r.dataset_sha256[:12]}; the newest runs use "
                                           f"{ref.dataset_sha256[:12]})"))
        else:
            kept.append(r)
    return kept


@dataclass(frozen=True)
class Failure:
    """A run that failed: a run directory with status.json ``failed`` and no final.json."""

    path: str  # the status.json, relative to results_dir
    algo: str
    task: str
    dataset: str
    seed: int | None
    profile: str
    error: str


def load_failures(results_dir: Path) -> list[Failure]:
    """Failed runs under ``results_dir``. The identity comes from the run's config.json (written
    before training), else from the path ``<profile>/<algo>/<task>/<tier>/seed<k>-<key>/``."""
    results_dir = Path(results_dir)
    out: list[Failure] = []
    for status_file in sorted(results_dir.rglob("status.json")):
        run_dir = status_file.parent
        if (run_dir / "final.json").exists():
            continue
        try:
            status = json.loads(status_file.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, json.JSONDecodeError):
            continue
        if not isinstance(status, dict) or status.get("status") != "failed":
            continue
        ident: dict = {}
        try:
            raw = json.loads((run_dir / "config.json").read_text(encoding="utf-8"))
            ident = raw if isinstance(raw, dict) else {}
        except (OSError, UnicodeDecodeError, json.JSONDecodeError):
            pass
        parts = run_dir.relative_to(results_dir).parts
        guess = dict(zip(("profile", "algo", "task", "dataset"), parts[-5:-1])) if len(parts) >= 5 else {}
        vals = {k: ident.get(k) if isinstance(ident.get(k), str) and ident.get(k) else guess.get(k) for k in ("profile", "algo", "task", "dataset")}
        if not all(vals.values()):
            continue
        seed = ident.get("seed")
        error = status.get("error")
        out.append(
            Failure(
                path=status_file.relative_to(results_dir).as_posix(),
                seed=seed if _is_int(seed) else None,
                error=(error.splitlines()[0][:300] if isinstance(error, str) and error else "no error message"),
                **vals,
            )
        )
    return out


# --------------------------------------------------------------------------------------------
# Paper results
# --------------------------------------------------------------------------------------------


def load_paper_results(path: Path | None = None) -> dict | None:
    """The transcribed paper tables (``paper_results.yaml``), or None when the file is absent."""
    path = PAPER_RESULTS if path is None else Path(path)
    if not path.is_file():
        return None
    return yaml.safe_load(path.read_text(encoding="utf-8"))


def _norm_map(name: str) -> str:
    return name.lower().replace("-", "_")


def paper_row(paper: dict | None, task: str, dataset: str) -> tuple[str, str, str] | None:
    """(table key, paper task label, paper tier label) for one of our rows, or None."""
    if not paper:
        return None
    tier = paper.get("tier_map", {}).get(dataset)
    if tier is None:
        return None
    tables = paper.get("tables", {})
    label = paper.get("task_map", {}).get(task)
    if label is not None:
        key = "main_results"
    else:
        prefix, _, smac_map = task.partition("-")
        if prefix not in SMAC_DOMAINS or not smac_map:
            return None
        key = "starcraft_results"
        rows = tables.get(key, {}).get("rows", {})
        label = next((m for m in rows if _norm_map(str(m)) == _norm_map(smac_map)), None)
        if label is None:
            return None
    if tier not in tables.get(key, {}).get("rows", {}).get(label, {}):
        return None
    return key, str(label), tier


def paper_value(paper: dict | None, task: str, dataset: str, algo: str) -> dict | None:
    """The paper's reported value for one of our cells.

    Returns None when the paper has no such row or column; otherwise
    ``{"mean", "std", "score_name", "table", "task", "tier", "sc2"}`` where mean/std are None
    when the paper prints "-"."""
    where = paper_row(paper, task, dataset)
    if where is None:
        return None
    key, label, tier = where
    table = paper["tables"][key]
    cells = table["rows"][label][tier]
    if algo not in cells:
        return None
    entry = cells[algo]
    return {
        "mean": None if entry is None else float(entry["mean"]),
        "std": None if entry is None else float(entry["std"]),
        "score_name": table.get("score_name", "normalised"),
        "table": table.get("label", key),
        "task": label,
        "tier": tier,
        "sc2": key == "starcraft_results",
    }


def _paper_algo_order(paper: dict | None, domain: str) -> list[str]:
    if not paper:
        return []
    tables = paper.get("tables", {})
    first, second = ("starcraft_results", "main_results") if domain in SMAC_DOMAINS else (
        "main_results",
        "starcraft_results",
    )
    order: list[str] = []
    for key in (first, second):
        for a in tables.get(key, {}).get("columns", []):
            if a not in order:
                order.append(a)
    return order


def _paper_task_rank(paper: dict | None) -> dict[str, int]:
    """Paper row label -> position (CN, PP, World, Half-C, then the SMAC maps)."""
    rank: dict[str, int] = {}
    if paper:
        for key in ("main_results", "starcraft_results"):
            for label in paper.get("tables", {}).get(key, {}).get("rows", {}):
                rank.setdefault(_norm_map(str(label)), len(rank))
    return rank


# --------------------------------------------------------------------------------------------
# Aggregation
# --------------------------------------------------------------------------------------------


def format_score(value: float | None, score_name: str) -> str:
    """Normalised scores with 1 decimal, win rates with 2. None -> an em dash."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "\u2014"
    text = f"{value:.2f}" if score_name == "win_rate" else f"{value:.1f}"
    if text.strip("-0.") == "" and text.startswith("-"):
        text = text[1:]  # no "-0.0"
    return text


def format_mean_std(mean: float | None, std: float | None, score_name: str) -> str:
    return f"{format_score(mean, score_name)} \u00b1 {format_score(std, score_name)}"


def aggregate(runs: list[RunResult]) -> list[dict]:
    """One dict per (domain, task, dataset, algo, score_name, profile, protocol_version)
    with ``cell_stats`` of the seeds' scores. Sorted by those keys."""
    groups: dict[tuple, list[RunResult]] = defaultdict(list)
    for r in runs:
        groups[(r.domain, r.task, r.dataset, r.algo, r.score_name, r.profile, r.protocol_version)].append(r)
    cells = []
    for key in sorted(groups, key=lambda k: tuple("" if x is None else str(x) for x in k)):
        members = sorted(groups[key], key=lambda r: r.seed)
        domain, task, dataset, algo, score_name, profile, protocol = key
        stats = cell_stats([r.score for r in members])
        cells.append(
            {
                "domain": domain,
                "task": task,
                "dataset": dataset,
                "algo": algo,
                "score_name": score_name,
                "profile": profile,
                "protocol_version": protocol,
                "n": stats["n"],
                "mean": stats["mean"],
                "std": stats["std"],
                "seeds": [r.seed for r in members],
                "scores": [r.score for r in members],
                "run_keys": [r.run_key for r in members],
                "files": [r.path for r in members],
            }
        )
    return cells


def _majority_variant(entries: list[dict]) -> tuple:
    """The (profile, protocol) whose cells are compared for bold in a row: most algorithms,
    then most seeds, then the 'paper' profile, then alphabetical."""
    count: Counter = Counter()
    seeds: Counter = Counter()
    for e in entries:
        v = (e["profile"], e["protocol_version"])
        count[v] += 1
        seeds[v] += e["n"]
    return min(
        count,
        key=lambda v: (-count[v], -seeds[v], v[0] != PAPER_PROFILE, v[0], -1 if v[1] is None else -v[1]),
    )


def _tier_rank(domain: str, tier: str) -> tuple:
    order = SMAC_TIERS if domain in SMAC_DOMAINS else CONTINUOUS_TIERS
    return (order.index(tier), "") if tier in order else (len(order), tier)


def _domain_rank(domain: str) -> tuple:
    return (DOMAIN_ORDER.index(domain), "") if domain in DOMAIN_ORDER else (len(DOMAIN_ORDER), domain)


def _task_rank(paper: dict | None, task: str, rank: dict[str, int]) -> tuple:
    label = None
    if paper:
        label = paper.get("task_map", {}).get(task)
        if label is None and task.partition("-")[0] in SMAC_DOMAINS:
            label = task.partition("-")[2]
    key = _norm_map(str(label)) if label is not None else None
    return (rank.get(key, len(rank)), task)


def algo_label(paper: dict | None, algo: str) -> str:
    return (paper or {}).get("algorithm_labels", {}).get(algo, algo)


MAIN_TABLE_FALLBACK = ("omar", "macql", "iql", "matd3bc", "dof", "cfcql", "spacql", "plcql")
SMAC_TABLE_FALLBACK = ("cfcql", "macql", "maicq", "omar", "madtkd", "bc", "iql", "awac", "spacql", "plcql")
ABLATION_FALLBACK = ("plcql", "plcql-k1", "plcql-kn", "plcql-w1")
TARGET = "plcql"  # the algorithm the headline claims and probabilities of improvement are about
RIVAL = "spacql"

# Agents per task, for the structural Q-evaluation count when the task registry cannot say.
KNOWN_N_AGENTS = {
    "mpe-cn": 3, "mpe-pp": 3, "mpe-world": 3, "mamujoco-halfcheetah-2x3": 2,
    "2s3z": 5, "3s_vs_5z": 3, "5m_vs_6m": 5, "6h_vs_8z": 6,
}


def _table_columns(paper: dict | None, key: str, fallback: tuple[str, ...]) -> list[str]:
    cols = ((paper or {}).get("tables", {}).get(key) or {}).get("columns")
    return list(cols) if cols else list(fallback)


def ablation_algos(paper: dict | None) -> list[str]:
    """Algorithm ids of the ablation table's columns (the full method first)."""
    variants = ((paper or {}).get("tables", {}).get("ablation") or {}).get("variants") or []
    ids = [v["algo"] for v in variants if isinstance(v, dict) and v.get("algo")]
    return ids or list(ABLATION_FALLBACK)


def is_discrete_task(domain: str, score_name: str) -> bool:
    """SMAC/SMAX tasks (scored by win rate) have discrete actions; MPE and MaMuJoCo continuous."""
    return domain in SMAC_DOMAINS or score_name == "win_rate"


def _implementations(algo: str) -> dict[str, type] | None:
    """{"continuous"|"discrete": class} of a registered algorithm, or None when the suite does not
    implement ``algo`` (or the algorithms cannot be imported here)."""
    try:
        from plcql_bench.algorithms.base import implementations

        return implementations(algo) or None
    except Exception:
        return None


def support(algo: str, discrete_task: bool) -> str:
    """"yes", "no" (the algorithm has no implementation for the task's action type) or "unknown"
    (the suite does not implement the algorithm). One name may have a continuous and a discrete
    implementation (algorithms/base.py: IMPLEMENTATIONS); a class with ``discrete=None`` is both."""
    impls = _implementations(algo)
    if impls is None:
        return "unknown"
    return "yes" if ("discrete" if discrete_task else "continuous") in impls else "no"


def n_agents(task: str) -> int | None:
    try:
        from plcql_bench.suite.tasks import get_task

        return int(get_task(task).spec.n_agents)
    except Exception:
        pass
    if task in KNOWN_N_AGENTS:
        return KNOWN_N_AGENTS[task]
    tail = task.partition("-")[2]
    for name, n in KNOWN_N_AGENTS.items():
        if _norm_map(tail) == _norm_map(name):
            return n
    return None


def _paper_task_label(paper: dict | None, task: str) -> str | None:
    if not paper:
        return None
    label = paper.get("task_map", {}).get(task)
    if label is not None:
        return str(label)
    prefix, _, tail = task.partition("-")
    if prefix in SMAC_DOMAINS and tail:
        rows = paper.get("tables", {}).get("starcraft_results", {}).get("rows", {})
        return next((str(m) for m in rows if _norm_map(str(m)) == _norm_map(tail)), None)
    return None


def paper_ablation_value(paper: dict | None, task: str, dataset: str, algo: str) -> dict | None:
    """The paper's ablation-table value for one of our cells (same keys as ``paper_value``)."""
    abl = ((paper or {}).get("tables", {}) or {}).get("ablation")
    label = _paper_task_label(paper, task)
    tier = (paper or {}).get("tier_map", {}).get(dataset)
    if not abl or label is None or tier is None:
        return None
    col = next((c for c in abl.get("columns", []) if str(c["task"]) == label and c["tier"] == tier), None)
    var = next((v for v in abl.get("variants", []) if v.get("algo") == algo), None)
    if col is None or var is None:
        return None
    entry = var.get("values", {}).get(label, {}).get(tier)
    return {
        "mean": None if entry is None else float(entry["mean"]),
        "std": None if entry is None else float(entry["std"]),
        "score_name": col.get("score_name", "normalised"),
        "table": abl.get("label", "ablation"),
        "task": label,
        "tier": tier,
        "sc2": task.partition("-")[0] in SMAC_DOMAINS,
    }


def _ablation_rows(paper: dict | None) -> list[tuple[str, str, str]]:
    """(task, dataset, domain) of the paper's ablation columns in this suite's ids. A SMAC map
    becomes the SMAX task ``smax-<map>`` (the suite's StarCraft substitute)."""
    abl = ((paper or {}).get("tables", {}) or {}).get("ablation") or {}
    inv_task = {str(v): k for k, v in (paper or {}).get("task_map", {}).items()}
    inv_tier = {v: k for k, v in (paper or {}).get("tier_map", {}).items()}
    out = []
    for c in abl.get("columns", []):
        label, tier = str(c["task"]), inv_tier.get(c["tier"])
        if tier is None:
            continue
        task = inv_task.get(label, f"smax-{label}")
        out.append((task, tier, task.partition("-")[0]))
    return out


def _entry_view(e: dict) -> dict:
    return {
        "text": format_mean_std(e["mean"], e["std"], e["score_name"]),
        "n": e["n"],
        "profile": e["profile"],
        "protocol_version": e["protocol_version"],
        "best": e["_best"],
        "tied": e["_tied"],
        "tie_p": e["_tie_p"],
        "tested": e["_tested"],
        "compared": e["_compared"],
        "seeds": ", ".join(str(s) for s in e["seeds"]),
    }


def _paper_view(ref: dict | None) -> dict | None:
    if ref is None:
        return None
    return {
        "text": format_mean_std(ref["mean"], ref["std"], ref["score_name"]) if ref["mean"] is not None else "\u2014 (not reported)",
        "sc2": ref["sc2"],
        "mean": ref["mean"],
        "std": ref["std"],
    }


def _build_table(
    key: str,
    label: str,
    score_label: str,
    algos: list[str],
    rows_in: list[tuple[str, str, str]],
    entries_by_row: dict[tuple[str, str], list[dict]],
    failures_by_cell: dict[tuple[str, str, str], list[Failure]],
    paper: dict | None,
    paper_lookup,
    show_protocol: bool,
) -> dict:
    """One table: rows (task, dataset, domain) x algorithm columns. Marks best and tied cells
    among the row's majority-profile entries. Entries are copied, never mutated."""
    rows = []
    mixed_any = False
    records = []
    for task, dataset, domain in rows_in:
        entries = [dict(e) for e in entries_by_row.get((task, dataset), []) if e["algo"] in algos]
        majority = _majority_variant(entries) if entries else None
        mixed = len({(e["profile"], e["protocol_version"]) for e in entries}) > 1
        mixed_any |= mixed
        for e in entries:
            e["_compared"] = (e["profile"], e["protocol_version"]) == majority
        best = set(best_in_row([e["mean"] for e in entries], eligible=[e["_compared"] for e in entries]))
        ties = ties_with_best([e["scores"] if e["_compared"] else None for e in entries], sorted(best))
        for i, e in enumerate(entries):
            e["_best"] = i in best
            e["_tied"], e["_tie_p"], e["_tested"] = ties[i]["tied"], ties[i]["p"], ties[i]["tested"]
        where = paper_row(paper, task, dataset)
        discrete = is_discrete_task(domain, entries[0]["score_name"] if entries else ("win_rate" if domain in SMAC_DOMAINS else "normalised"))
        row_cells = []
        for algo in algos:
            mine = sorted(
                (e for e in entries if e["algo"] == algo),
                key=lambda e: (not e["_compared"], e["profile"], str(e["protocol_version"])),
            )
            fails = failures_by_cell.get((task, dataset, algo), [])
            missing = None
            if not mine:
                if fails:
                    missing = {"kind": "failed", "detail": f"{len(fails)} run{'s' if len(fails) > 1 else ''} failed: {fails[0].error}"}
                else:
                    sup = support(algo, discrete)
                    if sup == "no":
                        kind = "discrete" if discrete else "continuous"
                        missing = {"kind": "unsupported", "detail": f"{algo_label(paper, algo)} does not support {kind} actions"}
                    elif sup == "unknown":
                        missing = {"kind": "not run", "detail": "not implemented in this suite yet"}
                    else:
                        missing = {"kind": "not run", "detail": "no result files for this cell"}
            ref = _paper_view(paper_lookup(paper, task, dataset, algo))
            row_cells.append(
                {
                    "algo": algo,
                    "best": any(e["_best"] for e in mine),
                    "tied": any(e["_tied"] for e in mine),
                    "entries": [_entry_view(e) for e in mine],
                    "missing": missing,
                    "n_failed": len(fails),
                    "failed_detail": fails[0].error if fails else "",
                    "paper": ref,
                }
            )
            base = {"table": key, "task": task, "dataset": dataset, "domain": domain, "algo": algo}
            paper_cols = {"paper_mean": None if ref is None else ref["mean"], "paper_std": None if ref is None else ref["std"]}
            if not mine:
                records.append({**base, "status": missing["kind"], "reason": missing["detail"], "profile": None,
                                "protocol_version": None, "n": 0, "mean": None, "std": None, "best": False,
                                "tied_with_best": False, "tie_p": None, "n_failed": len(fails), **paper_cols})
            for e in mine:
                records.append({**base, "status": "ok", "reason": "", "profile": e["profile"],
                                "protocol_version": e["protocol_version"], "n": e["n"], "mean": e["mean"],
                                "std": e["std"], "best": e["_best"], "tied_with_best": e["_tied"],
                                "tie_p": e["_tie_p"], "n_failed": len(fails), **paper_cols})
        rows.append(
            {
                "task": task,
                "dataset": dataset,
                "domain": domain,
                "paper_label": f"{where[1]} {where[2]}" if where else None,
                "paper_sc2": bool(where and where[0] == "starcraft_results"),
                "mixed": mixed,
                "cells": row_cells,
                "_entries": entries,
            }
        )
    return {
        "key": key,
        "domain": key,  # anchor id
        "label": label,
        "score_label": score_label,
        "algos": [{"id": a, "label": algo_label(paper, a)} for a in algos],
        "rows": rows,
        "mixed": mixed_any,
        "smax": any(r["domain"] == "smax" for r in rows),
        "show_protocol": show_protocol,
        "records": records,
    }


def build_tables(cells: list[dict], paper: dict | None, failures: list[Failure] = ()) -> list[dict]:
    """The three tables: the main (MPE + MaMuJoCo) table, the SMAC/SMAX table and the ablation
    table, each with the paper's columns first and any other algorithm we ran after them.

    A row appears in the main and SMAC tables when some run of it finished or failed; the
    ablation table always shows the paper's two ablation rows. Sets ``best``, ``compared``,
    ``tied`` on each aggregated cell (from the main/SMAC table; ablation-only algorithms from
    the ablation table)."""
    task_rank = _paper_task_rank(paper)
    show_protocol = len({c["protocol_version"] for c in cells}) > 1
    abl_algos = ablation_algos(paper)
    variants = set(abl_algos) - {TARGET}
    entries_by_row: dict[tuple[str, str], list[dict]] = defaultdict(list)
    for c in cells:
        entries_by_row[(c["task"], c["dataset"])].append(c)
    failures_by_cell: dict[tuple[str, str, str], list[Failure]] = defaultdict(list)
    for f in failures:
        failures_by_cell[(f.task, f.dataset, f.algo)].append(f)

    def domain_of(task: str) -> str:
        for c in cells:
            if c["task"] == task:
                return c["domain"]
        return task.partition("-")[0]

    def is_smac_row(task: str) -> bool:
        d = domain_of(task)
        return d in SMAC_DOMAINS or any(c["score_name"] == "win_rate" for c in cells if c["task"] == task)

    keys: set[tuple[str, str]] = {(c["task"], c["dataset"]) for c in cells if c["algo"] not in variants}
    keys |= {(f.task, f.dataset) for f in failures if f.algo not in variants}

    def ordered(ks) -> list[tuple[str, str, str]]:
        rows = [(t, d, domain_of(t)) for t, d in ks]
        return sorted(rows, key=lambda r: (_domain_rank(r[2]), _task_rank(paper, r[0], task_rank), _tier_rank(r[2], r[1])))

    def extra(rows: list[tuple[str, str, str]], base: list[str]) -> list[str]:
        ks = {(t, d) for t, d, _ in rows}
        present = {c["algo"] for c in cells if (c["task"], c["dataset"]) in ks} | {
            f.algo for f in failures if (f.task, f.dataset) in ks
        }
        return base + sorted(present - set(base) - variants)

    main_rows = ordered(k for k in keys if not is_smac_row(k[0]))
    smac_rows = ordered(k for k in keys if is_smac_row(k[0]))
    abl_rows = list(_ablation_rows(paper))
    more = {(c["task"], c["dataset"]) for c in cells if c["algo"] in variants} | {
        (f.task, f.dataset) for f in failures if f.algo in variants
    }
    abl_rows += [r for r in ordered(more) if (r[0], r[1]) not in {(t, d) for t, d, _ in abl_rows}]
    abl_rows = [(t, d, domain_of(t) if any(c["task"] == t for c in cells) else dom) for t, d, dom in abl_rows]

    tables = [
        _build_table("main", "MPE + MaMuJoCo", "normalised score", extra(main_rows, _table_columns(paper, "main_results", MAIN_TABLE_FALLBACK)),
                     main_rows, entries_by_row, failures_by_cell, paper, paper_value, show_protocol),
        _build_table("smac", "SMAC / SMAX", "win rate", extra(smac_rows, _table_columns(paper, "starcraft_results", SMAC_TABLE_FALLBACK)),
                     smac_rows, entries_by_row, failures_by_cell, paper, paper_value, show_protocol),
        _build_table("ablation", "Ablation of PLCQL", "normalised score / win rate", abl_algos,
                     abl_rows, entries_by_row, failures_by_cell, paper, paper_ablation_value, show_protocol),
    ]
    # Flags on the shared aggregated cells (for results.json / results.csv).
    for t in (tables[2], tables[0], tables[1]):  # main/SMAC win over ablation
        for row in t["rows"]:
            for e in row["_entries"]:
                for c in cells:
                    if c["task"] == e["task"] and c["dataset"] == e["dataset"] and c["algo"] == e["algo"] and c["profile"] == e["profile"] and c["protocol_version"] == e["protocol_version"]:
                        c["best"], c["compared"], c["tied"], c["tie_p"] = e["_best"], e["_compared"], e["_tied"], e["_tie_p"]
                        c["paper"] = paper_value(paper, c["task"], c["dataset"], c["algo"]) or paper_ablation_value(paper, c["task"], c["dataset"], c["algo"])
    for c in cells:
        c.setdefault("best", False)
        c.setdefault("compared", False)
        c.setdefault("tied", False)
        c.setdefault("tie_p", None)
        c.setdefault("paper", paper_value(paper, c["task"], c["dataset"], c["algo"]))
    return tables


# --------------------------------------------------------------------------------------------
# Dataset cards, provenance, paper reference tables
# --------------------------------------------------------------------------------------------


def load_manifest(data_dir: Path | None) -> tuple[dict | None, str | None]:
    """(merged manifest entries or None, note explaining why none were found).

    Reads `data_dir/manifest.json` and the per-profile `data_dir/<profile>/manifest.json`
    files the suite writes; keys become "<profile dir>:<task>/<tier>" so profiles never clash."""
    if data_dir is None:
        return None, None
    data_dir = Path(data_dir)
    paths = [p for p in [data_dir / "manifest.json", *sorted(data_dir.glob("*/manifest.json"))] if p.is_file()]
    if not paths:
        return None, f"no manifest.json in {data_dir}"
    merged: dict = {}
    for path in paths:
        try:
            manifest = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
            return None, f"{path} could not be read: {exc}"
        if not isinstance(manifest, dict):
            return None, f"{path} is not a JSON object"
        prefix = "" if path.parent == data_dir else f"{path.parent.name}:"
        merged.update({f"{prefix}{key}": entry for key, entry in manifest.items()})
    return merged, None


def _num(v: Any, fmt: str) -> str:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
        return "\u2014"
    return format(v, fmt)


def _pair(entry: dict, a: str, b: str, template: str) -> str:
    x, y = _num(entry.get(a), ".2f"), _num(entry.get(b), ".2f")
    return "\u2014" if x == y == "\u2014" else template.format(x, y)


def dataset_cards(manifest: dict, runs: list[RunResult], paper: dict | None) -> list[dict]:
    task_rank = _paper_task_rank(paper)
    used: dict[tuple[str, str], list[RunResult]] = defaultdict(list)
    for r in runs:
        used[(r.task, r.dataset)].append(r)
    cards = []
    for key, entry in manifest.items():
        if not isinstance(entry, dict):
            entry = {}
        k_task, _, k_tier = str(key).rpartition(":")[2].partition("/")
        task = entry.get("task_id") if isinstance(entry.get("task_id"), str) else k_task
        tier = entry.get("quality") if isinstance(entry.get("quality"), str) else k_tier
        sha = entry.get("sha256") if isinstance(entry.get("sha256"), str) else ""
        these = used.get((task, tier), [])
        mismatched = [r for r in these if sha and r.dataset_sha256 and r.dataset_sha256 != sha]
        cards.append(
            {
                "task": task,
                "tier": tier,
                "profile": str(entry.get("profile", "\u2014")),
                "n_transitions": _num(entry.get("n_transitions"), ","),
                "n_episodes": _num(entry.get("n_episodes"), ","),
                "return_mean_std": _pair(entry, "return_mean", "return_std", "{} \u00b1 {}"),
                "return_range": _pair(entry, "return_min", "return_max", "[{}, {}]"),
                "win_rate": _num(entry.get("win_rate"), ".2f"),
                "behaviour": str(entry.get("behaviour_policy_id", "\u2014")),
                "ref_random": _num(entry.get("ref_return_random"), ".2f"),
                "ref_expert": _num(entry.get("ref_return_expert"), ".2f"),
                "sha256": sha,
                "sha_short": sha[:12] if sha else "\u2014",
                "n_runs": len(these),
                "n_mismatch": len(mismatched),
                "_rank": (_task_rank(paper, task, task_rank), _tier_rank(task.partition("-")[0], tier)),
            }
        )
    cards.sort(key=lambda c: c.pop("_rank"))
    return cards


def provenance(runs: list[RunResult], now: datetime) -> dict:
    versions: dict[str, set[str]] = defaultdict(set)
    image: dict[str, set[str]] = defaultdict(set)
    for r in runs:
        for k, v in r.versions.items():
            versions[k].add(v)
        for k, v in r.image.items():
            image[k].add(v)
    return {
        "build_date_utc": now.astimezone(timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC"),
        "n_runs": len(runs),
        "profiles": dict(sorted(Counter(r.profile for r in runs).items())),
        "protocol_versions": dict(
            sorted(Counter("unknown" if r.protocol_version is None else str(r.protocol_version) for r in runs).items())
        ),
        "schema_versions": sorted({r.schema_version for r in runs}),
        "git_commits": dict(sorted(Counter(r.git_commit or "unknown" for r in runs).items())),
        "versions": {k: sorted(v) for k, v in sorted(versions.items())},
        "image": {k: sorted(v) for k, v in sorted(image.items())},
    }


def short_commit(commit: str) -> str:
    """First 12 hex digits, keeping a "-dirty" marker."""
    dirty = commit.endswith("-dirty")
    base = commit[: -len("-dirty")] if dirty else commit
    return base[:12] + ("-dirty" if dirty else "")


def paper_reference_tables(paper: dict | None) -> list[dict]:
    """The paper's tables as printed (for a collapsed reference section on the page)."""
    if not paper:
        return []
    out = []
    tables = paper.get("tables", {})
    for key in ("main_results", "starcraft_results"):
        t = tables.get(key)
        if not t:
            continue
        rows = []
        for task, tiers in t["rows"].items():
            for tier, cells in tiers.items():
                rows.append(
                    {
                        "label": f"{task} {tier}",
                        "values": [
                            format_mean_std(c["mean"], c["std"], t["score_name"]) if c else "\u2014"
                            for c in (cells.get(a) for a in t["columns"])
                        ],
                    }
                )
        out.append(
            {
                "label": t.get("label", key),
                "caption": t.get("caption", ""),
                "columns": [algo_label(paper, a) for a in t["columns"]],
                "rows": rows,
            }
        )
    abl = tables.get("ablation")
    if abl:
        cols = abl["columns"]
        out.append(
            {
                "label": abl.get("label", "ablation"),
                "caption": abl.get("caption", ""),
                "columns": [f"{c['task']} {c['tier']}" for c in cols],
                "rows": [
                    {
                        "label": v["label"],
                        "values": [
                            format_mean_std(x["mean"], x["std"], c["score_name"]) if x else "\u2014"
                            for c in cols
                            for x in [v["values"].get(c["task"], {}).get(c["tier"])]
                        ],
                    }
                    for v in abl["variants"]
                ],
            }
        )
    return out


# --------------------------------------------------------------------------------------------
# Rendering and output
# --------------------------------------------------------------------------------------------


def _environment() -> Environment:
    env = Environment(
        loader=FileSystemLoader(str(TEMPLATES_DIR)),
        autoescape=select_autoescape(enabled_extensions=("html", "j2"), default_for_string=True),
        undefined=StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
        keep_trailing_newline=True,
    )
    env.filters["short_commit"] = short_commit
    return env


def _css() -> Markup:
    css = (TEMPLATES_DIR / "style.css").read_text(encoding="utf-8")
    if "</" in css:
        raise ValueError("style.css must not contain '</' (it is inlined into a <style> element)")
    return Markup(css)


CSV_FIELDS = (
    "domain",
    "task",
    "dataset",
    "algo",
    "profile",
    "protocol_version",
    "score_name",
    "n",
    "mean",
    "std",
    "best",
    "tied_with_best",
    "compared",
    "seeds",
    "paper_mean",
    "paper_std",
)


def _json_cell(c: dict) -> dict:
    out = {k: c[k] for k in (
        "domain", "task", "dataset", "algo", "profile", "protocol_version", "score_name",
        "n", "mean", "std", "best", "compared", "seeds", "scores", "run_keys", "files",
    )}
    out["tied_with_best"] = bool(c.get("tied"))
    out["tie_p"] = c.get("tie_p")
    p = c.get("paper")
    out["paper"] = None if p is None else {k: p[k] for k in ("mean", "std", "table", "task", "tier")}
    return out


def _csv_text(cells: list[dict]) -> str:
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=CSV_FIELDS, lineterminator="\n")
    w.writeheader()
    for c in cells:
        p = c.get("paper") or {}
        w.writerow(
            {
                **{k: c[k] for k in CSV_FIELDS if k in c and k != "seeds"},
                "protocol_version": "" if c["protocol_version"] is None else c["protocol_version"],
                "mean": repr(c["mean"]),
                "std": repr(c["std"]),
                "best": int(bool(c["best"])),
                "tied_with_best": int(bool(c.get("tied"))),
                "compared": int(bool(c["compared"])),
                "seeds": " ".join(str(s) for s in c["seeds"]),
                "paper_mean": "" if p.get("mean") is None else p["mean"],
                "paper_std": "" if p.get("std") is None else p["std"],
            }
        )
    return buf.getvalue()


TABLE_FIELDS = (
    "table", "task", "dataset", "domain", "algo", "status", "reason", "profile", "protocol_version",
    "n", "mean", "std", "best", "tied_with_best", "tie_p", "n_failed", "paper_mean", "paper_std",
)


def _csv_records(records: list[dict], fields: tuple[str, ...] | None = None) -> str:
    fields = fields or tuple(dict.fromkeys(k for r in records for k in r))
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=list(fields), lineterminator="\n", extrasaction="ignore")
    w.writeheader()
    for r in records:
        w.writerow({k: "" if r.get(k) is None else (int(r[k]) if isinstance(r[k], bool) else r[k]) for k in fields})
    return buf.getvalue()


ENV_PACKAGES = ("mpe2", "pettingzoo", "mujoco", "gymnasium-robotics", "jaxmarl", "jax", "jaxlib", "smax", "pysc2", "sc2", "smac")


def env_versions(prov: dict) -> list[dict]:
    """The environment stacks behind the numbers (MuJoCo for MaMuJoCo, JaxMARL for SMAX, SC2),
    from the versions the runs recorded; the named stacks are listed even when no run used them."""
    versions = prov.get("versions", {})
    out = [{"name": k, "versions": versions[k], "absent": False} for k in ENV_PACKAGES if k in versions]
    for name, keys in (("MuJoCo", ("mujoco",)), ("SMAX (JaxMARL)", ("jaxmarl", "smax")), ("StarCraft II", ("sc2", "pysc2", "smac"))):
        if not any(k in versions for k in keys):
            out.append({"name": name, "versions": [], "absent": True})
    return out


def build_site(
    results_dir: Path,
    out_dir: Path,
    data_dir: Path | None = None,
    *,
    now: datetime | None = None,
    paper_path: Path | None = None,
    bootstrap_reps: int | None = None,
    poi_reps: int | None = None,
) -> Path:
    """Build the leaderboard from ``results_dir`` into ``out_dir``; returns the index.html path.

    ``now`` fixes the build date (for reproducible output); ``paper_path`` overrides the
    transcribed paper tables (default: ``paper_results.yaml`` next to this module);
    ``bootstrap_reps`` / ``poi_reps`` override the stratified-bootstrap replicates (tests)."""
    from plcql_bench.leaderboard import analysis
    from plcql_bench.leaderboard import stats as st

    results_dir, out_dir = Path(results_dir), Path(out_dir)
    if not results_dir.is_dir():
        raise FileNotFoundError(f"results directory not found: {results_dir}")
    now = now or datetime.now(timezone.utc)
    reps = bootstrap_reps or st.BOOTSTRAP_REPS
    preps = poi_reps or st.POI_REPS
    paper = load_paper_results(paper_path)
    runs, skipped = load_results(results_dir)
    failures = load_failures(results_dir)
    cells = aggregate(runs)
    tables = build_tables(cells, paper, failures)
    manifest, manifest_note = load_manifest(Path(data_dir) if data_dir is not None else None)
    prov = provenance(runs, now)
    profiles = sorted({r.profile for r in runs})

    def label(a: str) -> str:
        return algo_label(paper, a)

    runs_by_cell: dict[tuple, list[RunResult]] = defaultdict(list)
    for r in runs:
        runs_by_cell[(r.task, r.dataset, r.algo, r.profile, r.protocol_version)].append(r)
    main_t, smac_t, abl_t = tables
    aggs = [
        a
        for i, t in enumerate((main_t, smac_t))
        for a in [analysis.aggregates(t, label, TARGET, reps=reps, poi_reps=preps, salt=f"agg{i}")]
        if a is not None
    ]
    claims = analysis.claims([main_t, smac_t], paper, label, TARGET, RIVAL)
    curves = analysis.learning_curves(tables, runs_by_cell, label)
    par = analysis.par_policy(tables, runs_by_cell, results_dir, TARGET, n_agents)
    compute = analysis.compute_cost(runs, label, TARGET, RIVAL, n_agents)
    cards = dataset_cards(manifest, runs, paper) if manifest is not None else None

    downloads = {
        "main": ("tables/main", [r for r in main_t["records"]], TABLE_FIELDS),
        "smac": ("tables/smac", [r for r in smac_t["records"]], TABLE_FIELDS),
        "ablation": ("tables/ablation", [r for r in abl_t["records"]], TABLE_FIELDS),
        "aggregates": ("tables/aggregates", [r for a in aggs for r in a["records"]], None),
        "poi": ("tables/probability_of_improvement", [r for a in aggs for r in a["poi_records"]], None),
        "claims": ("tables/claims", claims["records"], None),
        "par": ("tables/par_policy", par["records"], None),
        "compute": ("tables/compute_cost", compute["records"], None),
        "datasets": ("tables/datasets", cards or [], None),
        "skipped": ("tables/skipped", [{"path": s.path, "reason": s.reason} for s in skipped]
                    + [{"path": f.path, "reason": f"failed run: {f.error}"} for f in failures], None),
    }

    context = {
        "title": "PLCQL-bench leaderboard",
        "css": _css(),
        "tables": tables,
        "n_cells": len(cells),
        "n_runs": len(runs),
        "skipped": skipped,
        "failures": failures,
        "cards": cards,
        "manifest_note": manifest_note,
        "provenance": prov,
        "env_versions": env_versions(prov),
        "profiles": profiles,
        "non_paper_profiles": [p for p in profiles if p != PAPER_PROFILE],
        "paper_source": (paper or {}).get("source"),
        "paper_tables": paper_reference_tables(paper),
        "any_mixed": any(t["mixed"] for t in tables),
        "tie_test": st.TIE_TEST,
        "aggregates": aggs,
        "claims": claims,
        "curves": curves,
        "par": par,
        "compute": compute,
        "target_label": label(TARGET),
        "rival_label": label(RIVAL),
        "downloads": {k: v[0] for k, v in downloads.items()},
        "bootstrap": {"reps": reps, "poi_reps": preps, "seed": st.BOOTSTRAP_SEED},
    }
    html = _environment().get_template("index.html.j2").render(**context)

    out_dir.mkdir(parents=True, exist_ok=True)
    index = out_dir / "index.html"
    index.write_text(html, encoding="utf-8")
    payload = {
        "schema_version": OUTPUT_SCHEMA_VERSION,
        "generated_at": now.astimezone(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "statistic": {"mean": "arithmetic mean over seeds", "std": "sample std, ddof=1 (0 when n=1)",
                      "tie": st.TIE_TEST},
        "cells": [_json_cell(c) for c in cells],
        "skipped": [{"path": s.path, "reason": s.reason} for s in skipped],
        "failed": [{"path": f.path, "algo": f.algo, "task": f.task, "dataset": f.dataset, "seed": f.seed,
                    "profile": f.profile, "error": f.error} for f in failures],
        "provenance": prov,
        "paper_source": (paper or {}).get("source"),
    }
    (out_dir / "results.json").write_text(json.dumps(payload, indent=2) + "\n", encoding="utf-8")
    (out_dir / "results.csv").write_text(_csv_text(cells), encoding="utf-8")
    (out_dir / "tables").mkdir(exist_ok=True)
    for stem, records, fields in downloads.values():
        (out_dir / f"{stem}.csv").write_text(_csv_records(records, fields), encoding="utf-8")
        (out_dir / f"{stem}.json").write_text(
            json.dumps({"schema_version": OUTPUT_SCHEMA_VERSION, "rows": records}, indent=2, default=str) + "\n",
            encoding="utf-8",
        )
    return index


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m plcql_bench.leaderboard.build", description="Build the static leaderboard site."
    )
    ap.add_argument("--results", required=True, type=Path, help="folder searched recursively for final.json")
    ap.add_argument("--out", required=True, type=Path, help="output folder (index.html, results.json/.csv)")
    ap.add_argument("--data", type=Path, default=None, help="dataset folder with manifest.json (optional)")
    args = ap.parse_args(argv)
    try:
        index = build_site(args.results, args.out, args.data)
    except FileNotFoundError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(index)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
