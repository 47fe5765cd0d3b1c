"""The README's first screen says what the committed board holds, in figures the leaderboard
computes (leaderboard/readme.py), never typed by hand: this test fails when README.md and
leaderboard/results disagree (fix: `make readme`), and checks that the generated figures are the
page's own (its claims and comparison tables) and that the README's screenshot of the front page
is there."""

from __future__ import annotations

import json
import re
import struct
from pathlib import Path

import pytest

from lb_fixtures import NOW, write_run
from plcql_bench.leaderboard import build, generations, readme
from plcql_bench.leaderboard.scoring import DEFAULT_VIEW

pytestmark = pytest.mark.filterwarnings("ignore::FutureWarning")
REPO = Path(__file__).resolve().parents[1]
SCREENSHOT = "docs/img/leaderboard-front.png"


def test_readme_summary_is_the_committed_boards():
    text = (REPO / "README.md").read_text(encoding="utf-8")
    block = readme.board_summary(REPO / "leaderboard" / "results", REPO)
    current = text[text.index(readme.BEGIN) + len(readme.BEGIN) + 1: text.index(readme.END)]
    assert current == block, "README.md's board summary is out of date: run `make readme` (or `python -m plcql_bench.leaderboard.readme`)"
    assert text.index(readme.BEGIN) < text.index("## Quick start"), "the summary belongs on the README's first screen"


def fixture_results(root: Path) -> Path:
    """PLCQL, SPaCQL and CFCQL on two CN rows, 3 seeds each, and a BC run with n < 3."""
    scores = {("plcql", "expert"): 110.0, ("spacql", "expert"): 100.0, ("cfcql", "expert"): 40.0,
              ("plcql", "random"): 30.0, ("spacql", "random"): 80.0, ("cfcql", "random"): 60.0}
    for (algo, tier), base in scores.items():
        for seed in range(3):
            write_run(root, algo, "mpe-cn", tier, seed, base + seed)
    write_run(root, "bc", "mpe-cn", "expert", 0, 70.0)
    return root


def test_summary_figures_are_the_pages(tmp_path):
    """Every figure of the summary is the built page's: runs and cells (results.json), the claims
    (tables/claims.json) and the verdicts per algorithm (tables/comparisons.json), default view."""
    res = fixture_results(tmp_path / "r")
    block = readme.board_summary(res, tmp_path)
    build.build(res, tmp_path / "site", now=NOW, bootstrap_reps=20, poi_reps=10)
    results = json.loads((tmp_path / "site" / "results.json").read_text())
    runs = sum(c["n"] for c in results["cells"])
    assert f"{runs} runs in {len(results['cells'])} cells" in block
    claims = next(c for c in json.loads((tmp_path / "site" / "tables" / "claims.json").read_text())["rows"]
                  if c["view"] == DEFAULT_VIEW.key)
    assert (f"PLCQL has the best mean on {claims['best']} of {claims['eligible']} (significantly on {claims['best_sig']}; "
            f"significantly below the row's best on {claims['below_best_sig']})") in block
    assert (f"PLCQL beats SPaCQL on {claims['beats']} of {claims['beats_of']} (significantly on {claims['beats_sig']}; "
            f"behind on {claims['behind']}, significantly on {claims['behind_sig']})") in block
    comps = [c for c in json.loads((tmp_path / "site" / "tables" / "comparisons.json").read_text())["rows"]
             if c["view"] == DEFAULT_VIEW.key]
    header = next(line for line in block.splitlines() if line.startswith("| algorithm"))
    columns = [c.strip() for c in header.strip("|").split("|")]
    for line in block.splitlines():
        cells = [c.strip() for c in line.strip("|").split("|")]
        if not line.startswith("| ") or cells[0] in ("algorithm",):
            continue
        algo = {"PLCQL": "plcql", "SPaCQL": "spacql", "CFCQL": "cfcql"}[cells[0]]
        mine = [c for c in comps if c["algo"] == algo]
        assert int(cells[1]) == len(mine)
        for name, value in zip(columns[2:], cells[2:]):
            assert int(value) == sum(c["verdict"] == name for c in mine), (algo, name)
    assert "cfcql" in {c["algo"] for c in comps} and "| BC |" not in block  # BC: no paper number on CN


