"""Leaderboard rendering from a fixture results tree: the ablation table (paper and suite
variants as rows), PAR diagnostics (per-k components, collapse badges, graceful fallback),
rliable aggregates (against direct rliable calls; hidden below 3 runs), learning curves,
downloads, escaping. Also the statistics against rliable on fixed arrays."""

from __future__ import annotations

import csv
import html as html_mod
import json
import re
import statistics

import numpy as np
import pytest

from lb_fixtures import NOW, curve_for, write_run
from plcql_bench.leaderboard import analysis, build, stats
from plcql_bench.leaderboard.scoring import omar_reference, omar_score
from test_leaderboard import board

pytestmark = pytest.mark.filterwarnings("ignore::FutureWarning")  # arch's RandomState deprecation
REPS, POI_REPS = 200, 100

SCORES = {  # (algo, task, tier) -> per-seed scores
    ("plcql", "mpe-cn", "expert"): [101.0, 99.0, 103.0],
    ("cfcql", "mpe-cn", "expert"): [95.0, 96.0, 94.0],
    ("spacql", "mpe-cn", "expert"): [90.0, 91.5, 89.0],
    ("bc", "mpe-cn", "expert"): [70.0, 72.0],
    ("plcql", "mpe-cn", "medium-replay"): [60.0, 64.0, 62.0],
    ("spacql", "mpe-cn", "medium-replay"): [66.0, 67.0, 68.0],
    ("cfcql", "mpe-cn", "medium-replay"): [30.0, 35.0, 32.0],
    ("bc", "mpe-cn", "medium-replay"): [10.0, 11.0, 12.0],
    ("plcql-k1", "mpe-cn", "medium-replay"): [40.0, 44.0, 42.0],
    ("plcql-lcb", "mpe-cn", "medium-replay"): [70.0, 72.0, 74.0],
    ("plcql-foo", "mpe-cn", "random"): [20.0, 21.0, 22.0],
    ("plcql", "smax-2s3z", "medium"): [0.5, 0.75, 0.625],
    ("cfcql", "smax-2s3z", "medium"): [0.25, 0.5, 0.375],
}
DIAG = {"plcql": 3, "plcql-lcb": 3}  # algorithms whose runs log diag/* (n = 3 agents)
COLLAPSED = {("plcql", "mpe-cn", "medium-replay"): 3}


def make_results(root):
    for (algo, task, tier), scores in SCORES.items():
        for seed, s in enumerate(scores):
            extra = {}
            if (algo, task, tier) in COLLAPSED and seed < 2:
                k = COLLAPSED[(algo, task, tier)]
                extra = {"warnings": [f"PAR collapsed to k = {k}"], "par_collapse": {"k": k, "entropy": 0.001, "p_k": 0.99}}
            diag = DIAG.get(algo) if task == "mpe-cn" else None
            write_run(root, algo, task, tier, seed, s, diag_n=diag,
                      collapse_to=COLLAPSED.get((algo, task, tier)), **extra)
    # an older PLCQL run format: only train/par/p_k* and E_k (no diag/*)
    lines = "".join(json.dumps({"update": u, "score": 0.5, "train/par/E_k": 2.0, "train/par/p_k1": 0.2,
                                "train/par/p_k2": 0.3, "train/par/p_k3": 0.2, "train/par/p_k4": 0.2, "train/par/p_k5": 0.1}) + "\n"
                    for u in range(0, 120, 10))
    for seed in range(3):
        d = write_run(root, "plcql", "smax-2s3z", "expert", seed, 0.9, metrics=lines)
        assert d.is_dir()
    return root


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("render")
    res = make_results(tmp / "results")
    built = build.build(res, tmp / "site", now=NOW, bootstrap_reps=REPS, poi_reps=POI_REPS)
    html = built.index.read_text(encoding="utf-8")
    return {"out": tmp / "site", "html": html, "board": board(html), "built": built, "results": res,
            "par_page": (tmp / "site" / "par.html").read_text(encoding="utf-8")}


def section(html, name):
    start = html.index(f'<section id="{name}">')
    return html[start:html.index("</section>", start)]


# ------------------------------------------------------------------ ablation table


