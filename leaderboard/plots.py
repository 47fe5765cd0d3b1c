"""Figures for the leaderboard, rendered by matplotlib (Agg) as SVG text for inlining.

Every function takes plain numbers (already aggregated by ``build.py``) and returns the SVG
markup of one figure (``Markup``, starting at ``<svg``) for inlining. Text stays text (``svg.fonttype = none``), so the
figures are small, searchable and use the page's fonts; ``$`` is never parsed as mathtext.
Each figure gets its own ``svg.hashsalt`` so the ids of clip paths never collide between the
figures inlined into one page, and no date is written, so the output is reproducible.
"""

from __future__ import annotations

import io
import math
import re
from typing import Sequence

import matplotlib
from markupsafe import Markup

matplotlib.use("Agg", force=False)
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.ticker import MaxNLocator  # noqa: E402

# PLCQL's diagnostic components (diag/<c>_k<k> in metrics.jsonl) and their panel titles
COMPONENTS = (("q1", "mean Q\u03b81(s\u2032, a\u2032(k))"), ("u", "u_Q"), ("w", "w"), ("rpar", "r_par"), ("p", "\u03c0_par(k | s\u2032)"))

__all__ = [
    "algo_color",
    "learning_curves_svg",
    "par_components_svg",
    "compute_ratio_svg",
    "aggregate_svg",
    "profile_svg",
]

# Colour per algorithm id; PLCQL and its ablations stand out, SPaCQL is its direct rival.
_COLORS = {
    "plcql": "#c0392b",
    "plcql-k1": "#e67e22",
    "plcql-kn": "#8e44ad",
    "plcql-w1": "#d35400",
    "plcql-k2": "#f1c40f",
    "plcql-uniform": "#95a5a6",
    "plcql-t0.1": "#e84393",
    "plcql-t10": "#6c5ce7",
    "plcql-target-actors": "#a0522d",
    "plcql-kn-target": "#7f8c8d",
    "plcql-member-clip": "#b8860b",
    "plcql-joint-clip": "#5d4037",
    "plcql-lcb": "#00897b",
    "spacql": "#1f5fbf",
    "cfcql": "#16a085",
    "bc": "#7f8c8d",
    "omar": "#2c3e50",
    "macql": "#9b59b6",
    "iql": "#27ae60",
    "matd3bc": "#b7950b",
    "dof": "#5d6d7e",
    "maicq": "#a04000",
    "madtkd": "#117a65",
    "awac": "#884ea0",
}
_FALLBACK = ["#34495e", "#f39c12", "#1abc9c", "#e84393", "#6c5ce7", "#00b894", "#fd79a8"]

_RC = {
    "svg.fonttype": "none",
    "text.parse_math": False,
    "font.size": 9,
    "axes.titlesize": 9.5,
    "axes.labelsize": 9,
    "legend.fontsize": 8,
    "axes.spines.top": False,
    "axes.spines.right": False,
    "axes.grid": True,
    "grid.color": "#e3e6ea",
    "grid.linewidth": 0.6,
    "font.family": ["DejaVu Sans", "sans-serif"],
}


def algo_color(algo: str) -> str:
    if algo in _COLORS:
        return _COLORS[algo]
    return _FALLBACK[sum(map(ord, algo)) % len(_FALLBACK)]


_PATH = re.compile(r' d="([^"]*)"')
_DECIMALS = re.compile(r"(-?\d+\.\d)\d+")


def _svg(fig, salt: str, tight: bool = True) -> Markup:
    """``tight=False`` for figures laid out with :func:`_grid` (no second draw to find the box)."""
    buf = io.StringIO()
    with matplotlib.rc_context({"svg.hashsalt": salt}):
        fig.savefig(buf, format="svg", bbox_inches="tight" if tight else None, metadata={"Date": None, "Creator": None})
    plt.close(fig)
    text = buf.getvalue()
    svg = re.sub(r"<metadata>.*?</metadata>\s*", "", text[text.index("<svg"):], flags=re.S)
    # Path data at 0.1 pt (far below a pixel) and on one line: about half the bytes.
    svg = _PATH.sub(lambda m: ' d="' + " ".join(_DECIMALS.sub(r"\1", m.group(1)).split()) + '"', svg)
    # matplotlib's SVG writer escapes every text node and attribute (labels come from result
    # files); refuse anything that would still execute or load when inlined into the page.
    lowered = svg.lower()
    if "<script" in lowered or "<foreignobject" in lowered or "javascript:" in lowered:
        raise ValueError("refusing to inline an SVG with script content")
    return Markup(svg)


def _figure(ncols: int, width_per: float = 3.2, height: float = 2.4, nrows: int = 1):
    fig, axes = plt.subplots(nrows, ncols, figsize=(max(width_per * ncols, 3.0), height * nrows), squeeze=False)
    return fig, axes.reshape(-1)


