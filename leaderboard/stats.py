"""Per-cell statistics for the leaderboard. Pure functions on arrays; no I/O, no formatting.

A *cell* is one (task, tier, algorithm, profile) combination; its values are the headline
scores of the individual seeds. Later aggregates (rliable IQM / bootstrap CIs, CI-based tie
markers) take the same per-seed score arrays and return plain dicts, so they can be added next
to :func:`cell_stats` and consumed by ``build.py`` without changing the cell layout.
"""

from __future__ import annotations

import math
import warnings
from typing import Iterable, Sequence

import numpy as np

__all__ = [
    "cell_stats",
    "t_interval",
    "welch_p_summary",
    "best_in_row",
    "welch_p",
    "ties_with_best",
    "iqm_and_mean",
    "interquartile_mean",
    "performance_profiles",
    "probability_of_improvement",
    "run_score_distribution",
    "improvement_probability",
    "score_matrix",
]


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


def t_interval(values: Iterable[float], level: float = 0.95) -> tuple[float, float] | None:
    """Student-t confidence interval of the mean of per-seed values, or None when n < 2.
    (Honest at small n: with n = 2 the 95% interval is the mean ± 12.7 standard errors.)"""
    arr = np.asarray(list(values), dtype=np.float64).reshape(-1)
    if arr.size < 2:
        return None
    from scipy import stats as sps

    half = float(sps.t.ppf(0.5 + level / 2, arr.size - 1) * arr.std(ddof=1) / math.sqrt(arr.size))
    return float(arr.mean()) - half, float(arr.mean()) + half


def welch_p_summary(values: Sequence[float], mean: float, std: float, n: int, resolution: float = 0.0) -> float | None:
    """Two-sided Welch p-value of per-seed ``values`` against a reported mean ± std over ``n``
    seeds (e.g. a paper's 5 seeds), or None when either side has fewer than 2 values. With no spread
    on either side, as :func:`welch_p`."""
    x = np.asarray(values, dtype=np.float64).reshape(-1)
    if x.size < 2 or n < 2:
        return None
    if x.std(ddof=1) == 0.0 and std == 0.0:
        return _without_spread(float(x.mean()), mean, resolution)
    from scipy import stats as sps

    return float(sps.ttest_ind_from_stats(x.mean(), x.std(ddof=1), x.size, mean, std, n, equal_var=False).pvalue)


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


# --------------------------------------------------------------------------------------------
# "Statistically tied with the best": Welch's t-test
# --------------------------------------------------------------------------------------------

TIE_ALPHA = 0.05
TIE_TEST = (
    "Welch's two-sided t-test (unequal variances) of the cell's seeds against the best cell's "
    f"seeds; tied when p \u2265 {TIE_ALPHA}. Needs n \u2265 2 in both cells."
)


def welch_p(a: Sequence[float], b: Sequence[float], resolution: float = 0.0) -> float | None:
    """Two-sided p-value of Welch's t-test for equal means, or None when either sample has
    fewer than 2 values (no variance estimate, no test). Two samples with zero variance (scipy
    returns NaN there) give p = 1 when their means differ by at most ``resolution`` (the page's
    display precision: means it shows as equal are never "significantly" different; a difference of
    1e-6 gave p = 0 under two identical "50.0 ± 0.0") and p = 0 otherwise."""
    x = np.asarray(a, dtype=np.float64).reshape(-1)
    y = np.asarray(b, dtype=np.float64).reshape(-1)
    if x.size < 2 or y.size < 2:
        return None
    if x.var(ddof=1) == 0.0 and y.var(ddof=1) == 0.0:
        return _without_spread(float(x.mean()), float(y.mean()), resolution)

    from scipy import stats as sps

    with warnings.catch_warnings():  # near-identical seeds: scipy warns about precision, p is still defined
        warnings.simplefilter("ignore", RuntimeWarning)
        return float(sps.ttest_ind(x, y, equal_var=False).pvalue)


