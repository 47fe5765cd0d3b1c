"""Scoring views: which policy a cell reports and on which normalised scale.

Every value comes from the run's final.json:

* *final* (the headline): the final policy on the full final evaluation (``final_eval``);
* *last10*: the mean of the last 10 points of the learning curve (``curve``: the policy at each
  evaluation point, on the protocol's first ``eval_episodes`` episodes);
* *best*: the best point of the curve (a checkpoint selection the protocol does not make; shown
  because papers often report it).

Normalisation: *omar* (the default) rescales the mean returns with the paper's reference returns, OMAR's
convention, which the paper's baselines use (datasets/imported.py: PAPER_REFERENCES); *ours* is the score
the run recorded (reference returns measured per dataset, ``ref_return_random`` / ``ref_return_expert``).
Win-rate tasks are not normalised: both scales give the win rate.
"""

from __future__ import annotations

from dataclasses import dataclass

from plcql_bench.suite.core.schema import RunRecord
from plcql_bench.datasets.imported import PAPER_REFERENCES

__all__ = ["View", "VIEWS", "DEFAULT_VIEW", "SCORINGS", "NORMS", "omar_reference", "omar_score", "run_values"]

SCORINGS = {"final": "final policy", "last10": "mean of the last 10 evaluations", "best": "best evaluation"}
# The default view is VIEWS[0]: the final policy on the paper's reference returns (OMAR's convention, which the
# paper's tables use), now that the paper profile's tiers match the originals' (docs/datasets.md, "v2"); our
# reference returns, measured on our tiers, are the other view.
NORMS = {"omar": "the paper's reference returns", "ours": "our reference returns"}
LAST_N = 10


@dataclass(frozen=True)
class View:
    scoring: str
    norm: str

    @property
    def key(self) -> str:
        return f"{self.scoring}-{self.norm}"

    @property
    def label(self) -> str:
        return f"{SCORINGS[self.scoring]}, {NORMS[self.norm]}"

    @property
    def is_default(self) -> bool:
        return self == DEFAULT_VIEW


VIEWS = tuple(View(s, n) for s in SCORINGS for n in NORMS)
DEFAULT_VIEW = View("final", "omar")


def omar_reference(task: str) -> tuple[float, float] | None:
    """(expert, random) returns of OMAR's convention for ``task``, or None."""

    ref = PAPER_REFERENCES.get(task)
    return None if ref is None else (float(ref[0]), float(ref[1]))


def omar_score(ret: float | None, ref: tuple[float, float] | None) -> float | None:
    if ret is None or ref is None:
        return None
    expert, random = ref
    return 100.0 * (ret - random) / (expert - random)


def _curve(rec: RunRecord, norm: str, ref) -> list[float]:
    key = "score" if norm == "ours" or rec.is_win_rate else "return_mean"
    vals = [p.get(key) for p in rec.curve]
    vals = [float(v) for v in vals if v is not None]
    return vals if key == "score" else [omar_score(v, ref) for v in vals] if ref else []


def run_values(rec: RunRecord) -> dict[str, float | None]:
    """The run's value under every view, keyed by ``View.key`` (None: not derivable, e.g. no
    curve, or no OMAR reference for the task)."""
    ref = None if rec.is_win_rate else omar_reference(rec.task)
    out: dict[str, float | None] = {}
    for norm in NORMS:
        if norm == "ours" or rec.is_win_rate:
            final = float(rec.score)
        else:
            final = omar_score(rec.final_eval.get("return_mean"), ref)
        curve = _curve(rec, norm, ref)
        out[View("final", norm).key] = final
        out[View("last10", norm).key] = sum(curve[-LAST_N:]) / len(curve[-LAST_N:]) if curve else None
        out[View("best", norm).key] = max(curve) if curve else None
    return out