def test_ablation_rows_are_variants_and_suite_variants_are_labelled(site):
    abl = site["board"]["table-ablation-final-ours"]
    rows = list(abl)
    expected = ["plcql", "plcql-k1", "plcql-kn", "plcql-w1", "plcql-k2", "plcql-uniform", "plcql-t0.1", "plcql-t10", "plcql-target-actors", "plcql-kn-target", "plcql-member-clip", "plcql-joint-clip", "plcql-lcb", "plcql-foo"]
    assert rows == [f"ablation-{a}" for a in expected]
    assert list(abl["ablation-plcql"]) == ["mpe-cn-medium-replay", "smax-2s3z-medium", "mpe-cn-random"]
    assert abl["ablation-plcql-k1"]["mpe-cn-medium-replay"]["text"].startswith("42.0 ± 2.0")
    assert "paper 58.2 ± 8.4" in abl["ablation-plcql-k1"]["mpe-cn-medium-replay"]["text"]
    lcb = abl["ablation-plcql-lcb"]["mpe-cn-medium-replay"]
    assert lcb["bold"] and "paper" not in lcb["text"]  # a suite variant never shows a paper number
    assert abl["ablation-plcql-k2"]["mpe-cn-medium-replay"]["text"].startswith("— not run")
    html = section(site["html"], "domain-ablation")
    for v in ("Fixed k=2", "Uniform π_par", "T = 0.1", "T = 10"):
        assert v in html
    rows_html = re.findall(r'<tr id="ablation-([^"]+)-final-ours"[^>]*>(.*?)</th>', html, re.S)
    labels = {a: html_mod.unescape(txt) for a, txt in rows_html}
    assert "this suite's variant, not the paper's" in labels["plcql-k2"] and "this suite's variant" not in labels["plcql-k1"]
    assert "beyond the paper: this suite's method" in labels["plcql-lcb"]
    assert "this suite's variant, not the paper's" in labels["plcql-foo"]  # unknown plcql-* names: automatic rows
    # variants never leak into the main table
    assert not any(c.startswith("plcql-") for c in site["board"]["table-main-final-ours"]["main-mpe-cn-expert"])


def test_collapse_badges_on_cells_and_runs(site):
    cell = site["board"]["table-main-final-ours"]["main-mpe-cn-medium-replay"]["plcql"]
    assert "PAR collapsed 2/3" in cell["text"]
    assert "PAR collapsed 2/3" in site["board"]["table-ablation-final-ours"]["ablation-plcql"]["mpe-cn-medium-replay"]["text"]
    runs = section(site["html"], "runs")
    assert runs.count("PAR collapsed to k = 3") == 4  # badge + warning text, 2 runs
    assert "2 PLCQL-family runs recorded a collapsed PAR policy" in " ".join(site["html"].split())


# ------------------------------------------------------------------ PAR diagnostics


def test_par_components_plotted_per_k(site):
    """The table on the front page, the figures on par.html (linked from it)."""
    table, par = section(site["html"], "par"), section(site["par_page"], "par")
    assert '<a href="par.html">' in table and "4 figures" in table and "<svg" not in table
    rows = {(r["algo"], r["task"], r["dataset"]): r for r in csv.DictReader(open(site["out"] / "tables" / "par_diagnostics.csv"))}
    assert set(rows) == {("plcql", "mpe-cn", "expert"), ("plcql", "mpe-cn", "medium-replay"),
                         ("plcql-lcb", "mpe-cn", "medium-replay"), ("plcql", "smax-2s3z", "expert")}
    mr = rows[("plcql", "mpe-cn", "medium-replay")]
    assert mr["source"] == "diag" and mr["runs_with_diagnostics"] == "3" and mr["runs_collapsed"] == "2"
    assert float(mr["p_k3"]) == pytest.approx(1.0) and float(mr["p_k1"]) == pytest.approx(0.0)
    assert float(rows[("plcql", "mpe-cn", "expert")]["p_k2"]) == pytest.approx(1 / 3)
    for name in ("mean Qθ1(s′, a′(k))", "u_Q", "r_par", "π_par(k | s′)", "π_par entropy"):
        assert name in par, name
    assert par.count("<svg") == 4
    # the older format degrades to what it has
    old = rows[("plcql", "smax-2s3z", "expert")]
    assert old["source"] == "train" and float(old["p_k5"]) == pytest.approx(0.1)
    assert "E[k]" in par
    assert '<a href="index.html#' in par  # each figure's caption leads back to its cell's runs


