"""The three tables (MPE + MaMuJoCo, SMAC / SMAX, PLCQL ablation) under one scoring view, as
pure functions of the cells, the unfinished runs and the paper's numbers.

Rules (docs/leaderboard.md):

* a cell's numbers: mean ± sample std over seeds, Student-t 95% interval, n;
* cells of a comparison group (a row of the main tables, a column of the ablation table) are
  compared only within the group's majority (profile, protocol version);
* **bold**: the highest mean among the compared cells with n >= 3, and only when at least two
  such cells exist (n < 3 cells are greyed, never bold and never tested);
* *not significantly different from the best*: Welch's test of a compared n >= 3 cell against the
  bold cell gives p >= 0.05 (the p-value is shown).
"""

from __future__ import annotations

from collections import Counter, defaultdict
from dataclasses import dataclass, field, replace

from plcql_bench.leaderboard import paper as pp
from plcql_bench.leaderboard.cells import (MIN_SEEDS, Cell, Stats, cell_stats, decimals_to_tell_apart,
                                           display_decimals, display_resolution)
from plcql_bench.leaderboard.registry import support
from plcql_bench.leaderboard.scoring import View
from plcql_bench.leaderboard.stats import TIE_ALPHA, best_in_row, welch_p

__all__ = ["Mark", "Entry", "TableCell", "Row", "Column", "Table", "mark_group", "main_tables",
           "ablation_table", "TARGET", "RIVAL"]

TARGET = "plcql"  # the algorithm the page is about (highlighted column, claims)
RIVAL = "spacql"


@dataclass(frozen=True)
class Mark:
    bold: bool = False
    p: float | None = None  # Welch p against the bold cell (tested cells only)
    ns: bool = False  # not significantly different from the bold cell
    decimals: int | None = None  # more than the page's decimals: to show a difference the marks claim


def mark_group(stats: list[Stats | None], compared: list[bool], alpha: float = TIE_ALPHA,
               score_name: str = "normalised") -> list[Mark]:
    """Bold and "not significantly different" marks for one comparison group. Means the page shows as
    equal and that have no spread are never called significantly different; where a difference is
    claimed between means shown as equal, both show as many decimals as it takes to see it."""
    eligible = [s is not None and c and s.n >= MIN_SEEDS for s, c in zip(stats, compared)]
    if sum(eligible) < 2:
        return [Mark() for _ in stats]
    best = best_in_row([s.mean if s is not None else None for s in stats], eligible=eligible)
    resolution = display_resolution(score_name)
    out = []
    for i, s in enumerate(stats):
        if i in best:
            out.append(Mark(bold=True))
        elif eligible[i]:
            ps = [p for p in (welch_p(s.values, stats[j].values, resolution) for j in best) if p is not None]
            p = max(ps) if ps else None
            out.append(Mark(p=p, ns=p is not None and p >= alpha))
        else:
            out.append(Mark())
    return _digits_for_claims(out, stats, best, score_name)


def _digits_for_claims(marks: list[Mark], stats: list, best: list[int], score_name: str) -> list[Mark]:
    """A cell called significantly below the best shows a mean that differs from the best's on the page:
    with more decimals (on both) where the page's own would show them as equal; a difference that even
    6 decimals do not show is not claimed (the cell is marked not significantly different)."""
    decimals: dict[int, int] = {}
    for i, m in enumerate(marks):
        if m.p is None or m.ns:
            continue
        for j in best:
            d = decimals_to_tell_apart(stats[i].mean, stats[j].mean, score_name)
            if d is None:
                marks[i] = replace(m, ns=True)
                break
            if d > display_decimals(score_name):
                decimals[i], decimals[j] = max(decimals.get(i, d), d), max(decimals.get(j, d), d)
    return [replace(m, decimals=decimals[i]) if i in decimals else m for i, m in enumerate(marks)]


@dataclass(frozen=True)
class Entry:
    """One of our cells inside a table cell, under the table's view."""

    cell: Cell
    stats: Stats
    compared: bool
    mark: Mark

    @property
    def grey(self) -> bool:
        return self.stats.n < MIN_SEEDS


@dataclass(frozen=True)
class TableCell:
    algo: str
    task: str
    dataset: str
    entries: tuple = ()
    missing: tuple | None = None  # (kind, detail) when there is no entry
    paper: pp.PaperRef | None = None
    unfinished: tuple = ()

    @property
    def bold(self) -> bool:
        return any(e.mark.bold for e in self.entries)


@dataclass(frozen=True)
class Column:
    id: str
    label: str
    empty: bool  # no result in any row (hidden by the "hide never-run columns" toggle)
    target: bool = False
    note: str = ""  # e.g. a budget, or "this suite's variant"


@dataclass(frozen=True)
class Row:
    id: str
    label: str
    sub: str  # paper row, or the variant's description
    domain: str
    budget: str
    cells: tuple
    mixed: bool = False
    suite: bool = False  # an ablation row that is this suite's variant, not the paper's
    beyond: bool = False


