"""The page's analysis sections, from the laid-out tables (default view) and the runs: rliable
aggregates, learning curves, PLCQL's PAR diagnostics and the compute cost. Each function returns
a plain dict for the template (figures as SVG text) plus flat ``records`` for the downloads."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any, Callable

import numpy as np
import yaml

from plcql_bench.leaderboard import plots
from plcql_bench.leaderboard.cells import MIN_SEEDS, format_score
from plcql_bench.leaderboard.stats import (
    BOOTSTRAP_REPS,
    BOOTSTRAP_SEED,
    POI_REPS,
    iqm_and_mean,
    performance_profiles,
    probability_of_improvement,
    score_matrix,
)
from plcql_bench.leaderboard.tables import Table
from plcql_bench.suite.core.store import atomic_write_bytes, read_metrics_text

__all__ = ["aggregates", "learning_curves", "par_diagnostics", "compute_cost", "read_metrics",
           "check_cost_file", "append_cost_measurement"]

N_TAUS = 41
MAX_POINTS = 80  # curves are thinned to this many points for plotting (the downloads keep all)
BENCH_SPEED = Path(__file__).resolve().parent / "bench_speed.yaml"


def _compared_by_row(table: Table) -> dict[str, dict[str, Any]]:
    """row label -> algo -> compared Entry."""
    out: dict[str, dict[str, Any]] = {}
    for row in table.rows:
        out[row.label] = {e.cell.algo: e for tc in row.cells for e in tc.entries if e.compared}
    return out


def aggregates(table: Table, label: Callable[[str], str], target: str, *, reps: int = BOOTSTRAP_REPS,
               poi_reps: int = POI_REPS, seed: int = BOOTSTRAP_SEED, salt: str = "agg") -> dict:
    """IQM / mean with stratified-bootstrap CIs, performance profiles and P(target > X) over the
    table's rows (compared cells, default view). Task set: the rows where ``target`` has >= 3 runs
    (else those of the algorithm with most such rows). An algorithm is aggregated only with
    >= 3 runs on every task of the set; the others are listed with the reason."""
    rows = _compared_by_row(table)
    algos = [c.id for c in table.columns]
    enough = {a: [r for r in rows if a in rows[r] and rows[r][a].stats.n >= MIN_SEEDS] for a in algos}
    anchor = target if enough.get(target) else max(algos, key=lambda a: len(enough[a]), default=None)
    tasks = enough.get(anchor, []) if anchor else []
    unit = "win rate" if table.key == "smac" else "normalised score"
    base = {"key": table.key, "label": table.label, "unit": unit, "tasks": tasks, "rows": [], "poi": [],
            "excluded": [], "figures": None, "records": [], "poi_records": [], "anchor": label(anchor) if anchor else None,
            "target_present": bool(enough.get(target))}
    if not tasks:
        base["reason"] = f"no task has {MIN_SEEDS} or more runs of any algorithm"
        return base
    included = [a for a in algos if all(a in rows[t] and rows[t][a].stats.n >= MIN_SEEDS for t in tasks)]
    for a in algos:
        if a not in included and any(a in rows[t] for t in tasks):
            short = [f"{t} (n={rows[t][a].stats.n})" if a in rows[t] else f"{t} (no runs)" for t in tasks
                     if a not in rows[t] or rows[t][a].stats.n < MIN_SEEDS]
            base["excluded"].append({"algo": a, "label": label(a), "why": ", ".join(short)})
    if len(included) < 1:
        base["reason"] = "no algorithm has 3 or more runs on every task"
        return base
    mats, used = {}, {}
    for a in included:
        mats[a], used[a] = score_matrix([rows[t][a].stats.values for t in tasks])
    agg = iqm_and_mean(mats, reps=reps, seed=seed)
    allv = np.concatenate([m.reshape(-1) for m in mats.values()])
    lo, hi = (0.0, 1.0) if unit == "win rate" else (float(allv.min()), float(allv.max()))
    if hi - lo < 1e-9:
        lo, hi = lo - 1.0, hi + 1.0
    taus = np.linspace(lo, hi, N_TAUS)
    prof = performance_profiles(mats, taus, reps=reps, seed=seed)
    sn = "win_rate" if unit == "win rate" else "normalised"
    base["rows"] = [{"algo": a, "label": label(a), "runs": used[a], **agg[a],
                     "iqm_text": format_score(agg[a]["iqm"], sn),
                     "iqm_ci_text": f"[{format_score(agg[a]['iqm_ci'][0], sn)}, {format_score(agg[a]['iqm_ci'][1], sn)}]",
                     "mean_text": format_score(agg[a]["mean"], sn),
                     "mean_ci_text": f"[{format_score(agg[a]['mean_ci'][0], sn)}, {format_score(agg[a]['mean_ci'][1], sn)}]"}
                    for a in included]
    if target in included:
        for a in included:
            if a == target:
                continue
            x, _ = score_matrix([rows[t][target].stats.values for t in tasks])
            y, _ = score_matrix([rows[t][a].stats.values for t in tasks])
            r = probability_of_improvement(x, y, reps=poi_reps, seed=seed)
            base["poi"].append({"algo": a, "label": label(a), "tasks": len(tasks), "p": r["p"], "ci": r["ci"],
                                "text": f"{r['p']:.2f} [{r['ci'][0]:.2f}, {r['ci'][1]:.2f}]"})
    base["figures"] = {
        "intervals": plots.aggregate_svg(f"{table.label} \u00b7 {len(tasks)} task(s)", base["rows"], unit, f"{salt}-int"),
        "profiles": plots.profile_svg(taus.tolist(), prof, {a: label(a) for a in included}, unit, f"{salt}-prof"),
    }
    base["records"] = [{"table": table.key, "algo": r["algo"], "tasks": len(tasks), "runs_per_task": r["runs"],
                        "iqm": r["iqm"], "iqm_ci_low": r["iqm_ci"][0], "iqm_ci_high": r["iqm_ci"][1], "mean": r["mean"],
                        "mean_ci_low": r["mean_ci"][0], "mean_ci_high": r["mean_ci"][1], "reps": reps, "seed": seed}
                       for r in base["rows"]]
    base["poi_records"] = [{"table": table.key, "x": target, "y": p["algo"], "tasks": p["tasks"], "p_improvement": p["p"],
                            "ci_low": p["ci"][0], "ci_high": p["ci"][1], "reps": poi_reps, "seed": seed} for p in base["poi"]]
    return base


# ------------------------------------------------------------------ learning curves


def _thin_index(n: int) -> list[int]:
    """Every k-th index (and the last) so that at most MAX_POINTS + 1 remain."""
    if n <= MAX_POINTS:
        return list(range(n))
    idx = list(range(0, n, math.ceil(n / MAX_POINTS)))
    return idx if idx[-1] == n - 1 else idx + [n - 1]


def _align(series: list[dict]) -> tuple[list, np.ndarray]:
    """Updates present in every series, and a (points x series) array of the values there."""
    common = sorted(set.intersection(*(set(s) for s in series))) if series else []
    return common, np.array([[s[u] for s in series] for u in common], dtype=np.float64).reshape(len(common), len(series))


def learning_curves(tables: list[Table], label: Callable[[str], str], view_key: str = "final-ours") -> list[dict]:
    """One figure per task: a panel per tier, a line per compared cell (mean ± 1 std over seeds
    at the rounds every seed evaluated), from each run's ``curve`` (our normalisation)."""
    panels: dict[str, dict[str, dict]] = {}
    for t in tables:
        for row in t.rows:
            for tc in row.cells:
                for e in tc.entries:
                    if not e.compared:
                        continue
                    series = [{p["update"]: p["score"] for p in r.rec.curve if p.get("score") is not None} for r in e.cell.runs]
                    xs, vals = _align([s for s in series if s])
                    if not xs:
                        continue
                    idx = _thin_index(len(xs))
                    vals = vals[idx]
                    x, m = [xs[i] for i in idx], vals.mean(axis=1).tolist()
                    s = (vals.std(axis=1, ddof=1) if vals.shape[1] > 1 else np.zeros(len(idx))).tolist()
                    p = panels.setdefault(tc.task, {}).setdefault(tc.dataset, {
                        "tier": tc.dataset, "lines": [],
                        "score_label": "win rate" if e.cell.score_name == "win_rate" else "normalised score"})
                    if tc.algo not in {ln["algo"] for ln in p["lines"]}:
                        p["lines"].append({"algo": tc.algo, "label": label(tc.algo), "x": x, "mean": m, "std": s, "n": vals.shape[1]})
    return [{"task": task, "svg": plots.learning_curves_svg(task, list(tiers.values()), f"curve-{i}")}
            for i, (task, tiers) in enumerate(panels.items())]


