"""Per-cell statistics for the leaderboard. Pure functions on arrays; no I/O, no formatting.

A *cell* is one (task, tier, algorithm, profile) combination; its values are the headline
scores of the individual seeds. Later aggregates (rliable IQM / bootstrap CIs, CI-based tie
markers) take the same per-seed score arrays and return plain dicts, so they can be added next
to :func:`cell_stats` and consumed by ``build.py`` without changing the cell layout.
"""

from __future__ import annotations

import math
from typing import Iterable, Sequence

import numpy as np

__all__ = ["cell_stats", "best_in_row"]


def cell_stats(values: Iterable[float]) -> dict:
    """Mean, sample standard deviation (ddof=1) and count of one cell's per-seed scores.

    ``std`` is 0.0 when n == 1 (a single seed gives no spread estimate; the page says so).
    An empty input gives ``{"mean": nan, "std": nan, "n": 0}``. Non-finite values are rejected:
    the caller filters invalid results before aggregating."""
    arr = np.asarray(list(values), dtype=np.float64).reshape(-1)
    n = int(arr.size)
    if n == 0:
        return {"mean": math.nan, "std": math.nan, "n": 0}
    if not np.all(np.isfinite(arr)):
        raise ValueError("cell_stats: values must be finite")
    mean = float(arr.mean())
    std = float(arr.std(ddof=1)) if n > 1 else 0.0
    return {"mean": mean, "std": std, "n": n}


def best_in_row(
    means: Sequence[float | None],
    *,
    eligible: Sequence[bool] | None = None,
    higher_is_better: bool = True,
    atol: float = 1e-9,
) -> list[int]:
    """Indices of the best mean(s) in a row.

    ``means``: one entry per cell in the row; ``None`` or NaN marks a missing cell.
    ``eligible``: optional mask; cells with ``False`` are never best (used to restrict the
    comparison to one profile). Exact ties (within ``atol``) are all returned. Returns an empty
    list when no eligible cell has a value. A CI-based "statistically tied with the best" marker
    belongs in a separate function taking per-cell intervals, so this one stays a plain argmax."""
    if eligible is not None and len(eligible) != len(means):
        raise ValueError("best_in_row: eligible must have the same length as means")
    candidates: list[tuple[int, float]] = []
    for i, m in enumerate(means):
        if m is None or (eligible is not None and not eligible[i]):
            continue
        m = float(m)
        if math.isnan(m):
            continue
        candidates.append((i, m if higher_is_better else -m))
    if not candidates:
        return []
    top = max(v for _, v in candidates)
    return [i for i, v in candidates if abs(v - top) <= atol]
