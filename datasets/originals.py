"""This suite's tiers beside the original datasets the paper trained on (OMAR's MPE and HalfCheetah).

The originals' statistics live in one data file, `datasets/originals.json`, with their source. A tier
is **in tolerance** when its mean return is within 5 % of the original's expert − random range of the
original's mean, its std within 25 % of the original's, and its transitions and episodes equal.
`plcql-bench datasets cards --compare originals` prints the comparison; tests/test_datasets_v2.py holds
the committed cards to it.

The originals' returns are agent 0's (og-marl's cards sum agent 0's reward); a v2 card records agent
0's return statistics (`agent0_returns`) and is compared on them, a v1 card on its team return.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ORIGINALS = Path(__file__).resolve().parent / "originals.json"


def load_originals(path: Path = ORIGINALS) -> dict[str, Any]:
    return json.loads(Path(path).read_text())


@dataclass(frozen=True)
class Comparison:
    task: str
    tier: str
    ours: dict[str, float] | None  # mean, std, min, max, transitions, episodes; None = no card
    original: dict[str, float]
    mean_tol: float  # allowed |ours - original| on the mean
    std_tol: float  # allowed |ours - original| on the std

    def problems(self) -> list[str]:
        """What is out of tolerance (empty when the tier holds)."""
        if self.ours is None:
            return ["no card"]
        o, g, out = self.ours, self.original, []
        if abs(o["mean"] - g["mean"]) > self.mean_tol:
            out.append(f"mean {o['mean']:.2f} not within {self.mean_tol:.2f} of {g['mean']:.2f}")
        if abs(o["std"] - g["std"]) > self.std_tol:
            out.append(f"std {o['std']:.2f} not within {self.std_tol:.2f} of {g['std']:.2f}")
        for k in ("transitions", "episodes"):
            if int(o[k]) != int(g[k]):
                out.append(f"{k} {int(o[k]):,} != {int(g[k]):,}")
        return out

    @property
    def holds(self) -> bool:
        return not self.problems()


def card_stats(entry: dict[str, Any]) -> dict[str, float]:
    """A card's return statistics on the originals' scale: agent 0's returns where the card has them."""
    a0 = entry.get("agent0_returns")
    src = a0 if a0 else {k: entry[f"return_{k}"] for k in ("mean", "std", "min", "max")}
    return {**{k: float(src[k]) for k in ("mean", "std", "min", "max")},
            "transitions": int(entry["n_transitions"]), "episodes": int(entry["n_episodes"]),
            "return": "agent 0" if a0 else "team"}


def compare(cards: dict[tuple[str, str], dict], originals: dict[str, Any] | None = None) -> list[Comparison]:
    """One Comparison per original tier, in the originals' order. `cards`: (task, tier) -> card entry."""
    originals = originals or load_originals()
    tol = originals["tolerance"]
    rows = []
    for task, tiers in originals["tasks"].items():
        span = tiers["expert"]["mean"] - tiers["random"]["mean"]
        for tier, g in tiers.items():
            entry = cards.get((task, tier))
            rows.append(Comparison(task, tier, card_stats(entry) if entry else None, g,
                                   mean_tol=tol["mean_fraction_of_range"] * span,
                                   std_tol=tol["std_fraction"] * g["std"]))
    return rows


def committed_cards(profile_dir: Path) -> dict[tuple[str, str], dict]:
    """(task, tier) -> card entry of every `<task>/<tier>.json` under a committed cards folder."""
    out = {}
    for path in sorted(Path(profile_dir).glob("*/*.json")):
        entry = json.loads(path.read_text())
        if "task_id" in entry and "quality" in entry:
            out[(entry["task_id"], entry["quality"])] = entry
    return out


def render(rows: list[Comparison]) -> str:
    """The comparison as a plain-text table, one line per tier, then a count."""
    head = (f"{'task':<26} {'tier':<14} {'ours mean ± std':>19} {'original':>19} {'ours min/max':>17} "
            f"{'original':>17} {'transitions':>19} {'episodes':>13}  verdict")
    lines = [head]
    for r in rows:
        g = r.original
        if r.ours is None:
            ours = mm = tr = ep = "—"
        else:
            o = r.ours
            ours = f"{o['mean']:.1f} ± {o['std']:.1f}"
            mm = f"{o['min']:.0f} / {o['max']:.0f}"
            tr = f"{o['transitions']:,}/{int(g['transitions']):,}"
            ep = f"{o['episodes']:,}/{int(g['episodes']):,}"
        verdict = "in tolerance" if r.holds else "OUT: " + "; ".join(r.problems())
        lines.append(f"{r.task:<26} {r.tier:<14} {ours:>19} {g['mean']:>10.1f} ± {g['std']:<6.1f} {mm:>17} "
                     f"{g['min']:>8.0f} / {g['max']:<6.0f} {tr:>19} {ep:>13}  {verdict}")
    held = sum(r.holds for r in rows)
    lines.append(f"{held} of {len(rows)} tiers in tolerance (mean within 5 % of the original's expert - random range, "
                 "std within 25 %, transitions and episodes equal)")
    return "\n".join(lines)