@dataclass(frozen=True)
class Table:
    key: str
    label: str
    score_label: str
    view: View
    columns: tuple
    rows: tuple
    transposed: bool = False  # rows are variants, columns are (task, tier)
    budgets: tuple = ()
    records: list = field(default_factory=list, compare=False)

    @property
    def has_smax(self) -> bool:
        return any(r.domain == "smax" for r in self.rows) or any(c.id.startswith("smax-") for c in self.columns)


# ------------------------------------------------------------------ helpers


def _majority(cells: list[Cell]) -> tuple | None:
    """The (profile, protocol) compared in a group: most algorithms, then most seeds, then the
    paper profile, then alphabetical."""
    if not cells:
        return None
    count, seeds = Counter(c.variant for c in cells), Counter()
    for c in cells:
        seeds[c.variant] += len(c.runs)
    return min(count, key=lambda v: (-count[v], -seeds[v], v[0] != "paper", v[0], -1 if v[1] is None else -v[1]))


def _entries(cells: list[Cell], view: View) -> tuple[list[Cell], list[Stats], list[bool], list[Mark]]:
    major = _majority(cells)
    stats = [cell_stats(c.values(view)) for c in cells]
    compared = [c.variant == major for c in cells]
    return cells, stats, compared, mark_group(stats, compared, score_name=cells[0].score_name if cells else "normalised")


def budget_text(cells: list[Cell]) -> str:
    """The training and evaluation budgets of the cells' runs, e.g. "2,001 rounds · final eval 100 ep"."""
    seen = sorted({(r.rec.budget.get("updates") or r.rec.train.get("updates"), r.rec.final_eval.get("episodes"))
                   for c in cells for r in c.runs}, key=str)
    return "; ".join(f"{u:,} rounds \u00b7 final eval {e} ep" if isinstance(u, int) and isinstance(e, int) else "budget not recorded"
                     for u, e in seen)


def _missing(algo: str, task: str, dataset: str, domain: str, unfinished: list, paper: dict | None) -> tuple:
    if unfinished:
        u = unfinished[0]
        return (u.state, f"{len(unfinished)} run{'s' if len(unfinished) > 1 else ''} {u.state}: {u.error}")
    discrete = domain in pp.SMAC_DOMAINS
    sup = support(algo, discrete)
    if sup == "no":
        return ("unsupported", f"{pp.algo_label(paper, algo)} does not support {'discrete' if discrete else 'continuous'} actions")
    if sup == "unknown":
        return ("not run", "not implemented in this suite yet")
    return ("not run", "no result files for this cell")


def _record(table: str, view: View, tc: TableCell, e: Entry | None) -> dict:
    p = tc.paper
    base = {"table": table, "view": view.key, "task": tc.task, "dataset": tc.dataset, "algo": tc.algo,
            "paper_mean": None if p is None else p.mean, "paper_std": None if p is None else p.std,
            "n_unfinished": len(tc.unfinished)}
    if e is None:
        return {**base, "status": tc.missing[0], "reason": tc.missing[1], "profile": None, "protocol_version": None,
                "n": 0, "mean": None, "std": None, "ci_low": None, "ci_high": None, "best": False,
                "not_significantly_below_best": False, "welch_p_vs_best": None, "compared": False,
                "n_dirty": 0, "n_par_collapsed": 0}
    s = e.stats
    return {**base, "status": "ok", "reason": "", "profile": e.cell.profile, "protocol_version": e.cell.protocol_version,
            "n": s.n, "mean": s.mean, "std": s.std, "ci_low": s.ci[0] if s.ci else None,
            "ci_high": s.ci[1] if s.ci else None, "best": e.mark.bold, "not_significantly_below_best": e.mark.ns,
            "welch_p_vs_best": e.mark.p, "compared": e.compared, "n_dirty": e.cell.n_dirty,
            "n_par_collapsed": len(e.cell.collapsed)}


def _table_cell(algo, task, dataset, domain, group, unfinished, paper, lookup) -> TableCell:
    """``group``: [(cell, stats, compared, mark)] of this algorithm in this setting."""
    entries = tuple(Entry(c, s, comp, m) for c, s, comp, m in sorted(group, key=lambda g: (not g[2], g[0].profile, str(g[0].protocol_version))))
    mine = [u for u in unfinished if u.algo == algo and u.task == task and u.dataset == dataset]
    missing = None if entries else _missing(algo, task, dataset, domain, mine, paper)
    return TableCell(algo, task, dataset, entries, missing, lookup(paper, task, dataset, algo), tuple(mine))


# ------------------------------------------------------------------ main and SMAC tables


