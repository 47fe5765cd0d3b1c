"""`plcql-bench regress`: compare a profile's results with a committed reference band.

The band (ci/reference_band.json) holds, per cell (algo, task, dataset), the seed-mean of the
headline score and a tolerance. A cell whose mean falls more than its tolerance below the band
is a regression, and makes the command exit 1; a rise beyond it is reported as an improvement
(not a failure); a cell of the band without results is missing (a failure). The band is only
ever written by `--update-band` from real results, never by hand."""

from __future__ import annotations

import json
import math
import statistics
from dataclasses import dataclass
from pathlib import Path

import click

BAND_VERSION = 1
# The tolerance of a cell: max(MIN_TOLERANCE, SEED_STD_FACTOR x the seed std of the reference).
MIN_TOLERANCE = 10.0
SEED_STD_FACTOR = 2.0


def collect(results_dir: Path, profile: str) -> dict[str, list[float]]:
    """Headline scores of the finished runs of `profile`, by cell key algo/task/dataset."""
    cells: dict[str, list[float]] = {}
    for final in sorted((Path(results_dir) / profile).rglob("final.json")):
        blob = json.loads(final.read_text())
        if blob.get("profile", profile) != profile or blob.get("score") is None:
            continue
        key = f"{blob['algo']}/{blob['task']}/{blob['dataset']}"
        cells.setdefault(key, []).append(float(blob["score"]))
    return cells


def make_band(cells: dict[str, list[float]], profile: str, note: str = "") -> dict:
    out = {}
    for key, scores in sorted(cells.items()):
        std = statistics.stdev(scores) if len(scores) > 1 else 0.0
        out[key] = {"mean": round(statistics.fmean(scores), 4), "seed_std": round(std, 4),
                    "n": len(scores), "tolerance": round(max(MIN_TOLERANCE, SEED_STD_FACTOR * std), 4)}
    return {"band_version": BAND_VERSION, "profile": profile, "score": "final normalised score, seed mean",
            "tolerance_rule": f"max({MIN_TOLERANCE}, {SEED_STD_FACTOR} x seed std)", "note": note, "cells": out}


@dataclass
class Row:
    cell: str
    ref: float
    tol: float
    now: float | None
    n: int

    @property
    def delta(self) -> float | None:
        return None if self.now is None else self.now - self.ref

    @property
    def verdict(self) -> str:
        if self.now is None or math.isnan(self.now):
            return "missing"
        if self.delta < -self.tol:
            return "regressed"
        if self.delta > self.tol:
            return "improved"
        return "ok"


def compare(band: dict, cells: dict[str, list[float]]) -> list[Row]:
    rows = []
    for key, ref in sorted(band["cells"].items()):
        scores = cells.get(key, [])
        now = statistics.fmean(scores) if scores else None
        rows.append(Row(key, float(ref["mean"]), float(ref["tolerance"]), now, len(scores)))
    return rows


def failed(rows: list[Row]) -> bool:
    return any(r.verdict in ("regressed", "missing") for r in rows)


def report(rows: list[Row], band: dict, extra: list[str]) -> str:
    """A markdown report: the verdict, what moved (largest first), then every cell."""
    bad = [r for r in rows if r.verdict in ("regressed", "missing")]
    moved = sorted((r for r in rows if r.verdict != "ok"),
                   key=lambda r: -abs(r.delta) if r.delta is not None else -math.inf)
    lines = [f"# Nightly regression: {'FAIL' if bad else 'PASS'}", "",
             f"Profile `{band['profile']}`; score: {band.get('score', 'score')}; a cell fails when its "
             f"mean drops more than its tolerance ({band.get('tolerance_rule', '')}) below the band.", "",
             f"{len(rows)} cells: {sum(r.verdict == 'ok' for r in rows)} within the band, "
             f"{sum(r.verdict == 'improved' for r in rows)} improved, "
             f"{sum(r.verdict == 'regressed' for r in rows)} regressed, "
             f"{sum(r.verdict == 'missing' for r in rows)} missing.", ""]
    lines += ["## What moved", ""]
    if moved:
        for r in moved:
            if r.verdict == "missing":
                lines.append(f"- **{r.cell}**: missing (no finished run; band {r.ref:.2f})")
            else:
                lines.append(f"- **{r.cell}**: {r.verdict}, {r.ref:.2f} -> {r.now:.2f} "
                             f"({r.delta:+.2f}, tolerance {r.tol:.2f})")
    else:
        lines.append("Nothing moved beyond its tolerance.")
    lines += ["", "## All cells", "", "| cell | band | tolerance | now | delta | seeds | verdict |",
              "|---|---|---|---|---|---|---|"]
    for r in rows:
        now = "-" if r.now is None else f"{r.now:.2f}"
        delta = "-" if r.delta is None else f"{r.delta:+.2f}"
        lines.append(f"| {r.cell} | {r.ref:.2f} | {r.tol:.2f} | {now} | {delta} | {r.n} | {r.verdict} |")
    if extra:
        lines += ["", "Cells with results but not in the band (not compared): " + ", ".join(extra)]
    return "\n".join(lines) + "\n"


@click.command("regress")
@click.option("--profile", default="nightly", show_default=True)
@click.option("--band", "band_path", type=click.Path(path_type=Path), default=Path("ci/reference_band.json"),
              show_default=True, help="Reference band (JSON).")
@click.option("--report", "report_path", type=click.Path(path_type=Path), default=None,
              help="Write the markdown report here (it is always printed).")
@click.option("--update-band", is_flag=True, help="Write the band from these results instead of comparing.")
@click.option("--note", default="", help="With --update-band: a note stored in the band (how it was made).")
@click.pass_obj
def regress(obj, profile, band_path, report_path, update_band, note) -> None:
    """Compare PROFILE's results with a reference band; exit 1 on a significant drop."""
    cells = collect(obj["results_dir"], profile)
    if update_band:
        if not cells:
            raise click.ClickException(f"no finished {profile} runs under {obj['results_dir']}")
        band = make_band(cells, profile, note)
        band_path.parent.mkdir(parents=True, exist_ok=True)
        band_path.write_text(json.dumps(band, indent=2, sort_keys=True) + "\n")
        click.echo(f"wrote {band_path}: {len(band['cells'])} cells from {sum(map(len, cells.values()))} runs")
        return
    band = json.loads(band_path.read_text())
    if band.get("profile") != profile:
        raise click.ClickException(f"{band_path} is a band for profile {band.get('profile')!r}, not {profile!r}")
    rows = compare(band, cells)
    text = report(rows, band, sorted(set(cells) - set(band["cells"])))
    if report_path:
        report_path.parent.mkdir(parents=True, exist_ok=True)
        report_path.write_text(text)
    click.echo(text, nl=False)
    if failed(rows):
        raise SystemExit(1)
