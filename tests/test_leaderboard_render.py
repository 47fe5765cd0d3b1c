"""Leaderboard rendering from a fixture results tree that exercises every feature: bold and
tie markers, the three "—" reasons, partial sweeps, the paper side by side, rliable
aggregates, headline claims, the SVG plots and the per-table downloads. Also the statistics
against direct rliable calls on fixed arrays."""

from __future__ import annotations

import csv
import json
import re
import statistics
from datetime import datetime, timezone
from html.parser import HTMLParser
from pathlib import Path

import numpy as np
import pytest

from plcql_bench.leaderboard import build, stats

pytestmark = pytest.mark.filterwarnings("ignore::FutureWarning")  # arch's RandomState deprecation

NOW = datetime(2026, 11, 26, 12, 0, 0, tzinfo=timezone.utc)
REPS, POI_REPS = 200, 100

# (algo, task, tier) -> per-seed scores. mpe-cn medium: PLCQL best, SPaCQL statistically tied
# (Welch p ~ 0.6), CFCQL clearly worse; BC a partial sweep (n=1).
SCORES = {
    ("plcql", "mpe-cn", "expert"): [101.0, 99.0, 103.0],
    ("cfcql", "mpe-cn", "expert"): [95.0, 96.0, 94.0],
    ("spacql", "mpe-cn", "expert"): [90.0, 91.5, 89.0],
    ("bc", "mpe-cn", "expert"): [70.0, 72.0, 71.0],
    ("plcql", "mpe-cn", "medium"): [80.0, 85.0, 90.0],
    ("spacql", "mpe-cn", "medium"): [78.0, 84.0, 86.0],
    ("cfcql", "mpe-cn", "medium"): [50.0, 52.0, 51.0],
    ("bc", "mpe-cn", "medium"): [40.0],
    ("plcql", "mpe-cn", "medium-replay"): [60.0, 64.0, 62.0],
    ("spacql", "mpe-cn", "medium-replay"): [66.0, 67.0, 68.0],
    ("cfcql", "mpe-cn", "medium-replay"): [30.0, 35.0, 32.0],
    ("plcql-k1", "mpe-cn", "medium-replay"): [40.0, 44.0, 42.0],
    ("plcql-w1", "mpe-cn", "medium-replay"): [58.0, 63.0, 61.0],
    ("plcql", "smax-2s3z", "medium"): [0.5, 0.75, 0.625],
    ("cfcql", "smax-2s3z", "medium"): [0.25, 0.5, 0.375],
}
FAILED = [("iql", "mpe-cn", "expert", 0, "RuntimeError: CUDA out of memory")]
UPDATES_PER_S = {"plcql": 40.0, "spacql": 10.0, "cfcql": 50.0, "bc": 400.0, "plcql-k1": 40.0, "plcql-w1": 40.0}
N_AGENTS_CN = 3


def final_json(algo: str, task: str, tier: str, seed: int, score: float) -> dict:
    win = task.startswith("smax")
    curve = [{"update": u, "return_mean": 0.0, "score": score * f} for u, f in ((0, 0.1), (10, 0.6), (20, 1.0))]
    return {
        "schema_version": 1, "protocol_version": 1, "run_key": f"{algo}-{task}-{tier}-{seed}",
        "algo": algo, "task": task, "domain": task.split("-")[0], "dataset": tier, "seed": seed,
        "profile": "smoke", "status": "done", "dataset_sha256": "a" * 64, "config": {},
        "score_name": "win_rate" if win else "normalised", "score": score,
        "final_eval": {"episodes": 10, "return_mean": 1.0, "return_std": 0.1, "win_rate": score if win else None},
        "curve": curve,
        "train": {"updates": 20, "wall_clock_s": 3.0, "train_s": 20 / UPDATES_PER_S[algo], "updates_per_s": UPDATES_PER_S[algo]},
        "versions": {"plcql-bench": "0.1.0", "torch": "2.13.0", "mpe2": "1.1.1", **({"jaxmarl": "0.0.7"} if win else {})},
        "git_commit": "0123456789abcdef0123", "finished_at": "2026-11-25T23:10:00Z",
    }


