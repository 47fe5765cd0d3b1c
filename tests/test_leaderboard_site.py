"""The site a newcomer gets (issue 59): the committed results as the front page, the runs they
trained one click away, each board labelled with its folder, run count and profile
(`leaderboard --front`, leaderboard/site.py); and `plan` / `status` saying which results folder
they read, pointing to the committed results when it holds nothing. The pages themselves are
checked in a browser by tests/test_browser_leaderboard.py."""

from __future__ import annotations

import html as html_mod
import re
from pathlib import Path

import pytest

from cli_main import run_cli
from lb_fixtures import NOW, write_run
from plcql_bench.leaderboard.site import YOUR_RUNS, build_boards, committed_hint, count_runs

pytestmark = pytest.mark.filterwarnings("ignore::FutureWarning")
FAST = {"now": NOW, "bootstrap_reps": 20, "poi_reps": 10}


def committed(root: Path) -> Path:
    """A stand-in for leaderboard/results: 2 algorithms x 3 seeds of profile paper."""
    for algo, base in (("plcql", 60.0), ("cfcql", 50.0)):
        for seed in range(3):
            write_run(root, algo, "mpe-cn", "expert", seed, base + seed)
    return root


def smoke(root: Path) -> Path:
    """What `make all` trains, in miniature: 2 runs of profile smoke."""
    for seed in range(2):
        write_run(root, "bc", "mpe-cn", "random", seed, 1.0 + seed, profile="smoke")
    return root


def words(html: str) -> str:
    """The text of some HTML, tags dropped, whitespace collapsed."""
    return " ".join(html_mod.unescape(re.sub(r"<[^>]+>", " ", html)).split())


def text(path: Path) -> str:
    return words(path.read_text(encoding="utf-8"))


def bar(page: Path) -> str:
    m = re.search(r'<nav class="boards".*?</nav>', page.read_text(encoding="utf-8"), re.S)
    assert m, f"{page}: no bar of boards"
    return m.group(0)


def test_front_page_is_the_committed_board_and_links_your_runs(tmp_path):
    site = build_boards(committed(tmp_path / "committed"), smoke(tmp_path / "results"), tmp_path / "site", **FAST)
    front, yours = tmp_path / "site" / "index.html", tmp_path / "site" / YOUR_RUNS / "index.html"
    assert site.front.index == front and site.yours.index == yours
    assert (site.front.n_runs, site.front.profiles, site.yours.n_runs, site.yours.profiles) == (6, ("paper",), 2, ("smoke",))
    front_bar, yours_bar = bar(front), bar(yours)
    # the front page: its own board is the current one, yours a link with its count and profile
    assert 'href="your-runs/index.html"' in front_bar and 'aria-current="page"' in front_bar
    t = words(front_bar)
    assert "Committed results (this page) 6 runs · profile paper" in t
    assert "Your runs 2 runs · profile smoke" in t and "smoke: Tiny datasets and 20 update rounds" in t
    # ... and the board of your runs links back, with the same labels
    assert 'href="../index.html"' in yours_bar and "Your runs" in yours_bar
    assert "PLCQL-bench: your runs" in text(yours) and "profile smoke use budgets other than the paper's" in text(yours)
    assert "6 runs in 2 cells" in text(front) and "2 runs in 1 cell" in text(yours)
    # the figure pages of each board carry the same bar; their own board links to its front page
    for page in (tmp_path / "site" / "curves.html", tmp_path / "site" / YOUR_RUNS / "par.html"):
        assert 'href="index.html"' in bar(page) and "(this board)" in bar(page)


def test_front_page_before_anything_was_trained(tmp_path):
    """No results folder of your own yet (a clean clone's `make board`): no second page, and the
    bar says how to get one."""
    site = build_boards(committed(tmp_path / "committed"), tmp_path / "results", tmp_path / "site", **FAST)
    assert site.yours is None and not (tmp_path / "site" / YOUR_RUNS).exists()
    t = text(tmp_path / "site" / "index.html")
    assert "Your runs no finished runs · " in words(bar(tmp_path / "site" / "index.html"))
    assert "make all trains the smoke matrix" in t and "your-runs/index.html" not in t


def test_one_folder_is_one_board(tmp_path):
    res = committed(tmp_path / "committed")
    site = build_boards(res, res, tmp_path / "site", **FAST)
    assert site.yours is None and '<nav class="boards"' not in (tmp_path / "site" / "index.html").read_text()


def test_front_page_weighs_less_than_its_figures(tmp_path):
    """The learning curves and PAR figures, most of a board's bytes, are on pages of their own:
    the front page has no curve, only links to them."""
    res = tmp_path / "r"
    for seed in range(3):
        write_run(res, "plcql", "mpe-cn", "expert", seed, 50.0 + seed, diag_n=3, collapse_to=3)
    build_boards(res, tmp_path / "none", tmp_path / "site", **FAST)
    front, curves, par = (tmp_path / "site" / f"{p}.html" for p in ("index", "curves", "par"))
    page = front.read_text()
    for name in ("curves", "par"):
        start = page.index(f'<section id="{name}">')
        sec = page[start:page.index("</section>", start)]
        assert f'<a href="{name}.html">' in sec and "<svg" not in sec, name
    assert curves.read_text().count("<svg") == 1 and par.read_text().count("<svg") == 1


