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

from plcql_bench.leaderboard.stats import best_in_row, cell_stats

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
    kept.sort(key=lambda r: r.path)
    skipped.sort(key=lambda s: s.path)
    return kept, skipped


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


def build_tables(cells: list[dict], paper: dict | None) -> list[dict]:
    """Lay the aggregated cells out as one table per domain and mark the best cell per row.

    Mutates each cell dict: sets ``best`` and ``compared`` and attaches ``paper``."""
    task_rank = _paper_task_rank(paper)
    show_protocol = len({c["protocol_version"] for c in cells}) > 1
    by_domain: dict[str, list[dict]] = defaultdict(list)
    for c in cells:
        by_domain[c["domain"]].append(c)

    tables = []
    for domain in sorted(by_domain, key=_domain_rank):
        dcells = by_domain[domain]
        paper_order = _paper_algo_order(paper, domain)
        present = {c["algo"] for c in dcells}
        algos = [a for a in paper_order if a in present] + sorted(present - set(paper_order))

        rows_map: dict[tuple[str, str], list[dict]] = defaultdict(list)
        for c in dcells:
            rows_map[(c["task"], c["dataset"])].append(c)
        row_keys = sorted(rows_map, key=lambda k: (_task_rank(paper, k[0], task_rank), _tier_rank(domain, k[1])))

        rows = []
        mixed_any = False
        for task, dataset in row_keys:
            entries = rows_map[(task, dataset)]
            majority = _majority_variant(entries)
            mixed = len({(e["profile"], e["protocol_version"]) for e in entries}) > 1
            mixed_any |= mixed
            for e in entries:
                e["compared"] = (e["profile"], e["protocol_version"]) == majority
            best = set(
                best_in_row([e["mean"] for e in entries], eligible=[e["compared"] for e in entries])
            )
            for i, e in enumerate(entries):
                e["best"] = i in best
                e["paper"] = paper_value(paper, task, dataset, e["algo"])
            where = paper_row(paper, task, dataset)
            row_cells = []
            for algo in algos:
                mine = sorted(
                    (e for e in entries if e["algo"] == algo),
                    key=lambda e: (not e["compared"], e["profile"], str(e["protocol_version"])),
                )
                ref = paper_value(paper, task, dataset, algo)
                row_cells.append(
                    {
                        "algo": algo,
                        "best": any(e["best"] for e in mine),
                        "entries": [
                            {
                                "text": format_mean_std(e["mean"], e["std"], e["score_name"]),
                                "n": e["n"],
                                "profile": e["profile"],
                                "protocol_version": e["protocol_version"],
                                "best": e["best"],
                                "compared": e["compared"],
                                "seeds": ", ".join(str(s) for s in e["seeds"]),
                            }
                            for e in mine
                        ],
                        "paper": None
                        if ref is None
                        else {
                            "text": format_mean_std(ref["mean"], ref["std"], ref["score_name"])
                            if ref["mean"] is not None
                            else "\u2014 (not reported)",
                            "sc2": ref["sc2"],
                        },
                    }
                )
            rows.append(
                {
                    "task": task,
                    "dataset": dataset,
                    "paper_label": f"{where[1]} {where[2]}" if where else None,
                    "paper_sc2": bool(where and where[0] == "starcraft_results"),
                    "mixed": mixed,
                    "cells": row_cells,
                }
            )
        score_names = sorted({c["score_name"] for c in dcells})
        tables.append(
            {
                "domain": domain,
                "label": DOMAIN_LABELS.get(domain, domain),
                "score_label": " / ".join(
                    "win rate" if s == "win_rate" else "normalised score" for s in score_names
                ),
                "algos": [{"id": a, "label": algo_label(paper, a)} for a in algos],
                "rows": rows,
                "mixed": mixed_any,
                "smax": domain == "smax",
                "show_protocol": show_protocol,
                "n_runs": sum(c["n"] for c in dcells),
            }
        )
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
                "compared": int(bool(c["compared"])),
                "seeds": " ".join(str(s) for s in c["seeds"]),
                "paper_mean": "" if p.get("mean") is None else p["mean"],
                "paper_std": "" if p.get("std") is None else p["std"],
            }
        )
    return buf.getvalue()


def build_site(
    results_dir: Path,
    out_dir: Path,
    data_dir: Path | None = None,
    *,
    now: datetime | None = None,
    paper_path: Path | None = None,
) -> Path:
    """Build the leaderboard from ``results_dir`` into ``out_dir``; returns the index.html path.

    ``now`` fixes the build date (for reproducible output); ``paper_path`` overrides the
    transcribed paper tables (default: ``paper_results.yaml`` next to this module)."""
    results_dir, out_dir = Path(results_dir), Path(out_dir)
    if not results_dir.is_dir():
        raise FileNotFoundError(f"results directory not found: {results_dir}")
    now = now or datetime.now(timezone.utc)
    paper = load_paper_results(paper_path)
    runs, skipped = load_results(results_dir)
    cells = aggregate(runs)
    tables = build_tables(cells, paper)
    manifest, manifest_note = load_manifest(Path(data_dir) if data_dir is not None else None)
    prov = provenance(runs, now)
    profiles = sorted({r.profile for r in runs})

    context = {
        "title": "PLCQL-bench leaderboard",
        "css": _css(),
        "tables": tables,
        "n_cells": len(cells),
        "n_runs": len(runs),
        "skipped": skipped,
        "cards": dataset_cards(manifest, runs, paper) if manifest is not None else None,
        "manifest_note": manifest_note,
        "provenance": prov,
        "profiles": profiles,
        "non_paper_profiles": [p for p in profiles if p != PAPER_PROFILE],
        "paper_source": (paper or {}).get("source"),
        "paper_tables": paper_reference_tables(paper),
        "any_mixed": any(t["mixed"] for t in tables),
    }
    html = _environment().get_template("index.html.j2").render(**context)

    out_dir.mkdir(parents=True, exist_ok=True)
    index = out_dir / "index.html"
    index.write_text(html, encoding="utf-8")
    payload = {
        "schema_version": OUTPUT_SCHEMA_VERSION,
        "generated_at": now.astimezone(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "statistic": {"mean": "arithmetic mean over seeds", "std": "sample std, ddof=1 (0 when n=1)"},
        "cells": [_json_cell(c) for c in cells],
        "skipped": [{"path": s.path, "reason": s.reason} for s in skipped],
        "provenance": prov,
        "paper_source": (paper or {}).get("source"),
    }
    (out_dir / "results.json").write_text(json.dumps(payload, indent=2) + "\n", encoding="utf-8")
    (out_dir / "results.csv").write_text(_csv_text(cells), encoding="utf-8")
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