def test_summary_drifts_with_the_results_and_check_says_so(tmp_path, capsys):
    """A new run changes the summary; --check then exits 1 and the plain command rewrites the block,
    leaving the rest of the README as it was."""
    res = fixture_results(tmp_path / "r")
    md = tmp_path / "README.md"
    md.write_text(f"# x\n\nintro\n\n{readme.BEGIN}\nold\n{readme.END}\n\n## Quick start\n", encoding="utf-8")
    args = ["--results", str(res), "--readme", str(md)]
    assert readme.main(args) == 0
    first = md.read_text()
    assert first.startswith("# x\n\nintro\n\n") and first.endswith(f"{readme.END}\n\n## Quick start\n")
    assert readme.main(args + ["--check"]) == 0
    write_run(res, "cfcql", "mpe-cn", "random", 3, 61.0)
    assert readme.board_summary(res, tmp_path) not in first
    assert readme.main(args + ["--check"]) == 1 and md.read_text() == first
    assert "out of date (make readme)" in capsys.readouterr().err
    assert readme.main(args) == 0 and "20 runs in 7 cells" in md.read_text()


def test_readme_without_markers_is_one_line(tmp_path, capsys):
    md = tmp_path / "README.md"
    md.write_text("# no block\n")
    assert readme.main(["--results", str(fixture_results(tmp_path / "r")), "--readme", str(md)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"error: {md}: no ") and md.read_text() == "# no block\n"


def test_readme_shows_and_links_the_front_page_screenshot():
    """The screenshot `make readme` takes with the browser test's checker: a 1,366 px wide PNG."""
    text = (REPO / "README.md").read_text(encoding="utf-8")
    assert re.search(rf"!\[[^\]]+\]\({re.escape(SCREENSHOT)}\)", text)
    png = (REPO / SCREENSHOT).read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and png[12:16] == b"IHDR"
    width, height = struct.unpack(">II", png[16:24])
    assert (width, height) == (1366, 768)
    assert "make board" in text[: text.index("## Quick start")] and "site/index.html" in text[: text.index("## Quick start")]


def _generations_row(table: str, cell: str, algo: str) -> list[str]:
    row = next(line for line in table.splitlines() if line.startswith(f"| {cell} | {algo} |"))
    return [c.strip() for c in row.strip("|").split("|")]


def test_generations_table_marks_the_verdicts_that_moved_with_the_data(tmp_path):
    """docs/reproduction.md's v1 -> v2 table: each cell's verdict on both generations, computed as the board
    computes it, and how it moved: toward the paper (v1 differs from it, v2 does not), away (the reverse), flipped
    (below <-> above), no; never while one side has fewer than 3 seeds. The line above the table counts them."""
    v1, v2 = tmp_path / "v1", tmp_path / "v2"
    for seed in range(3):
        write_run(v1, "cfcql", "mpe-cn", "expert", seed, 20.0 + seed)    # far below the paper's 112.0 ± 4.0
        write_run(v2, "cfcql", "mpe-cn", "expert", seed, 20.0 + seed)    # the same: not moved
        write_run(v1, "iql", "mpe-cn", "expert", seed, 20.0 + seed)      # below ...
        write_run(v2, "iql", "mpe-cn", "expert", seed, 2000.0 * seed)    # ... then too spread to tell: toward
        write_run(v1, "omar", "mpe-cn", "expert", seed, 2000.0 * seed)   # too spread to tell ...
        write_run(v2, "omar", "mpe-cn", "expert", seed, 20.0 + seed)     # ... then below: away
        write_run(v1, "matd3bc", "mpe-pp", "random", seed, -20.0 + seed)      # below the paper ...
        write_run(v2, "matd3bc", "mpe-pp", "random", seed, 900.0 + seed)      # ... then far above it: flipped
    write_run(v2, "plcql", "mpe-cn", "random", 0, 80.0)                  # one seed: no verdict to compare
    table = generations.generations_table(v1, v2)
    cf, iql, omar, bc, pl = (_generations_row(table, "mpe-cn expert", "CFCQL"), _generations_row(table, "mpe-cn expert", "IQL"),
                             _generations_row(table, "mpe-cn expert", "OMAR"), _generations_row(table, "mpe-pp random", "MA-TD3+BC"),
                             _generations_row(table, "mpe-cn random", "PLCQL"))
    assert cf[4] == cf[7] == "below" and cf[9] == "no"
    assert iql[4] == "below" and iql[7] not in ("below", "above") and iql[9] == "toward"
    assert omar[4] not in ("below", "above") and omar[7] == "below" and omar[9] == "away"
    assert (bc[4], bc[7], bc[9]) == ("below", "above", "flipped")
    assert pl[3] == "—" and pl[7] == "too few seeds" and pl[9] == "—"
    assert ("over the 4 cells both generations judge (≥ 3 seeds each): 1 toward the paper (v1 differs from it, v2 "
            "does not), 1 away from it (the reverse), 1 flipped (below on one generation, above on the other), "
            "1 unchanged.") in table
    comps = build.board(v2, views=[DEFAULT_VIEW]).views[0]["comparisons"]  # the board's own figures
    mine = next(c for c in comps if (c.task, c.dataset, c.algo) == ("mpe-cn", "expert", "iql"))
    assert iql[6] == f"{mine.mean:.1f} (3)" and iql[7] == mine.verdict


def _summary_row(table: str, name: str) -> list[str]:
    row = next(line for line in table.splitlines() if line.startswith(f"| {name} |"))
    return [c.strip() for c in row.strip("|").split("|")][1:]


def test_generations_summary_counts_verdicts_and_recomputes_the_claims_per_generation(tmp_path):
    """The summary above the cell table: each generation's verdict counts, and the paper's headline claims
    recomputed on that generation's rows only (a row enters once every compared algorithm has 3 seeds)."""
    v1, v2 = tmp_path / "v1", tmp_path / "v2"
    for seed in range(3):
        write_run(v1, "cfcql", "mpe-cn", "expert", seed, 20.0 + seed)    # below the paper's 112.0 ± 4.0
        write_run(v2, "cfcql", "mpe-cn", "expert", seed, 30.0 + seed)    # below again
        write_run(v2, "plcql", "mpe-pp", "medium", seed, 90.0 + seed)    # PLCQL ahead of SPaCQL, significantly
        write_run(v2, "spacql", "mpe-pp", "medium", seed, 60.0 + seed)
    write_run(v1, "plcql", "mpe-pp", "medium", 0, 90.0)                  # one seed: no row eligible in v1
    table = generations.generations_table(v1, v2)
    assert _summary_row(table, "cells compared with the paper") == ["2", "3"]
    # (the default view rescales to the paper's reference returns: v2's SPaCQL falls below the paper, PLCQL not)
    assert _summary_row(table, "… verdict below") == ["1", "2"]
    assert _summary_row(table, "… verdict not distinguishable") == ["0", "1"]
    assert _summary_row(table, "… verdict too few seeds") == ["1", "0"]
    assert _summary_row(table, "claims: rows where every compared algorithm has ≥ 3 seeds") == ["0", "1"]
    assert _summary_row(table, "… PLCQL has the row's best mean (significantly)") == ["—", "1 (1)"]
    assert _summary_row(table, "… PLCQL ahead of SPaCQL (significantly)") == ["—", "1 of 1 (1); behind on 0 (0)"]


def test_reproduction_generations_table_is_the_committed_results():
    text = (REPO / "docs" / "reproduction.md").read_text(encoding="utf-8")
    block = generations.generations_table(REPO / "leaderboard" / "archive" / generations.ARCHIVE / "results",
                                          REPO / "leaderboard" / "results")
    current = text[text.index(generations.BEGIN) + len(generations.BEGIN) + 1: text.index(generations.END)]
    assert current == block, "docs/reproduction.md's generations table is out of date: run `make readme`"
