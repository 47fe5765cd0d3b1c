"""Build the static leaderboard site from finished runs: ``plcql-bench leaderboard``.

The orchestrator only: loading (load.py) -> cells (cells.py) -> per scoring view the tables
(tables.py) and the reproduction summary (summary.py) -> analysis sections on the default view
(analysis.py) -> cards and provenance (provenance.py) -> the page (render.py) and its data files
(write.py). Every number on the page that is not labelled "paper" comes from the result files.
"""

from __future__ import annotations

import dataclasses
import os
from collections import Counter
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

from plcql_bench.leaderboard import analysis, summary
from plcql_bench.leaderboard import stats as st
from plcql_bench.leaderboard.cells import critic_diverged, format_mean_std, group_cells
from plcql_bench.leaderboard.load import DIVERGENCE_RULE, Loaded, archives, load
from plcql_bench.leaderboard.official import load_official, official_cells, official_rows
from plcql_bench.leaderboard.paper import (algo_label, ablation_variants, load_paper_results, load_variants,
                                           paper_ablation_value, paper_claims_check, paper_value, reference_tables)
from plcql_bench.leaderboard.provenance import build_provenance, dataset_cards, load_cards, run_rows
from plcql_bench.leaderboard.registry import n_agents, registered_names, support
from plcql_bench.leaderboard.render import render_pages
from plcql_bench.leaderboard.scoring import NORMS, SCORINGS, VIEWS
from plcql_bench.leaderboard.tables import RIVAL, TARGET, ablation_table, main_tables
from plcql_bench.leaderboard.write import cell_json, write_outputs

__all__ = ["Board", "BoardLink", "Built", "Page", "board", "build", "build_site", "load_paper_results", "paper_value",
           "prepare", "support", "write"]


@dataclass(frozen=True)
class Built:
    index: Path
    n_runs: int
    skipped: list  # of Damaged: files in no number on the page (``--strict`` fails on any)
    profiles: tuple[str, ...] = ()  # of the runs on the board


@dataclass(frozen=True)
class Board:
    """The tables and the comparison with the paper, per scoring view, of one results folder:
    what the page shows before its figures (also the README's summary, leaderboard/readme.py)."""
    paper: dict | None
    cards: list
    loaded: Loaded  # with the damaged official-check files among its skipped
    checks: list
    official: dict  # official_cells(checks)
    cells: list
    family: set  # the PLCQL variants on the board (the target itself not included)
    label: object  # algorithm id -> its label on the page
    views: list  # per VIEWS entry: {"view", "tables": [main, smac, ablation], "comparisons", "claims", "findings"}


@dataclass(frozen=True)
class BoardLink:
    """One board of a site of several (leaderboard/site.py), named in the bar atop each page."""
    name: str  # "Committed results", "Your runs"
    index: Path | None  # its index.html; None when it has no runs (no page)
    results: str  # the results folder it renders, as the user named it
    n_runs: int
    profiles: tuple[str, ...]
    about: str = ""  # what its profile(s) mean


def board(results_dir: Path, *, paper_path: Path | None = None, cards_root: Path | None = None,
          views=VIEWS) -> Board:
    """Load ``results_dir`` and lay out its tables and comparisons under each of ``views``."""
    results_dir = Path(results_dir)
    if not results_dir.is_dir():
        raise FileNotFoundError(f"results directory not found: {results_dir}")
    if cards_root is None and (Path(results_dir).parent / "cards").is_dir():
        cards_root = Path(results_dir).parent / "cards"  # an archived generation carries its own dataset cards
    paper, cards = load_paper_results(paper_path), load_cards(cards_root)
    loaded = load(results_dir, {c["sha256"]: c for c in cards})
    checks, damaged_checks = load_official(results_dir)
    loaded = dataclasses.replace(loaded, skipped=sorted(loaded.skipped + damaged_checks, key=lambda d: d.path))
    official = official_cells(checks)
    cells = group_cells(loaded.runs)
    names = set(registered_names()) | {c.algo for c in cells} | {u.algo for u in loaded.unfinished}
    variants = ablation_variants(paper, load_variants(), names)
    family = {v.algo for v in variants} - {TARGET}
    suite_labels = {v.algo: v.label for v in variants if not v.paper}

    def label(a: str) -> str:
        return suite_labels.get(a) or algo_label(paper, a)

    out = []
    for view in views:
        main, smac = main_tables(cells, loaded.unfinished, paper, view, family)
        abl = ablation_table(cells, loaded.unfinished, paper, variants, view)
        comps = summary.comparisons([main, smac, abl], label, official, view)
        out.append({"view": view, "tables": [main, smac, abl], "comparisons": comps,
                    "claims": summary.claims([main, smac], label, paper), "findings": summary.findings(comps, label)})
    return Board(paper, cards, loaded, checks, official, cells, family, label, out)