def _grid(nrows: int, ncols: int, w: float, h: float, *, top: float = 0.35, bottom: float = 0.9,
          left: float = 0.6, hspace: float = 0.55):
    """A fixed subplot grid (inches): panels w x h, a title band on top and a legend band below.
    Much cheaper than tight_layout / bbox_inches="tight", which draw the figure once more."""
    width, height = ncols * w + 0.2, nrows * h + top + bottom
    fig, axes = plt.subplots(nrows, ncols, figsize=(width, height), squeeze=False)
    fig.subplots_adjust(left=left / width, right=1 - 0.15 / width, top=1 - top / height, bottom=bottom / height,
                        wspace=left / w + 0.05, hspace=hspace)
    return fig, axes.reshape(-1)


def learning_curves_svg(task: str, panels: Sequence[dict], salt: str) -> str:
    """One panel per dataset tier: mean score over seeds against update round, shaded ± 1 std.
    One legend for the figure, below the panels (never over a curve).

    ``panels``: ``[{"tier", "score_label", "lines": [{"algo", "label", "x", "mean", "std", "n"}]}]``."""
    n_labels = len({line["label"] for p in panels for line in p["lines"]})
    ncols = min(max(n_labels, 1), 5)
    with matplotlib.rc_context(_RC):
        fig, axes = _grid(1, len(panels), 3.2, 2.1, top=0.3, bottom=0.6 + 0.19 * math.ceil(n_labels / ncols))
        handles: dict[str, object] = {}
        for ax, p in zip(axes, panels):
            for line in p["lines"]:
                c = algo_color(line["algo"])
                x, m, s = line["x"], line["mean"], line["std"]
                (h,) = ax.plot(x, m, color=c, lw=1.4, label=line["label"])
                handles.setdefault(line["label"], h)
                if any(v > 0 for v in s):
                    ax.fill_between(x, [a - b for a, b in zip(m, s)], [a + b for a, b in zip(m, s)], color=c, alpha=0.15, lw=0)
            ax.set_title(f"{task} · {p['tier']}")
            ax.set_xlabel("update round")
            ax.set_ylabel(p["score_label"])
            ax.xaxis.set_major_locator(MaxNLocator(5))
        fig.legend(list(handles.values()), list(handles), loc="lower center", bbox_to_anchor=(0.5, 0.0),
                   ncols=ncols, frameon=False)
        return _svg(fig, salt, tight=False)


_K_COLORS = ["#1f5fbf", "#e67e22", "#c0392b", "#16a085", "#8e44ad", "#7f8c8d"]


def par_components_svg(title: str, mean: dict, salt: str) -> str:
    """PAR diagnostics over training, one line per k (mean over seeds): Q_θ1 at the PAR joint
    action, u_Q, w, r_par and π_par(k), plus π_par's entropy. Runs that logged only the older
    ``train/par/p_k`` keys give the p(k) and E[k] panels.

    ``mean``: ``{"x": [...], "<comp>": {k: [...]}, "entropy" or "E_k": [...]}``."""

    comps = [(c, name) for c, name in COMPONENTS if c in mean]
    scalar = "entropy" if "entropy" in mean else "E_k"
    with matplotlib.rc_context(_RC):
        n = len(comps) + 1
        ncols = min(n, 3)
        nrows = math.ceil(n / ncols)
        fig, axes = _grid(nrows, ncols, 2.7, 1.7, top=0.5, bottom=0.75, left=0.5, hspace=0.75)
        x = mean["x"]
        for ax, (c, name) in zip(axes, comps):
            for k, vals in sorted(mean[c].items()):
                ax.plot(x, vals, color=_K_COLORS[(k - 1) % len(_K_COLORS)], lw=1.3, label=f"k={k}")
            ax.set_title(name)
            if c == "p":
                ax.set_ylim(-0.02, 1.02)
        ax = axes[len(comps)]
        vals = [v for v in mean.get(scalar, []) if v is not None]
        if vals and len(vals) == len(x):
            ax.plot(x, vals, color="#2c3e50", lw=1.3)
        ax.set_title("\u03c0_par entropy (nats)" if scalar == "entropy" else "E[k]")
        for extra in axes[n:]:
            extra.set_visible(False)
        for i, a in enumerate(axes[:n]):
            a.xaxis.set_major_locator(MaxNLocator(4))
            if i >= n - ncols:
                a.set_xlabel("update round")
        handles, labels = axes[0].get_legend_handles_labels()
        fig.suptitle(title, fontsize=9.5)
        fig.legend(handles, labels, loc="lower center", bbox_to_anchor=(0.5, 0.0), ncols=len(labels), frameon=False)
        return _svg(fig, salt, tight=False)


