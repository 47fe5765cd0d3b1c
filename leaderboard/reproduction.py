"""The PLCQL reproduction study's table (docs/reproduction.md), computed from result files only.

For each (task, tier) cell and algorithm: the number of seeds, and the score three ways (final policy,
mean of the last 10 evaluation points, best evaluation point), each under this suite's reference
returns (the dataset's, as the leaderboard) and under OMAR's (the paper's convention), plus how many runs
ended with a collapsed PAR policy (n/a: no PAR diagnostics in the result, e.g. a fixed k or a baseline).

    python -m plcql_bench.leaderboard.reproduction --results leaderboard/results/paper \\
        --cell mpe-cn/medium-replay --cell mpe-cn/random
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

from plcql_bench.datasets.importers import PAPER_REFERENCES

STUDY_ALGOS = ["bc", "cfcql", "spacql", "plcql", "plcql-k1", "plcql-k2", "plcql-kn", "plcql-w1", "plcql-uniform",
               "plcql-t0.1", "plcql-t10", "plcql-lcb"]
LAST = 10


def run_scores(final: dict) -> dict[str, float] | None:
    """{final, last10, best} x {ours, omar} for one finished run (normalised, x100); None for win-rate tasks."""
    task = final["task"]
    if task not in PAPER_REFERENCES or final.get("score") is None:
        return None
    curve = final["curve"]
    fe = final["final_eval"]
    R, S = fe["return_mean"], fe["normalised_score"]
    e, r, _ = PAPER_REFERENCES[task]
    omar = lambda ret: 100.0 * (ret - r) / (e - r)  # noqa: E731
    tail = curve[-LAST:]
    return {
        "final/ours": S, "final/omar": omar(R),
        "last10/ours": statistics.mean(p["score"] for p in tail),
        "last10/omar": statistics.mean(omar(p["return_mean"]) for p in tail),
        "best/ours": max(p["score"] for p in curve), "best/omar": max(omar(p["return_mean"]) for p in curve),
    }


def collect(results: Path, cells: list[str], algos: list[str]) -> dict:
    """{cell: {algo: [run scores + collapse flag]}} over the finished runs under `results` (a profile dir)."""
    out: dict = {}
    for cell in cells:
        task, tier = cell.split("/")
        for algo in algos:
            runs = []
            for f in sorted((results / algo / task / tier).glob("seed*/final.json")):
                d = json.loads(f.read_text())
                if d.get("status") != "done":
                    continue
                s = run_scores(d)
                if s is None:
                    continue
                s["collapsed"] = bool(d.get("par_collapse")) if "par_collapse" in d else None
                s["seed"] = d["seed"]
                runs.append(s)
            if runs:
                out.setdefault(cell, {})[algo] = runs
    return out


def _fmt(vals: list[float]) -> str:
    if len(vals) == 1:
        return f"{vals[0]:.1f}"
    return f"{statistics.mean(vals):.1f} ± {statistics.stdev(vals):.1f}"


def markdown(table: dict) -> str:
    cols = ["final/ours", "last10/ours", "best/ours", "final/omar", "last10/omar", "best/omar"]
    lines = []
    for cell, algos in table.items():
        lines += [f"**{cell}** (normalised score; mean ± std over seeds; `ours` = this suite's reference returns, "
                  "`omar` = OMAR's)", "",
                  "| algorithm | seeds | " + " | ".join(c.replace("/", " ") for c in cols) + " | PAR collapsed |",
                  "|---|---|" + "---|" * len(cols) + "---|"]
        for algo, runs in algos.items():
            cells = [_fmt([r[c] for r in runs]) for c in cols]
            flags = [r["collapsed"] for r in runs if r["collapsed"] is not None]
            coll = f"{sum(flags)} of {len(flags)}" if flags else "n/a"
            lines.append(f"| {algo} | {len(runs)} | " + " | ".join(cells) + f" | {coll} |")
        lines.append("")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--results", type=Path, default=Path("leaderboard/results/paper"))
    ap.add_argument("--cell", action="append", default=None, help="task/tier (repeatable)")
    ap.add_argument("--algo", action="append", default=None)
    a = ap.parse_args(argv)
    print(markdown(collect(a.results, a.cell or ["mpe-cn/medium-replay", "mpe-cn/random"], a.algo or STUDY_ALGOS)))


if __name__ == "__main__":
    main()