@dataclass(frozen=True)
class Page:
    """A board laid out for its page, not yet written: ``write`` renders it (with the bar of
    the site's boards, when there are several)."""
    context: dict
    downloads: dict
    results: dict
    n_runs: int
    skipped: list
    profiles: tuple[str, ...]


def build(results_dir: Path, out_dir: Path, *, now: datetime | None = None, paper_path: Path | None = None,
          cards_root: Path | None = None, bootstrap_reps: int | None = None, poi_reps: int | None = None) -> Built:
    """Build the site from ``results_dir`` into ``out_dir``. ``now`` fixes the build date,
    ``paper_path`` / ``cards_root`` override the paper tables and the committed dataset cards,
    ``bootstrap_reps`` / ``poi_reps`` the bootstrap replicates (tests)."""
    return write(prepare(results_dir, now=now, paper_path=paper_path, cards_root=cards_root,
                         bootstrap_reps=bootstrap_reps, poi_reps=poi_reps), out_dir)


def prepare(results_dir: Path, *, now: datetime | None = None, paper_path: Path | None = None,
            cards_root: Path | None = None, bootstrap_reps: int | None = None, poi_reps: int | None = None) -> Page:
    """Everything of ``build`` but the writing: the page's context, its data files and counts."""
    results_dir = Path(results_dir)
    now = now or datetime.now(timezone.utc)
    reps, preps = bootstrap_reps or st.BOOTSTRAP_REPS, poi_reps or st.POI_REPS
    b = board(results_dir, paper_path=paper_path, cards_root=cards_root)
    paper, cards, loaded, checks, official = b.paper, b.cards, b.loaded, b.checks, b.official
    cells, family, label, views = b.cells, b.family, b.label, b.views
    main, smac, abl = views[0]["tables"]  # VIEWS[0] is the default view
    aggs = [analysis.aggregates(t, label, TARGET, reps=reps, poi_reps=preps, salt=f"agg-{t.key}") for t in (main, smac)]
    par = analysis.par_diagnostics([main, smac, abl], results_dir, family | {TARGET}, label)
    compute = analysis.compute_cost(n_agents=n_agents)
    card_rows = dataset_cards(cards, loaded.runs, paper)
    ordered_cells = [e.cell for t in (main, smac, abl) for row in t.rows for tc in row.cells for e in tc.entries]
    runs = run_rows(list({c.anchor: c for c in ordered_cells}.values()), cards, label)
    prov = build_provenance(loaded.runs, now)
    coverage = summary.coverage([main, smac], paper)
    card_shas = {c["sha256"] for c in cards}
    context = {
        "title": "PLCQL-bench: reproduction report and leaderboard", "paper_source": (paper or {}).get("source"),
        "views": views, "default_tables": [main, smac, abl],
        "tables_by_key": {k: [v["tables"][i] for v in views] for i, k in enumerate(("main", "smac", "ablation"))},
        "scorings": SCORINGS, "norms": list(NORMS), "norm_labels": NORMS, "default_label": VIEWS[0].label,
        "coverage": coverage,
        "paper_claims": paper_claims_check(paper, TARGET, RIVAL), "target_label": label(TARGET), "rival_label": label(RIVAL),
        "n_runs": len(loaded.runs), "n_cells": len(cells), "skipped": loaded.skipped, "unfinished": loaded.unfinished,
        "archives": archives(results_dir),
        "official": official_rows(official, cells, label),
        "unfinished_states": dict(Counter(u.state for u in loaded.unfinished)),
        "n_collapsed": sum(bool(r.rec.par_collapse) for r in loaded.runs),
        "n_diverged": sum(critic_diverged(r.rec) for r in loaded.runs),
        "divergence_rule": DIVERGENCE_RULE,
        "profiles": sorted({c.profile for c in cells}), "non_paper_profiles": sorted({c.profile for c in cells} - {"paper"}),
        "show_protocol": len({c.protocol_version for c in cells}) > 1, "aggregates": aggs,
        "curves": analysis.learning_curves([main, smac, abl], label), "par": par, "compute": compute,
        "cards": card_rows, "runs_without_card": sum(r.rec.dataset_sha256 not in card_shas for r in loaded.runs),
        "run_groups": runs, "provenance": prov, "paper_tables": reference_tables(paper, format_mean_std),
        "tie_test": st.TIE_TEST, "bootstrap": {"reps": reps, "poi_reps": preps, "seed": st.BOOTSTRAP_SEED},
    }
    downloads = {
        "main": [r for v in views for r in v["tables"][0].records],
        "smac": [r for v in views for r in v["tables"][1].records],
        "ablation": [r for v in views for r in v["tables"][2].records],
        "comparisons": [{"view": v["view"].key, **c.__dict__} for v in views for c in v["comparisons"]],
        "claims": [{"view": v["view"].key, **{k: x for k, x in v["claims"].items() if k != "excluded"},
                    "excluded": "; ".join(f"{a}: {b}" for a, b in v["claims"]["excluded"])} for v in views],
        "aggregates": [r for a in aggs for r in a["records"]],
        "probability_of_improvement": [r for a in aggs for r in a["poi_records"]],
        "par_diagnostics": par["records"], "compute_cost": compute["records"], "datasets": card_rows,
        "official_checks": [{k: v for k, v in c.items() if k not in ("curve", "settings")} for c in checks],
        "runs": [{"cell": g["label"], **{k: v for k, v in r.items() if k != "values"}, **r["values"]} for g in runs for r in g["runs"]],
        "skipped": [{"path": s.path, "reason": s.reason} for s in loaded.skipped]
                   + [{"path": u.path, "reason": f"{u.state}: {u.error}"} for u in loaded.unfinished],
    }
    results = {
        "generated_at": now.astimezone(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "views": {v.key: v.label for v in VIEWS}, "default_view": VIEWS[0].key,
        "cells": [cell_json(c, paper_value(paper, c.task, c.dataset, c.algo) or paper_ablation_value(paper, c.task, c.dataset, c.algo))
                  for c in cells],
        "skipped": [{"path": s.path, "reason": s.reason} for s in loaded.skipped],
        "unfinished": [u.__dict__ for u in loaded.unfinished], "provenance": prov,
    }
    return Page(context, downloads, results, len(loaded.runs), list(loaded.skipped), tuple(context["profiles"]))


def write(page: Page, out_dir: Path, *, title: str | None = None, boards: list[BoardLink] = (),
          current: int = 0) -> Built:
    """Render ``page`` into ``out_dir``; ``boards`` (with ``boards[current]`` this one) puts the
    bar of the site's boards atop the page, with relative links, and ``title`` replaces its own."""
    out_dir = Path(out_dir)
    bar = [{"name": b.name, "href": b.index and Path(os.path.relpath(b.index, out_dir)).as_posix(), "results": b.results,
            "n_runs": b.n_runs, "profiles": b.profiles, "about": b.about, "current": i == current}
           for i, b in enumerate(boards)]
    pages = render_pages({**page.context, "boards": bar, "title": title or page.context["title"]})
    index = write_outputs(out_dir, pages, page.results, page.downloads)
    return Built(index, page.n_runs, page.skipped, page.profiles)


def build_site(results_dir: Path, out_dir: Path, **kw) -> Path:
    """``build(...)``'s index.html path."""
    return build(results_dir, out_dir, **kw).index