# ------------------------------------------------------------------ PAR diagnostics


def run_metrics(results_dir: Path, final_path: str) -> list[dict]:
    """The metrics of the run whose final.json is at `final_path` (relative to `results_dir`)."""
    return read_metrics(Path(results_dir) / Path(final_path).parent / "metrics.jsonl")


def read_metrics(path: Path) -> list[dict]:
    """The records of a metrics.jsonl, or of its published metrics.jsonl.gz (unreadable lines and files give
    nothing)."""

    out = []
    try:
        lines = (read_metrics_text(path) or "").splitlines()
    except (OSError, UnicodeDecodeError):
        return []
    for line in lines:
        try:
            rec = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(rec, dict):
            out.append(rec)
    return out


def _num(v: Any) -> float | None:
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) else None


def _run_diag(hist: list[dict]) -> dict:
    """{"x": updates, "<comp>": {k: [values]}, "entropy": [..]} from the diag/* keys, or the
    older train/par/p_k* keys (then only "p" and "E_k")."""
    ks = sorted({int(k.rsplit("_k", 1)[1]) for h in hist for k in h if k.startswith("diag/p_k") and k.rsplit("_k", 1)[1].isdigit()})
    out: dict[str, Any] = {"x": [], "source": "diag" if ks else "train"}
    if not ks:
        ks = sorted({int(k.rsplit("p_k", 1)[1]) for h in hist for k in h if k.startswith("train/par/p_k") and k.rsplit("p_k", 1)[1].isdigit()})
        if not ks:
            return {}
        comps = {"p": "train/par/p_k{k}"}
        extra = {"E_k": "train/par/E_k"}
    else:
        comps = {c: f"diag/{c}_k{{k}}" for c, _ in plots.COMPONENTS}
        extra = {"entropy": "diag/par_entropy"}
    for c in list(comps) + list(extra):
        out[c] = {k: [] for k in ks} if c in comps else []
    for h in hist:
        u = h.get("update")
        vals = {c: {k: _num(h.get(pat.format(k=k))) for k in ks} for c, pat in comps.items()}
        if not isinstance(u, int) or any(v is None for d in vals.values() for v in d.values()):
            continue
        out["x"].append(u)
        for c, d in vals.items():
            for k, v in d.items():
                out[c][k].append(v)
        for c, key in extra.items():
            out[c].append(_num(h.get(key)))
    return out if out["x"] else {}