def _without_spread(mean_a: float, mean_b: float, resolution: float) -> float:
    """The test's limit when neither side has any spread: equal (within ``resolution``) or certainly not."""
    return 1.0 if abs(mean_a - mean_b) <= resolution else 0.0


def ties_with_best(
    samples: Sequence[Sequence[float] | None],
    best: Sequence[int],
    *,
    alpha: float = TIE_ALPHA,
) -> list[dict]:
    """For each cell of a row: ``{"tied": bool, "p": float | None, "tested": bool}``.

    ``samples``: per-seed scores of each cell (None = missing or not compared).
    ``best``: indices of the bold cell(s) (from :func:`best_in_row`). A non-best cell is tied
    when Welch's test against some best cell gives p >= alpha (the largest p is kept). Best
    cells themselves are never marked tied; untestable cells (n < 2) are ``tested=False``."""
    out = []
    for i, s in enumerate(samples):
        if s is None or i in best or not best:
            out.append({"tied": False, "p": None, "tested": False})
            continue
        ps = [welch_p(s, samples[j]) for j in best if samples[j] is not None]
        ps = [p for p in ps if p is not None]
        if not ps:
            out.append({"tied": False, "p": None, "tested": False})
            continue
        p = max(ps)
        out.append({"tied": p >= alpha, "p": p, "tested": True})
    return out


# --------------------------------------------------------------------------------------------
# Aggregates across tasks with rliable (Agarwal et al., 2021)
# --------------------------------------------------------------------------------------------

BOOTSTRAP_SEED = 0  # numpy RandomState seed of every stratified bootstrap on the page
BOOTSTRAP_REPS = 2000
POI_REPS = 1000  # probability of improvement runs a Mann-Whitney test per task per replicate


def _rliable():
    """rliable's library and metrics modules (imported lazily: arch and pandas are slow)."""

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from rliable import library, metrics
    return library, metrics


def _quiet_interval_estimates(score_dict, func, reps: int, seed: int):
    library, _ = _rliable()
    # rliable's StratifiedBootstrap draws its resampling indices from numpy's *global* RNG
    # (np.random.choice in update_indices) and ignores random_state there, so the global RNG
    # is seeded for the call and restored afterwards; random_state is passed as well.
    saved = np.random.get_state()
    np.random.seed(seed)
    try:
        with warnings.catch_warnings():
            # arch >= 7 deprecates RandomState in favour of Generator; rliable still passes one.
            warnings.simplefilter("ignore", FutureWarning)
            return library.get_interval_estimates(
                score_dict, func, reps=reps, random_state=np.random.RandomState(seed)
            )
    finally:
        np.random.set_state(saved)


def interquartile_mean(scores: np.ndarray) -> float:
    """rliable's ``metrics.aggregate_iqm`` (scipy ``trim_mean(scores, 0.25, axis=None)``: the
    mean of the middle half of all run scores) without scipy's per-call overhead, which
    dominates inside the bootstrap; equality with rliable is a unit test."""
    a = np.sort(np.asarray(scores, dtype=np.float64).reshape(-1))
    cut = int(0.25 * a.size)
    return float(a[cut:a.size - cut].mean())


def iqm_and_mean(
    score_dict: dict[str, np.ndarray], *, reps: int = BOOTSTRAP_REPS, seed: int = BOOTSTRAP_SEED
) -> dict[str, dict]:
    """IQM and mean of each algorithm's (runs x tasks) score matrix with stratified-bootstrap
    95% percentile CIs (rliable ``get_interval_estimates``, fixed ``RandomState(seed)``).

    Returns ``{algo: {"iqm", "iqm_ci": (lo, hi), "mean", "mean_ci": (lo, hi)}}``."""
    if not score_dict:
        return {}

    def func(x):
        return np.array([interquartile_mean(x), float(np.mean(x))])

    point, ci = _quiet_interval_estimates(score_dict, func, reps, seed)
    return {
        a: {
            "iqm": float(point[a][0]),
            "iqm_ci": (float(ci[a][0][0]), float(ci[a][1][0])),
            "mean": float(point[a][1]),
            "mean_ci": (float(ci[a][0][1]), float(ci[a][1][1])),
        }
        for a in score_dict
    }