def par_metrics(seed: int, n: int = N_AGENTS_CN) -> str:
    lines = [{"update": 0, "score": 1.0}]
    for u, shift in ((10, 0.0), (20, 0.1)):
        p = np.full(n, (1 - shift) / n)
        p[0] += shift + 0.01 * seed
        p /= p.sum()
        rec = {"update": u, "score": 1.0, "train/par/E_k": float((p * np.arange(1, n + 1)).sum())}
        rec.update({f"train/par/p_k{i + 1}": float(p[i]) for i in range(n)})
        lines.append(rec)
    return "".join(json.dumps(r) + "\n" for r in lines)


def make_fixture_results(root: Path) -> Path:
    """A results tree in the runner's layout: results/<profile>/<algo>/<task>/<tier>/seed<k>-<key>/."""
    for (algo, task, tier), scores in SCORES.items():
        for seed, s in enumerate(scores):
            d = root / "smoke" / algo / task / tier / f"seed{seed}-abc{seed}"
            d.mkdir(parents=True, exist_ok=True)
            (d / "final.json").write_text(json.dumps(final_json(algo, task, tier, seed, s)), encoding="utf-8")
            (d / "status.json").write_text('{"status": "done"}', encoding="utf-8")
            if algo == "plcql":
                n = 5 if task == "smax-2s3z" else N_AGENTS_CN
                (d / "metrics.jsonl").write_text(par_metrics(seed, n), encoding="utf-8")
    for algo, task, tier, seed, err in FAILED:
        d = root / "smoke" / algo / task / tier / f"seed{seed}-dead"
        d.mkdir(parents=True, exist_ok=True)
        (d / "config.json").write_text(json.dumps({"algo": algo, "task": task, "dataset": tier, "seed": seed, "profile": "smoke"}))
        (d / "status.json").write_text(json.dumps({"status": "failed", "error": err, "traceback": "..."}))
    return root


class Cells(HTMLParser):
    """table id -> {(task, tier): {column: {"text", "bold", "tie", "class"}}}."""

    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.tables: dict[str, dict] = {}
        self._t = None
        self._head: list[str] = []
        self._row: list[dict] = []
        self._cell = None
        self._thead = False

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if tag == "table" and "board" in (a.get("class") or ""):
            self._t = a["id"]
            self.tables[self._t] = {}
        if self._t is None:
            return
        if tag == "thead":
            self._thead = True
        elif tag == "tr":
            self._row = []
        elif tag in ("td", "th"):
            self._cell = {"text": "", "bold": False, "tie": False, "class": a.get("class") or ""}
        elif tag == "strong" and self._cell is not None:
            self._cell["bold"] = True
        elif tag == "span" and a.get("class") == "tie" and self._cell is not None:
            self._cell["tie"] = True

    def handle_endtag(self, tag):
        if self._t is None:
            return
        if tag == "table":
            self._t = None
        elif tag == "thead":
            self._thead = False
        elif tag in ("td", "th") and self._cell is not None:
            self._cell["text"] = " ".join(self._cell["text"].split())
            self._row.append(self._cell)
            self._cell = None
        elif tag == "tr":
            if self._thead:
                self._head = [c["text"] for c in self._row]
            else:
                key = (self._row[0]["text"].split("paper row")[0].strip(), self._row[1]["text"])
                self.tables[self._t][key] = dict(zip(self._head[2:], self._row[2:]))

    def handle_data(self, data):
        if self._cell is not None:
            self._cell["text"] += data


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("lb")
    res = make_fixture_results(tmp / "results")
    out = tmp / "site"
    index = build.build_site(res, out, now=NOW, bootstrap_reps=REPS, poi_reps=POI_REPS)
    html = index.read_text(encoding="utf-8")
    p = Cells()
    p.feed(html)
    return {"out": out, "html": html, "tables": p.tables, "results": res}


def fmt(values, decimals=1):
    sd = statistics.stdev(values) if len(values) > 1 else 0.0
    return f"{statistics.fmean(values):.{decimals}f} ± {sd:.{decimals}f}"


# ------------------------------------------------------------------ tables


