"""The built leaderboard in a real browser: headless Chromium loads it from file://, there are
no console errors, the tables are visible, and a screenshot is saved as an artifact
(``artifacts/leaderboard.png``, or ``$PLCQL_ARTIFACTS_DIR``). ``$PLCQL_SITE`` points the test at
an already built page (e.g. ``site/index.html`` after ``make all``) instead of the fixture site.

Skipped only when Chromium is not installed (CI installs Debian's ``chromium``)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from plcql_bench.leaderboard import build
from plcql_bench.leaderboard.browser import check_page, find_chromium

pytestmark = [
    pytest.mark.skipif(find_chromium() is None, reason="chromium is not on PATH (Debian: apt-get install chromium)"),
    pytest.mark.filterwarnings("ignore::FutureWarning"),
]

REPO = Path(__file__).resolve().parents[1]
ARTIFACTS = Path(os.environ.get("PLCQL_ARTIFACTS_DIR", REPO / "artifacts"))


@pytest.fixture(scope="module")
def page(tmp_path_factory) -> Path:
    if os.environ.get("PLCQL_SITE"):
        return Path(os.environ["PLCQL_SITE"])
    from test_leaderboard_render import NOW, make_fixture_results

    tmp = tmp_path_factory.mktemp("browser")
    res = make_fixture_results(tmp / "results")
    return build.build_site(res, tmp / "site", now=NOW, bootstrap_reps=100, poi_reps=50)


def test_page_loads_without_errors_and_tables_are_visible(page):
    shot = ARTIFACTS / "leaderboard.png"
    shot.unlink(missing_ok=True)
    report = check_page(page, screenshot=shot)
    assert report.ok, "\n".join(report.errors)
    ids = {t["id"] for t in report.tables}
    assert "table-main" in ids and "table-ablation" in ids
    if not os.environ.get("PLCQL_SITE"):
        assert ids == {"table-main", "table-smac", "table-ablation"}
        assert report.svgs >= 5
    for t in report.tables:
        assert t["rows"] >= 1 and t["width"] > 300
    assert shot.is_file() and shot.stat().st_size > 10_000
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_the_check_can_fail(tmp_path):
    """A page with a script error, a missing resource and a hidden table must not pass."""
    bad = tmp_path / "bad.html"
    bad.write_text(
        "<!doctype html><html><head><title>x</title></head><body>"
        '<table class="board" id="t" style="display:none"><tbody><tr><td>1</td></tr></tbody></table>'
        '<img src="missing.png" alt="">'
        "<script>undefinedFunction();</script></body></html>",
        encoding="utf-8",
    )
    report = check_page(bad)
    text = "\n".join(report.errors)
    assert not report.ok
    assert "undefinedFunction" in text  # uncaught error, seen by the console log and the probe
    assert "missing.png" in text  # failed resource load
    assert "table t is not visible" in text
    empty = tmp_path / "empty.html"
    empty.write_text("<!doctype html><html><head></head><body><p>no tables</p></body></html>", encoding="utf-8")
    assert any("at least 1 leaderboard table" in e for e in check_page(empty).errors)
