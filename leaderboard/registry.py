"""What the suite itself knows about algorithms and tasks (with fallbacks, so the leaderboard
still renders where the algorithms or environments cannot be imported)."""

from __future__ import annotations

from functools import cache

__all__ = ["support", "registered_names", "n_agents"]

# Agents per task, for when the task registry cannot say.
KNOWN_N_AGENTS = {"mpe-cn": 3, "mpe-pp": 3, "mpe-world": 3, "mamujoco-halfcheetah-2x3": 2,
                  "2s3z": 5, "3s_vs_5z": 3, "5m_vs_6m": 5, "6h_vs_8z": 6}


def _implementations(algo: str) -> dict[str, type] | None:
    """{"continuous"|"discrete": class} of a registered algorithm, or None when the suite does
    not implement ``algo`` (or the algorithms cannot be imported here)."""
    try:
        from plcql_bench.algorithms.base import implementations

        return implementations(algo) or None
    except Exception:
        return None


def support(algo: str, discrete_task: bool) -> str:
    """"yes", "no" (no implementation for the task's action type) or "unknown" (the suite does
    not implement the algorithm). A name may have a continuous and a discrete implementation."""
    impls = _implementations(algo)
    if impls is None:
        return "unknown"
    return "yes" if ("discrete" if discrete_task else "continuous") in impls else "no"


@cache
def registered_names() -> frozenset[str]:
    try:
        from plcql_bench.algorithms.base import load_all

        return frozenset(load_all())
    except Exception:
        return frozenset()


def n_agents(task: str) -> int | None:
    try:
        from plcql_bench.suite.tasks import get_task

        return int(get_task(task).spec.n_agents)
    except Exception:
        pass
    tail = task.partition("-")[2]
    for name, n in KNOWN_N_AGENTS.items():
        if task == name or tail.lower().replace("-", "_") == name.lower():
            return n
    return None
