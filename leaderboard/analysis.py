"""The page's analysis sections, computed from the laid-out tables and the runs:
rliable aggregates, the paper's headline claims, learning curves, PLCQL's PAR policy and the
compute-cost comparison. Each function returns a plain dict for the template (figures as SVG
text) plus flat ``records`` for the CSV/JSON downloads."""

from __future__ import annotations

import json
import math
import statistics
from collections import defaultdict
from pathlib import Path
from typing import Any, Callable

import numpy as np

from plcql_bench.leaderboard import plots
from plcql_bench.leaderboard.stats import (
    BOOTSTRAP_REPS,
    BOOTSTRAP_SEED,
    POI_REPS,
    headline_claims,
    iqm_and_mean,
    performance_profiles,
    probability_of_improvement,
    score_matrix,
)

__all__ = ["aggregates", "claims", "learning_curves", "par_policy", "compute_cost"]

N_TAUS = 41


def _fmt(v: float | None, score_name: str) -> str:
    if v is None or not math.isfinite(v):
        return "\u2014"
    return f"{v:.2f}" if score_name == "win_rate" else f"{v:.1f}"


def _row_entries(table: dict, variant: tuple) -> dict[tuple[str, str], dict[str, dict]]:
    """(task, dataset) -> algo -> entry, for the table's entries of one (profile, protocol)."""
    out: dict[tuple[str, str], dict[str, dict]] = defaultdict(dict)
    for row in table["rows"]:
        for e in row["_entries"]:
            if (e["profile"], e["protocol_version"]) == variant:
                out[(row["task"], row["dataset"])][e["algo"]] = e
    return out


def _majority(table: dict) -> tuple | None:
    count: dict[tuple, int] = defaultdict(int)
    for row in table["rows"]:
        for e in row["_entries"]:
            count[(e["profile"], e["protocol_version"])] += e["n"]
    if not count:
        return None
    return min(count, key=lambda v: (-count[v], v[0] != "paper", v[0], str(v[1])))


