"""Leaderboard: statistics, aggregation and the rendered page, from fixture result files."""

from __future__ import annotations

import csv
import json
import math
import re
import statistics
from datetime import datetime, timezone
from html.parser import HTMLParser
from pathlib import Path

import pytest

from plcql_bench.leaderboard import build
from plcql_bench.leaderboard.build import format_score, load_paper_results, paper_value
from plcql_bench.leaderboard.stats import best_in_row, cell_stats

NOW = datetime(2026, 11, 26, 12, 0, 0, tzinfo=timezone.utc)
MAIN_COLUMNS = ["OMAR", "MACQL", "IQL", "MA-TD3+BC", "DoF", "CFCQL", "SPaCQL", "PLCQL"]


def build_site(*args, **kw):
    """The real builder with fewer bootstrap replicates, to keep the tests fast."""
    kw.setdefault("bootstrap_reps", 100)
    kw.setdefault("poi_reps", 50)
    return build.build_site(*args, **kw)


# ------------------------------------------------------------------ helpers


def result(**over) -> dict:
    base = {
        "schema_version": 1,
        "protocol_version": 1,
        "run_key": "k",
        "algo": "plcql",
        "task": "mpe-cn",
        "domain": "mpe",
        "dataset": "expert",
        "seed": 0,
        "profile": "smoke",
        "status": "done",
        "dataset_sha256": "a" * 64,
        "config": {"lr": 3e-4},
        "score_name": "normalised",
        "score": 50.0,
        "final_eval": {"episodes": 10, "return_mean": 1.0, "return_std": 0.1, "win_rate": None},
        "curve": [],
        "train": {"updates": 20, "wall_clock_s": 3.1},
        "versions": {"plcql_bench": "0.1.0", "torch": "2.13.0", "mpe2": "1.1.1"},
        "git_commit": "0123456789abcdef0123",
        "finished_at": "2026-11-25T23:10:00Z",
    }
    base.update(over)
    return base


def write(root: Path, rel: str, payload) -> Path:
    path = root / rel / "final.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(payload if isinstance(payload, str) else json.dumps(payload), encoding="utf-8")
    return path


class BoardParser(HTMLParser):
    """Collects every table.board as {(task, tier): {column label: cell text}} plus which
    cells contain a <strong>, and the text of each <section id=...>."""

    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.tables: list[dict] = []
        self.sections: dict[str, str] = {}
        self._section: str | None = None
        self._in_board = False
        self._headers: list[str] = []
        self._row: list[list] = []  # [text, has_strong]
        self._cell = None
        self._in_thead = False

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if tag == "section" and a.get("id"):
            self._section = a["id"]
            self.sections.setdefault(self._section, "")
        if tag == "table" and "board" in (a.get("class") or ""):
            self._in_board = True
            self.tables.append({"rows": {}, "bold": {}})
            self._headers = []
        if not self._in_board:
            return
        if tag == "thead":
            self._in_thead = True
        elif tag == "tr":
            self._row = []
        elif tag in ("td", "th"):
            self._cell = ["", False]
        elif tag == "strong" and self._cell is not None:
            self._cell[1] = True

    def handle_endtag(self, tag):
        if tag == "section":
            self._section = None
        if not self._in_board:
            return
        if tag == "table":
            self._in_board = False
        elif tag == "thead":
            self._in_thead = False
        elif tag in ("td", "th") and self._cell is not None:
            self._row.append(self._cell)
            self._cell = None
        elif tag == "tr":
            if self._in_thead:
                self._headers = [" ".join(c[0].split()) for c in self._row]
            else:
                task = self._row[0][0].split("paper row")[0].strip()
                tier = self._row[1][0].strip()
                cols = self._headers[2:]
                cells = self._row[2:]
                self.tables[-1]["rows"][(task, tier)] = {h: " ".join(c[0].split()) for h, c in zip(cols, cells)}
                self.tables[-1]["bold"][(task, tier)] = {h: c[1] for h, c in zip(cols, cells)}

    def handle_data(self, data):
        if self._section:
            self.sections[self._section] += data
        if self._cell is not None:
            self._cell[0] += data


def parse(html: str) -> BoardParser:
    p = BoardParser()
    p.feed(html)
    return p


def fmt(values: list[float], decimals: int = 1) -> str:
    mean = statistics.fmean(values)
    std = statistics.stdev(values) if len(values) > 1 else 0.0
    return f"{mean:.{decimals}f} ± {std:.{decimals}f}"


