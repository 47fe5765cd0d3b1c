"""The nightly regression check: the committed band passes on results equal to it, and a
synthetic drop injected into fixture results fails with a report that names the cell."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from plcql_bench.suite.commands.main import cli
from plcql_bench.suite.runs.regress import compare, failed, failing, make_band

ROOT = Path(__file__).resolve().parent.parent
BAND = ROOT / "ci" / "reference_band.json"


def _band() -> dict:
    return json.loads(BAND.read_text())


def _write_results(results: Path, band: dict, shift: dict[str, float] | None = None) -> None:
    """Fixture runs whose seed mean equals the band's mean (plus `shift` per cell)."""
    shift = shift or {}
    for cell, ref in band["cells"].items():
        algo, task, dataset = cell.split("/")
        n = max(2, int(ref["n"]))
        for seed in range(n):
            spread = (seed - (n - 1) / 2) * 0.5             # symmetric: the mean is unchanged
            run = results / band["profile"] / algo / task / dataset / f"seed{seed}-fixture"
            run.mkdir(parents=True)
            (run / "final.json").write_text(json.dumps({
                "algo": algo, "task": task, "dataset": dataset, "seed": seed, "profile": band["profile"],
                "status": "done", "score": ref["mean"] + spread + shift.get(cell, 0.0)}))


def _regress(tmp_path: Path, *args: str):
    return CliRunner().invoke(cli, ["--results-dir", str(tmp_path / "results"), "regress",
                                    "--band", str(BAND), "--report", str(tmp_path / "report.md"), *args])


def test_committed_band_is_generated_and_matches_profile():
    band = _band()
    assert band["profile"] == "nightly" and band["cells"]
    from plcql_bench.suite.runs.profiles import load_profile  # noqa: PLC0415
    prof = load_profile("nightly")
    expected = {f"{a}/{t}/{d}" for a in prof.matrix["algos"] for t in prof.matrix["tasks"]
                for d in prof.matrix["tiers"]}
    assert set(band["cells"]) == expected
    for ref in band["cells"].values():
        assert ref["tolerance"] > 0 and ref["n"] == len(prof.matrix["seeds"])


def test_band_passes_on_results_equal_to_it(tmp_path):
    band = _band()
    _write_results(tmp_path / "results", band)
    res = _regress(tmp_path)
    assert res.exit_code == 0, res.output
    assert "# Nightly regression: PASS" in (tmp_path / "report.md").read_text()


def test_synthetic_regression_fails_and_is_reported(tmp_path):
    band = _band()
    cell = sorted(band["cells"])[0]
    drop = band["cells"][cell]["tolerance"] + 5.0
    _write_results(tmp_path / "results", band, {cell: -drop})
    res = _regress(tmp_path)
    assert res.exit_code == 1, res.output
    text = (tmp_path / "report.md").read_text()
    assert "# Nightly regression: FAIL" in text
    assert f"**{cell}**: regressed" in text and "1 regressed" in text


def test_missing_cell_fails_and_a_rise_fails_a_two_sided_band(tmp_path):
    band = _band()
    assert band["fail_on"] == "both"
    cells = sorted(band["cells"])
    _write_results(tmp_path / "results", band, {cells[0]: band["cells"][cells[0]]["tolerance"] + 5.0})
    res = _regress(tmp_path)
    assert res.exit_code == 1 and f"**{cells[0]}**: improved" in res.output
    # A one-sided band (no fail_on) reports the rise without failing.
    one_sided = {k: v for k, v in band.items() if k != "fail_on"}
    (tmp_path / "one.json").write_text(json.dumps(one_sided))
    res = CliRunner().invoke(cli, ["--results-dir", str(tmp_path / "results"), "regress",
                                   "--band", str(tmp_path / "one.json")])
    assert res.exit_code == 0 and "improved" in res.output
    # Remove one cell's runs entirely: missing fails.
    algo, task, dataset = cells[1].split("/")
    for final in (tmp_path / "results" / band["profile"] / algo / task / dataset).rglob("final.json"):
        final.unlink()
    res = _regress(tmp_path)
    assert res.exit_code == 1 and f"**{cells[1]}**: missing" in res.output


def test_make_band_tolerance_rule():
    # a: seeds 10/30 and 0/20 (pooled std 14.14); b: constant (pooled std 0 -> the floor).
    band = make_band({"a/t/d": [10.0, 30.0], "a/t/e": [0.0, 20.0], "b/t/d": [5.0, 5.0]}, "p")
    a = band["cells"]["a/t/d"]
    assert a["mean"] == 20.0 and a["pooled_std"] == pytest.approx(14.1421, abs=1e-3)
    assert a["tolerance"] == pytest.approx(3.5 * 14.1421 * (2 / 2) ** 0.5, abs=1e-3)
    assert band["cells"]["b/t/d"]["tolerance"] == 10.0 and band["fail_on"] == "both"
    rows = compare(band, {"a/t/d": [20.0 - 50.0], "a/t/e": [10.0 + 50.0], "b/t/d": [5.0]})
    assert [r.verdict for r in rows] == ["regressed", "improved", "ok"]
    assert failed(rows, band) and failed(rows[1:], band) and not failed(rows[1:], {})