def compute_ratio_svg(rows: Sequence[dict], salt: str) -> str:
    """bench-speed's paired PLCQL/SPaCQL ratios with their 95% intervals, per measurement (task, machine,
    date): the whole update round and, where measured paired, the target construction alone; the line at 1
    is parity."""
    series = [("ratio", "ratio_ci", "whole round", algo_color("plcql"), -0.17)]
    if any(r.get("target_paired") for r in rows):
        series.append(("target_ratio", "target_ratio_ci", "target construction", algo_color("spacql"), 0.17))
    with matplotlib.rc_context(_RC):
        fig, (ax,) = _figure(1, width_per=6.6, height=0.6 * len(rows) + 1.4)
        ends = [1.0]
        for key, ci, label, color, dy in series:
            for i, r in enumerate(rows):
                if key != "ratio" and not r.get("target_paired"):
                    continue
                lo, hi = r[ci]
                ends += [lo, hi]
                ax.barh(i + dy, hi - lo, left=lo, height=0.3, color=color, alpha=0.35)
                ax.plot([r[key]] * 2, [i + dy - 0.15, i + dy + 0.15], color=color, lw=2)
        ax.axvline(1.0, color="#555", lw=1, ls="--")
        ax.set_yticks(range(len(rows)))
        ax.set_yticklabels([f"{r['task']} (n={r['n_agents']}) · {r['device']} · {r['date']}" for r in rows])
        ax.set_ylim(len(rows) - 0.5, -0.5)
        lo, hi = min(ends), max(ends)
        pad = 0.1 * (hi - lo) + 0.01
        ax.set_xlim(lo - pad, hi + pad)
        ax.set_xlabel("PLCQL / SPaCQL time, paired ratio, 95% CI" + (
            "\nupper: whole round · lower: target construction" if len(series) > 1 else ""))
        ax.grid(axis="y", visible=False)
        fig.tight_layout()
        return _svg(fig, salt)


def aggregate_svg(title: str, rows: Sequence[dict], score_label: str, salt: str) -> str:
    """rliable-style interval plot: IQM and mean with their 95% CIs, one line per algorithm.

    ``rows``: ``[{"algo", "label", "iqm", "iqm_ci", "mean", "mean_ci"}]``."""
    with matplotlib.rc_context(_RC):
        fig, axes = _figure(2, width_per=3.3, height=0.45 * len(rows) + 1.0)
        for ax, key, name in ((axes[0], "iqm", "IQM"), (axes[1], "mean", "Mean")):
            for i, r in enumerate(rows):
                lo, hi = r[f"{key}_ci"]
                c = algo_color(r["algo"])
                ax.barh(i, hi - lo, left=lo, height=0.6, color=c, alpha=0.35)
                ax.plot([r[key], r[key]], [i - 0.3, i + 0.3], color=c, lw=2)
            lo = min(min(r[f"{key}_ci"][0], r[key]) for r in rows)
            hi = max(max(r[f"{key}_ci"][1], r[key]) for r in rows)
            pad = 0.08 * (hi - lo) + 0.02 * max(1.0, abs(hi))
            ax.set_xlim(lo - pad, hi + pad)  # every interval and point inside the axes
            ax.set_ylim(len(rows) - 0.5, -0.5)
            ax.set_yticks(range(len(rows)))
            ax.set_yticklabels([r["label"] for r in rows] if ax is axes[0] else [""] * len(rows))
            ax.set_title(f"{name} ({score_label})")
            ax.xaxis.set_major_locator(MaxNLocator(5))
            ax.grid(axis="y", visible=False)
        fig.suptitle(title, fontsize=9.5)
        fig.tight_layout()
        return _svg(fig, salt)


def profile_svg(taus: Sequence[float], profiles: dict[str, dict], labels: dict[str, str], score_label: str, salt: str) -> str:
    """Performance profiles: fraction of runs with score > tau, with 95% CI bands."""
    with matplotlib.rc_context(_RC):
        fig, (ax,) = _figure(1, width_per=4.6, height=2.8)
        for a, p in profiles.items():
            c = algo_color(a)
            ax.plot(taus, p["profile"], color=c, lw=1.6, label=labels.get(a, a))
            ax.fill_between(taus, p["lo"], p["hi"], color=c, alpha=0.15, lw=0)
        ax.xaxis.set_major_locator(MaxNLocator(6))
        ax.set_xlabel(f"{score_label} threshold \u03c4")
        ax.set_ylabel("fraction of runs with score > \u03c4")
        ax.set_ylim(-0.02, 1.02)
        ax.legend(frameon=False, loc="best")
        fig.tight_layout()
        return _svg(fig, salt)


def finite(values: Sequence[float]) -> bool:
    return all(isinstance(v, (int, float)) and math.isfinite(v) for v in values)
