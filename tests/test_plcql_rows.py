"""docs/reproduction.md's PLCQL rows block (leaderboard/plcql_rows.py): PLCQL and SPaCQL per row against the
paper, between each other, with their diagnostics, and the PLCQL study, all computed from result files by the
board's own code. The committed block must be the committed results'."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from scipy import stats as sps

from lb_fixtures import curve_for, diag_lines, write_run
from plcql_bench.leaderboard import build, plcql_rows
from plcql_bench.leaderboard.scoring import DEFAULT_VIEW

pytestmark = pytest.mark.filterwarnings("ignore::FutureWarning")
REPO = Path(__file__).resolve().parents[1]
LEARNED = {"fixed_k": None}  # a PLCQL record whose π_par is learned (leaderboard/load.py learns_par)


def td_metrics(curve: list[dict], growth: float) -> str:
    """metrics.jsonl with the critic's TD loss over 20 logged points: 1.0, then `growth` from the 11th on (late
    over early median: `growth`)."""
    rows = [{"update": i * 5, "train/critic/td_loss": 1.0 if i < 10 else growth} for i in range(20)]
    return "\n".join(json.dumps(r) for r in rows + [{"update": p["update"], "score": p["score"]} for p in curve]) + "\n"


def _row(block: str, label: str, section: int) -> list[str]:
    """The cells of the row labelled `label` in the block's `section`-th table (0: against the paper, 1: between)."""
    tables = [t for t in block.split("\n\n") if t.startswith("| row |")]
    line = next(x for x in tables[section].splitlines() if x.startswith(f"| {label} |"))
    return [c.strip() for c in line.strip("|").split("|")]


def fixture(root: Path, with_study: bool = False) -> Path:
    """CN random: PLCQL (π_par drifting to k = 3, flagged collapsed on seed 0), SPaCQL (critic diverging 10,000×), CFCQL, 3 seeds each."""
    for seed in range(3):
        collapsed = {"par_collapse": {"k": 3, "entropy": 0.001, "p_k": 0.99}} if seed == 0 else {}  # as the runner writes it
        write_run(root, "plcql", "mpe-cn", "random", seed, 90.0 + seed, config=LEARNED, diag_n=3, collapse_to=3, **collapsed)
        write_run(root, "spacql", "mpe-cn", "random", seed, 60.0 + 2 * seed,
                  metrics=td_metrics(curve_for(60.0 + 2 * seed), 1e4))
        write_run(root, "cfcql", "mpe-cn", "random", seed, 85.0 + 3 * seed)
        if with_study:
            write_run(root, "plcql-k1", "mpe-cn", "random", seed, 70.0 + seed, config={"fixed_k": 1},
                      metrics=td_metrics(curve_for(70.0 + seed), 3.0))
    return root


def test_rows_are_the_boards_figures(tmp_path):
    res = fixture(tmp_path / "r")
    block = plcql_rows.rows_block(res)
    b = build.board(res, views=[DEFAULT_VIEW])
    view = b.views[0]
    comps = {c.algo: c for c in view["comparisons"] if (c.task, c.dataset) == ("mpe-cn", "random")}
    cells = {e.cell.algo: e for tc in view["tables"][0].rows[0].cells for e in tc.entries}
    paper_row = _row(block, "mpe-cn · random", 0)
    assert paper_row[1].endswith("(3)") and paper_row[1].startswith(f"{comps['plcql'].mean:.1f} ± ")
    assert paper_row[2] == f"{comps['plcql'].paper_mean:.1f} ± {comps['plcql'].paper_std:.1f}"
    assert paper_row[3] == comps["plcql"].verdict and paper_row[6] == comps["spacql"].verdict
    best = max(cells.values(), key=lambda e: e.stats.mean)
    assert paper_row[7] == f"{b.label(best.cell.algo)} {best.stats.mean:.1f}"  # the board's bold cell

    between = _row(block, "mpe-cn · random", 1)
    pl, sp, cf = (cells[a].stats for a in ("plcql", "spacql", "cfcql"))
    p = sps.ttest_ind(pl.values, sp.values, equal_var=False).pvalue
    assert p < 0.05 and between[1] == f"**+{pl.mean - sp.mean:.1f} (p {p:.2f})**"   # significant: bold
    p_cf = sps.ttest_ind(pl.values, cf.values, equal_var=False).pvalue
    assert p_cf >= 0.05 and between[2] == f"+{pl.mean - cf.mean:.1f} (p {p_cf:.2f})"  # not significant: plain
    assert between[4] == "—; 10,000–10,000×"          # PLCQL logged no TD loss; SPaCQL's grew 10,000-fold
    assert between[5] == "0 of 3; 3 of 3"             # ... which the board flags as diverged
    # E[k] over the last 20 % of the evaluation points: π_par drifts from uniform to k = 3 (lb_fixtures.diag_lines)
    late = [json.loads(x) for x in diag_lines(curve_for(90.0), 3, 3).splitlines()][9:]  # of 12 points: int(12 × 0.8) on
    e_k = sum(sum(k * h[f"diag/p_k{k}"] for k in (1, 2, 3)) for h in late) / len(late)
    assert between[6] == f"{e_k:.2f} ± 0.00"
    assert between[7] == "1 of 3"  # seed 0's record says π_par collapsed
    assert "The PLCQL study" not in block  # no variant ran


def test_study_table_compares_each_variant_with_full_plcql(tmp_path):
    res = fixture(tmp_path / "r", with_study=True)
    block = plcql_rows.rows_block(res)
    study = block[block.index("The PLCQL study"):]
    assert "**mpe-cn · random**" in study
    k1 = next(x for x in study.splitlines() if x.startswith("| Fixed k=1 |"))
    cells = [c.strip() for c in k1.strip("|").split("|")]
    view = build.board(res, views=[DEFAULT_VIEW]).views[0]
    by = {e.cell.algo: e.stats for row in view["tables"][2].rows for tc in row.cells for e in tc.entries}
    p = sps.ttest_ind(by["plcql-k1"].values, by["plcql"].values, equal_var=False).pvalue
    assert cells[4] == f"**{by['plcql-k1'].mean - by['plcql'].mean:+.1f} (p {p:.2f})**".replace("-", "−")
    assert cells[2] == "—" and cells[3] == "—"  # the paper's ablation row is CN medium-replay, not random
    assert cells[6] == "3.0–3.0×" and cells[7] == "0 of 3"
    assert cells[8] == "n/a" and cells[9] == "n/a"  # k is fixed: no π_par


def test_reproduction_rows_block_is_the_committed_results():
    text = (REPO / "docs" / "reproduction.md").read_text(encoding="utf-8")
    block = plcql_rows.rows_block(REPO / "leaderboard" / "results")
    current = text[text.index(plcql_rows.BEGIN) + len(plcql_rows.BEGIN) + 1: text.index(plcql_rows.END)]
    assert current == block, "docs/reproduction.md's PLCQL rows block is out of date: run `make readme`"