def aggregates(
    table: dict,
    label: Callable[[str], str],
    target: str,
    *,
    reps: int = BOOTSTRAP_REPS,
    poi_reps: int = POI_REPS,
    seed: int = BOOTSTRAP_SEED,
    salt: str = "agg",
) -> dict | None:
    """IQM / mean with stratified-bootstrap CIs, performance profiles and probabilities of
    improvement of ``target`` over every other algorithm of ``table``, on one profile.

    Task set: the rows where ``target`` has results (if it has none: the rows of the algorithm
    with most rows). Only algorithms with results on every one of those rows are aggregated;
    the others are listed with their coverage. Probability of improvement uses, per baseline,
    the rows both algorithms ran."""
    variant = _majority(table)
    if variant is None:
        return None
    score_name = "win_rate" if table["key"] == "smac" else "normalised"
    by_row = _row_entries(table, variant)
    algos = [a["id"] for a in table["algos"]]
    coverage = {a: [k for k in by_row if a in by_row[k]] for a in algos}
    anchor = target if coverage.get(target) else max(algos, key=lambda a: len(coverage[a]))
    tasks = [k for k in by_row if anchor in by_row[k]]
    if not tasks:
        return None
    included = [a for a in algos if all(a in by_row[k] for k in tasks)]
    excluded = [
        {"algo": a, "label": label(a), "covered": sum(1 for k in tasks if a in by_row[k]), "of": len(tasks)}
        for a in algos
        if a not in included and coverage[a]
    ]
    matrices, runs_used = {}, {}
    for a in included:
        matrices[a], runs_used[a] = score_matrix([by_row[k][a]["scores"] for k in tasks])
    agg = iqm_and_mean(matrices, reps=reps, seed=seed)
    allv = np.concatenate([m.reshape(-1) for m in matrices.values()])
    lo, hi = float(allv.min()), float(allv.max())
    if score_name == "win_rate":
        lo, hi = 0.0, 1.0
    elif hi - lo < 1e-9:
        lo, hi = lo - 1.0, hi + 1.0
    taus = np.linspace(lo, hi, N_TAUS)
    prof = performance_profiles(matrices, taus, reps=reps, seed=seed)
    rows = [
        {
            "algo": a,
            "label": label(a),
            "runs": runs_used[a],
            **agg[a],
            "iqm_text": _fmt(agg[a]["iqm"], score_name),
            "iqm_ci_text": f"[{_fmt(agg[a]['iqm_ci'][0], score_name)}, {_fmt(agg[a]['iqm_ci'][1], score_name)}]",
            "mean_text": _fmt(agg[a]["mean"], score_name),
            "mean_ci_text": f"[{_fmt(agg[a]['mean_ci'][0], score_name)}, {_fmt(agg[a]['mean_ci'][1], score_name)}]",
        }
        for a in included
    ]
    poi = []
    if coverage.get(target):
        for a in algos:
            if a == target or not coverage[a]:
                continue
            common = [k for k in by_row if target in by_row[k] and a in by_row[k]]
            if not common:
                poi.append({"algo": a, "label": label(a), "tasks": 0, "p": None, "ci": None, "text": "\u2014 (no common task)"})
                continue
            x, _ = score_matrix([by_row[k][target]["scores"] for k in common])
            y, _ = score_matrix([by_row[k][a]["scores"] for k in common])
            r = probability_of_improvement(x, y, reps=poi_reps, seed=seed)
            poi.append({"algo": a, "label": label(a), "tasks": len(common), "p": r["p"], "ci": r["ci"],
                        "text": f"{r['p']:.2f} [{r['ci'][0]:.2f}, {r['ci'][1]:.2f}]"})
    unit = "win rate" if score_name == "win_rate" else "normalised score"
    figs = {
        "intervals": plots.aggregate_svg(f"{table['label']} \u00b7 {len(tasks)} task(s) \u00b7 profile {variant[0]}", rows, unit, f"{salt}-int"),
        "profiles": plots.profile_svg(taus.tolist(), prof, {a: label(a) for a in included}, unit, f"{salt}-prof"),
    }
    records = [
        {"table": table["key"], "profile": variant[0], "protocol_version": variant[1], "algo": r["algo"], "tasks": len(tasks),
         "runs_per_task": r["runs"], "iqm": r["iqm"], "iqm_ci_low": r["iqm_ci"][0], "iqm_ci_high": r["iqm_ci"][1],
         "mean": r["mean"], "mean_ci_low": r["mean_ci"][0], "mean_ci_high": r["mean_ci"][1], "reps": reps, "seed": seed}
        for r in rows
    ]
    poi_records = [
        {"table": table["key"], "profile": variant[0], "protocol_version": variant[1], "x": target, "y": p["algo"],
         "tasks": p["tasks"], "p_improvement": p["p"], "ci_low": None if p["ci"] is None else p["ci"][0],
         "ci_high": None if p["ci"] is None else p["ci"][1], "reps": poi_reps, "seed": seed}
        for p in poi
    ]
    return {
        "key": table["key"],
        "label": table["label"],
        "profile": variant[0],
        "protocol_version": variant[1],
        "unit": unit,
        "tasks": [f"{t} {d}" for t, d in tasks],
        "anchor": label(anchor),
        "target_present": bool(coverage.get(target)),
        "rows": rows,
        "excluded": excluded,
        "poi": poi,
        "reps": reps,
        "poi_reps": poi_reps,
        "seed": seed,
        "figures": figs,
        "records": records,
        "poi_records": poi_records,
    }


