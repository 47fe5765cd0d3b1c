"""Measured costs per machine, and the cost of a cell from them (`plan`'s estimate).

A calibration file (JSON, `suite/runs/calibrations/<machine>.json`, or any path) holds, per algorithm
and task, the cost of one update round and of one evaluation:

    {"machine": "cpu-dev-2core", "description": "...", "device": "cpu", "torch_threads": 1,
     "source": "how it was measured", "measured_at": "2026-11-26",
     "costs": {"<algo>": {"<task>": {"round_ms": 12.3,              # median update round
                                     "eval_s": [a, b],              # one evaluation of E episodes: a + b * E seconds
                                     "proxy": "...",                # optional: not measured on this task/machine;
                                                                    #   where the number was taken from
                                     "note": "..."}}},              # optional: where a number came from
     "default_jobs": 2,          # optional: plan's --jobs default for this machine
     "recorded_fallback": true}  # optional: false = cells it has no cost for are not counted (a GPU
                                 #   calibration: runtimes recorded on this machine do not apply)

`bench-speed --calibrate MACHINE` measures and writes one (rounds on a synthetic buffer with the
task's reference config, evaluations with the untrained policy). A cell's cost is

    rounds_left * round_ms + (evaluations left) * eval_s(eval_episodes) + eval_s(final_eval_episodes)

with one evaluation at round 0 and every `eval_every` rounds (suite/runs/runner.py).
"""

from __future__ import annotations

import heapq
import json
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from plcql_bench.suite.core.errors import BenchError
from plcql_bench.suite.core.store import atomic_write_bytes
from plcql_bench.algorithms.base import REGISTRY, load_all

DEFAULT_MACHINE = "cpu-dev-2core"


def calibrations_dir() -> Path:
    return Path(str(resources.files("plcql_bench.suite.runs").joinpath("calibrations")))


def known_machines() -> list[str]:
    return sorted(p.stem for p in calibrations_dir().glob("*.json"))


def load_calibration(name_or_path: str) -> dict:
    """A committed calibration by machine name, or a calibration JSON file."""
    path = Path(name_or_path)
    if not (path.suffix == ".json" and path.exists()):
        path = calibrations_dir() / f"{name_or_path}.json"
    if not path.exists():
        raise BenchError(f"unknown machine calibration {name_or_path!r} (committed: "
                         f"{', '.join(known_machines()) or 'none'}; or a .json path written by "
                         "`plcql-bench bench-speed --calibrate`)")
    try:
        calib = json.loads(path.read_text())
        calib["costs"]
    except (ValueError, KeyError, TypeError) as exc:
        raise BenchError(f"{path}: not a calibration file ({type(exc).__name__}: {exc})") from None
    calib["path"] = str(path)
    return calib


def calibration_for(machine: str | None = None) -> dict | None:
    """The calibration an estimate comes from: `machine` (a committed name or a file) when given, else
    the default machine's; None for an install that ships no calibrations."""
    if machine is None and DEFAULT_MACHINE not in known_machines():
        return None
    return load_calibration(machine or DEFAULT_MACHINE)


def save_calibration(calib: dict, path: Path) -> None:
    """Write (merging into an existing file: new measurements replace old ones per algo x task)."""
    path = Path(path)
    if path.exists():
        old = json.loads(path.read_text())
        for algo, tasks in calib["costs"].items():
            old.setdefault("costs", {}).setdefault(algo, {}).update(tasks)
        calib = {**old, **{k: v for k, v in calib.items() if k != "costs"}, "costs": old["costs"]}
    calib.pop("path", None)
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_bytes(path, (json.dumps(calib, indent=1, sort_keys=True) + "\n").encode())


@dataclass
class CellCost:
    cell: object
    seconds: float | None  # None: no cost known for this algo x task
    rounds_s: float = 0.0
    eval_s: float = 0.0
    proxy: bool = False  # the round cost is a stand-in measurement (entry "proxy")


def eval_seconds(entry: dict, episodes: int) -> float:
    a, b = entry["eval_s"]
    return float(a) + float(b) * episodes


def _base_algorithm(name: str) -> str | None:
    """The algorithm a registered variant (e.g. plcql-k1, `register_variant`) is built on, else None."""

    load_all()
    cls = REGISTRY.get(name)
    return cls.variant_of if cls is not None else None


def cell_cost(cell, profile, calib: dict, rounds_done: int = 0) -> CellCost:
    """Seconds the cell still needs on the calibrated machine (rounds + evaluations). A variant
    the calibration does not name costs as its base algorithm, counted as a stand-in (proxy)."""
    entry = calib["costs"].get(cell.algo, {}).get(cell.task)
    stand_in = False
    if not entry and (base := _base_algorithm(cell.algo)):
        entry, stand_in = calib["costs"].get(base, {}).get(cell.task), True
    if not entry or "round_ms" not in entry:
        return CellCost(cell, None)
    budget = profile.train_budget(cell.task, cell.tier)
    rounds = budget["updates"]
    left = max(rounds - rounds_done, 0)
    rounds_s = left * float(entry["round_ms"]) / 1000.0
    evals_total = 1 + rounds // budget["eval_every"] + (rounds % budget["eval_every"] != 0)
    evals_done = 0 if rounds_done == 0 else 1 + rounds_done // budget["eval_every"]
    ev = 0.0
    if "eval_s" in entry:
        ev = (max(evals_total - evals_done, 0) * eval_seconds(entry, budget["eval_episodes"])
              + eval_seconds(entry, budget["final_eval_episodes"]))
    return CellCost(cell, rounds_s + ev, rounds_s, ev, stand_in or bool(entry.get("proxy")))


def makespan(durations: list[float], jobs: int, in_order: bool = False) -> float:
    """Wall-clock of running `durations` on `jobs` parallel slots, each run going to the first slot
    free: longest first (LPT), or in the order given (`in_order`: a priority queue, as a campaign)."""
    if jobs <= 1 or not durations:
        return float(sum(durations))
    slots = [0.0] * min(jobs, len(durations))
    for d in (durations if in_order else sorted(durations, reverse=True)):
        heapq.heappush(slots, heapq.heappop(slots) + d)
    return max(slots)