# Main fixture: 2 algos x 2 tiers x 2 seeds, a partial bc cell (n=1), a corrupt file, a failed run.
SCORES = {
    ("plcql", "expert"): [100.0, 96.5],
    ("plcql", "medium"): [61.25, 70.0],
    ("cfcql", "expert"): [90.0, 80.0],
    ("cfcql", "medium"): [75.0, 79.75],
    ("bc", "expert"): [42.0],
}


@pytest.fixture()
def site(tmp_path):
    res = tmp_path / "results"
    for (algo, tier), scores in SCORES.items():
        for seed, s in enumerate(scores):
            write(res, f"{algo}/mpe-cn/{tier}/seed{seed}", result(algo=algo, dataset=tier, seed=seed, score=s, run_key=f"{algo}-{tier}-{seed}"))
    write(res, "broken/corrupt", '{"schema_version": 1, "status": "do')
    write(res, "plcql/mpe-cn/random/seed0", result(dataset="random", status="failed", score=None))
    out = tmp_path / "site"
    index = build_site(res, out, now=NOW)
    return {"index": index, "out": out, "html": index.read_text(encoding="utf-8"), "results": res}


# ------------------------------------------------------------------ stats


def test_cell_stats_matches_statistics_module():
    vals = [1.0, 2.5, 7.25, -3.0]
    s = cell_stats(vals)
    assert s["n"] == 4
    assert s["mean"] == pytest.approx(statistics.fmean(vals))
    assert s["std"] == pytest.approx(statistics.stdev(vals))  # ddof=1


def test_cell_stats_single_and_empty():
    assert cell_stats([3.5]) == {"mean": 3.5, "std": 0.0, "n": 1}
    e = cell_stats([])
    assert e["n"] == 0 and math.isnan(e["mean"]) and math.isnan(e["std"])
    with pytest.raises(ValueError):
        cell_stats([1.0, float("nan")])


def test_best_in_row():
    assert best_in_row([1.0, 3.0, 2.0]) == [1]
    assert best_in_row([1.0, None, float("nan"), 0.5]) == [0]
    assert best_in_row([2.0, 2.0, 1.0]) == [0, 1]  # exact ties are all best
    assert best_in_row([5.0, 3.0], eligible=[False, True]) == [1]
    assert best_in_row([1.0, 3.0], higher_is_better=False) == [0]
    assert best_in_row([None, None]) == []
    assert best_in_row([]) == []
    with pytest.raises(ValueError):
        best_in_row([1.0], eligible=[True, False])


def test_format_score():
    assert format_score(87.34, "normalised") == "87.3"
    assert format_score(0.456, "win_rate") == "0.46"
    assert format_score(-0.01, "normalised") == "0.0"
    assert format_score(None, "normalised") == "—"


# ------------------------------------------------------------------ paper table


def test_paper_results_transcription():
    paper = load_paper_results()
    assert paper["source"]["title"] == "Learning Partial Action Replacement in Offline MARL"
    assert paper["source"]["status"] == "reported"
    main = paper["tables"]["main_results"]
    sc = paper["tables"]["starcraft_results"]
    assert main["columns"] == ["omar", "macql", "iql", "matd3bc", "dof", "cfcql", "spacql", "plcql"]
    assert sc["columns"] == ["cfcql", "macql", "maicq", "omar", "madtkd", "bc", "iql", "awac", "spacql", "plcql"]
    n = 0
    for table in (main, sc):
        for tiers in table["rows"].values():
            for cells in tiers.values():
                assert list(cells) == table["columns"]
                n += len(cells)
    assert n == 16 * 8 + 16 * 10
    assert main["rows"]["CN"]["Exp"]["plcql"] == {"mean": 110.9, "std": 3.0}
    assert main["rows"]["Half-C"]["Med"]["dof"] is None  # "-" in the paper
    assert sc["rows"]["6h_vs_8z"]["Mixed"]["plcql"] == {"mean": 0.56, "std": 0.28}
    assert paper["tables"]["ablation"]["variants"][0]["values"]["CN"]["Med-R"] == {"mean": 95.4, "std": 6.1}
    assert paper_value(paper, "mpe-cn", "medium-replay", "spacql")["mean"] == 71.9
    assert paper_value(paper, "smax-3s_vs_5z", "mixed", "cfcql")["sc2"] is True
    assert paper_value(paper, "smac-5m-vs-6m", "expert", "bc")["mean"] == 0.82
    assert paper_value(paper, "mpe-cn", "expert", "nosuchalgo") is None
    assert paper_value(paper, "mpe-foo", "expert", "plcql") is None


# ------------------------------------------------------------------ site


def test_outputs_written(site):
    for name in ("index.html", "results.json", "results.csv"):
        assert (site["out"] / name).is_file()


