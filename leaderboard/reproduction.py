"""The PLCQL reproduction study's table (docs/reproduction.md), computed from result files only.

For each (task, tier) cell and algorithm: the number of seeds, and the score in the leaderboard's six
views (final policy, mean of the last 10 evaluation points, best evaluation point; under this suite's
reference returns and under OMAR's: leaderboard/scoring.py), the PAR variants' expected k and the critic's
value level late in training (`late_par`), and how many runs ended with a collapsed PAR policy (n/a: no
learned PAR, e.g. a fixed k or a baseline) or a diverged critic.

    python -m plcql_bench.leaderboard.reproduction --results leaderboard/results/paper \\
        --cell mpe-cn/medium-replay --cell mpe-cn/random
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

from plcql_bench.leaderboard.analysis import run_metrics
from plcql_bench.leaderboard.cells import critic_diverged
from plcql_bench.leaderboard.load import learns_par, with_critic_check, with_par_collapse
from plcql_bench.leaderboard.scoring import SCORINGS, View, run_values
from plcql_bench.suite.core.schema import scan_records

STUDY_ALGOS = ["bc", "cfcql", "spacql", "plcql", "plcql-k1", "plcql-k2", "plcql-kn", "plcql-w1", "plcql-uniform",
               "plcql-t0.1", "plcql-t10", "plcql-target-actors", "plcql-kn-target", "plcql-member-clip",
               "plcql-joint-clip", "plcql-lcb"]
# final, last10, best; ours, then OMAR's (the study's tables in docs/reproduction.md keep this order, whatever
# the board's default normalisation)
ORDER = [View(s, n).key for n in ("ours", "omar") for s in SCORINGS]


LATE_SHARE = 0.2  # the last 20 % of a run's evaluation points, as the PAR collapse rule


def late_par(history: list[dict]) -> dict[str, float | None]:
    """Over the last LATE_SHARE of the evaluation points that carry PAR diagnostics: E[k] under π_par on
    the probe batch (Σ_k k·p_k) and the first member's Q on the probe at the k = 1 replacements (the same
    states for every variant). None for runs without them (the baselines)."""
    points = [h for h in history if "diag/p_k1" in h and "diag/q1_k1" in h]
    if not points:
        return {"E_k": None, "q_probe": None}
    late = points[int(len(points) * (1 - LATE_SHARE)):] or points[-1:]
    n = sum(1 for k in late[0] if k.startswith("diag/p_k"))
    ek = statistics.mean(sum(i * h[f"diag/p_k{i}"] for i in range(1, n + 1)) for h in late)
    return {"E_k": ek, "q_probe": statistics.mean(h["diag/q1_k1"] for h in late)}


def collect(results: Path, cells: list[str], algos: list[str]) -> dict:
    """{cell: {algo: [{view key: value, "collapsed": bool | None}]}} over the valid result files under
    `results` (damaged ones are reported on stderr and left out, as the leaderboard does)."""
    good, bad = scan_records(results)
    for d in bad:
        print(f"skipped {d.path}: {d.reason}", file=sys.stderr)
    out: dict = {}
    for path, rec in good:
        cell = f"{rec.task}/{rec.dataset}"
        if cell not in cells or rec.algo not in algos:
            continue
        vals = run_values(rec)
        history = run_metrics(results, path)  # read once for the three checks
        rec = with_par_collapse(results, path, rec, history)
        vals["collapsed"] = bool(rec.par_collapse) if learns_par(rec) else None
        vals["diverged"] = critic_diverged(with_critic_check(results, path, rec, history))
        vals.update(late_par(history))
        out.setdefault(cell, {}).setdefault(rec.algo, []).append(vals)
    return {c: {a: out[c][a] for a in algos if a in out.get(c, {})} for c in cells if c in out}


def mean_std(vals: list[float | None], digits: int = 1) -> str:
    """Mean ± std of the values that are not None as the tables print it ("—" for none, the value alone for one)."""
    vals = [v for v in vals if v is not None]
    if not vals:
        return "—"
    if len(vals) == 1:
        return f"{vals[0]:.{digits}f}"
    return f"{statistics.mean(vals):.{digits}f} ± {statistics.stdev(vals):.{digits}f}"


def markdown(table: dict) -> str:
    head = [k.replace("-", " ") for k in ORDER]
    lines = []
    for cell, algos in table.items():
        lines += [f"**{cell}** (normalised score, mean ± std over seeds; `ours` = this suite's reference returns, "
                  "`omar` = OMAR's)", "",
                  "| algorithm | seeds | " + " | ".join(head) + " | E[k] late | Q probe late | PAR collapsed | "
                  "critic diverged |",
                  "|---|---|" + "---|" * len(head) + "---|---|---|---|"]
        for algo, runs in algos.items():
            flags = [r["collapsed"] for r in runs if r["collapsed"] is not None]
            coll = f"{sum(flags)} of {len(flags)}" if flags else "n/a"
            lines.append(f"| {algo} | {len(runs)} | " + " | ".join(mean_std([r[k] for r in runs]) for k in ORDER)
                         + f" | {mean_std([r['E_k'] for r in runs], 2)} | {mean_std([r['q_probe'] for r in runs])}"
                         + f" | {coll} | {sum(x['diverged'] for x in runs)} of {len(runs)} |")
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