def main_tables(cells: list[Cell], unfinished: list, paper: dict | None, view: View, family: set[str]) -> tuple[Table, Table]:
    """The MPE + MaMuJoCo table and the SMAC / SMAX table: one row per (task, tier) with a
    finished or unfinished run of a non-variant algorithm; the paper's columns, then any other."""
    cells = [c for c in cells if c.algo not in family]
    unfinished = [u for u in unfinished if u.algo not in family]
    domain_of = {c.task: c.domain for c in cells}
    keys = {(c.task, c.dataset) for c in cells} | {(u.task, u.dataset) for u in unfinished}
    out = []
    for key, label, score_label, smac in (("main", "MPE + MaMuJoCo", "normalised score", False),
                                           ("smac", "SMAC / SMAX", "win rate", True)):
        rows_in = sorted(((t, d, domain_of.get(t, t.partition("-")[0])) for t, d in keys
                          if (domain_of.get(t, t.partition("-")[0]) in pp.SMAC_DOMAINS) == smac),
                         key=lambda r: (pp.domain_rank(r[2]), pp.task_rank(paper, r[0]), pp.tier_rank(r[2], r[1])))
        base = pp.table_columns(paper, "starcraft_results" if smac else "main_results")
        present = {c.algo for c in cells if (c.task, c.dataset, c.domain) in rows_in} | {
            u.algo for u in unfinished if (u.task, u.dataset) in {(t, d) for t, d, _ in rows_in}}
        algos = base + sorted(present - set(base))
        out.append(_grid(key, label, score_label, view, algos, rows_in, cells, unfinished, paper))
    return out[0], out[1]


def _grid(key, label, score_label, view, algos, rows_in, cells, unfinished, paper) -> Table:
    by_row: dict[tuple, list[Cell]] = defaultdict(list)
    for c in cells:
        if c.algo in algos:
            by_row[(c.task, c.dataset)].append(c)
    rows, records, filled = [], [], set()
    for task, dataset, domain in rows_in:
        group = list(zip(*_entries(by_row[(task, dataset)], view))) if by_row[(task, dataset)] else []
        row_cells = []
        for algo in algos:
            tc = _table_cell(algo, task, dataset, domain, [g for g in group if g[0].algo == algo], unfinished, paper, pp.paper_value)
            row_cells.append(tc)
            if tc.entries:
                filled.add(algo)
            records += [_record(key, view, tc, e) for e in tc.entries] or [_record(key, view, tc, None)]
        where = pp.paper_row(paper, task, dataset)
        rows.append(Row(f"{key}-{task}-{dataset}", f"{task} \u00b7 {dataset}",
                        f"paper row: {where[1]} {where[2]}{' (SC2)' if where[0] == 'starcraft_results' else ''}" if where else "",
                        domain, budget_text(by_row[(task, dataset)]), tuple(row_cells),
                        mixed=len({c.variant for c in by_row[(task, dataset)]}) > 1))
    columns = tuple(Column(a, pp.algo_label(paper, a), a not in filled, a == TARGET) for a in algos)
    return Table(key, label, score_label, view, columns, tuple(rows), records=records)


# ------------------------------------------------------------------ ablation table


def ablation_table(cells: list[Cell], unfinished: list, paper: dict | None, variants: list, view: View) -> Table:
    """Rows: the variants (paper's first, then this suite's); columns: the paper's ablation
    settings, then every other (task, tier) where a variant other than the full method ran."""
    names = {v.algo for v in variants}
    settings = pp.ablation_settings(paper)
    more = {(c.task, c.dataset) for c in cells if c.algo in names and c.algo != TARGET} | {
        (u.task, u.dataset) for u in unfinished if u.algo in names and u.algo != TARGET}
    domain_of = {c.task: c.domain for c in cells}
    settings += sorted(more - set(settings), key=lambda s: (pp.task_rank(paper, s[0]), pp.tier_rank(domain_of.get(s[0], ""), s[1])))
    grid: dict[tuple, TableCell] = {}
    records, filled, col_budget = [], set(), []
    for task, dataset in settings:
        domain = domain_of.get(task, task.partition("-")[0])
        here = [c for c in cells if c.task == task and c.dataset == dataset and c.algo in names]
        group = list(zip(*_entries(here, view))) if here else []
        col_budget.append(budget_text(here))
        for v in variants:
            tc = _table_cell(v.algo, task, dataset, domain, [g for g in group if g[0].algo == v.algo], unfinished, paper,
                             pp.paper_ablation_value if v.paper else (lambda *a: None))
            grid[(v.algo, task, dataset)] = tc
            if tc.entries:
                filled.add((task, dataset))
            records += [_record("ablation", view, tc, e) for e in tc.entries] or [_record("ablation", view, tc, None)]
    columns = tuple(Column(f"{t}-{d}", f"{t} \u00b7 {d}", (t, d) not in filled, False, b)
                    for (t, d), b in zip(settings, col_budget))
    rows = tuple(Row(f"ablation-{v.algo}", v.label, v.what or ("the paper's ablation" if v.paper else ""), "",
                     "", tuple(grid[(v.algo, t, d)] for t, d in settings), suite=not v.paper, beyond=v.beyond)
                 for v in variants)
    return Table("ablation", "Ablation of PLCQL", "normalised score / win rate", view, columns, rows,
                 transposed=True, records=records)
