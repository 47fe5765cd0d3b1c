"""The built leaderboard in a real browser (headless Chromium, file://): no console errors, the
tables visible, **no table clipped at desktop widths** (1280, 1366, 1440, 1920 px) in any scoring
view with or without the empty columns, **no page overflow at 390 px**, screenshots saved as
artifacts (``artifacts/``, or ``$PLCQL_ARTIFACTS_DIR``). A second test proves each check can fail.
``$PLCQL_SITE`` points the tests at an already built page instead of the fixture sites.

The site `make all` leaves (issue 59): the committed board as the front page, measured (size, time
to first render; ``artifacts/leaderboard-front.json``) and shot at a laptop's 1,366 x 768, and its
link to the board of the runs just trained followed and checked the same way.

Skipped only when Chromium is not installed (CI installs Debian's ``chromium``)."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest

from lb_fixtures import NOW, write_run
from plcql_bench.leaderboard import build
from plcql_bench.leaderboard.browser import check_page, find_chromium
from plcql_bench.leaderboard.paper import load_paper_results, table_columns
from plcql_bench.leaderboard.scoring import DEFAULT_VIEW
from plcql_bench.leaderboard.site import YOUR_RUNS, build_boards

pytestmark = [
    pytest.mark.skipif(find_chromium() is None, reason="chromium is not on PATH (Debian: apt-get install chromium)"),
    pytest.mark.filterwarnings("ignore::FutureWarning"),
]

REPO = Path(__file__).resolve().parents[1]
ARTIFACTS = Path(os.environ.get("PLCQL_ARTIFACTS_DIR", REPO / "artifacts"))


def widest_results(root: Path) -> Path:
    """Every column of both paper tables filled (plus an algorithm the paper lacks), 3 seeds each,
    with n.s. marks, dirty and collapse badges: the widest tables the page can have."""
    paper = load_paper_results()
    for key, task, tier, base in (("main_results", "mpe-cn", "medium-replay", 50.0), ("starcraft_results", "smax-2s3z", "medium", 0.5)):
        for i, algo in enumerate(table_columns(paper, key) + ["newalgo"]):
            for seed in range(3):
                s = base + (i + seed) * (1.0 if base > 1 else 0.01)
                extra = {"par_collapse": {"k": 3, "entropy": 0.001, "p_k": 0.99}} if algo == "plcql" and seed else {}
                write_run(root, algo, task, tier, seed, s, commit="e" * 40 + ("-dirty" if seed == 0 else ""), **extra)
    return root


@pytest.fixture(scope="module")
def pages(tmp_path_factory) -> dict[str, Path]:
    if os.environ.get("PLCQL_SITE"):
        return {"site": Path(os.environ["PLCQL_SITE"])}
    tmp = tmp_path_factory.mktemp("browser")
    wide = build.build_site(widest_results(tmp / "wide"), tmp / "wide-site", now=NOW, bootstrap_reps=50, poi_reps=20)
    committed = build.build_site(REPO / "leaderboard" / "results", tmp / "committed-site", now=NOW, bootstrap_reps=50, poi_reps=20)
    return {"wide": wide, "committed": committed}


@pytest.mark.parametrize("width", [1280, 1366, 1440, 1920])
def test_no_table_clipped_at_desktop_widths(pages, width):
    for name, page in pages.items():
        shot = ARTIFACTS / f"leaderboard-{name}-{width}.png" if width == 1440 else None
        report = check_page(page, screenshot=shot, window=(width, 900))
        assert report.ok, f"{name}:\n" + "\n".join(report.errors)
        assert report.clipped == [] and report.page_width <= width
        shown = {t["id"] for t in report.tables}
        assert shown and all(t.endswith(DEFAULT_VIEW.key) for t in shown)  # the default view's tables
        if name == "wide":  # every table has results there (the committed board may hold SMAX runs alone)
            assert {f"table-{k}-{DEFAULT_VIEW.key}" for k in ("main", "ablation", "smac")} <= shown  # smac: 12 columns
        for t in report.tables:
            assert t["rows"] >= 1 and t["width"] > 100  # visible (an ablation table with no results yet is one label column)
        if shot is not None:
            assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and shot.stat().st_size > 10_000


def test_no_page_overflow_at_390px(pages):
    for name, page in pages.items():
        shot = ARTIFACTS / f"leaderboard-{name}-390.png"
        report = check_page(page, screenshot=shot, window=(390, 900), allow_scroll=True)
        assert report.ok, f"{name}:\n" + "\n".join(report.errors)
        assert report.inner_width <= 390 and report.page_width <= report.inner_width
        assert shot.is_file()


# The front page's budget: today's board is about 1.3 MB (it was 3.4 MB with every figure inline)
# and renders first in about 0.3 s on a busy 2-core machine; these bounds leave room for more results
# and a slower machine, not for a return of the figures to the front page.
FRONT_PAGE_MAX_BYTES = 2_500_000
FIRST_RENDER_MAX_MS = 5_000


@pytest.fixture(scope="module")
def made_site(tmp_path_factory) -> Path:
    """What `make all` leaves on a clean clone: the committed results in front, the smoke runs it
    trained (here: a stand-in of 6 runs) in site/your-runs/."""
    tmp = tmp_path_factory.mktemp("made")
    for algo, tier in (("bc", "random"), ("cfcql", "expert"), ("plcql", "medium")):
        for seed in range(2):
            write_run(tmp / "results", algo, "mpe-cn", tier, seed, 5.0 + seed, profile="smoke")
    build_boards(REPO / "leaderboard" / "results", tmp / "results", tmp / "site", now=NOW, bootstrap_reps=50, poi_reps=20)
    return tmp / "site"


def test_front_page_is_the_committed_board_fast_and_fits_a_laptop(made_site):
    front = made_site / "index.html"
    shot = ARTIFACTS / "leaderboard-front-1366.png"
    report = check_page(front, screenshot=shot, window=(1366, 768), timing=True)
    assert report.ok, "\n".join(report.errors)
    assert report.clipped == [] and report.page_width <= 1366
    assert report.tables and all(t["rows"] >= 1 and t["width"] <= 1366 for t in report.tables)  # what holds results
    t = report.timing
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    (ARTIFACTS / "leaderboard-front.json").write_text(json.dumps({"bytes": report.page_bytes, **t}, indent=1) + "\n")
    print(f"front page: {report.page_bytes:,} bytes, first render {t['first_render_ms']} ms, load {t['load_ms']} ms")
    assert report.page_bytes < FRONT_PAGE_MAX_BYTES
    assert t["first_render_ms"] is not None and 0 < t["first_render_ms"] < FIRST_RENDER_MAX_MS
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_front_page_link_leads_to_your_runs_and_back(made_site):
    front = (made_site / "index.html").read_text(encoding="utf-8")
    href = re.search(r'<a class="board-link"[^>]*href="([^"]+)"', front).group(1)
    yours = (made_site / href).resolve()
    assert yours == (made_site / YOUR_RUNS / "index.html").resolve()
    report = check_page(yours, screenshot=ARTIFACTS / "leaderboard-your-runs-1366.png", window=(1366, 768))
    assert report.ok, "\n".join(report.errors)
    assert report.clipped == [] and report.page_width <= 1366
    text = " ".join(re.sub(r"<[^>]+>", " ", yours.read_text(encoding="utf-8")).split())
    assert "Your runs (this page) 6 runs · profile smoke" in text and "Committed results" in text
    back = re.search(r'<a class="board-link[^"]*"[^>]*href="([^"]+)"', yours.read_text(encoding="utf-8")).group(1)
    assert (yours.parent / back).resolve() == (made_site / "index.html").resolve()


@pytest.mark.parametrize("page", ["curves.html", "par.html", f"{YOUR_RUNS}/curves.html"])
def test_figure_pages_render(made_site, page):
    report = check_page(made_site / page, window=(1366, 768), min_tables=0)
    assert report.ok, "\n".join(report.errors)
    assert report.page_width <= 1366


def test_the_checks_can_fail(tmp_path):
    """A script error, a missing resource, a hidden table, a clipped table and page overflow are
    all reported."""
    bad = tmp_path / "bad.html"
    bad.write_text(
        "<!doctype html><html><head><title>x</title></head><body>"
        '<table class="board" id="t" style="display:none"><tbody><tr><td>1</td></tr></tbody></table>'
        '<img src="missing.png" alt="">'
        "<script>undefinedFunction();</script></body></html>", encoding="utf-8")
    text = "\n".join(check_page(bad).errors)
    assert "undefinedFunction" in text and "missing.png" in text and "at least 1 leaderboard table" in text
    wide = tmp_path / "wide.html"
    wide.write_text(
        "<!doctype html><html><head><title>w</title><style>.scroll{overflow-x:auto}</style></head><body>"
        '<div class="scroll"><table class="board" id="w"><tbody><tr><td style="min-width:1700px">x</td></tr></tbody></table></div>'
        "</body></html>", encoding="utf-8")
    report = check_page(wide, window=(1440, 900))
    assert not report.ok and any("table w is clipped by" in e and "at 1440 px" in e for e in report.errors)
    assert report.page_width <= 1440  # it scrolls inside its box: clipped, but no page overflow
    narrow = check_page(wide, window=(390, 900), allow_scroll=True)
    assert narrow.ok  # at phone widths a table may scroll in its box...
    spill = tmp_path / "spill.html"
    spill.write_text(
        "<!doctype html><html><head><title>s</title></head><body>"
        '<table class="board" id="s"><tbody><tr><td style="min-width:600px">x</td></tr></tbody></table></body></html>',
        encoding="utf-8")
    report = check_page(spill, window=(390, 900), allow_scroll=True)
    assert any(e.startswith("page overflow") for e in report.errors)  # ...but never widen the page