def par_diagnostics(tables: list[Table], results_dir: Path, family: set[str], label: Callable[[str], str]) -> dict:
    """PLCQL-family runs' PAR policy: per-k components over training (mean over seeds) and a
    table of the last evaluation point, with each run's collapse mark from final.json."""
    seen, items, records = set(), [], []
    for t in tables:
        for row in t.rows:
            for tc in row.cells:
                for e in tc.entries:
                    c = e.cell
                    if c.algo not in family or not e.compared or (c.algo, c.task, c.dataset, c.profile) in seen:
                        continue
                    seen.add((c.algo, c.task, c.dataset, c.profile))
                    diags = [d for d in (_run_diag(run_metrics(results_dir, r.path)) for r in c.runs) if d]
                    collapsed = c.collapsed
                    if not diags and not collapsed:
                        continue
                    items.append(_par_item(c, diags, collapsed, label, len(items)))
                    records.append(items[-1]["record"])
    items.sort(key=lambda i: (i["task"], i["dataset"], i["algo"] != "plcql", i["algo"]))
    return {"items": items, "records": records, "any_diag": any(i["source"] == "diag" for i in items)}


def _par_item(cell, diags: list[dict], collapsed: list[dict], label, i: int) -> dict:
    src = {d["source"] for d in diags}
    source = "diag" if "diag" in src else ("train" if src else "none")
    diags = [d for d in diags if d["source"] == source]
    mean: dict[str, Any] = {}
    if diags:
        xs, _ = _align([{u: 0.0 for u in d["x"]} for d in diags])
        pos = [{u: j for j, u in enumerate(d["x"])} for d in diags]
        idx = _thin_index(len(xs))
        keep = [xs[i] for i in idx]
        rows = [[p[u] for p in pos] for u in keep]  # per kept update, each run's position

        def avg(series: list[list]) -> list:
            arr = np.array([[series[r][j] for r, j in enumerate(row)] for row in rows], dtype=np.float64)
            return arr.mean(axis=1).tolist()

        for comp in [c for c in diags[0] if c not in ("x", "source")]:
            if isinstance(diags[0][comp], dict):
                mean[comp] = {k: avg([d[comp][k] for d in diags]) for k in diags[0][comp]}
            elif all(v is not None for d in diags for v in d[comp]):
                mean[comp] = avg([d[comp] for d in diags])
        mean["x"] = keep
    last_p = [mean["p"][k][-1] for k in sorted(mean["p"])] if mean.get("p") and mean["x"] else []
    entropy = mean.get("entropy", [None])[-1] if mean.get("entropy") else None
    title = f"{label(cell.algo)} \u00b7 {cell.task} \u00b7 {cell.dataset}"
    svg = plots.par_components_svg(title, mean, f"par-{i}") if mean.get("x") else None
    record = {"algo": cell.algo, "task": cell.task, "dataset": cell.dataset, "profile": cell.profile, "runs": len(cell.runs),
              "runs_with_diagnostics": len(diags), "source": source, "final_entropy": entropy,
              "runs_collapsed": len(collapsed), **{f"p_k{j + 1}": v for j, v in enumerate(last_p)}}
    return {"algo": cell.algo, "label": label(cell.algo), "task": cell.task, "dataset": cell.dataset, "source": source,
            "n_runs": len(cell.runs), "n_diag": len(diags), "last_p": last_p, "entropy": entropy,
            "collapsed": collapsed, "svg": svg, "record": record, "anchor": cell.anchor}


