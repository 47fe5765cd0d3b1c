"""Leaderboard rules: small-n statistics (bold, greying, n.s. marks, intervals, precision),
scoring views, verdicts against the paper, claims, loading and damage handling, --strict, and
the committed paper-budget results."""

from __future__ import annotations

import json
import re
import statistics
from html.parser import HTMLParser
from pathlib import Path

import sys

import pytest

from lb_fixtures import NOW, final_record, write_failed, write_run
from plcql_bench.leaderboard import build, cells, scoring, summary, tables
from plcql_bench.leaderboard.cells import Stats, cell_stats, format_mean_std, format_score, format_spread
from plcql_bench.leaderboard.paper import load_paper_results, paper_claims_check, paper_value
from plcql_bench.leaderboard.stats import best_in_row, t_interval, welch_p, welch_p_summary
from plcql_bench.suite.core.schema import RunRecord

pytestmark = pytest.mark.filterwarnings("ignore::FutureWarning")  # arch's RandomState deprecation
COMMITTED = Path(__file__).resolve().parents[1] / "leaderboard" / "results"
# the v1 generation's MPE runs (leaderboard/archive/datasets-v1/: rendered with their own cards and checks)
ARCHIVE_V1 = Path(__file__).resolve().parents[1] / "leaderboard" / "archive" / "datasets-v1" / "results"


def build_quick(res, out, **kw):
    kw.setdefault("bootstrap_reps", 50)
    kw.setdefault("poi_reps", 20)
    return build.build(res, out, now=NOW, **kw)


class Board(HTMLParser):
    """table id -> {row id: {column id: {"text", "bold", "class"}}}, from data-row / data-col."""

    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.tables: dict[str, dict] = {}
        self._t = self._row = self._cell = None
        self._depth = 0

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if tag == "table" and "board" in (a.get("class") or ""):
            self._t = self.tables.setdefault(a["id"], {})
        elif self._t is not None and tag == "tr" and a.get("data-row"):
            self._row = self._t.setdefault(a["data-row"], {})
        elif self._row is not None and tag == "td" and a.get("data-col"):
            self._cell = self._row.setdefault(a["data-col"], {"text": "", "bold": False, "class": a.get("class", "")})
            self._depth = 0
        elif self._cell is not None:
            self._cell["text"] += " "  # block-level spans render on their own line
            if tag == "strong":
                self._cell["bold"] = True
            if tag == "td":
                self._depth += 1

    def handle_endtag(self, tag):
        if tag == "td" and self._cell is not None:
            self._cell["text"] = " ".join(self._cell["text"].split())
            self._cell = None
        elif tag == "tr":
            self._row = None
        elif tag == "table":
            self._t = None

    def handle_data(self, data):
        if self._cell is not None:
            self._cell["text"] += data


def board(html: str) -> dict:
    p = Board()
    p.feed(html)
    return p.tables


# ------------------------------------------------------------------ numbers and formatting


def test_t_interval_and_stats_match_scipy():
    from scipy import stats as sps

    vals = [43.78, 61.24, 53.04]
    lo, hi = t_interval(vals)
    ref = sps.t.interval(0.95, 2, loc=statistics.fmean(vals), scale=sps.sem(vals))
    assert (lo, hi) == pytest.approx(ref)
    s = cell_stats(vals)
    assert (s.n, s.mean, s.std) == (3, pytest.approx(statistics.fmean(vals)), pytest.approx(statistics.stdev(vals)))
    one = cell_stats([63.8])
    assert one.std is None and one.ci is None  # a single seed has no spread and no interval
    assert t_interval([1.0]) is None


def test_precision_and_single_seed_text():
    assert format_spread(0.03, "normalised") == "< 0.05"
    assert format_spread(0.004, "win_rate") == "< 0.005"
    assert format_spread(0.0, "normalised") == "0.0"  # identical seeds: an exact zero
    assert format_mean_std(14.3, 0.03, "normalised") == "14.3 \u00b1 < 0.05"
    assert format_mean_std(63.8, None, "normalised") == "63.8"
    assert format_score(-0.01, "normalised") == "0.0" and format_score(0.456, "win_rate") == "0.46"


def _stats(*groups):
    return [cell_stats(g) for g in groups]


