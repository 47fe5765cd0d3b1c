"""The reproduction summary at the top of the page: coverage of the paper's rows, every cell
against the paper's number with a verdict, and the headline claims recomputed only where the
comparison has enough seeds. Pure functions of the laid-out tables.

Verdict of one of our cells against the paper's mean ± std (over the paper's 5 seeds):

* *reproduced*: our mean lies within the paper's mean ± std;
* *below* / *above*: it lies outside, and Welch's test of our seeds against the paper's
  (mean, std, 5 seeds) rejects equal means at 0.05;
* *not distinguishable*: it lies outside, but the test does not reject (too few seeds or too
  much spread to tell);
* *too few seeds* (n < 3), *not comparable* (SMAX against the paper's StarCraft II numbers),
  *not reported* (the paper prints "-").
"""

from __future__ import annotations

from collections import Counter, defaultdict
from dataclasses import dataclass

from plcql_bench.leaderboard import paper as pp
from plcql_bench.leaderboard.cells import MIN_SEEDS, display_resolution
from plcql_bench.leaderboard.stats import TIE_ALPHA, welch_p, welch_p_summary
from plcql_bench.leaderboard.tables import RIVAL, TARGET, Table, mark_group

__all__ = ["VERDICTS", "Comparison", "coverage", "comparisons", "claims", "findings", "verdict", "verdict_counts"]

PAPER_ROWS = {"main": ("main_results", "MPE + MaMuJoCo"), "smac": ("starcraft_results", "SMAC (SMAX here, not comparable)")}
# The verdicts a comparable cell can get, in the order the summaries list them.
VERDICTS = ("reproduced", "below", "above", "not distinguishable", "too few seeds")


def _compared(tc):
    return next((e for e in tc.entries if e.compared), None)


def coverage(tables: list[Table], paper: dict | None) -> dict:
    """How many of the paper's rows have our (compared) results, in all and per table
    (``by_table``: {table key: (rows covered, the paper's rows)}), and per algorithm and table with
    the seeds per row; the algorithms without any result are only named."""
    algos: dict[str, dict] = {}
    covered: set[tuple] = set()
    total = 0
    papers_rows: dict[str, int] = {}
    for t in tables:
        key = PAPER_ROWS[t.key][0]
        n_paper = sum(len(tiers) for tiers in ((paper or {}).get("tables", {}).get(key, {}).get("rows", {}) or {}).values())
        total += n_paper
        papers_rows[t.key] = n_paper
        for col in t.columns:
            in_paper = col.id in pp.table_columns(paper, key)
            seeds = []
            for row in t.rows:
                tc = next(c for c in row.cells if c.algo == col.id)
                e = _compared(tc)
                where = pp.paper_row(paper, tc.task, tc.dataset)
                if e is not None and (where is not None or not in_paper):
                    seeds.append(e.stats.n)
                    if where is not None:
                        covered.add(where)
            a = algos.setdefault(col.id, {"algo": col.id, "label": col.label, "target": col.target})
            a[t.key] = {"rows": len(seeds), "of": n_paper if in_paper else None, "seeds": sorted(seeds, reverse=True)}
    ran = [a for a in algos.values() if any(a.get(k, {}).get("rows") for k in PAPER_ROWS)]
    for a in ran:
        a["min_seeds_rows"] = sum(s >= MIN_SEEDS for k in PAPER_ROWS for s in a.get(k, {}).get("seeds", []))
    ran.sort(key=lambda a: (not a["target"], a["label"]))
    by_table = {k: (sum(w[0] == PAPER_ROWS[k][0] for w in covered), n) for k, n in papers_rows.items()}
    return {"ran": ran, "not_run": [a["label"] for a in algos.values() if a not in ran],
            "rows_covered": len(covered), "rows_total": total, "by_table": by_table}


@dataclass(frozen=True)
class Comparison:
    table: str
    task: str
    dataset: str
    algo: str
    label: str
    score_name: str
    n: int
    mean: float
    ci: tuple | None
    paper_mean: float | None
    paper_std: float | None
    delta: float | None
    delta_ci: tuple | None
    p: float | None
    verdict: str
    # the official code's final policy on the same dataset (leaderboard/official.py), never part of the verdict
    official_n: int | None = None
    official_mean: float | None = None
    official_std: float | None = None
    official_code: str | None = None


def verdict(values, mean: float, paper_mean: float | None, paper_std: float | None, sc2: bool,
            resolution: float = 0.0) -> tuple[str, float | None]:
    """(verdict, Welch p against the paper's 5 seeds) for one cell; see the module docstring. ``resolution``:
    the page's display precision (no spread on either side and means within it: not distinguishable)."""
    if sc2:
        return "not comparable", None
    if paper_mean is None:
        return "not reported", None
    if len(values) < MIN_SEEDS:
        return "too few seeds", None
    p = welch_p_summary(values, paper_mean, paper_std, pp.PAPER_SEEDS, resolution)
    if abs(mean - paper_mean) <= paper_std:
        return "reproduced", p
    if p is None or p >= TIE_ALPHA:
        return "not distinguishable", p
    return ("below" if mean < paper_mean else "above"), p