# ------------------------------------------------------------------ compute cost


def compute_cost(path: Path | None = None, n_agents: Callable[[str], int | None] = lambda t: None) -> dict:
    """bench-speed's paired PLCQL/SPaCQL measurements (bench_speed.yaml: machine, date, command, the whole
    round's median per-round ratio with its 95% interval and, where measured paired, the target construction's
    alone) and the structural Q-evaluation counts. A row without a paired target ratio (measured before
    `--record-cost`) shows the ratio of its two target medians, marked unpaired."""
    path = BENCH_SPEED if path is None else Path(path)
    if not path.is_file():
        return {"rows": [], "svg": None, "records": [], "source": None}
    data = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    rows = []
    for m in data.get("measurements", []):
        n = m.get("n_agents") or n_agents(m["task"])
        tm = m.get("target_ms") or {}
        paired = "target_ratio" in m
        t_ratio = m["target_ratio"] if paired else (tm["plcql"] / tm["spacql"] if tm.get("spacql") else None)
        rows.append({**m, "n_agents": n, "q_evals": {"plcql": 1, "spacql": n}, "target_ratio": t_ratio,
                     "target_ratio_ci": m.get("target_ratio_ci"), "target_paired": paired})
    svg = plots.compute_ratio_svg(rows, "compute") if rows else None
    records = [{k: v for k, v in r.items() if k != "q_evals"} | {"plcql_q_evals": 1, "spacql_q_evals": r["n_agents"]} for r in rows]
    return {"rows": rows, "svg": svg, "records": records, "source": data.get("source", "")}


COST_FIELDS = ("task", "n_agents", "machine", "date", "command", "rounds", "plcql_ms", "spacql_ms", "ratio",
               "ratio_ci", "target_ms", "target_ratio", "target_ratio_ci")


def check_cost_file(path: str | Path) -> list:
    """The measurements of a compute-cost file (a mapping with a `measurements` list, as bench_speed.yaml, that
    a record can be appended to); ValueError naming the file otherwise. A file that does not exist yet is an
    empty one."""
    path = Path(path)
    if not path.exists():
        return []
    before = _cost_measurements(path)
    _with_record(path, before, {"task": "probe"})  # the append will work: checked before any timing
    return before


def _cost_measurements(path: Path) -> list:
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as exc:
        raise ValueError(f"{path}: not a readable YAML file ({type(exc).__name__})") from None
    if not isinstance(data, dict) or not isinstance(data.get("measurements"), list):
        raise ValueError(f"{path}: not a compute-cost file (expected a mapping with a 'measurements' list)")
    return data["measurements"]


def _with_record(path: Path, before: list, record: dict) -> str:
    """The file's text with `record` appended to its `measurements` (its other text, comments included, kept);
    ValueError when that text would not read back as the old measurements plus the record."""
    text = path.read_text(encoding="utf-8") if path.exists() else (
        "# PLCQL against SPaCQL, paired: `plcql-bench bench-speed --record-cost FILE` (leaderboard/analysis.py)\n"
        "measurements:\n")
    if text.rstrip().endswith("measurements: []"):
        text = text.rstrip()[: -len("[]")].rstrip() + "\n"
    item = yaml.safe_dump([record], sort_keys=False, default_flow_style=None, width=200)
    new = text.rstrip("\n") + "\n" + "".join(f"  {line}\n" for line in item.splitlines())
    try:
        after = yaml.safe_load(new).get("measurements")
    except yaml.YAMLError:
        after = None
    if after != before + [record]:
        raise ValueError(f"{path}: 'measurements' must be the file's last key, a block list indented by 2 spaces "
                         "(as leaderboard/bench_speed.yaml)")
    return new


def append_cost_measurement(path: str | Path, record: dict) -> None:
    """Append one measurement to the compute-cost file, keeping its text (comments) as it is; the new file is
    checked to read back with the record last, and written atomically (a failed write leaves the old one)."""
    missing = [k for k in COST_FIELDS if k not in record]
    if missing:
        raise ValueError(f"compute-cost record without {', '.join(missing)}")
    path = Path(path)
    before = _cost_measurements(path) if path.exists() else []
    atomic_write_bytes(path, _with_record(path, before, record).encode("utf-8"))