# ------------------------------------------------------------------ the command line


@pytest.fixture()
def clone(tmp_path, monkeypatch) -> Path:
    """A working directory laid out like a clean clone: leaderboard/results holds the committed runs,
    results/ does not exist yet."""
    committed(tmp_path / "leaderboard" / "results")
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("PLCQL_RESULTS_DIR", raising=False)
    return tmp_path


def test_leaderboard_front_writes_both_boards(clone, monkeypatch, capsys):
    code, out, err = run_cli(monkeypatch, capsys, "leaderboard", "--front", "leaderboard/results", "--out", "site")
    assert code == 0, err
    assert "no runs in results/ yet: site/your-runs not written" in out and "site/index.html (6 runs from leaderboard/results)" in out
    t = words(bar(clone / "site" / "index.html"))
    assert "Committed results (this page) 6 runs · profile paper · leaderboard/results/" in t
    smoke(clone / "results")
    code, out, err = run_cli(monkeypatch, capsys, "leaderboard", "--front", "leaderboard/results", "--out", "site")
    assert code == 0, err
    assert "site/index.html (6 runs from leaderboard/results)" in out and "site/your-runs/index.html (2 runs from results)" in out
    assert 'href="your-runs/index.html"' in bar(clone / "site" / "index.html")


def test_leaderboard_front_user_errors(clone, monkeypatch, capsys):
    """A front folder that does not exist, or a results folder named on the command line that does
    not: one line naming it, exit 2, nothing written."""
    for args, named in ((("leaderboard", "--front", "nope", "--out", "site"), "nope (--front)"),
                        (("--results-dir", "typo", "leaderboard", "--front", "leaderboard/results", "--out", "site"), "typo"),
                        (("leaderboard", "--front", "leaderboard/results", "--results", "typo", "--out", "site"), "typo")):
        code, out, err = run_cli(monkeypatch, capsys, *args)
        lines = err.strip().splitlines()
        assert code == 2 and len(lines) == 1 and lines[0].startswith("error: results directory not found") and named in lines[0]
        assert "Traceback" not in err and not (clone / "site").exists()


def test_status_on_a_clean_clone_points_to_the_committed_results(clone, monkeypatch, capsys):
    code, out, err = run_cli(monkeypatch, capsys, "status")
    assert code == 0 and err == ""
    assert out.splitlines() == [
        "results: results/ (the default --results-dir)", "0 runs: none",
        "hint: results/ holds no runs; the committed results are in leaderboard/results/ (6 runs of profile paper): "
        "plcql-bench --results-dir leaderboard/results status"]
    code, out, _ = run_cli(monkeypatch, capsys, "--results-dir", "leaderboard/results", "status")
    assert code == 0 and "6 runs: done 6" in out and "results: leaderboard/results/ (--results-dir)" in out
    assert "hint" not in out
    (clone / "results").mkdir()  # an empty folder of your own: the same pointer
    code, out, _ = run_cli(monkeypatch, capsys, "status")
    assert code == 0 and out.splitlines()[-1].startswith("hint: results/ holds no runs; the committed results")


def test_plan_says_which_results_it_read(clone, monkeypatch, capsys):
    code, out, err = run_cli(monkeypatch, capsys, "plan", "--profile", "paper", "--no-cells", "--only", "algo=plcql,cfcql,task=mpe-cn,dataset=expert,seed=0,1,2")
    assert code == 0, err
    lines = out.splitlines()
    assert lines[0] == "results: results/ (the default --results-dir)"
    assert lines[1] == "plan (paper): 6 cells: done 0, partial 0, running 0, failed 0, todo 6"
    assert lines[2] == ("hint: results/ holds no runs of profile paper; the committed results are in leaderboard/results/ "
                        "(6 runs of profile paper): plcql-bench --results-dir leaderboard/results plan --profile paper")
    # the smoke profile's plan points to the profile the committed results hold
    code, out, _ = run_cli(monkeypatch, capsys, "plan", "--no-cells")
    assert code == 0 and out.splitlines()[2].endswith("plcql-bench --results-dir leaderboard/results plan --profile paper")


def test_plan_reading_the_committed_results_needs_no_hint(clone, monkeypatch, capsys):
    code, out, err = run_cli(monkeypatch, capsys, "--results-dir", "leaderboard/results", "plan", "--profile", "paper",
                             "--no-cells", "--only", "algo=plcql,cfcql,task=mpe-cn,dataset=expert,seed=0,1,2")
    assert code == 0, err
    # (the fixture's runs are not this code's run keys, so they count as todo: still no pointer to themselves)
    assert out.splitlines()[0] == "results: leaderboard/results/ (--results-dir)" and "hint" not in out


def test_committed_hint_and_count_runs(clone):
    assert count_runs(clone / "leaderboard" / "results") == 6 and count_runs(clone / "missing") == 0
    assert committed_hint(clone / "leaderboard" / "results", "status") is None  # it is the committed folder
    assert "(6 runs of profile paper)" in committed_hint(clone / "elsewhere", "status")