def test_n1_cell_is_never_bold_and_leaves_others_untested():
    # The case: "63.8 ± 0.0, single seed" bold over 56.0 ± 11.0 (n = 3).
    marks = tables.mark_group(_stats([63.8], [45.0, 56.0, 67.0]), [True, True])
    assert not any(m.bold for m in marks)  # one eligible cell only: no bold at all
    marks = tables.mark_group(_stats([63.8], [45.0, 56.0, 67.0], [40.0, 41.0, 42.0]), [True, True, True])
    assert [m.bold for m in marks] == [False, True, False]
    assert marks[0].p is None and not marks[0].ns  # n = 1: not tested
    assert marks[2].p == pytest.approx(welch_p([40.0, 41.0, 42.0], [45.0, 56.0, 67.0]))


def test_n2_cells_are_grey_and_never_bold():
    marks = tables.mark_group(_stats([90.0, 91.0], [50.0, 51.0, 52.0], [40.0, 41.0, 42.0]), [True] * 3)
    assert [m.bold for m in marks] == [False, True, False]  # the n = 2 cell has the highest mean


def test_single_algorithm_row_is_never_bold():
    assert tables.mark_group(_stats([50.0, 51.0, 52.0]), [True]) == [tables.Mark()]
    # two algorithms, but one from another profile (not compared): still one comparable cell
    assert not any(m.bold for m in tables.mark_group(_stats([50.0, 51.0, 52.0], [60.0, 61.0, 62.0]), [True, False]))


def test_not_significantly_different_uses_welch():
    best, other, far = [80.0, 85.0, 90.0], [78.0, 84.0, 86.0], [50.0, 52.0, 51.0]
    marks = tables.mark_group(_stats(best, other, far), [True] * 3)
    assert marks[0].bold and marks[1].ns and not marks[2].ns
    assert marks[1].p == pytest.approx(welch_p(other, best)) and marks[1].p >= 0.05 > marks[2].p


# ------------------------------------------------------------------ scoring views


def test_scoring_views_from_the_result_file():
    curve = [{"update": u, "return_mean": 100.0 + u, "score": float(u)} for u in range(0, 130, 10)]  # 13 points
    rec = RunRecord.from_json(final_record("plcql", "mpe-cn", "medium", 0, 42.0, curve=curve))
    v = scoring.run_values(rec)
    assert v["final-ours"] == 42.0
    assert v["last10-ours"] == pytest.approx(statistics.fmean(range(30, 130, 10)))
    assert v["best-ours"] == 120.0
    expert, random = 516.8, 159.8  # OMAR's CN references
    assert v["final-omar"] == pytest.approx(100 * (42.0 - random) / (expert - random))
    assert v["best-omar"] == pytest.approx(100 * (220.0 - random) / (expert - random))
    assert v["last10-omar"] == pytest.approx(statistics.fmean(100 * (100.0 + u - random) / (expert - random) for u in range(30, 130, 10)))


def test_win_rate_views_are_not_normalised_and_missing_curves_give_none():
    rec = RunRecord.from_json(final_record("bc", "smax-2s3z", "medium", 0, 0.5,
                                                                     curve=[{"update": 0, "return_mean": 1.0, "score": 0.25}]))
    v = scoring.run_values(rec)
    assert v["final-ours"] == v["final-omar"] == 0.5 and v["best-omar"] == v["best-ours"] == 0.25
    bare = RunRecord.from_json(final_record("bc", "mpe-zz", "medium", 0, 5.0, curve=[]))
    v = scoring.run_values(bare)
    assert v["last10-ours"] is None and v["final-omar"] is None  # no curve; no OMAR reference for the task


# ------------------------------------------------------------------ verdicts and claims


def test_verdicts_against_the_paper():
    assert summary.verdict([50.0, 52.0, 54.0], 52.0, 52.2, 9.6, False)[0] == "reproduced"
    v, p = summary.verdict([43.78, 61.24, 53.04], 52.69, 95.4, 6.1, False)
    assert v == "below" and p == pytest.approx(welch_p_summary([43.78, 61.24, 53.04], 95.4, 6.1, 5)) and p < 0.05
    assert summary.verdict([33.41, 49.46, 43.76], 42.21, 52.2, 9.6, False)[0] == "not distinguishable"
    assert summary.verdict([120.0, 121.0, 122.0], 121.0, 95.4, 6.1, False)[0] == "above"
    assert summary.verdict([50.0, 52.0], 51.0, 52.2, 9.6, False)[0] == "too few seeds"
    assert summary.verdict([0.5, 0.6, 0.7], 0.6, 0.51, 0.19, True)[0] == "not comparable"
    assert summary.verdict([1.0, 2.0, 3.0], 2.0, None, None, False)[0] == "not reported"