def test_par_component_means_equal_the_metrics(site):
    res = site["results"]
    diags = []
    for d in sorted((res / "paper" / "plcql" / "mpe-cn" / "expert").iterdir()):
        hist = analysis.read_metrics(d / "metrics.jsonl")
        diags.append(analysis._run_diag(hist))
    assert [d["source"] for d in diags] == ["diag"] * 3
    q1_last = statistics.fmean(d["q1"][2][-1] for d in diags)
    assert q1_last == pytest.approx(5.0 + 2 + 0.1)  # 5 + k + 0.1 * seed, mean over seeds 0..2


# ------------------------------------------------------------------ aggregates


def test_aggregates_match_direct_rliable(site):
    from rliable import library as rly
    from rliable import metrics

    rows = {r["algo"]: r for r in csv.DictReader(open(site["out"] / "tables" / "aggregates.csv")) if r["table"] == "main"}
    assert set(rows) == {"cfcql", "spacql", "plcql"}  # BC has 2 runs on expert: not aggregated
    tiers = ("expert", "medium-replay")
    # the aggregates are in the default view: the paper's reference returns (the fixtures' return = their score)
    ref = omar_reference("mpe-cn")
    mats = {a: np.array([[omar_score(s, ref) for s in SCORES[(a, "mpe-cn", t)]] for t in tiers]).T for a in rows}
    np.random.seed(stats.BOOTSTRAP_SEED)
    point, ci = rly.get_interval_estimates(
        mats, lambda x: np.array([metrics.aggregate_iqm(x), metrics.aggregate_mean(x)]), reps=REPS,
        random_state=np.random.RandomState(stats.BOOTSTRAP_SEED))
    for a, r in rows.items():
        assert float(r["iqm"]) == pytest.approx(point[a][0]) and float(r["mean"]) == pytest.approx(point[a][1])
        assert (float(r["iqm_ci_low"]), float(r["iqm_ci_high"])) == pytest.approx((ci[a][0][0], ci[a][1][0]))
    agg = " ".join(section(site["html"], "aggregates").split())
    assert "BC: mpe-cn · expert (n=2)" in agg and "Only 2 tasks" in agg
    poi = {r["y"]: r for r in csv.DictReader(open(site["out"] / "tables" / "probability_of_improvement.csv")) if r["table"] == "main"}
    assert float(poi["spacql"]["p_improvement"]) == pytest.approx(metrics.probability_of_improvement(mats["plcql"], mats["spacql"]))


def test_aggregates_hidden_below_three_runs(tmp_path):
    res = tmp_path / "r"
    for algo in ("plcql", "cfcql"):
        for seed in range(2):
            write_run(res, algo, "mpe-cn", "expert", seed, 50.0 + seed)
    html = build.build(res, tmp_path / "s", now=NOW, bootstrap_reps=20, poi_reps=10).index.read_text()
    agg = " ".join(section(html, "aggregates").split())
    assert "No aggregate: no task has 3 or more runs of any algorithm" in agg and "<svg" not in agg


def test_a_run_on_a_rebuild_of_its_card_says_so(tmp_path):
    """A run trained on another CPU's rebuild of the card's dataset sits in the card's cell, and its provenance
    row says it was rebuilt, with the file's own sha256, and (runs since card_refs were recorded) that it was scored
    with the card's reference returns."""
    res = tmp_path / "r"
    write_run(res, "cfcql", "mpe-cn", "expert", 0, 50.0)
    write_run(res, "cfcql", "mpe-cn", "expert", 1, 52.0,
              dataset_rebuild={"card_sha256": "a" * 64, "file_sha256": "f" * 64, "max_rel_diff": 4.96e-08})
    refs = {"ref_return_random": 0.0, "ref_return_expert": 100.0}
    write_run(res, "cfcql", "mpe-cn", "expert", 2, 51.0,
              dataset_rebuild={"card_sha256": "a" * 64, "file_sha256": "e" * 64, "max_rel_diff": 1.7e-05,
                               "card_refs": refs, "file_refs": {**refs, "ref_return_expert": 100.00001}})
    html = build.build(res, tmp_path / "s", now=NOW, bootstrap_reps=20, poi_reps=10).index.read_text()
    assert html.count("rebuilt on another CPU") == 2
    assert f"file sha256 {'f' * 64}; statistics within 5.0e-08 of the card's (docs" in html  # before card_refs
    assert f"file sha256 {'e' * 64}; statistics within 1.7e-05 of the card's; scored with the card's reference" in html