# ------------------------------------------------ the band's self-test (ci/nightly_selftest.py)
def _selftest():
    spec = importlib.util.spec_from_file_location("nightly_selftest", ROOT / "ci" / "nightly_selftest.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_selftest_variants_change_only_what_they_say():
    st = _selftest()
    raw = st.nightly_raw()
    band_seeds = set(raw["matrix"]["seeds"])
    seed_sets = [set(st.noise_variant(raw, s)[0][0]["matrix"]["seeds"]) for s in st.NOISE_SEED_SETS]
    assert all(len(s) == len(band_seeds) for s in seed_sets)
    assert not (seed_sets[0] & seed_sets[1]) and not ((seed_sets[0] | seed_sets[1]) & band_seeds)
    # cql_alpha x 100 reaches exactly the algorithms that have it, at each tier's own value.
    from plcql_bench.suite.runs.profiles import _parse, load_profile  # noqa: PLC0415
    from plcql_bench.suite.runs.runner import Cell, resolve_config  # noqa: PLC0415

    clean = load_profile("nightly")
    calls = st.injected_variant(raw, "cql_alpha", lambda v: 100.0 * v)
    assert st.algos_with(raw, "cql_alpha") == {"cfcql", "plcql"}
    covered = set()
    for prof_raw, (only,) in calls:
        fields = dict(kv.split("=") for kv in only.split(","))
        cell = Cell(fields["algo"], fields["task"], fields["dataset"], 0)
        got, ref = resolve_config(cell, _parse(prof_raw, "t")), resolve_config(cell, clean)
        covered.add((cell.algo, cell.tier))
        if hasattr(ref, "cql_alpha"):
            assert got.cql_alpha == pytest.approx(100.0 * ref.cql_alpha) and ref.cql_alpha > 0
        assert {k: v for k, v in vars(got).items() if k != "cql_alpha"} == \
            {k: v for k, v in vars(ref).items() if k != "cql_alpha"}
    assert covered == {(a, q) for a in raw["matrix"]["algos"] for q in raw["matrix"]["tiers"]}


def test_injected_config_is_what_the_run_trains_with(tmp_path):
    """End to end at 2 rounds: the injected profile's run records cql_alpha x 100 in config.json."""
    st = _selftest()
    raw = st.nightly_raw()
    raw["datasets"]["episodes"]["default"] = 8
    raw["train"].update(updates={"default": 2}, eval_every=1, checkpoint_every=1, eval_episodes=1,
                        final_eval_episodes=1)
    raw["matrix"]["seeds"] = [0]
    prof_raw, only = next(c for c in st.injected_variant(raw, "cql_alpha", lambda v: 100.0 * v)
                          if c[1] == ["algo=cfcql,task=mpe-cn,dataset=expert"])
    path = tmp_path / "p.yaml"
    path.write_text(yaml.safe_dump(prof_raw))
    res = CliRunner().invoke(cli, ["--data-dir", str(tmp_path / "d"), "--results-dir", str(tmp_path / "r"),
                                   "all", "--profile", str(path), "--only", only[0]])
    assert res.exit_code == 0, res.output
    (config,) = (tmp_path / "r" / "nightly").rglob("config.json")
    assert json.loads(config.read_text())["config"]["cql_alpha"] == pytest.approx(250.0)  # CN expert: 2.5


def test_band_catches_the_recorded_injected_regression_and_not_seed_noise():
    """ci/band_evidence.json holds the scores of real nightly-profile runs that `make
    nightly-selftest` measured against this very band: two seed sets disjoint from the band's, and
    the band's seeds with cql_alpha x 100. The committed band must pass both seed-noise runs and
    fail the injected one, with flagged cells of injected algorithms only (BC, untouched, must not
    be flagged; measured: CFCQL's cells catch it, PLCQL's stay within their tolerance)."""
    band, evidence = _band(), json.loads((ROOT / "ci" / "band_evidence.json").read_text())
    assert evidence["band_note"] == band["note"], "the band changed: rerun `make nightly-selftest`"
    expects = []
    for name, variant in evidence["variants"].items():
        assert set(variant["cells"]) == set(band["cells"]), name
        assert all(len(s) == band["cells"][c]["n"] for c, s in variant["cells"].items()), name
        rows = compare(band, variant["cells"])
        flagged = {r.cell.split("/")[0] for r in rows if r.verdict in failing(band)}
        if variant["expect"] == "pass":
            assert not failed(rows, band), (name, flagged)
        else:
            assert failed(rows, band) and flagged and flagged <= set(evidence["injection"]["algos"]), (name, flagged)
        expects.append(variant["expect"])
    assert sorted(expects) == ["fail", "pass", "pass"]
    assert set(evidence["injection"]["algos"]) == {"cfcql", "plcql"}