def claims(tables: list[dict], paper: dict | None, label: Callable[[str], str], target: str, rival: str) -> dict:
    """The paper's headline claims ("best on X% of tasks", "beats SPaCQL on Y% of tasks")
    recomputed over the rows of the main and SMAC tables, each row on its compared cells."""
    rows = []
    compared_algos: set[str] = set()
    for t in tables:
        for row in t["rows"]:
            comp = [e for e in row["_entries"] if e["_compared"]]
            if not comp:
                continue
            compared_algos |= {e["algo"] for e in comp}
            rows.append({"means": {e["algo"]: e["mean"] for e in comp}, "best": [e["algo"] for e in comp if e["_best"]]})
    ours = headline_claims(rows, target, rival)
    pc = (paper or {}).get("claims", {}) or {}
    items = []
    for key, text, of_key in (
        ("best", f"{label(target)} has the best mean", "best_of"),
        ("beats", f"{label(target)} beats {label(rival)}", "beats_of"),
    ):
        p = pc.get(key) or {}
        pct = ours[f"{key}_pct"]
        if ours[of_key] == 0:
            why = f"no results for {label(target)} yet" if not any(target in r["means"] for r in rows) else f"no results for {label(rival)} yet"
            ours_text = f"\u2014 ({why})"
        else:
            ours_text = f"{pct:.0f}% ({ours[key]} of {ours[of_key]} tasks)"
        paper_text = f"{p['pct']}% ({p['count']} of {p['of']} tasks)" if p else "\u2014"
        items.append({"key": key, "claim": text, "ours": ours_text, "paper": paper_text, "count": ours[key],
                      "of": ours[of_key], "pct": pct, "paper_pct": p.get("pct"), "paper_count": p.get("count"),
                      "paper_of": p.get("of")})
    n_paper_algos = len(((paper or {}).get("tables", {}).get("main_results") or {}).get("columns", []))
    return {
        "items": items,
        "n_rows": len(rows),
        "compared": [label(a) for a in sorted(compared_algos)],
        "n_paper_algos": n_paper_algos,
        "records": [{k: it[k] for k in ("key", "claim", "count", "of", "pct", "paper_count", "paper_of", "paper_pct")} for it in items],
    }


def _mean_std(vals: list[float]) -> tuple[float, float]:
    return statistics.fmean(vals), statistics.stdev(vals) if len(vals) > 1 else 0.0


def _align(series: list[dict[int, float]]) -> tuple[list[int], list[list[float]]]:
    """Updates present in every series, and the values at them."""
    common = sorted(set.intersection(*(set(s) for s in series))) if series else []
    return common, [[s[u] for s in series] for u in common]


def learning_curves(tables: list[dict], runs_by_cell: dict[tuple, list], label: Callable[[str], str]) -> list[dict]:
    """One figure per task: a panel per dataset tier, a line per algorithm (the row's compared
    cells), mean over seeds ± 1 std at the update rounds every seed evaluated."""
    panels: dict[str, dict[str, dict]] = {}
    order: list[str] = []
    for t in tables:
        for row in t["rows"]:
            lines = []
            for e in row["_entries"]:
                if not e["_compared"]:
                    continue
                runs = runs_by_cell.get((e["task"], e["dataset"], e["algo"], e["profile"], e["protocol_version"]), [])
                series = [dict(r.curve) for r in runs if r.curve]
                if not series:
                    continue
                xs, vals = _align(series)
                if not xs:
                    continue
                ms = [_mean_std(v) for v in vals]
                lines.append({"algo": e["algo"], "label": label(e["algo"]), "x": xs, "mean": [m for m, _ in ms],
                              "std": [s for _, s in ms], "n": len(series)})
            if not lines:
                continue
            task_panels = panels.setdefault(row["task"], {})
            if row["task"] not in order:
                order.append(row["task"])
            p = task_panels.setdefault(row["dataset"], {"tier": row["dataset"], "score_label": t["score_label"] if t["key"] != "ablation" else ("win rate" if row["domain"] in ("smax", "smac") else "normalised score"), "lines": []})
            seen = {ln["algo"] for ln in p["lines"]}
            p["lines"].extend(ln for ln in lines if ln["algo"] not in seen)
    return [
        {"task": task, "svg": plots.learning_curves_svg(task, list(panels[task].values()), f"curve-{i}")}
        for i, task in enumerate(order)
    ]


def _read_metrics(path: Path) -> list[dict]:
    out = []
    try:
        for line in path.read_text(encoding="utf-8").splitlines():
            line = line.strip()
            if not line:
                continue
            try:
                rec = json.loads(line)
            except json.JSONDecodeError:
                continue
            if isinstance(rec, dict):
                out.append(rec)
    except (OSError, UnicodeDecodeError):
        return []
    return out


def _num(v: Any) -> float | None:
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) else None