def test_three_tables_with_paper_columns(site):
    t = site["tables"]
    assert set(t) == {"table-main", "table-smac", "table-ablation"}
    main = t["table-main"][("mpe-cn", "expert")]
    assert list(main) == ["OMAR", "MACQL", "IQL", "MA-TD3+BC", "DoF", "CFCQL", "SPaCQL", "PLCQL", "BC"]
    smac = t["table-smac"][("smax-2s3z", "medium")]
    assert list(smac) == ["CFCQL", "MACQL", "MAICQ", "OMAR", "MADTKD", "BC", "IQL", "AWAC", "SPaCQL", "PLCQL"]
    abl = t["table-ablation"]
    assert list(abl) == [("mpe-cn", "medium-replay"), ("smax-2s3z", "medium")]  # the paper's ablation rows
    assert list(abl[("mpe-cn", "medium-replay")]) == ["PLCQL", "PLCQL k=1", "PLCQL k=n", "PLCQL w=1"]
    # the variants never leak into the main table
    assert not any("k=1" in c for c in main)


def test_cells_are_mean_std_n_profile(site):
    for (algo, task, tier), scores in SCORES.items():
        table = "table-smac" if task.startswith("smax") else "table-main"
        if algo.startswith("plcql-"):
            table = "table-ablation"
        label = build.algo_label(build.load_paper_results(), algo)
        text = site["tables"][table][(task, tier)][label]["text"]
        assert text.startswith(fmt(scores, 2 if task.startswith("smax") else 1)), (algo, task, tier, text)
        assert f"n={len(scores)}" in text and "smoke" in text
    # partial sweep: BC has one seed on medium
    assert "n=1 (single seed)" in site["tables"]["table-main"][("mpe-cn", "medium")]["BC"]["text"]


def test_bold_is_the_best_mean_only(site):
    main = site["tables"]["table-main"]
    for tier in ("expert", "medium", "medium-replay"):
        means = {a: statistics.fmean(v) for (a, t, d), v in SCORES.items() if t == "mpe-cn" and d == tier and not a.startswith("plcql-")}
        best = max(means, key=means.get)
        label = build.algo_label(build.load_paper_results(), best)
        assert [k for k, c in main[("mpe-cn", tier)].items() if c["bold"]] == [label], tier
        assert "best" in main[("mpe-cn", tier)][label]["class"]


def test_tie_markers_follow_welch(site):
    main = site["tables"]["table-main"]
    from scipy import stats as sps

    best = SCORES[("plcql", "mpe-cn", "medium")]
    for algo, label in (("spacql", "SPaCQL"), ("cfcql", "CFCQL")):
        p = sps.ttest_ind(SCORES[(algo, "mpe-cn", "medium")], best, equal_var=False).pvalue
        assert main[("mpe-cn", "medium")][label]["tie"] == (p >= 0.05), (algo, p)
    assert main[("mpe-cn", "medium")]["SPaCQL"]["tie"] and not main[("mpe-cn", "medium")]["CFCQL"]["tie"]
    assert not main[("mpe-cn", "medium")]["BC"]["tie"]  # n = 1: never tested
    assert not main[("mpe-cn", "medium")]["PLCQL"]["tie"]  # the bold cell itself
    assert "Welch" in site["html"] and "p ≥ 0.05" in site["html"]
    rows = list(csv.DictReader(open(site["out"] / "tables" / "main.csv", encoding="utf-8")))
    spacql = next(r for r in rows if r["algo"] == "spacql" and r["dataset"] == "medium")
    assert spacql["tied_with_best"] == "1" and float(spacql["tie_p"]) == pytest.approx(
        sps.ttest_ind(SCORES[("spacql", "mpe-cn", "medium")], best, equal_var=False).pvalue)


def test_missing_cells_give_their_reason(site):
    main = site["tables"]["table-main"]
    smac = site["tables"]["table-smac"]
    iql = main[("mpe-cn", "expert")]["IQL"]
    assert iql["text"].startswith("— failed") and "missing-failed" in iql["class"]
    assert "CUDA out of memory" in site["html"]  # the error is on the page (tooltip and list)
    assert main[("mpe-cn", "expert")]["OMAR"]["text"].startswith("— not run")
    assert smac[("smax-2s3z", "medium")]["BC"]["text"].startswith("— not run")
    assert main[("mpe-cn", "medium")]["OMAR"]["text"].startswith("— not run")
    abl = site["tables"]["table-ablation"][("mpe-cn", "medium-replay")]
    assert abl["PLCQL k=n"]["text"].startswith("— not run")
    failed = json.loads((site["out"] / "results.json").read_text())["failed"]
    assert [(f["algo"], f["task"], f["dataset"], f["seed"]) for f in failed] == [("iql", "mpe-cn", "expert", 0)]