# ------------------------------------------------------------------ curves, downloads, escaping


def test_learning_curves_are_thinned_and_legends_outside(tmp_path):
    res = tmp_path / "r"
    for seed in range(3):
        write_run(res, "bc", "mpe-cn", "expert", seed, 50.0, curve=curve_for(50.0, points=600))
    html = build.build(res, tmp_path / "s", now=NOW, bootstrap_reps=20, poi_reps=10).index.read_text()
    assert '<a href="curves.html">' in section(html, "curves") and "<svg" not in section(html, "curves")
    curves = section((tmp_path / "s" / "curves.html").read_text(), "curves")
    assert curves.count("<svg") == 1 and "BC" in curves
    idx = analysis._thin_index(600)
    assert len(idx) <= analysis.MAX_POINTS + 1 and idx[0] == 0 and idx[-1] == 599
    assert analysis._thin_index(50) == list(range(50))


def test_every_table_has_csv_and_json_downloads(site):
    hrefs = {h for h in re.findall(r'href="([^"#][^"]*)"', site["html"])}
    assert hrefs, "no download links"
    for h in hrefs:
        assert (site["out"] / h).is_file(), h
    for stem in ("main", "smac", "ablation", "comparisons", "claims", "aggregates", "probability_of_improvement",
                 "par_diagnostics", "compute_cost", "datasets", "runs", "skipped"):
        data = json.loads((site["out"] / "tables" / f"{stem}.json").read_text())
        with open(site["out"] / "tables" / f"{stem}.csv", encoding="utf-8") as f:
            assert len(list(csv.DictReader(f))) == len(data["rows"]), stem
    main = json.loads((site["out"] / "tables" / "main.json").read_text())["rows"]
    assert {r["view"] for r in main} == {"final-ours", "final-omar", "last10-ours", "last10-omar", "best-ours", "best-omar"}
    cells = json.loads((site["out"] / "results.json").read_text())["cells"]
    plcql = next(c for c in cells if (c["algo"], c["task"], c["dataset"]) == ("plcql", "mpe-cn", "expert"))
    assert plcql["views"]["final-ours"]["mean"] == pytest.approx(101.0) and plcql["paper"]["mean"] == 110.9


def test_html_is_escaped(tmp_path):
    res = tmp_path / "r"
    evil = "<b onclick=alert(1)>x$y$"  # an algorithm name from a result file (no "/": it is a directory)
    for seed in range(3):
        write_run(res, evil, "mpe-cn", "expert", seed, 10.0 + seed, versions={"torch": '<img src=x onerror="alert(1)">'})
    write_run(res, "plcql", "mpe-cn", "expert", 0, 11.0, profile="smoke<i>", commit='"><script>1</script>')
    html = build.build(res, tmp_path / "s", now=NOW, bootstrap_reps=20, poi_reps=10).index.read_text()
    assert "&lt;b onclick=alert(1)&gt;x$y$" in html and "&lt;img src=x" in html and "smoke&lt;i&gt;" in html
    assert "&#34;&gt;&lt;script&gt;1" in html
    for page in ("index", "curves", "par"):  # every page of the board
        text = (tmp_path / "s" / f"{page}.html").read_text()
        assert "<b onclick" not in text and "<img" not in text and "smoke<i>" not in text and "<script" not in text, page
    curves = (tmp_path / "s" / "curves.html").read_text()
    assert section(curves, "curves").count("&lt;b onclick=alert(1)&gt;x$y$") >= 1  # matplotlib escapes SVG text