def test_displayed_means_are_computed_from_files(site):
    board = parse(site["html"]).tables
    assert len(board) == 2  # main table and the ablation table (no SMAC rows)
    rows = board[0]["rows"]
    for (algo, tier), scores in SCORES.items():
        label = {"plcql": "PLCQL", "cfcql": "CFCQL", "bc": "BC"}[algo]
        text = rows[("mpe-cn", tier)][label]
        assert text.startswith(fmt(scores)), (algo, tier, text)
        assert f"n={len(scores)}" in text and "smoke" in text
    # independent of the cell lookup: every expected string is on the page
    for scores in SCORES.values():
        assert fmt(scores) in site["html"]


def test_best_cell_bold_and_only_it(site):
    table = parse(site["html"]).tables[0]
    expected = {}
    for tier in ("expert", "medium"):
        means = {a: statistics.fmean(v) for (a, t), v in SCORES.items() if t == tier}
        expected[tier] = max(means, key=means.get)
    labels = {"plcql": "PLCQL", "cfcql": "CFCQL", "bc": "BC"}
    for tier, best in expected.items():
        bold = table["bold"][("mpe-cn", tier)]
        assert [k for k, v in bold.items() if v] == [labels[best]]
    strong = re.findall(r'<strong class="score">(.*?)</strong>', site["html"])
    assert sorted(strong) == sorted(fmt(SCORES[(a, t)]) for t, a in expected.items())


def test_missing_cell_shows_dash(site):
    rows = parse(site["html"]).tables[0]["rows"]
    assert rows[("mpe-cn", "medium")]["BC"].startswith("—")
    assert "random" not in {tier for _, tier in rows}  # the failed run made no row


def test_rows_and_columns_in_paper_order(site):
    table = parse(site["html"]).tables[0]
    assert [tier for _, tier in table["rows"]] == ["expert", "medium"]
    assert list(table["rows"][("mpe-cn", "expert")]) == MAIN_COLUMNS + ["BC"]


def test_skipped_files_listed(site):
    text = " ".join(parse(site["html"]).sections["skipped"].split())
    assert "broken/corrupt/final.json" in text and "invalid JSON" in text
    assert "plcql/mpe-cn/random/seed0/final.json" in text and "status is 'failed'" in text
    data = json.loads((site["out"] / "results.json").read_text())
    assert {s["path"] for s in data["skipped"]} == {"broken/corrupt/final.json", "plcql/mpe-cn/random/seed0/final.json"}


def test_paper_value_shown_as_reported(site):
    cell = parse(site["html"]).tables[0]["rows"][("mpe-cn", "expert")]["PLCQL"]
    assert "paper (reported)" in cell and "110.9 ± 3.0" in cell
    # ours comes first, then the reported line
    assert cell.index(fmt(SCORES[("plcql", "expert")])) < cell.index("paper (reported)")
    assert re.search(r'class="paper[^"]*"><span class="tag">paper \(reported\)</span> 110\.9', site["html"])
    # bc has no column in the paper's MPE table, so no reported line there
    assert "paper" not in parse(site["html"]).tables[0]["rows"][("mpe-cn", "expert")]["BC"]


def test_results_csv_equals_aggregates(site):
    with open(site["out"] / "results.csv", newline="", encoding="utf-8") as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == len(SCORES)
    got = {(r["algo"], r["dataset"]): r for r in rows}
    assert set(got) == set(SCORES)
    for key, scores in SCORES.items():
        r = got[key]
        assert int(r["n"]) == len(scores)
        assert float(r["mean"]) == pytest.approx(statistics.fmean(scores))
        assert float(r["std"]) == pytest.approx(statistics.stdev(scores) if len(scores) > 1 else 0.0)
        assert r["profile"] == "smoke" and r["task"] == "mpe-cn" and r["score_name"] == "normalised"
        assert r["seeds"] == " ".join(str(i) for i in range(len(scores)))
    assert got[("plcql", "expert")]["paper_mean"] == "110.9"
    assert {k for k, r in got.items() if r["best"] == "1"} == {("plcql", "expert"), ("cfcql", "medium")}
    data = json.loads((site["out"] / "results.json").read_text())
    assert len(data["cells"]) == len(SCORES)
    for c in data["cells"]:
        assert c["mean"] == pytest.approx(statistics.fmean(SCORES[(c["algo"], c["dataset"])]))


def test_page_is_self_contained_and_explained(site):
    html = site["html"]
    assert "<style>" in html and "border-collapse" in html  # CSS inlined
    assert "<link" not in html and "<script" not in html
    assert not re.search(r'(src|href)="(https?:)?//', html)
    assert "ddof = 1" in html and "100·(R − R<sub>random</sub>)" in html
    assert "not reproduced" in html
    footer = html[html.index('<footer id="provenance">'):]
    for needle in ("2026-11-26 12:00:00 UTC", "smoke", "0123456789ab", "torch", "2.13.0", "mpe2", "v1"):
        assert needle in footer