def test_paper_numbers_beside_ours_labelled_reported(site):
    main = site["tables"]["table-main"]
    cell = main[("mpe-cn", "medium")]["SPaCQL"]["text"]
    assert cell.index(fmt(SCORES[("spacql", "mpe-cn", "medium")])) < cell.index("paper (reported) 78.6 ± 6.4")
    assert "paper (reported) 114.9 ± 2.6" in main[("mpe-cn", "expert")]["OMAR"]["text"]  # even when not run
    abl = site["tables"]["table-ablation"][("mpe-cn", "medium-replay")]
    assert "paper (reported) 58.2 ± 8.4" in abl["PLCQL k=1"]["text"]
    assert "paper (reported), SC2 0.40 ± 0.10" in site["tables"]["table-smac"][("smax-2s3z", "medium")]["CFCQL"]["text"]
    assert 'id="show-paper"' in site["html"] and "#show-paper:not(:checked) ~ main .paper" in site["html"]


def test_headline_claims(site):
    rows = list(csv.DictReader(open(site["out"] / "tables" / "claims.csv", encoding="utf-8")))
    by = {r["key"]: r for r in rows}
    # PLCQL is best on expert, medium and smax medium, not on medium-replay (SPaCQL): 3 of 4
    assert (by["best"]["count"], by["best"]["of"]) == ("3", "4")
    # PLCQL beats SPaCQL on expert and medium, not medium-replay; no SPaCQL on smax: 2 of 3
    assert (by["beats"]["count"], by["beats"]["of"]) == ("2", "3")
    assert by["best"]["paper_pct"] == "66" and by["beats"]["paper_pct"] == "84"
    section = site["html"][site["html"].index('id="claims"'):site["html"].index('id="domain-main"')]
    assert "75% (3 of 4 tasks)" in section and "67% (2 of 3 tasks)" in section
    assert "66% (21 of 32 tasks)" in section and "84% (27 of 32 tasks)" in section


def test_smac_column_without_a_discrete_implementation_says_unsupported(tmp_path, monkeypatch):
    """Every SMAC column has a discrete implementation now; pretend OMAR has none and check the cell."""
    real = build._implementations
    monkeypatch.setattr(build, "_implementations",
                        lambda algo: {"continuous": object} if algo == "omar" else real(algo))
    res = make_fixture_results(tmp_path / "r")
    html = build.build_site(res, tmp_path / "s", now=NOW, bootstrap_reps=20, poi_reps=10).read_text(encoding="utf-8")
    p = Cells()
    p.feed(html)
    cell = p.tables["table-smac"][("smax-2s3z", "medium")]["OMAR"]
    assert cell["text"].startswith("— unsupported") and "missing-unsupported" in cell["class"]
    assert re.search(r'title="OMAR does not support discrete actions">unsupported<', html)
    assert p.tables["table-smac"][("smax-2s3z", "medium")]["BC"]["text"].startswith("— not run")


def test_claims_without_spacql_say_so(tmp_path):
    res = tmp_path / "r"
    for (algo, task, tier), scores in SCORES.items():
        if algo in ("plcql", "cfcql") and task == "mpe-cn":
            for seed, s in enumerate(scores):
                d = res / algo / tier / str(seed)
                d.mkdir(parents=True)
                (d / "final.json").write_text(json.dumps(final_json(algo, task, tier, seed, s)))
    html = build.build_site(res, tmp_path / "s", now=NOW, bootstrap_reps=50, poi_reps=20).read_text(encoding="utf-8")
    assert "— (no results for SPaCQL yet)" in html
    assert "No SPaCQL results yet" in html  # compute-cost section