def test_paper_claims_recounted_from_its_own_table():
    c = paper_claims_check(load_paper_results())
    assert (c["rows"], c["beats"], c["ties"], c["best"]) == (32, 26, 2, 21)
    assert c["claims"]["beats"]["pct"] == 84 and c["claims"]["best"]["pct"] == 66


def test_claims_only_on_rows_where_every_algorithm_has_3_seeds(tmp_path):
    res = tmp_path / "r"
    for seed, (p, s, c) in enumerate([(90.0, 70.0, 60.0), (92.0, 72.0, 61.0), (94.0, 71.0, 62.0)]):
        write_run(res, "plcql", "mpe-cn", "medium", seed, p)
        write_run(res, "spacql", "mpe-cn", "medium", seed, s)
        write_run(res, "cfcql", "mpe-cn", "medium", seed, c)
        write_run(res, "bc", "mpe-cn", "medium", seed, 150.0 + seed)  # not a column of the paper's MPE table
        write_run(res, "plcql", "mpe-pp", "medium", seed, p - 40.0)  # a row against both claims: SPaCQL best
        write_run(res, "spacql", "mpe-pp", "medium", seed, s)
        write_run(res, "cfcql", "mpe-pp", "medium", seed, c)
    for seed in range(3):
        write_run(res, "plcql", "mpe-cn", "expert", seed, 100.0 + seed)
    write_run(res, "spacql", "mpe-cn", "expert", 0, 120.0)  # n = 1: this row is left out
    html = build_quick(res, tmp_path / "s").index.read_text()
    claims = {r["view"]: r for r in json.loads((tmp_path / "s" / "tables" / "claims.json").read_text())["rows"]}
    c = claims["final-ours"]
    assert (c["rows_with_target"], c["eligible"], c["best"], c["best_sig"], c["below_best_sig"]) == (3, 2, 1, 1, 1)
    assert (c["beats"], c["beats_sig"], c["behind"], c["behind_sig"], c["beats_of"]) == (1, 1, 1, 1, 2)
    assert "significantly below the row's best on 1" in html and "behind SPaCQL on 1, significantly on 1" in html
    assert "SPaCQL n=1" in c["excluded"] and "BC" not in c["algos"]
    assert "26 of 32 strictly better (81%), 2 ties" in html and "the stated 84% does not follow from the table" in html


# ------------------------------------------------------------------ the rendered rules


