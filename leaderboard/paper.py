"""The paper's reported numbers (paper_results.yaml, transcribed once) and the lookups that tie
them to this suite's ids: rows, columns, labels, the ablation variants, and the paper's headline
claims recounted from its own tables."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import yaml

from plcql_bench.algorithms.base import parse_sweep_name

__all__ = ["load_paper_results", "load_variants", "paper_value", "paper_ablation_value", "paper_row",
           "algo_label", "table_columns", "ablation_settings", "ablation_variants", "Variant",
           "paper_claims_check", "reference_tables", "task_rank", "tier_rank", "domain_rank",
           "SMAC_DOMAINS", "PAPER_SEEDS"]

HERE = Path(__file__).resolve().parent
PAPER_RESULTS = HERE / "paper_results.yaml"
VARIANTS = HERE / "variants.yaml"
PAPER_SEEDS = 5  # the paper's tables are over 5 seeds

CONTINUOUS_TIERS = ("expert", "medium", "medium-replay", "random")
SMAC_TIERS = ("medium", "medium-replay", "expert", "mixed")
SMAC_DOMAINS = ("smax", "smac")
DOMAIN_ORDER = ("mpe", "mamujoco", "smax", "smac")
MAIN_FALLBACK = ("omar", "macql", "iql", "matd3bc", "dof", "cfcql", "spacql", "plcql")
SMAC_FALLBACK = ("cfcql", "macql", "maicq", "omar", "madtkd", "bc", "iql", "awac", "spacql", "plcql")
ABLATION_FALLBACK = ("plcql", "plcql-k1", "plcql-kn", "plcql-w1")
FAMILY = "plcql"  # ablation rows: the full method and every algorithm named plcql-*


def load_paper_results(path: Path | None = None) -> dict | None:
    """The transcribed paper tables, or None when the file is absent."""
    path = PAPER_RESULTS if path is None else Path(path)
    return yaml.safe_load(path.read_text(encoding="utf-8")) if path.is_file() else None


def load_variants(path: Path | None = None) -> dict:
    """This suite's ablation-table rows beyond the paper's (variants.yaml)."""
    path = VARIANTS if path is None else Path(path)
    return (yaml.safe_load(path.read_text(encoding="utf-8")) or {}) if path.is_file() else {}


def _norm(name: str) -> str:
    return str(name).lower().replace("-", "_")


def algo_label(paper: dict | None, algo: str) -> str:
    return (paper or {}).get("algorithm_labels", {}).get(algo, algo)


def _task_label(paper: dict | None, task: str) -> tuple[str, str] | None:
    """(table key, paper row label) of one of our tasks; SMAC maps also match smax-<map>."""
    if not paper:
        return None
    label = paper.get("task_map", {}).get(task)
    if label is not None:
        return "main_results", str(label)
    prefix, _, tail = task.partition("-")
    if prefix not in SMAC_DOMAINS or not tail:
        return None
    rows = paper.get("tables", {}).get("starcraft_results", {}).get("rows", {})
    label = next((m for m in rows if _norm(m) == _norm(tail)), None)
    return None if label is None else ("starcraft_results", str(label))


def paper_row(paper: dict | None, task: str, dataset: str) -> tuple[str, str, str] | None:
    """(table key, paper task label, paper tier label) for one of our rows, or None."""
    where = _task_label(paper, task)
    tier = (paper or {}).get("tier_map", {}).get(dataset)
    if where is None or tier is None:
        return None
    key, label = where
    if tier not in paper["tables"].get(key, {}).get("rows", {}).get(label, {}):
        return None
    return key, label, tier


@dataclass(frozen=True)
class PaperRef:
    mean: float | None  # None: the paper prints "-"
    std: float | None
    score_name: str
    table: str
    task: str
    tier: str
    sc2: bool  # a StarCraft II number (not comparable to SMAX)


def paper_value(paper: dict | None, task: str, dataset: str, algo: str) -> PaperRef | None:
    """The paper's main/SMAC-table value for one of our cells, or None (no such row or column)."""
    where = paper_row(paper, task, dataset)
    if where is None:
        return None
    key, label, tier = where
    table = paper["tables"][key]
    cells = table["rows"][label][tier]
    if algo not in cells:
        return None
    e = cells[algo]
    return PaperRef(None if e is None else float(e["mean"]), None if e is None else float(e["std"]),
                    table.get("score_name", "normalised"), table.get("label", key), label, tier,
                    key == "starcraft_results")


def ablation_settings(paper: dict | None) -> list[tuple[str, str]]:
    """(task, dataset) of the paper's ablation columns in this suite's ids; a SMAC map becomes
    the SMAX task ``smax-<map>`` (the suite's StarCraft substitute)."""
    abl = ((paper or {}).get("tables", {}) or {}).get("ablation") or {}
    inv_task = {str(v): k for k, v in (paper or {}).get("task_map", {}).items()}
    inv_tier = {v: k for k, v in (paper or {}).get("tier_map", {}).items()}
    return [(inv_task.get(str(c["task"]), f"smax-{c['task']}"), inv_tier[c["tier"]])
            for c in abl.get("columns", []) if c["tier"] in inv_tier]


def paper_ablation_value(paper: dict | None, task: str, dataset: str, algo: str) -> PaperRef | None:
    abl = ((paper or {}).get("tables", {}) or {}).get("ablation")
    where = _task_label(paper, task)
    tier = (paper or {}).get("tier_map", {}).get(dataset)
    if not abl or where is None or tier is None:
        return None
    label = where[1]
    col = next((c for c in abl.get("columns", []) if str(c["task"]) == label and c["tier"] == tier), None)
    var = next((v for v in abl.get("variants", []) if v.get("algo") == algo), None)
    if col is None or var is None:
        return None
    e = var.get("values", {}).get(label, {}).get(tier)
    return PaperRef(None if e is None else float(e["mean"]), None if e is None else float(e["std"]),
                    col.get("score_name", "normalised"), abl.get("label", "ablation"), label, tier,
                    task.partition("-")[0] in SMAC_DOMAINS)


