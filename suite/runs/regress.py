"""`plcql-bench regress`: compare a profile's results with a committed reference band.

The band (ci/reference_band.json) holds, per cell (algo, task, dataset), the seed-mean of the
headline score and a tolerance. A cell whose mean falls more than its tolerance below the band
has regressed; one that rises more than its tolerance above it has improved; a cell of the band
without results is missing. Regressed and missing cells make the command exit 1, and so do
improved ones when the band says `"fail_on": "both"` (the nightly band does: at its short budget
an unexplained rise is as much a change in learning as a drop, e.g. cql_alpha x 100 pulls CFCQL
towards behaviour cloning, which scores higher there). The band is only ever written by
`--update-band` from real results, never by hand.

Tolerance of a cell: max(MIN_TOLERANCE, Z x s x sqrt(2 / n)), where n is the band's seeds per cell
and s the seed std of the cell's algorithm pooled over its cells (more degrees of freedom than one
cell's n - 1). sqrt(2 / n) s is the standard deviation of the difference of two n-seed means, so
the band tolerates Z of those; MIN_TOLERANCE keeps near-deterministic cells (BC) from failing on
the last digits of another machine's arithmetic."""

from __future__ import annotations

import json
import math
import statistics
from dataclasses import dataclass
from pathlib import Path


BAND_VERSION = 2
MIN_TOLERANCE = 10.0   # normalised points
Z = 3.5                # standard deviations of a difference of seed means (see the docstring)


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


def pooled_std(cells: dict[str, list[float]]) -> dict[str, float]:
    """Per algorithm, the seed std pooled over its cells: sqrt(sum of squared deviations from
    each cell's mean / sum of (n - 1)); 0 when no cell has two seeds."""
    ss: dict[str, float] = {}
    dof: dict[str, int] = {}
    for key, scores in cells.items():
        algo, m = key.split("/")[0], statistics.fmean(scores)
        ss[algo] = ss.get(algo, 0.0) + sum((s - m) ** 2 for s in scores)
        dof[algo] = dof.get(algo, 0) + len(scores) - 1
    return {a: math.sqrt(ss[a] / dof[a]) if dof[a] else 0.0 for a in ss}


def make_band(cells: dict[str, list[float]], profile: str, note: str = "") -> dict:
    pooled = pooled_std(cells)
    out = {}
    for key, scores in sorted(cells.items()):
        std = statistics.stdev(scores) if len(scores) > 1 else 0.0
        s = pooled[key.split("/")[0]]
        out[key] = {"mean": round(statistics.fmean(scores), 4), "seed_std": round(std, 4),
                    "pooled_std": round(s, 4), "n": len(scores),
                    "tolerance": round(max(MIN_TOLERANCE, Z * s * math.sqrt(2 / len(scores))), 4)}
    return {"band_version": BAND_VERSION, "profile": profile, "score": "final normalised score, seed mean",
            "tolerance_rule": f"max({MIN_TOLERANCE:g}, {Z:g} x pooled seed std of the algorithm x sqrt(2/n))",
            "fail_on": "both", "note": note, "cells": out}


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


def failing(band: dict) -> tuple[str, ...]:
    """The verdicts that fail: a drop or a missing cell; a rise too where the band says so."""
    return ("regressed", "missing", "improved") if band.get("fail_on") == "both" else ("regressed", "missing")


def failed(rows: list[Row], band: dict | None = None) -> bool:
    bad = failing(band or {})
    return any(r.verdict in bad for r in rows)


def report(rows: list[Row], band: dict, extra: list[str]) -> str:
    """A markdown report: the verdict, what moved (largest first), then every cell."""
    bad = [r for r in rows if r.verdict in failing(band)]
    moved = sorted((r for r in rows if r.verdict != "ok"),
                   key=lambda r: -abs(r.delta) if r.delta is not None else -math.inf)
    how = ("moves more than its tolerance away from the band, up or down" if band.get("fail_on") == "both"
           else "drops more than its tolerance below the band")
    lines = [f"# Nightly regression: {'FAIL' if bad else 'PASS'}", "",
             f"Profile `{band['profile']}`; score: {band.get('score', 'score')}; a cell fails when its "
             f"mean {how} (tolerance: {band.get('tolerance_rule', '')}).", "",
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
