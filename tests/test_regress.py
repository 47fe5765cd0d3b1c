"""The nightly regression check: the committed band passes on results equal to it, and a
synthetic drop injected into fixture results fails with a report that names the cell."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from plcql_bench.suite.cli import cli
from plcql_bench.suite.regress import compare, failed, make_band

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
    from plcql_bench.suite.profiles import load_profile  # noqa: PLC0415
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


def test_missing_cell_fails_and_rise_is_not_a_failure(tmp_path):
    band = _band()
    cells = sorted(band["cells"])
    _write_results(tmp_path / "results", band, {cells[0]: band["cells"][cells[0]]["tolerance"] + 5.0})
    res = _regress(tmp_path)
    assert res.exit_code == 0 and "improved" in res.output
    # Remove one cell's runs entirely: missing fails.
    algo, task, dataset = cells[1].split("/")
    for final in (tmp_path / "results" / band["profile"] / algo / task / dataset).rglob("final.json"):
        final.unlink()
    res = _regress(tmp_path)
    assert res.exit_code == 1 and f"**{cells[1]}**: missing" in res.output


def test_make_band_tolerance_rule():
    band = make_band({"a/t/d": [10.0, 30.0], "b/t/d": [5.0, 5.0]}, "p")
    assert band["cells"]["a/t/d"]["mean"] == 20.0
    assert band["cells"]["a/t/d"]["tolerance"] == pytest.approx(2 * 14.1421, abs=1e-3)
    assert band["cells"]["b/t/d"]["tolerance"] == 10.0
    rows = compare(band, {"a/t/d": [20.0 - 30.0], "b/t/d": [5.0]})
    assert failed(rows) and [r.verdict for r in rows] == ["regressed", "ok"]
