"""Official-code checks on the page (suite/core/official.py: the reference's own code trained on this suite's
dataset and scored by this suite's protocol, `python -m plcql_bench.suite.runs.reference_score`).

They are never ranked, never bold and never enter a verdict: they sit beside our cell in the comparison with
the paper, so a reader can tell a gap that comes with our data (the official code is as far from the paper as
we are) from one that comes with our implementation. Only the final policy is comparable: the official loop
evaluates every 200 rounds on fewer episodes than our runs, so the last-10 and best views show none.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

from plcql_bench.leaderboard.cells import cell_stats
from plcql_bench.leaderboard.scoring import DEFAULT_VIEW, View, omar_reference, omar_score
from plcql_bench.suite.core.official import CODES, load_checks
from plcql_bench.suite.core.schema import Damaged

__all__ = ["OfficialCell", "load_official", "official_cells", "official_dir", "official_rows"]


def official_dir(results_dir: Path) -> Path:
    """The checks beside the results folder: ``<parent>/official`` (leaderboard/official)."""
    return Path(results_dir).parent / "official"


@dataclass(frozen=True)
class OfficialCell:
    """The official code's runs of one (algorithm it is the reference of, task, tier, profile)."""

    code: str
    repo: str
    commits: tuple
    algo: str
    task: str
    dataset: str
    profile: str
    checks: tuple  # of check dicts, by seed

    @property
    def seeds(self) -> list[int]:
        return [c["seed"] for c in self.checks]

    def same_data(self, cell) -> bool:
        """Whether every check trained on the dataset build our cell's runs trained on (its sha256)."""
        return {c["dataset_sha256"] for c in self.checks} == {r.rec.dataset_sha256 for r in cell.runs}

    def values(self, view: View) -> list[float]:
        """Per-seed values under `view` (final views only, see the module docstring)."""
        if view.scoring != "final":
            return []
        if view.norm == "ours":
            return [float(c["score"]) for c in self.checks]
        ref = omar_reference(self.task)
        return [] if ref is None else [omar_score(float(c["return_mean"]), ref) for c in self.checks]

    def summary(self, view: View) -> dict | None:
        vals = self.values(view)
        if not vals:
            return None
        s = cell_stats(vals)
        return {"n": s.n, "mean": s.mean, "std": s.std, "values": list(s.values), "repo": self.repo,
                "commit": ", ".join(self.commits) or "unknown"}


def load_official(results_dir: Path) -> tuple[list[dict], list[Damaged]]:
    """The checks beside `results_dir` and the damaged check files (as the loader's skipped files: no number
    on the page comes from them, and ``--strict`` fails on them)."""
    root = official_dir(results_dir)
    checks, damaged = load_checks(root)
    return checks, [Damaged(f"{root.name}/{path}", reason) for path, reason in damaged]


def official_cells(checks: list[dict]) -> dict[tuple, OfficialCell]:
    """{(algo, task, tier, profile): OfficialCell}; one check per seed (the newest, by finished_at)."""
    by: dict[tuple, dict[int, dict]] = defaultdict(dict)
    for c in checks:
        key = (c["code"], c["task"], c["tier"], c["profile"])
        old = by[key].get(c["seed"])
        if old is None or c["finished_at"] > old["finished_at"]:
            by[key][c["seed"]] = c
    out = {}
    for (code, task, tier, profile), seeds in sorted(by.items()):
        runs = tuple(seeds[s] for s in sorted(seeds))
        algo = CODES[code][1]
        commits = tuple(sorted({c["commit"] for c in runs if c["commit"]}))
        out[(algo, task, tier, profile)] = OfficialCell(code, CODES[code][0], commits, algo, task, tier, profile, runs)
    return out


def official_rows(official: dict[tuple, OfficialCell], cells: list, label) -> list[dict]:
    """The page's list of checks (the default view: final policy, the paper's reference returns), each beside
    our cell of the same algorithm, task, tier and profile."""
    view = DEFAULT_VIEW
    ours = {(c.algo, c.task, c.dataset, c.profile): c for c in cells}
    rows = []
    for key, oc in official.items():
        o = oc.summary(view)
        mine = ours.get(key)
        s = cell_stats(mine.values(view)) if mine is not None else None
        rows.append({"algo": oc.algo, "label": label(oc.algo), "task": oc.task, "dataset": oc.dataset,
                     "profile": oc.profile, "code": f"{oc.repo}@{o['commit']}", "seeds": oc.seeds,
                     "same_data": oc.same_data(mine) if mine is not None else None,
                     "values": o["values"], "n": o["n"], "mean": o["mean"], "std": o["std"],
                     "ours_n": s.n if s else 0, "ours_mean": s.mean if s else None, "ours_std": s.std if s else None,
                     "anchor": mine.anchor if mine is not None else None})
    return rows