def test_html_is_escaped(tmp_path):
    res = tmp_path / "r"
    evil = '<script>alert("x")</script>'
    write(res, "a", result(algo=evil, score=10.0, versions={"evilpkg": '<img src=x onerror="alert(1)">'}))
    write(res, "b", result(algo="plcql", profile="smoke<b>", score=11.0, git_commit='"><script>1</script>',
                           image={"tag": "<b>x</b>"}))
    write(res, "c", result(task="mpe-cn", dataset="<i>tier</i>", score=5.0))
    html = build_site(res, tmp_path / "s", now=NOW).read_text(encoding="utf-8")
    assert "<script" not in html and "<img" not in html and "<i>tier" not in html and "smoke<b>" not in html
    assert "&lt;script&gt;alert(" in html
    assert "&lt;img src=x" in html
    assert "smoke&lt;b&gt;" in html and "&lt;b&gt;x&lt;/b&gt;" in html


def test_dirty_commit_and_image_in_provenance(tmp_path):
    res = tmp_path / "r"
    write(res, "a", result(git_commit="f" * 40 + "-dirty", image={"tag": "plcql-bench:0.1.0"}))
    html = build_site(res, tmp_path / "s", now=NOW).read_text(encoding="utf-8")
    footer = html[html.index('<footer id="provenance">'):]
    assert "ffffffffffff-dirty" in footer and "plcql-bench:0.1.0" in footer


def test_mixed_profiles_bold_only_within_majority(tmp_path):
    res = tmp_path / "r"
    for seed in range(2):
        write(res, f"p{seed}", result(algo="plcql", seed=seed, score=60.0 + seed))
        write(res, f"c{seed}", result(algo="cfcql", seed=seed, score=50.0 + seed))
    write(res, "bc", result(algo="bc", profile="paper", score=99.0))  # higher, but another profile
    html = build_site(res, tmp_path / "s", now=NOW).read_text(encoding="utf-8")
    table = parse(html).tables[0]
    bold = table["bold"][("mpe-cn", "expert")]
    assert [k for k, v in bold.items() if v] == ["PLCQL"]
    bc = table["rows"][("mpe-cn", "expert")]["BC"]
    assert "99.0 ± 0.0" in bc and "paper" in bc and "not compared" in bc
    assert "Bold rule" in html


def test_duplicate_seed_is_skipped(tmp_path):
    res = tmp_path / "r"
    write(res, "old", result(score=10.0, finished_at="2026-11-25T10:00:00Z"))
    write(res, "new", result(score=20.0, finished_at="2026-11-25T11:00:00Z"))
    runs, skipped = build.load_results(res)
    assert [r.score for r in runs] == [20.0]
    assert [s.path for s in skipped] == ["old/final.json"] and "duplicate" in skipped[0].reason


def test_runs_on_an_older_dataset_build_are_skipped(tmp_path):
    res = tmp_path / "r"
    old, new = "a" * 64, "b" * 64
    write(res, "bc0", result(dataset="medium-replay", algo="bc", seed=0, score=10.0, dataset_sha256=old, finished_at="2026-11-25T10:00:00Z"))
    write(res, "cq1", result(dataset="medium-replay", algo="cfcql", seed=1, score=30.0, dataset_sha256=old, finished_at="2026-11-25T10:30:00Z"))
    write(res, "bc1", result(dataset="medium-replay", algo="bc", seed=1, score=20.0, dataset_sha256=new, finished_at="2026-11-25T11:00:00Z"))
    write(res, "other", result(algo="bc", dataset="expert", seed=0, score=90.0, dataset_sha256=old,
                               finished_at="2026-11-25T09:00:00Z"))
    runs, skipped = build.load_results(res)
    assert sorted(r.path.split("/")[0] for r in runs) == ["bc1", "other"]  # other tier untouched
    reasons = {s.path.split("/")[0]: s.reason for s in skipped}
    assert set(reasons) == {"bc0", "cq1"} and "older build" in reasons["cq1"] and new[:12] in reasons["bc0"]