@dataclass(frozen=True)
class Variant:
    """One row of the ablation table."""

    algo: str
    label: str
    paper: bool  # in the paper's ablation table (else this suite's, not the paper's)
    what: str = ""
    beyond: bool = False  # a new method beyond the paper (not an ablation of it)


def ablation_variants(paper: dict | None, suite: dict, names: set[str]) -> list[Variant]:
    """The paper's ablation rows, then variants.yaml's, then any other ``plcql-*`` name in
    ``names`` (registered or run), labelled as this suite's."""
    out = [Variant(v["algo"], v.get("label", v["algo"]), True)
           for v in (((paper or {}).get("tables", {}) or {}).get("ablation") or {}).get("variants", []) if v.get("algo")]
    if not out:
        out = [Variant(a, algo_label(paper, a), True) for a in ABLATION_FALLBACK]
    seen = {v.algo for v in out}
    for algo, meta in suite.items():
        if algo not in seen:
            out.append(Variant(algo, meta.get("label", algo), False, meta.get("what", ""), bool(meta.get("beyond"))))
            seen.add(algo)
    for algo in sorted(n for n in names if n.startswith(FAMILY + "-") and n not in seen):
        out.append(Variant(algo, algo, False, _variant_what(algo)))
    return out


def _variant_what(algo: str) -> str:
    """The ablation row's description of a variant variants.yaml does not describe: a sweep's field and
    value (all --set), else that it is a registered variant."""

    sweep = parse_sweep_name(algo)
    if sweep is not None:
        base, field, value = sweep
        return f"sweep of {base}: {field} = {value!r} (all --set {base}.{field}=...)"
    return "registered variant (no description in leaderboard/variants.yaml)"


def table_columns(paper: dict | None, key: str) -> list[str]:
    fallback = {"main_results": MAIN_FALLBACK, "starcraft_results": SMAC_FALLBACK}[key]
    return list(((paper or {}).get("tables", {}).get(key) or {}).get("columns") or fallback)


def paper_claims_check(paper: dict | None, target: str = "plcql", rival: str = "spacql") -> dict | None:
    """The paper's headline claims recounted from its own tables: rows where ``target`` has the
    strictly highest mean of the row, and rows where it is strictly above / equal to ``rival``."""
    if not paper:
        return None
    rows = best = beats = ties = 0
    for key in ("main_results", "starcraft_results"):
        for tiers in paper.get("tables", {}).get(key, {}).get("rows", {}).values():
            for cells in tiers.values():
                t, r = cells.get(target), cells.get(rival)
                if t is None:
                    continue
                rows += 1
                others = [c["mean"] for a, c in cells.items() if c and a != target]
                best += all(t["mean"] > m for m in others)
                if r is not None:
                    beats += t["mean"] > r["mean"]
                    ties += t["mean"] == r["mean"]
    return {"rows": rows, "best": best, "beats": beats, "ties": ties, "claims": paper.get("claims", {})}


def reference_tables(paper: dict | None, fmt) -> list[dict]:
    """The paper's tables as printed, for the collapsed reference section (``fmt(mean, std,
    score_name)`` formats one entry)."""
    if not paper:
        return []
    out, tables = [], paper.get("tables", {})
    for key in ("main_results", "starcraft_results"):
        t = tables.get(key)
        if t:
            rows = [{"label": f"{task} {tier}",
                     "values": [fmt(c["mean"], c["std"], t["score_name"]) if c else "\u2014" for c in (cells.get(a) for a in t["columns"])]}
                    for task, tiers in t["rows"].items() for tier, cells in tiers.items()]
            out.append({"label": t.get("label", key), "caption": t.get("caption", ""),
                        "columns": [algo_label(paper, a) for a in t["columns"]], "rows": rows})
    abl = tables.get("ablation")
    if abl:
        cols = abl["columns"]
        out.append({"label": abl.get("label", "ablation"), "caption": abl.get("caption", ""),
                    "columns": [f"{c['task']} {c['tier']}" for c in cols],
                    "rows": [{"label": v["label"],
                              "values": [fmt(x["mean"], x["std"], c["score_name"]) if x else "\u2014"
                                         for c in cols for x in [v["values"].get(c["task"], {}).get(c["tier"])]]}
                             for v in abl["variants"]]})
    return out


def task_rank(paper: dict | None, task: str) -> tuple:
    """Paper order of tasks (CN, PP, World, Half-C, then the SMAC maps), unknown tasks last."""
    order: list[str] = []
    for key in ("main_results", "starcraft_results"):
        order += [_norm(lbl) for lbl in (paper or {}).get("tables", {}).get(key, {}).get("rows", {})]
    where = _task_label(paper, task)
    label = _norm(where[1]) if where else None
    return (order.index(label) if label in order else len(order), task)


def tier_rank(domain: str, tier: str) -> tuple:
    order = SMAC_TIERS if domain in SMAC_DOMAINS else CONTINUOUS_TIERS
    return (order.index(tier), "") if tier in order else (len(order), tier)


def domain_rank(domain: str) -> tuple:
    return (DOMAIN_ORDER.index(domain), "") if domain in DOMAIN_ORDER else (len(DOMAIN_ORDER), domain)