def test_aggregates_match_direct_rliable(site):
    from rliable import library as rly
    from rliable import metrics

    rows = {r["algo"]: r for r in csv.DictReader(open(site["out"] / "tables" / "aggregates.csv", encoding="utf-8"))
            if r["table"] == "main"}
    assert set(rows) == {"cfcql", "spacql", "plcql"}  # BC lacks medium-replay: not aggregated
    tiers = ("expert", "medium", "medium-replay")
    mats = {a: np.array([SCORES[(a, "mpe-cn", t)] for t in tiers]).T for a in rows}
    np.random.seed(stats.BOOTSTRAP_SEED)  # rliable's bootstrap draws from the global RNG
    point, ci = rly.get_interval_estimates(
        mats, lambda x: np.array([metrics.aggregate_iqm(x), metrics.aggregate_mean(x)]), reps=REPS,
        random_state=np.random.RandomState(stats.BOOTSTRAP_SEED))
    for a, r in rows.items():
        assert float(r["iqm"]) == pytest.approx(point[a][0]) and float(r["mean"]) == pytest.approx(point[a][1])
        assert (float(r["iqm_ci_low"]), float(r["iqm_ci_high"])) == pytest.approx((ci[a][0][0], ci[a][1][0]))
        assert (float(r["mean_ci_low"]), float(r["mean_ci_high"])) == pytest.approx((ci[a][0][1], ci[a][1][1]))
        assert r["reps"] == str(REPS)
    html = site["html"]
    assert "Not aggregated (no results on every task): BC (2 of 3 tasks)" in html
    poi = {r["y"]: r for r in csv.DictReader(open(site["out"] / "tables" / "probability_of_improvement.csv", encoding="utf-8"))
           if r["table"] == "main"}
    assert set(poi) == {"cfcql", "spacql", "bc"}
    x = mats["plcql"]
    assert float(poi["spacql"]["p_improvement"]) == pytest.approx(metrics.probability_of_improvement(x, mats["spacql"]))
    assert float(poi["cfcql"]["p_improvement"]) == pytest.approx(1.0)
    assert poi["bc"]["tasks"] == "2"  # pairwise common tasks


def test_plots_are_inline_svg(site):
    html = site["html"]

    def section(name):
        start = html.index(f'<section id="{name}">')
        return html[start:html.index("</section>", start)]

    assert section("curves").count("<svg") == 2  # mpe-cn and smax-2s3z
    assert section("par").count("<svg") == 2
    assert "E[k] over training" in section("par") and "p(k) at the end of training" in section("par")
    compute = section("compute")
    assert compute.count("<svg") == 1 and "Q-evaluations per iteration" in compute
    assert section("aggregates").count("<svg") == 4  # intervals + profiles, main and SMAC
    rows = {(r["task"], r["algo"]): r for r in csv.DictReader(open(site["out"] / "tables" / "compute_cost.csv", encoding="utf-8"))}
    assert float(rows[("mpe-cn", "plcql")]["ms_per_round"]) == pytest.approx(25.0)
    assert float(rows[("mpe-cn", "spacql")]["ms_per_round"]) == pytest.approx(100.0)
    assert rows[("mpe-cn", "plcql")]["q_evals_per_transition"] == "1"
    assert rows[("mpe-cn", "spacql")]["q_evals_per_transition"] == str(N_AGENTS_CN)
    assert rows[("smax-2s3z", "spacql")]["q_evals_per_transition"] == "5"
    par = {(r["task"], r["dataset"]): r for r in csv.DictReader(open(site["out"] / "tables" / "par_policy.csv", encoding="utf-8"))}
    assert set(par) == {("mpe-cn", "expert"), ("mpe-cn", "medium"), ("mpe-cn", "medium-replay"), ("smax-2s3z", "medium")}
    assert par[("mpe-cn", "expert")]["runs"] == "3"
    ids = re.findall(r'<clipPath id="([^"]+)"', html)
    assert len(ids) == len(set(ids))  # figures never share clip-path ids
    assert not re.search(r'(src|href)="(https?:)?//', html)  # nothing is fetched
    assert "<metadata>" not in html