@pytest.fixture(scope="module")
def small_n_site(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("smalln")
    res = tmp / "results"
    for seed, s in enumerate([45.0, 56.0, 67.0]):
        write_run(res, "cfcql", "mpe-cn", "random", seed, s)
    write_run(res, "bc", "mpe-cn", "random", 0, 63.8)  # n = 1, highest mean
    for seed, s in enumerate([14.30, 14.33, 14.27]):
        write_run(res, "bc", "mpe-cn", "medium-replay", seed, s)  # a single algorithm in its row
    for seed, s in enumerate([70.0, 72.0]):
        write_run(res, "plcql", "mpe-cn", "random", seed, s, commit="f" * 40 + "-dirty")  # n = 2, dirty
    built = build_quick(res, tmp / "site")
    html = built.index.read_text()
    return {"html": html, "board": board(html), "out": tmp / "site"}


def test_page_n1_and_n2_cells_grey_never_bold(small_n_site):
    row = small_n_site["board"]["table-main-final-ours"]["main-mpe-cn-random"]
    assert not row["bc"]["bold"] and "grey" in row["bc"]["class"] and "63.8 single seed" in row["bc"]["text"]
    assert not row["plcql"]["bold"] and "grey" in row["plcql"]["class"] and "n < 3" in row["plcql"]["text"]
    assert not row["cfcql"]["bold"]  # the only n >= 3 cell in the row: nothing to be best against
    assert "n.s." not in row["cfcql"]["text"]


def test_page_single_algorithm_row_not_bold_and_precision(small_n_site):
    cell = small_n_site["board"]["table-main-final-ours"]["main-mpe-cn-medium-replay"]["bc"]
    assert not cell["bold"] and cell["text"].startswith("14.3 ± < 0.05")


def test_page_intervals_and_dirty_flag(small_n_site):
    cell = small_n_site["board"]["table-main-final-ours"]["main-mpe-cn-random"]["cfcql"]
    lo, hi = t_interval([45.0, 56.0, 67.0])
    assert f"[{lo:.1f}, {hi:.1f}]" in cell["text"]
    plcql = small_n_site["board"]["table-main-final-ours"]["main-mpe-cn-random"]["plcql"]
    assert "dirty 2/2" in plcql["text"]
    assert "2 of 9 runs were trained from a working tree with uncommitted changes" in " ".join(small_n_site["html"].split())


def test_every_view_is_rendered_and_selectable(small_n_site):
    ids = set(small_n_site["board"])
    for v in scoring.VIEWS:
        assert f"table-main-{v.key}" in ids and f"table-ablation-{v.key}" in ids
        assert f'class="view v-{v.key}"' in small_n_site["html"]
    for ctl in ("sc-final", "sc-last10", "sc-best", "nm-ours", "nm-omar", "hide-empty", "show-paper"):
        assert f'id="{ctl}"' in small_n_site["html"]
    assert re.search(r'id="sc-final"\s+checked', small_n_site["html"]) and re.search(r'id="nm-omar"\s+checked', small_n_site["html"])
    best = small_n_site["board"]["table-main-best-ours"]["main-mpe-cn-random"]["cfcql"]["text"]
    final = small_n_site["board"]["table-main-final-ours"]["main-mpe-cn-random"]["cfcql"]["text"]
    assert best.startswith("56.0") and final.startswith("56.0")  # curve_for ends at the final score
    omar = small_n_site["board"]["table-main-final-omar"]["main-mpe-cn-random"]["cfcql"]["text"]
    assert omar.startswith(format_score(statistics.fmean(100 * (s - 159.8) / (516.8 - 159.8) for s in (45.0, 56.0, 67.0)), "normalised"))


def test_never_run_columns_marked_for_the_toggle(small_n_site):
    row = small_n_site["board"]["table-main-final-ours"]["main-mpe-cn-random"]
    assert "col-empty" in row["omar"]["class"] and "col-empty" not in row["cfcql"]["class"]
    assert "col-target" in row["plcql"]["class"]
    assert "#hide-empty:checked ~ main .col-empty { display: none; }" in small_n_site["html"]


def test_every_n_link_reaches_its_runs(small_n_site):
    html = small_n_site["html"]
    targets = set(re.findall(r'href="#([^"]+)"', html))
    ids = set(re.findall(r'id="([^"]+)"', html))
    assert targets <= ids, targets - ids
    assert any(t.startswith("cell-paper-cfcql-mpe-cn-random") for t in targets)


# ------------------------------------------------------------------ loading, damage, strict


def test_bad_files_are_skipped_listed_and_bannered(tmp_path):
    res = tmp_path / "r"
    for seed in range(3):
        write_run(res, "cfcql", "mpe-cn", "random", seed, 50.0 + seed)
    bad = write_run(res, "cfcql", "mpe-cn", "random", 3, 60.0)
    (bad / "final.json").write_text((bad / "final.json").read_text()[:150])  # truncated
    big = write_run(res, "cfcql", "mpe-cn", "random", 4, 2.07)
    raw = json.loads((big / "final.json").read_text())
    raw["score"] = 1e9  # final_eval still says 2.07
    (big / "final.json").write_text(json.dumps(raw))
    write_failed(res, "plcql", "mpe-cn", "random", 0, "RuntimeError: boom")
    write_failed(res, "plcql", "mpe-cn", "random", 1, "", status='{"status": "fai')  # malformed status.json
    built = build_quick(res, tmp_path / "s")
    reasons = {s.path.split("/")[-2].split("-")[0]: s.reason for s in built.skipped}
    assert "invalid JSON" in reasons["seed3"] and "differs from final_eval" in reasons["seed4"]
    assert "status.json unreadable" in reasons["seed1"]
    assert built.n_runs == 3
    html = " ".join(built.index.read_text().split())
    assert f"{len(built.skipped)} result files skipped" in html
    cell = board(built.index.read_text())["table-main-final-ours"]["main-mpe-cn-random"]["plcql"]
    assert cell["text"].startswith("— failed") and "missing-failed" in cell["class"]
    assert "RuntimeError: boom" in html and "status.json unreadable" in html  # the failed run does not disappear


def test_run_key_and_directory_mismatch_rejected(tmp_path):
    res = tmp_path / "r"
    d = write_run(res, "plcql", "mpe-cn", "expert", 0, 50.0)
    raw = json.loads((d / "final.json").read_text())
    raw["config"]["lr"] = 1.0  # edited content, stale key
    (d / "final.json").write_text(json.dumps(raw))
    d2 = write_run(res, "plcql", "mpe-cn", "expert", 1, 51.0)
    other = d2.parent / "seed1-0000000000"
    d2.rename(other)  # right content, wrong directory
    built = build_quick(res, tmp_path / "s")
    reasons = sorted(s.reason for s in built.skipped)
    assert built.n_runs == 0 and len(reasons) == 2
    assert any("is not the hash of the record's identity" in r for r in reasons)
    assert any("does not match its directory seed1-0000000000" in r for r in reasons)


def test_duplicates_older_builds_and_card_mismatch(tmp_path):
    res = tmp_path / "r"
    write_run(res, "bc", "mpe-cn", "expert", 0, 10.0, commit="a" * 40)
    dup = write_run(res, "bc", "mpe-cn", "expert", 0, 20.0, commit="a" * 40, updates=120)  # same seed, other key
    raw = json.loads((dup / "final.json").read_text())
    raw["finished_at"] = "2026-11-26T00:00:00+00:00"
    (dup / "final.json").write_text(json.dumps(raw))
    write_run(res, "bc", "mpe-cn", "random", 0, 5.0, sha="cd" * 32, **{"finished_at": "2026-11-20T00:00:00+00:00"})
    write_run(res, "bc", "mpe-cn", "random", 1, 6.0, sha="ef" * 32)
    cards = tmp_path / "cards" / "paper" / "mpe-cn"
    cards.mkdir(parents=True)
    (cards / "medium.json").write_text(json.dumps({"sha256": "12" * 32, "task_id": "mpe-cn", "quality": "medium", "profile": "paper",
                                                   "ref_return_random": 0.0, "ref_return_expert": 200.0}))
    write_run(res, "bc", "mpe-cn", "medium", 0, 30.0, sha="12" * 32)  # return 30 on [0, 200] is 15, not 30
    built = build_quick(res, tmp_path / "s", cards_root=tmp_path / "cards")
    reasons = " | ".join(s.reason for s in built.skipped)
    assert "duplicate of seed 0" in reasons and "older build of mpe-cn/random" in reasons
    assert "does not follow from final_eval.return_mean 30 and the dataset card's reference returns (15)" in reasons
    assert built.n_runs == 2


def test_a_cell_never_mixes_two_configs(tmp_path):
    """Seeds trained before a default changed are skipped once a run under the new config finishes; a
    key-neutral field at its neutral value equals its absence (runs recorded before the field existed)."""
    res = tmp_path / "r"
    old = {"lr": 0.01, "grad_clip": 0.5}
    write_run(res, "cfcql", "mpe-cn", "expert", 0, 40.0, config=old, finished_at="2026-11-20T00:00:00+00:00")
    write_run(res, "cfcql", "mpe-cn", "expert", 1, 41.0, config={**old, "critic_clip": "joint"},
              finished_at="2026-11-21T00:00:00+00:00")  # neutral value: the same config as seed 0's
    write_run(res, "cfcql", "mpe-cn", "medium", 0, 30.0, config=old, finished_at="2026-11-20T00:00:00+00:00")
    write_run(res, "cfcql", "mpe-cn", "medium", 1, 31.0, config={**old, "critic_clip": "per-member"},
              finished_at="2026-11-22T00:00:00+00:00")
    built = build_quick(res, tmp_path / "s")
    reasons = [s.reason for s in built.skipped]
    assert built.n_runs == 3 and len(reasons) == 1, reasons
    assert "older config of cfcql (critic_clip 'joint' -> 'per-member'" in reasons[0]
    assert "cfcql/mpe-cn/medium/seed1-" in reasons[0]
    assert "medium/seed0-" in built.skipped[0].path


def test_archives_beside_the_results_are_named_and_never_counted(tmp_path):
    res = tmp_path / "results"
    write_run(res, "cfcql", "mpe-cn", "expert", 0, 40.0)
    old = tmp_path / "archive" / "old-clip"
    write_run(old, "cfcql", "mpe-cn", "expert", 1, 99.0)
    write_run(old, "cfcql", "mpe-cn", "expert", 2, 98.0)
    (old / "README.md").write_text("# Runs under the old clip\n\nWhy they left.\n")
    (tmp_path / "archive" / "no-readme").mkdir()  # not an archive: nothing says why
    checks = tmp_path / "archive" / "old-checks"
    (checks / "paper" / "omar" / "mpe-cn" / "expert").mkdir(parents=True)
    for seed in (0, 1):  # official-code check files (suite/core/official.py), no runs
        (checks / "paper" / "omar" / "mpe-cn" / "expert" / f"seed{seed}.json").write_text("{}")
    (checks / "README.md").write_text("# Checks run the old way\n")
    built = build_quick(res, tmp_path / "s")
    text = " ".join(built.index.read_text().split())
    assert built.n_runs == 1
    assert f'<code>{tmp_path.name}/archive/old-clip/</code> (2 runs: Runs under the old clip)' in text
    assert f'<code>{tmp_path.name}/archive/old-checks/</code> (2 official-code checks: Checks run the old way)' in text
    assert "no-readme" not in text
    assert "99.0" not in text  # no number comes from the archive
    quiet = build_quick(old, tmp_path / "s2")  # an archive itself has no archive beside it
    assert "archives-banner" not in quiet.index.read_text()


def _main(monkeypatch, *args) -> int:
    """The real entry point (user errors -> one line on stderr, exit status 2), in process."""
    from plcql_bench.suite.commands.main import main

    monkeypatch.setattr(sys, "argv", ["plcql-bench", *args])
    try:
        main()
    except SystemExit as exc:
        return int(exc.code)
    return 0


def test_cli_strict_exit_codes(tmp_path, monkeypatch, capsys):
    res = tmp_path / "r"
    write_run(res, "bc", "mpe-cn", "expert", 0, 10.0)
    assert _main(monkeypatch, "leaderboard", "--results", str(res), "--out", str(tmp_path / "s"), "--strict") == 0
    d = write_run(res, "bc", "mpe-cn", "expert", 1, 11.0)
    (d / "final.json").write_text("{")
    capsys.readouterr()
    assert _main(monkeypatch, "leaderboard", "--results", str(res), "--out", str(tmp_path / "s")) == 0
    assert "1 result file(s) skipped" in capsys.readouterr().out
    assert _main(monkeypatch, "leaderboard", "--results", str(res), "--out", str(tmp_path / "s2"), "--strict") == 2
    err = capsys.readouterr().err
    assert "error: 1 result file skipped (--strict); first: " in err and "invalid JSON" in err
    assert err.count("skipped ") == 2  # one line per file, then the error line
    assert (tmp_path / "s2" / "index.html").is_file()  # the site is still written
    assert _main(monkeypatch, "leaderboard", "--results", str(tmp_path / "nope"), "--out", str(tmp_path / "s3")) == 2
    assert "results directory not found" in capsys.readouterr().err


# ------------------------------------------------------------------ the committed paper-budget results


@pytest.fixture(scope="module")
def committed(tmp_path_factory):
    """The archived v1 generation's board: the committed MPE runs these tests read (the current results start
    again on the v2 tiers)."""
    out = tmp_path_factory.mktemp("committed")
    built = build_quick(ARCHIVE_V1, out)
    return {"built": built, "html": built.index.read_text(), "out": out}


def _committed_finals(root: Path = ARCHIVE_V1) -> list[dict]:
    return [json.loads(f.read_text()) for f in sorted(root.rglob("final.json"))]


VERDICTS = {"reproduced", "below", "above", "not distinguishable", "too few seeds", "not comparable"}


def test_committed_results_build_strict(tmp_path):
    """Whatever is committed builds without a skipped file, with a verdict of the known kinds for every cell."""
    built = build_quick(COMMITTED, tmp_path / "site")
    assert built.skipped == [] and built.n_runs == len(_committed_finals(COMMITTED))
    rows = json.loads((tmp_path / "site" / "tables" / "comparisons.json").read_text())["rows"]
    assert {c["verdict"] for c in rows} <= VERDICTS


def test_committed_results_build_strict_and_state_the_finding(committed):
    """The archived v1 runs build without a skipped file, and the comparison table gives a verdict for
    every cell the paper has a number for (CFCQL on CN random: reproduced)."""
    assert committed["built"].skipped == [] and committed["built"].n_runs == len(_committed_finals())
    comps = {(c["task"], c["dataset"], c["algo"]): c for c in json.loads((committed["out"] / "tables" / "comparisons.json").read_text())["rows"]
             if c["view"] == "final-ours"}
    assert comps[("mpe-cn", "random", "cfcql")]["verdict"] == "reproduced"
    assert {c["verdict"] for c in comps.values()} <= VERDICTS


def test_the_finding_is_stated_for_plcql_below_the_paper(tmp_path):
    """The retired PLCQL runs' scores (CN medium-replay 43.8 / 61.2 / 53.0 against the paper's 95.4 ± 6.1):
    verdict "below", and the summary says so with both means."""
    root = tmp_path / "res"
    for seed, score in enumerate((43.8, 61.2, 53.0)):
        write_run(root, "plcql", "mpe-cn", "medium-replay", seed, score)
    out = tmp_path / "site"
    built = build_quick(root, out)
    comps = {(c["task"], c["dataset"], c["algo"]): c for c in json.loads((out / "tables" / "comparisons.json").read_text())["rows"]
             if c["view"] == "final-ours"}
    assert comps[("mpe-cn", "medium-replay", "plcql")]["verdict"] == "below"
    text = " ".join(built.index.read_text().split())
    assert "PLCQL: below on 1 of 1 cell compared with the paper" in text and "52.7 vs 95.4" in text


def test_committed_results_context(committed):
    html = committed["html"]
    finals = _committed_finals()
    assert "2,001 rounds · final eval 100 ep" in html and "6,001 rounds · final eval 100 ep" in html
    dirty = sum(str(r.get("git_commit", "")).endswith("-dirty") for r in finals)
    if dirty:
        assert f"{dirty} of {len(finals)} runs were trained from a working tree with uncommitted changes" in " ".join(html.split())
    assert 'id="card-paper-mpe-cn-random"' in html  # the committed cards, not a local manifest
    assert "hash mismatch" not in html
    assert "0.959 [0.942, 0.970]" in html and "2026-11-26" in html  # bench-speed's paired measurement
    footer = html[html.index('<footer id="provenance">'):]
    assert "episode_limit" not in footer.split("Environment settings")[0]  # not a package version
    assert "<code>mpe-cn</code>: episode_limit 25" in footer


def test_paper_values_unchanged():
    paper = load_paper_results()
    assert paper_value(paper, "mpe-cn", "medium-replay", "spacql").mean == 71.9
    assert paper_value(paper, "smax-3s_vs_5z", "mixed", "cfcql").sc2 is True
    assert paper_value(paper, "smac-5m-vs-6m", "expert", "bc").mean == 0.82
    assert paper_value(paper, "mpe-cn", "expert", "nosuchalgo") is None
    assert paper_value(paper, "mpe-foo", "expert", "plcql") is None
    n = sum(len(c) for key in ("main_results", "starcraft_results") for t in paper["tables"][key]["rows"].values() for c in t.values())
    assert n == 16 * 8 + 16 * 10


def test_best_in_row_and_cells_helpers():
    assert best_in_row([1.0, 3.0, 3.0]) == [1, 2]
    assert best_in_row([5.0, 3.0], eligible=[False, True]) == [1]
    assert isinstance(cells.cell_stats([]), Stats) and cells.cell_stats([]).mean is None


def test_footer_states_the_compute_behind_the_board(tmp_path):
    """Per kind of machine, the runs and the hours of training they recorded (a resumed run whole), summed; a run without a
    hardware record is counted as unrecorded, not dropped."""
    root = tmp_path / "res"
    cpu = {"cpu": "AMD EPYC", "cpu_count": 2, "device": "cpu", "torch_threads": 1}
    gpu = {"cpu": "Xeon", "cpu_count": 16, "device": "cuda:0", "gpu": "NVIDIA H100 80GB HBM3", "torch_threads": 1}
    half_hour = {"updates": 110, "wall_clock_s": 1800.0, "train_s": 1700.0, "updates_per_s": 0.06}
    resumed = {"updates": 110, "wall_clock_s": 600.0, "train_s": 3600.0, "updates_per_s": 0.03}  # last session 10 min
    for seed in range(2):
        write_run(root, "cfcql", "mpe-cn", "expert", seed, 90.0, hardware=cpu, train=half_hour)
    write_run(root, "cfcql", "mpe-cn", "expert", 2, 90.0, hardware=cpu, train=resumed)
    write_run(root, "cfcql", "mpe-cn", "medium", 0, 50.0, hardware=gpu)
    write_run(root, "bc", "mpe-cn", "medium", 0, 40.0)
    built = build_quick(root, tmp_path / "site")
    footer = " ".join(built.index.read_text().split())
    footer = footer[footer.index('<footer id="provenance">'):]
    assert "CPU AMD EPYC, 2 cores, 1 torch thread(s) per run: 3 runs, 2.0 run-hours" in footer  # 0.5 + 0.5 + 1
    assert "GPU NVIDIA H100 80GB HBM3: 1 run," in footer and "unrecorded: 1 run," in footer
    assert footer.index("CPU AMD EPYC") < footer.index("GPU NVIDIA")  # most hours first


def _td_history(early: float, late: float, n: int = 50, spike_at: int | None = None) -> str:
    rows = []
    for i in range(n):
        td = early if i < n // 2 else late
        if i == spike_at:
            td = late * 1e6
        rows.append(json.dumps({"update": 10 * i, "train/critic/td_loss": td}))
    return "\n".join(rows) + "\n"


def test_a_diverged_critic_is_flagged_on_the_board(tmp_path):
    """A TD loss 1,000x its early median over the last 20 % of training marks the run (warning, cell badge,
    banner); 10x does not, nor does one spike, nor a run without a TD loss."""
    from plcql_bench.leaderboard.load import critic_divergence

    root = tmp_path / "res"
    write_run(root, "cfcql", "mpe-cn", "medium-replay", 0, 10.0, metrics=_td_history(50.0, 5e4))
    write_run(root, "cfcql", "mpe-cn", "medium-replay", 1, 45.0, metrics=_td_history(50.0, 500.0))
    write_run(root, "cfcql", "mpe-cn", "medium-replay", 2, 44.0, metrics=_td_history(50.0, 60.0, spike_at=48))
    write_run(root, "bc", "mpe-cn", "medium-replay", 0, 14.0, metrics=_td_history(0.0, 0.0)[:0])
    assert critic_divergence([json.loads(x) for x in _td_history(50.0, 5e4).splitlines()])["ratio"] == 1000.0
    assert critic_divergence([json.loads(x) for x in _td_history(50.0, 500.0).splitlines()]) is None
    assert critic_divergence([{"train/critic/td_loss": 1.0}] * 9) is None  # too short to judge
    built = build_quick(root, tmp_path / "site")
    text = " ".join(built.index.read_text().split())
    assert "1 run had a diverged critic" in text
    assert "critic diverged 1/3" in text
    assert "critic diverged: TD loss 5e+04 over the last 20% of training, 1000x its early 50" in text


def test_a_critic_that_ran_away_and_came_partly_back_is_flagged(tmp_path):
    """A stretch of TD loss 10,000x its early median in mid-training marks the run even when it ends only 40x
    above (under the "ended" rule's 100x); two consecutive spikes do not, nor does a stretch 1,000x up."""
    from plcql_bench.leaderboard.load import critic_divergence

    def history(excursion: float, length: int) -> list[dict]:
        td = [50.0] * 20 + [50.0 * excursion] * length + [2000.0] * (30 - length)
        return [{"update": 10 * i, "train/critic/td_loss": v} for i, v in enumerate(td)]

    info = critic_divergence(history(1e4, 10))
    assert info["rule"] == "peaked" and info["peak_ratio"] == 1e4 and info["ratio"] == 40.0
    assert info["peak_update"] == 200  # the first 5-point window with a high median: points 18-22, centred on 20
    assert critic_divergence(history(1e4, 2)) is None  # two spikes: every 5-point median stays low
    assert critic_divergence(history(1e3, 10)) is None  # 1,000x during training, 40x at the end: not flagged

    root = tmp_path / "res"
    metrics = "".join(json.dumps(r) + "\n" for r in history(1e4, 10))
    write_run(root, "plcql", "mpe-cn", "medium", 2, 23.7, metrics=metrics)
    text = " ".join(build_quick(root, tmp_path / "site").index.read_text().split())
    assert "critic diverged during training: TD loss 5e+05 around round 200" in text
    assert "10000x its early 50; 40x at the end" in text
    assert "1 run had a diverged critic" in text
