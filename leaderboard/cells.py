"""Typed runs and cells, their statistics under a scoring view, and number formatting.

A *cell* is one (task, tier, algorithm, profile, protocol version) with its runs (one per seed).
Its statistics depend on the view (leaderboard/scoring.py): the per-seed values, their mean,
sample std (ddof 1) and Student-t 95% interval of the mean.
"""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass
from typing import Iterable

from plcql_bench.leaderboard.scoring import View, run_values
from plcql_bench.leaderboard.stats import t_interval
from plcql_bench.suite.core.schema import RunRecord

__all__ = ["Run", "Cell", "Stats", "group_cells", "cell_stats", "format_score", "format_mean_std",
           "format_interval", "display_decimals", "display_resolution", "decimals_to_tell_apart", "MIN_SEEDS"]

MIN_SEEDS = 3  # below this a cell is greyed, never bold and never tested


@dataclass(frozen=True)
class Run:
    """One valid run as the leaderboard uses it: where its final.json is, the record, and its
    value under every view."""

    path: str  # final.json relative to the results folder, POSIX separators
    rec: RunRecord
    values: dict

    @classmethod
    def of(cls, path: str, rec: RunRecord) -> "Run":
        return cls(path, rec, run_values(rec))

    @property
    def anchor(self) -> str:
        return "run-" + (self.rec.run_key or self.path.replace("/", "-"))


@dataclass(frozen=True)
class Cell:
    domain: str
    task: str
    dataset: str
    algo: str
    score_name: str
    profile: str
    protocol_version: int | None
    runs: tuple  # of Run, by seed

    @property
    def variant(self) -> tuple:
        """Cells are only compared within one (profile, protocol version)."""
        return (self.profile, self.protocol_version)

    @property
    def anchor(self) -> str:
        return f"cell-{self.profile}-{self.algo}-{self.task}-{self.dataset}"

    @property
    def seeds(self) -> list[int]:
        return [r.rec.seed for r in self.runs]

    def values(self, view: View) -> list[float]:
        return [r.values[view.key] for r in self.runs if r.values.get(view.key) is not None]

    @property
    def n_dirty(self) -> int:
        return sum(r.rec.dirty for r in self.runs)

    @property
    def collapsed(self) -> list[dict]:
        """The par_collapse records of the cell's runs that collapsed."""
        return [r.rec.par_collapse for r in self.runs if r.rec.par_collapse]

    @property
    def diverged(self) -> list[int]:
        """The seeds of the cell's runs whose critic diverged (leaderboard/load.py `critic_divergence`)."""
        return [r.rec.seed for r in self.runs if critic_diverged(r.rec)]


DIVERGED = "critic diverged"  # the warning leaderboard/load.py `with_critic_check` adds


def critic_diverged(rec) -> bool:
    """Whether the run's record carries the leaderboard's "critic diverged" warning."""
    return any(w.startswith(DIVERGED) for w in rec.warnings)


def group_cells(runs: Iterable[Run]) -> list[Cell]:
    groups: dict[tuple, list[Run]] = defaultdict(list)
    for r in runs:
        x = r.rec
        groups[(x.domain, x.task, x.dataset, x.algo, x.score_name, x.profile, x.protocol_version)].append(r)
    cells = []
    for key in sorted(groups, key=lambda k: tuple("" if v is None else str(v) for v in k)):
        cells.append(Cell(*key, runs=tuple(sorted(groups[key], key=lambda r: r.rec.seed))))
    return cells


@dataclass(frozen=True)
class Stats:
    n: int
    mean: float | None
    std: float | None  # None when n < 2
    ci: tuple | None  # 95% t-interval of the mean, None when n < 2
    values: tuple


def cell_stats(values: Iterable[float]) -> Stats:
    vals = tuple(float(v) for v in values)
    n = len(vals)
    if n == 0:
        return Stats(0, None, None, None, ())
    mean = math.fsum(vals) / n
    std = math.sqrt(math.fsum((v - mean) ** 2 for v in vals) / (n - 1)) if n > 1 else None
    return Stats(n, mean, std, t_interval(vals), vals)


# ------------------------------------------------------------------ formatting


def display_decimals(score_name: str) -> int:
    """The decimals the page shows: 1 for normalised scores, 2 for win rates."""
    return 2 if score_name == "win_rate" else 1


def display_resolution(score_name: str) -> float:
    """Half the last digit the page shows: two means closer than this may display as equal."""
    return 0.5 * 10 ** -display_decimals(score_name)


def decimals_to_tell_apart(a: float, b: float, score_name: str, most: int = 6) -> int | None:
    """The decimals needed for two means to display differently: the page's own when they already do,
    more (up to ``most``) when it shows them as equal; None when they are not told apart even so."""
    for d in range(display_decimals(score_name), most + 1):
        if format_score(a, score_name, d) != format_score(b, score_name, d):
            return d
    return None


def format_score(value: float | None, score_name: str, decimals: int | None = None) -> str:
    """Normalised scores with 1 decimal, win rates with 2 (or ``decimals``). None -> an em dash; never "-0.0"."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "\u2014"
    text = f"{value:.{display_decimals(score_name) if decimals is None else decimals}f}"
    if text.startswith("-") and text.strip("-0.") == "":
        text = text[1:]
    return text


def format_spread(std: float | None, score_name: str, decimals: int | None = None) -> str:
    """A std, or "< 0.05" (resp. "< 0.005") when a non-zero spread is below display precision."""
    if std is None:
        return "\u2014"
    d = display_decimals(score_name) if decimals is None else decimals
    if 0 < std < 0.5 * 10 ** -d:
        return f"< {0.5 * 10 ** -d:.{d + 1}f}"
    return format_score(std, score_name, d)


def format_mean_std(mean: float | None, std: float | None, score_name: str, decimals: int | None = None) -> str:
    if std is None:
        return format_score(mean, score_name, decimals)
    return f"{format_score(mean, score_name, decimals)} \u00b1 {format_spread(std, score_name, decimals)}"


def format_interval(ci: tuple | None, score_name: str) -> str:
    if ci is None:
        return "no interval (n < 2)"
    return f"[{format_score(ci[0], score_name)}, {format_score(ci[1], score_name)}]"