def performance_profiles(
    score_dict: dict[str, np.ndarray],
    taus: Sequence[float],
    *,
    reps: int = BOOTSTRAP_REPS,
    seed: int = BOOTSTRAP_SEED,
) -> dict[str, dict]:
    """Run-score distributions (rliable ``score_distributions``: fraction of runs with score
    > tau) with stratified-bootstrap 95% CIs. Same estimator as rliable's
    ``create_performance_profile`` (via :func:`run_score_distribution`), called through
    ``get_interval_estimates`` so the bootstrap gets a fixed random state. Returns ``{algo: {"profile": [...], "lo": [...], "hi": [...]}}``."""
    if not score_dict:
        return {}
    tau = np.asarray(taus, dtype=np.float64)
    point, ci = _quiet_interval_estimates(score_dict, lambda x: run_score_distribution(x, tau), reps, seed)
    return {
        a: {"profile": point[a].tolist(), "lo": ci[a][0].tolist(), "hi": ci[a][1].tolist()}
        for a in score_dict
    }


def run_score_distribution(scores: np.ndarray, taus: np.ndarray) -> np.ndarray:
    """Fraction of all (run, task) scores above each tau: rliable's ``score_distributions``
    (``np.vectorize(run_score_deviation)``) as one array operation, ~100x faster inside the
    bootstrap; equality with rliable is a unit test."""
    flat = np.asarray(scores, dtype=np.float64).reshape(-1)
    return (flat[:, None] > np.asarray(taus, dtype=np.float64)[None, :]).mean(axis=0)


def improvement_probability(x: np.ndarray, y: np.ndarray) -> float:
    """rliable's ``metrics.probability_of_improvement`` without a scipy call per task: per task
    the Mann-Whitney U statistic of X over Y divided by n_x n_y, i.e. P(X > Y) + P(X = Y) / 2,
    averaged over tasks (a task with identical samples gives 0.5, as in rliable). Used inside
    rliable's stratified bootstrap; equality with rliable's function is a unit test."""
    x = np.asarray(x, dtype=np.float64)
    y = np.asarray(y, dtype=np.float64)
    gt = (x[:, None, :] > y[None, :, :]).sum(axis=(0, 1))
    eq = (x[:, None, :] == y[None, :, :]).sum(axis=(0, 1))
    per_task = (gt + 0.5 * eq) / (x.shape[0] * y.shape[0])
    return float(per_task.mean())


def probability_of_improvement(
    x: np.ndarray, y: np.ndarray, *, reps: int = POI_REPS, seed: int = BOOTSTRAP_SEED
) -> dict:
    """P(X > Y) (rliable's ``metrics.probability_of_improvement``: Mann-Whitney U per task,
    averaged over tasks; computed by :func:`improvement_probability`) with rliable's
    stratified-bootstrap 95% CI. ``x``, ``y``: (runs x tasks)
    matrices over the same tasks (run counts may differ)."""
    point, ci = _quiet_interval_estimates(
        {"x,y": (np.asarray(x, np.float64), np.asarray(y, np.float64))},
        improvement_probability,
        reps,
        seed,
    )
    return {"p": float(point["x,y"]), "ci": (float(ci["x,y"][0][0]), float(ci["x,y"][1][0]))}


def score_matrix(per_task: Sequence[Sequence[float]]) -> tuple[np.ndarray, int]:
    """(runs x tasks) matrix from per-task seed scores that may have different lengths:
    every task keeps its first m scores (the lowest seeds), m = the smallest count.
    Returns (matrix, m). rliable's stratified bootstrap needs a rectangular matrix."""
    if not per_task:
        return np.zeros((0, 0)), 0
    m = min(len(s) for s in per_task)
    return np.asarray([list(s)[:m] for s in per_task], dtype=np.float64).T.reshape(m, len(per_task)), m