def test_empty_results(tmp_path):
    (tmp_path / "empty").mkdir()
    built = build.build(tmp_path / "empty", tmp_path / "s", now=NOW)
    assert built.n_runs == 0 and "No finished runs" in built.index.read_text()
    with pytest.raises(FileNotFoundError):
        build.build(tmp_path / "nope", tmp_path / "s2")


# ------------------------------------------------------------------ statistics vs rliable


FIXED = {
    "a": np.array([[0.9, 0.2, 0.55], [0.7, 0.35, 0.6], [0.8, 0.1, 0.5], [1.0, 0.3, 0.45]]),
    "b": np.array([[0.6, 0.4, 0.5], [0.5, 0.2, 0.65], [0.65, 0.3, 0.4]]),
}


def test_iqm_mean_cis_equal_rliable():
    from rliable import library as rly
    from rliable import metrics

    ours = stats.iqm_and_mean(FIXED, reps=300, seed=7)
    np.random.seed(7)
    point, ci = rly.get_interval_estimates(
        FIXED, lambda x: np.array([metrics.aggregate_iqm(x), metrics.aggregate_mean(x)]), reps=300)
    for a in FIXED:
        assert ours[a]["iqm"] == pytest.approx(metrics.aggregate_iqm(FIXED[a]))
        assert ours[a]["iqm_ci"] == pytest.approx((ci[a][0][0], ci[a][1][0]))
        assert ours[a]["mean_ci"] == pytest.approx((ci[a][0][1], ci[a][1][1]))
    assert stats.iqm_and_mean(FIXED, reps=300, seed=7) == ours  # reproducible


def test_interquartile_mean_equals_rliable():
    from rliable import metrics

    rng = np.random.default_rng(0)
    for shape in ((3, 2), (5, 16), (4, 7), (1, 1)):
        x = rng.normal(size=shape)
        assert stats.interquartile_mean(x) == pytest.approx(metrics.aggregate_iqm(x), rel=1e-12)


def test_performance_profiles_equal_rliable():
    from rliable import library as rly

    taus = np.linspace(0, 1, 21)
    assert np.allclose(stats.run_score_distribution(FIXED["a"], taus), rly.score_distributions(FIXED["a"], taus))
    ours = stats.performance_profiles(FIXED, taus, reps=200, seed=3)
    np.random.seed(3)
    point, ci = rly.create_performance_profile(FIXED, taus, reps=200)
    for a in FIXED:
        assert np.allclose(ours[a]["profile"], point[a])
        assert np.allclose(ours[a]["lo"], ci[a][0]) and np.allclose(ours[a]["hi"], ci[a][1])


def test_probability_of_improvement_equals_rliable():
    from rliable import library as rly
    from rliable import metrics

    x, y = FIXED["a"], FIXED["b"]
    assert stats.improvement_probability(x, y) == pytest.approx(metrics.probability_of_improvement(x, y))
    ours = stats.probability_of_improvement(x, y, reps=100, seed=5)
    np.random.seed(5)
    point, ci = rly.get_interval_estimates({"x,y": (x, y)}, metrics.probability_of_improvement, reps=100)
    assert ours["p"] == pytest.approx(point["x,y"])
    assert ours["ci"] == pytest.approx((ci["x,y"][0][0], ci["x,y"][1][0]))


def test_welch_and_score_matrix():
    from scipy import stats as sps

    a, b = [1.0, 2.0, 3.0, 4.0], [2.5, 3.5, 4.5]
    assert stats.welch_p(a, b) == pytest.approx(sps.ttest_ind(a, b, equal_var=False).pvalue)
    assert stats.welch_p([1.0], b) is None
    assert stats.welch_p([2.0, 2.0], [2.0, 2.0]) == 1.0 and stats.welch_p([2.0, 2.0], [3.0, 3.0]) == 0.0
    m, k = stats.score_matrix([[1.0, 2.0, 3.0], [4.0, 5.0]])
    assert k == 2 and m.tolist() == [[1.0, 4.0], [2.0, 5.0]]