def test_invalid_fields_are_skipped_not_fatal(tmp_path):
    res = tmp_path / "r"
    write(res, "ok", result())
    write(res, "nan", '{"schema_version": 1, "status": "done", "algo": "x", "task": "mpe-cn", "dataset": "expert", "seed": 0, "profile": "smoke", "score": NaN}')
    write(res, "list", "[1, 2]")
    write(res, "schema", result(schema_version=99))
    write(res, "seed", result(seed="zero"))
    write(res, "wr", result(task="smax-2s3z", domain="smax", score_name="win_rate", score=3.0))
    write(res, "noalgo", result(algo=""))
    (res / "binary").mkdir()
    (res / "binary" / "final.json").write_bytes(b"\xff\xfe\x00garbage")
    runs, skipped = build.load_results(res)
    assert len(runs) == 1
    reasons = {s.path.split("/")[0]: s.reason for s in skipped}
    assert set(reasons) == {"nan", "list", "schema", "seed", "wr", "noalgo", "binary"}
    assert "finite" in reasons["nan"] and "schema_version" in reasons["schema"] and "[0, 1]" in reasons["wr"]
    build_site(res, tmp_path / "s", now=NOW)  # renders


def test_smax_rows_labelled_not_comparable(tmp_path):
    res = tmp_path / "r"
    for seed, s in enumerate([0.5, 0.75]):
        write(res, f"s{seed}", result(task="smax-2s3z", domain="smax", dataset="medium", seed=seed, score_name="win_rate", score=s))
    write(res, "cn", result(score=70.0))
    html = build_site(res, tmp_path / "s", now=NOW).read_text(encoding="utf-8")
    tables = parse(html).tables
    assert len(tables) == 3  # MPE first, then SMAX, then the ablation
    cell = tables[1]["rows"][("smax-2s3z", "medium")]["PLCQL"]
    assert cell.startswith(fmt([0.5, 0.75], 2))
    assert "paper (reported), SC2" in cell and "0.51 ± 0.19" in cell
    assert "not comparable" in html
    assert html.index('id="domain-main"') < html.index('id="domain-smac"') < html.index('id="domain-ablation"')


def test_dataset_cards_from_manifest(tmp_path):
    res = tmp_path / "r"
    write(res, "a", result(dataset_sha256="b" * 64))
    data = tmp_path / "data"
    data.mkdir()
    (data / "manifest.json").write_text(json.dumps({
        "mpe-cn/expert": {"n_transitions": 1000, "n_episodes": 40, "return_mean": -12.5, "return_std": 1.25,
                           "return_min": -20.0, "return_max": -9.0, "sha256": "a" * 64,
                           "ref_return_random": -60.0, "ref_return_expert": -10.0, "profile": "smoke"},
        "mpe-cn/random": {"n_transitions": 1000, "task_id": "mpe-cn", "quality": "random", "behaviour_policy_id": "uniform"},
        "smax-2s3z/mixed": {"file": "x.h5", "sha256": "c" * 64, "win_rate": 0.375},
    }))
    html = build_site(res, tmp_path / "s", data, now=NOW).read_text(encoding="utf-8")
    text = " ".join(parse(html).sections["datasets"].split())
    assert "-12.50 ± 1.25" in text and "1,000" in text and "aaaaaaaaaaaa" in text and "-60.00" in text
    assert "1 hash mismatch" in text
    assert text.index("mpe-cnexpert") < text.index("mpe-cnrandom") < text.index("smax-2s3zmixed")
    assert "uniform" in text and "Win rate" in text and "0.38" in text


def test_empty_results_and_cli(tmp_path, capsys):
    res = tmp_path / "empty"
    res.mkdir()
    assert build.main(["--results", str(res), "--out", str(tmp_path / "s")]) == 0
    assert "No finished runs" in (tmp_path / "s" / "index.html").read_text(encoding="utf-8")
    assert build.main(["--results", str(tmp_path / "nope"), "--out", str(tmp_path / "s2")]) == 2
    assert "not found" in capsys.readouterr().err


def test_paper_dash_is_shown_as_not_reported(tmp_path):
    res = tmp_path / "r"
    write(res, "dof", result(algo="dof", task="mamujoco-halfcheetah-2x3", domain="mamujoco", score=33.3))
    write(res, "new", result(algo="newalgo", task="mamujoco-halfcheetah-2x3", domain="mamujoco", score=44.4))
    html = build_site(res, tmp_path / "s", now=NOW).read_text(encoding="utf-8")
    table = parse(html).tables[0]
    row = table["rows"][("mamujoco-halfcheetah-2x3", "expert")]
    assert list(row) == MAIN_COLUMNS + ["newalgo"]  # paper algorithms first, then others
    assert "paper (reported) — (not reported)" in row["DoF"]
    assert "paper" not in row["newalgo"] and table["bold"][("mamujoco-halfcheetah-2x3", "expert")]["newalgo"]
    assert "MaMuJoCo" in html
