"""Official-code checks: a reference implementation's own code (thu-rllab/CFCQL, for CFCQL and MACQL;
ling-pan/OMAR) trained on
this suite's dataset and scored by this suite's protocol. They answer one question about a gap between our
number and the paper's: is it our implementation's, or the data's? `suite/runs/reference_score.py` writes one file
per run; the leaderboard shows them beside our cells, labelled as the official code's.

Layout: ``<root>/<profile>/<code>/<task>/<tier>/seed<S>.json`` (root: ``leaderboard/official``, beside
``leaderboard/results``). Every field below is required; `read_check` names the first one that is missing or
of the wrong type.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from plcql_bench.suite.core.store import atomic_write_json, read_json

SCHEMA = "plcql-bench-official-check/1"
# code -> (the repository, the algorithm of this suite it is the reference of)
CODES = {"cfcql": ("thu-rllab/CFCQL", "cfcql"), "macql": ("thu-rllab/CFCQL", "macql"), "omar": ("ling-pan/OMAR", "omar")}
FIELDS: dict[str, type | tuple] = {
    "schema": str, "code": str, "repo": str, "commit": (str, type(None)), "task": str, "tier": str, "seed": int,
    "profile": str, "rounds": int, "dataset_sha256": str, "final_episodes": int, "score": float,
    "return_mean": float, "curve": list, "cql_alpha": float, "settings": dict, "finished_at": str,
    "runtime_s": float,
}


def check_path(root: Path, profile: str, code: str, task: str, tier: str, seed: int) -> Path:
    return Path(root) / profile / code / task / tier / f"seed{seed}.json"


def _problem(rec: Any) -> str | None:
    """The first thing wrong with a check record, or None."""
    if not isinstance(rec, dict):
        return "not a JSON object"
    for name, kind in FIELDS.items():
        if name not in rec:
            return f"field {name!r} missing"
        value = rec[name]
        ok = isinstance(value, kind) and not isinstance(value, bool)
        if kind is float:  # JSON integers are valid numbers
            ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
        if not ok:
            return f"field {name!r} is {type(value).__name__}, expected {getattr(kind, '__name__', kind)}"
    if rec["schema"] != SCHEMA:
        return f"field 'schema' is {rec['schema']!r}, expected {SCHEMA!r}"
    if rec["code"] not in CODES:
        return f"field 'code' is {rec['code']!r}, expected one of {sorted(CODES)}"
    return None


def write_check(path: Path, rec: dict) -> None:
    """Write a check atomically; a record this module could not read back is refused."""
    problem = _problem(rec)
    if problem:
        raise ValueError(f"{path}: {problem}")
    atomic_write_json(Path(path), rec)


def _read(path: Path) -> tuple[dict | None, str | None]:
    """(the check, None), or (None, what is wrong with the file)."""
    try:
        rec = read_json(Path(path))
    except (OSError, ValueError) as exc:
        return None, f"unreadable ({exc})"
    problem = _problem(rec)
    return (None, problem) if problem else (rec, None)


def read_check(path: Path) -> dict:
    """The check at `path`; ValueError naming the file and the field when it is damaged."""
    rec, problem = _read(path)
    if problem:
        raise ValueError(f"{path}: {problem}")
    return rec


def load_checks(root: Path) -> tuple[list[dict], list[tuple[str, str]]]:
    """Every check under `root` (none if it does not exist) and the damaged files as (path, reason)."""
    checks, damaged = [], []
    root = Path(root)
    for path in sorted(root.rglob("seed*.json")) if root.is_dir() else []:
        rel = path.relative_to(root).as_posix()
        rec, problem = _read(path)
        if problem:
            damaged.append((rel, problem))
        else:
            checks.append({**rec, "path": rel})
    return checks, damaged