def comparisons(tables: list[Table], label, official: dict | None = None, view=None) -> list[Comparison]:
    """Every compared cell that has a paper number beside it (once, also when it appears in
    the main and the ablation table), with the official code's result on the same dataset where
    `official` ({(algo, task, tier, profile): OfficialCell}) has one under `view`, trained on the same
    dataset build (sha256) as our runs."""
    out, seen = [], set()
    for t in tables:
        for row in t.rows:
            for tc in row.cells:
                e = _compared(tc)
                if e is None or tc.paper is None or e.stats.mean is None or (tc.task, tc.dataset, tc.algo) in seen:
                    continue  # (no mean: the view cannot be derived for its runs, e.g. no OMAR reference)
                seen.add((tc.task, tc.dataset, tc.algo))
                s, ref = e.stats, tc.paper
                v, p = verdict(s.values, s.mean, ref.mean, ref.std, ref.sc2, display_resolution(e.cell.score_name))
                comparable = v not in ("not comparable", "not reported")
                delta = s.mean - ref.mean if comparable else None
                dci = (s.ci[0] - ref.mean, s.ci[1] - ref.mean) if comparable and s.ci else None
                oc = (official or {}).get((tc.algo, tc.task, tc.dataset, e.cell.profile))
                o = oc.summary(view) if oc is not None and view is not None and oc.same_data(e.cell) else None
                official_fields = {} if o is None else {
                    "official_n": o["n"], "official_mean": o["mean"], "official_std": o["std"],
                    "official_code": f"{o['repo']}@{o['commit']}"}
                out.append(Comparison(t.key, tc.task, tc.dataset, tc.algo, label(tc.algo), e.cell.score_name, s.n, s.mean,
                                      s.ci, ref.mean, ref.std, delta, dci, p, v, **official_fields))
    return out


def claims(tables: list[Table], label, paper: dict | None = None) -> dict:
    """The paper's two headline claims recomputed on the rows of the main and SMAC tables where
    every compared algorithm has >= 3 seeds (and PLCQL plus at least one other ran). As in the paper,
    a row's rivals are the columns of the paper's table (BC, on the board for MPE, is not one there).
    Each claim is counted both ways, so a row that contradicts it shows as plainly as one that
    supports it: below_best_sig = rows where PLCQL's mean is significantly below the row's best,
    behind(_sig) = rows where the rival's mean is above PLCQL's (significantly)."""
    with_target, eligible, excluded = 0, [], []
    for t in tables:
        columns = set(pp.table_columns(paper, PAPER_ROWS[t.key][0]))
        for row in t.rows:
            comp = [e for tc in row.cells for e in tc.entries if e.compared and e.cell.algo in columns]
            if not any(e.cell.algo == TARGET for e in comp):
                continue
            with_target += 1
            few = [e for e in comp if e.stats.n < MIN_SEEDS]
            if len(comp) < 2:
                excluded.append((row.label, f"only {label(TARGET)} ran"))
            elif few:
                excluded.append((row.label, ", ".join(f"{label(e.cell.algo)} n={e.stats.n}" for e in few)))
            else:
                eligible.append(comp)
    best = best_sig = below_best_sig = beats = beats_sig = behind = behind_sig = beats_of = 0
    algos = set()
    for comp in eligible:
        algos |= {e.cell.algo for e in comp}
        score_name = comp[0].cell.score_name
        marks = dict(zip((e.cell.algo for e in comp), mark_group([e.stats for e in comp], [True] * len(comp),
                                                                 score_name=score_name)))
        target = next(e for e in comp if e.cell.algo == TARGET)
        if marks[TARGET].bold:
            best += 1
            best_sig += all(m.p is not None and not m.ns for a, m in marks.items() if a != TARGET)
        else:
            below_best_sig += marks[TARGET].p is not None and not marks[TARGET].ns
        rival = next((e for e in comp if e.cell.algo == RIVAL), None)
        if rival is not None:
            beats_of += 1
            p = welch_p(target.stats.values, rival.stats.values, display_resolution(score_name))
            significant = p is not None and p < TIE_ALPHA
            if target.stats.mean > rival.stats.mean:
                beats += 1
                beats_sig += significant
            elif rival.stats.mean > target.stats.mean:
                behind += 1
                behind_sig += significant
    return {"rows_with_target": with_target, "eligible": len(eligible), "excluded": excluded,
            "best": best, "best_sig": best_sig, "below_best_sig": below_best_sig, "beats": beats,
            "beats_sig": beats_sig, "behind": behind, "behind_sig": behind_sig, "beats_of": beats_of,
            "algos": sorted(label(a) for a in algos)}


def _by_algo(comps: list[Comparison]) -> dict[str, list[Comparison]]:
    """The comparable cells per algorithm, PLCQL first, then by id."""
    by: dict[str, list[Comparison]] = defaultdict(list)
    for c in comps:
        if c.verdict not in ("not comparable", "not reported"):
            by[c.algo].append(c)
    return {a: by[a] for a in [TARGET] + sorted(a for a in by if a != TARGET) if by.get(a)}


def verdict_counts(comps: list[Comparison]) -> dict[str, Counter]:
    """{algorithm: Counter of its cells' verdicts} over the comparable cells, PLCQL first."""
    return {algo: Counter(c.verdict for c in cs) for algo, cs in _by_algo(comps).items()}


def findings(comps: list[Comparison], label) -> list[str]:
    """One sentence per algorithm with comparable cells: its verdicts against the paper."""
    out = []
    for algo, cs in _by_algo(comps).items():
        counts = Counter(c.verdict for c in cs)
        parts = ", ".join(f"{v} on {counts[v]}" for v in VERDICTS if counts[v])
        detail = "; ".join(f"{c.task} {c.dataset}: {c.mean:.{2 if c.score_name == 'win_rate' else 1}f} vs "
                           f"{c.paper_mean:.{2 if c.score_name == 'win_rate' else 1}f}" for c in cs if c.verdict in ("below", "above"))
        out.append(f"{label(algo)}: {parts} of {len(cs)} cell{'s' if len(cs) > 1 else ''} compared with the paper"
                   + (f" ({detail})" if detail else "") + ".")
    return out