def par_policy(tables: list[dict], runs_by_cell: dict[tuple, list], results_dir: Path, target: str, n_agents: Callable[[str], int | None]) -> dict:
    """PLCQL's PAR policy from each run's metrics.jsonl (``train/par/E_k``, ``train/par/p_k<i>``):
    E[k] over training and p(k) at the last evaluation point, per task and tier, mean over seeds."""
    per_task: dict[str, list[dict]] = {}
    records = []
    n_runs = 0
    for t in tables[:2]:
        for row in t["rows"]:
            for e in row["_entries"]:
                if e["algo"] != target or not e["_compared"]:
                    continue
                runs = runs_by_cell.get((e["task"], e["dataset"], e["algo"], e["profile"], e["protocol_version"]), [])
                ek_series, last_pk = [], []
                for r in runs:
                    hist = _read_metrics(results_dir / Path(r.path).parent / "metrics.jsonl")
                    ek = {}
                    pk_last = None
                    for h in hist:
                        u, v = h.get("update"), _num(h.get("train/par/E_k"))
                        if isinstance(u, int) and v is not None:
                            ek[u] = v
                            ks = sorted((int(k.rsplit("p_k", 1)[1]), _num(x)) for k, x in h.items()
                                        if k.startswith("train/par/p_k") and k.rsplit("p_k", 1)[1].isdigit())
                            if ks and all(x is not None for _, x in ks):
                                pk_last = [x for _, x in ks]
                    if ek:
                        ek_series.append(ek)
                    if pk_last:
                        last_pk.append(pk_last)
                if not ek_series:
                    continue
                n_runs += len(ek_series)
                xs, vals = _align(ek_series)
                width = min((len(p) for p in last_pk), default=0)
                pk = [statistics.fmean(p[i] for p in last_pk) for i in range(width)]
                per_task.setdefault(e["task"], []).append(
                    {"tier": e["dataset"], "x": xs, "ek": [statistics.fmean(v) for v in vals], "pk": pk, "n": len(ek_series)}
                )
                records.append({"task": e["task"], "dataset": e["dataset"], "profile": e["profile"], "runs": len(ek_series),
                                "final_E_k": statistics.fmean(vals[-1]) if vals else None,
                                **{f"p_k{i + 1}": v for i, v in enumerate(pk)}})
    figures = [
        {"task": task, "svg": plots.par_svg(task, tiers, n_agents(task), f"par-{i}")}
        for i, (task, tiers) in enumerate(per_task.items())
    ]
    return {"figures": figures, "n_runs": n_runs, "records": records}


def compute_cost(runs: list, label: Callable[[str], str], target: str, rival: str, n_agents: Callable[[str], int | None]) -> dict:
    """Measured time per update round (1 / ``train.updates_per_s``, mean over runs, per task)
    and the structural Q-evaluations per iteration: PLCQL computes 1 PAR target per transition
    (one sampled k), SPaCQL n (one per subset size k = 1..n). Runs of one profile only."""
    pool = [r for r in runs if r.algo in (target, rival) and r.updates_per_s]
    if not pool:
        return {"rows": [], "svg": None, "profile": None, "rival_present": False, "records": []}
    count: dict[str, int] = defaultdict(int)
    for r in pool:
        count[r.profile] += 1
    profile = min(count, key=lambda p: (-count[p], p != "paper", p))
    by: dict[tuple[str, str], list[float]] = defaultdict(list)
    tasks: list[str] = []
    for r in pool:
        if r.profile != profile:
            continue
        by[(r.task, r.algo)].append(1000.0 / r.updates_per_s)
        if r.task not in tasks:
            tasks.append(r.task)
    rows, records = [], []
    for task in sorted(tasks):
        n = n_agents(task)
        ms = {a: (statistics.fmean(by[(task, a)]) if by.get((task, a)) else None) for a in (target, rival)}
        q = {target: 1, rival: n}
        rows.append({"task": task, "n_agents": n, "ms": ms, "q_evals": q,
                     "runs": {a: len(by.get((task, a), [])) for a in (target, rival)}})
        for a in (target, rival):
            records.append({"task": task, "algo": a, "profile": profile, "n_agents": n, "runs": len(by.get((task, a), [])),
                            "ms_per_round": ms[a], "q_evals_per_transition": q[a]})
    svg = plots.compute_svg(rows, [(target, label(target)), (rival, label(rival))], "compute")
    return {"rows": rows, "svg": svg, "profile": profile, "rival_present": any(r.algo == rival for r in pool), "records": records}