def test_every_table_has_csv_and_json_downloads(site):
    hrefs = re.findall(r'href="([^"#][^"]*)"', site["html"])
    local = [h for h in hrefs if not h.startswith(("http:", "https:"))]
    assert local, "no download links"
    for h in local:
        assert (site["out"] / h).is_file(), h
    for stem in ("main", "smac", "ablation", "aggregates", "probability_of_improvement", "claims", "par_policy", "compute_cost", "skipped"):
        assert f"tables/{stem}.csv" in local and f"tables/{stem}.json" in local, stem
        data = json.loads((site["out"] / "tables" / f"{stem}.json").read_text())
        with open(site["out"] / "tables" / f"{stem}.csv", encoding="utf-8") as f:
            assert len(list(csv.DictReader(f))) == len(data["rows"]), stem
    main = json.loads((site["out"] / "tables" / "main.json").read_text())["rows"]
    assert {r["status"] for r in main} == {"ok", "not run", "failed"}


def test_provenance_lists_env_versions(site):
    footer = site["html"][site["html"].index('<footer id="provenance">'):]
    assert "mpe2</code> 1.1.1" in footer and "jaxmarl</code> 0.0.7" in footer
    assert "MuJoCo: not used by these results" in footer


def test_svg_text_is_escaped(tmp_path):
    res = tmp_path / "r"
    d = res / "x"
    d.mkdir(parents=True)
    evil = "<script>alert(1)</script>$x$"
    (d / "final.json").write_text(json.dumps({**final_json("plcql", "mpe-cn", "expert", 0, 50.0), "algo": evil}))
    html = build.build_site(res, tmp_path / "s", now=NOW, bootstrap_reps=20, poi_reps=10).read_text(encoding="utf-8")
    assert "<script" not in html and "&lt;script&gt;alert(1)&lt;/script&gt;$x$" in html


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
        assert ours[a]["mean"] == pytest.approx(metrics.aggregate_mean(FIXED[a]))
        assert ours[a]["iqm_ci"] == pytest.approx((ci[a][0][0], ci[a][1][0]))
        assert ours[a]["mean_ci"] == pytest.approx((ci[a][0][1], ci[a][1][1]))
    assert stats.iqm_and_mean(FIXED, reps=300, seed=7) == ours  # reproducible


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
    assert stats.improvement_probability(x, x) == pytest.approx(0.5)
    ours = stats.probability_of_improvement(x, y, reps=100, seed=5)
    np.random.seed(5)
    point, ci = rly.get_interval_estimates({"x,y": (x, y)}, metrics.probability_of_improvement, reps=100)
    assert ours["p"] == pytest.approx(point["x,y"])
    assert ours["ci"] == pytest.approx((ci["x,y"][0][0], ci["x,y"][1][0]))


def test_welch_and_ties():
    from scipy import stats as sps

    a, b = [1.0, 2.0, 3.0, 4.0], [2.5, 3.5, 4.5]
    assert stats.welch_p(a, b) == pytest.approx(sps.ttest_ind(a, b, equal_var=False).pvalue)
    assert stats.welch_p([1.0], b) is None
    assert stats.welch_p([2.0, 2.0], [2.0, 2.0]) == 1.0 and stats.welch_p([2.0, 2.0], [3.0, 3.0]) == 0.0
    t = stats.ties_with_best([[10.0, 11.0, 12.0], [9.0, 11.0, 12.5], [1.0, 1.5, 1.2], [11.0], None], [0])
    assert [x["tied"] for x in t] == [False, True, False, False, False]
    assert [x["tested"] for x in t] == [False, True, True, False, False]


def test_score_matrix_and_claims():
    m, k = stats.score_matrix([[1.0, 2.0, 3.0], [4.0, 5.0]])
    assert k == 2 and m.tolist() == [[1.0, 4.0], [2.0, 5.0]]
    rows = [
        {"means": {"plcql": 2.0, "spacql": 1.0}, "best": ["plcql"]},
        {"means": {"plcql": 1.0, "spacql": 1.0}, "best": ["plcql", "spacql"]},
        {"means": {"plcql": 0.0, "bc": 3.0}, "best": ["bc"]},
        {"means": {"bc": 3.0}, "best": ["bc"]},
    ]
    c = stats.headline_claims(rows)
    assert (c["best"], c["best_of"], c["beats"], c["beats_of"]) == (2, 3, 1, 2)
    assert stats.headline_claims([])["best_pct"] is None
