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

__all__ = [
    "algo_color",
    "learning_curves_svg",
    "par_svg",
    "compute_svg",
    "aggregate_svg",
    "profile_svg",
]

# Colour per algorithm id; PLCQL and its ablations stand out, SPaCQL is its direct rival.
_COLORS = {
    "plcql": "#c0392b",
    "plcql-k1": "#e67e22",
    "plcql-kn": "#8e44ad",
    "plcql-w1": "#d35400",
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


def _svg(fig, salt: str) -> Markup:
    buf = io.StringIO()
    with matplotlib.rc_context({"svg.hashsalt": salt}):
        fig.savefig(buf, format="svg", bbox_inches="tight", metadata={"Date": None, "Creator": None})
    plt.close(fig)
    text = buf.getvalue()
    svg = re.sub(r"<metadata>.*?</metadata>\s*", "", text[text.index("<svg"):], flags=re.S)
    # matplotlib's SVG writer escapes every text node and attribute (labels come from result
    # files); refuse anything that would still execute or load when inlined into the page.
    lowered = svg.lower()
    if "<script" in lowered or "<foreignobject" in lowered or "javascript:" in lowered:
        raise ValueError("refusing to inline an SVG with script content")
    return Markup(svg)


def _figure(ncols: int, width_per: float = 3.2, height: float = 2.4, nrows: int = 1):
    fig, axes = plt.subplots(nrows, ncols, figsize=(max(width_per * ncols, 3.0), height * nrows), squeeze=False)
    return fig, axes.reshape(-1)


def learning_curves_svg(task: str, panels: Sequence[dict], salt: str) -> str:
    """One panel per dataset tier: mean score over seeds against update round, shaded ± 1 std.

    ``panels``: ``[{"tier", "score_label", "lines": [{"algo", "label", "x", "mean", "std", "n"}]}]``."""
    with matplotlib.rc_context(_RC):
        fig, axes = _figure(len(panels))
        for ax, p in zip(axes, panels):
            for line in p["lines"]:
                c = algo_color(line["algo"])
                x, m, s = line["x"], line["mean"], line["std"]
                ax.plot(x, m, color=c, lw=1.6, label=f"{line['label']} (n={line['n']})")
                if any(v > 0 for v in s):
                    ax.fill_between(x, [a - b for a, b in zip(m, s)], [a + b for a, b in zip(m, s)], color=c, alpha=0.15, lw=0)
            ax.set_title(f"{task} · {p['tier']}")
            ax.set_xlabel("update round")
            ax.set_ylabel(p["score_label"])
            ax.legend(frameon=False, loc="best")
        fig.tight_layout()
        return _svg(fig, salt)


def par_svg(task: str, tiers: Sequence[dict], n_agents: int | None, salt: str) -> str:
    """Left: E[k] of PLCQL's PAR policy over training, one line per tier (mean over seeds).
    Right: the PAR policy's distribution over k at the last evaluation point (mean over seeds).

    ``tiers``: ``[{"tier", "x", "ek", "pk": [p_k1..p_kn], "n"}]``."""
    with matplotlib.rc_context(_RC):
        fig, (ax1, ax2) = _figure(2, width_per=3.6)
        palette = ["#c0392b", "#1f5fbf", "#16a085", "#b7950b", "#8e44ad"]
        for i, t in enumerate(tiers):
            c = palette[i % len(palette)]
            if t["x"]:
                ax1.plot(t["x"], t["ek"], color=c, lw=1.6, label=f"{t['tier']} (n={t['n']})")
        kmax = n_agents or max((len(t["pk"]) for t in tiers), default=1)
        ax1.set_ylim(0.9, kmax + 0.1)
        ax1.set_title(f"{task} · E[k] over training")
        ax1.set_xlabel("update round")
        ax1.set_ylabel("E[k] (agents replaced)")
        ax1.legend(frameon=False, loc="best")
        width = 0.8 / max(len(tiers), 1)
        for i, t in enumerate(tiers):
            ks = list(range(1, len(t["pk"]) + 1))
            ax2.bar([k - 0.4 + width * (i + 0.5) for k in ks], t["pk"], width=width, color=palette[i % len(palette)], label=t["tier"])
        ax2.set_xticks(list(range(1, kmax + 1)))
        ax2.set_ylim(0, 1)
        ax2.set_title(f"{task} · p(k) at the end of training")
        ax2.set_xlabel("k (agents whose action is replaced)")
        ax2.set_ylabel("probability")
        ax2.legend(frameon=False, loc="best")
        fig.tight_layout()
        return _svg(fig, salt)


def compute_svg(rows: Sequence[dict], algos: Sequence[tuple[str, str]], salt: str) -> str:
    """Two grouped bar charts over tasks: measured ms per update round (mean over runs) and the
    structural number of Q-evaluations (PAR targets) per transition per iteration.

    ``rows``: ``[{"task", "ms": {algo: float | None}, "q_evals": {algo: int | None}}]``;
    ``algos``: ``[(id, label)]`` in plotting order."""
    with matplotlib.rc_context(_RC):
        fig, (ax1, ax2) = _figure(2, width_per=max(3.6, 0.9 * len(rows) + 1.5))
        width = 0.8 / max(len(algos), 1)
        xs = list(range(len(rows)))
        for key, ax, title, ylabel in (
            ("ms", ax1, "time per update round (measured)", "ms per round"),
            ("q_evals", ax2, "Q-evaluations per iteration (structural)", "PAR targets per transition"),
        ):
            for i, (a, label) in enumerate(algos):
                vals = [r[key].get(a) for r in rows]
                pos = [x - 0.4 + width * (i + 0.5) for x in xs]
                ax.bar([p for p, v in zip(pos, vals) if v is not None], [v for v in vals if v is not None],
                       width=width, color=algo_color(a), label=label)
                for p, v in zip(pos, vals):
                    if v is not None:
                        ax.annotate(f"{v:,.0f}" if v >= 100 else f"{v:.3g}", (p, v), ha="center", va="bottom", fontsize=7, xytext=(0, 1), textcoords="offset points")
            ax.set_xticks(xs)
            ax.set_xticklabels([r["task"] for r in rows], rotation=20 if len(rows) > 3 else 0, ha="right" if len(rows) > 3 else "center")
            ax.set_title(title)
            ax.set_ylabel(ylabel)
            ax.margins(y=0.3)
            ax.legend(frameon=False, loc="upper left", ncols=2)
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
            ax.set_yticks(range(len(rows)))
            ax.set_yticklabels([r["label"] for r in rows] if ax is axes[0] else [""] * len(rows))
            ax.set_title(f"{name} ({score_label})")
            ax.xaxis.set_major_locator(MaxNLocator(5))
            ax.invert_yaxis()
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
