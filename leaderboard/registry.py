"""What the suite itself knows about algorithms and tasks: which algorithm implements which action
kind, the registered names, and a task's number of agents (with a table for the paper's SMAC map
names, which are not task ids of this suite)."""

from __future__ import annotations

from functools import cache

from plcql_bench.algorithms.base import implementations, load_all
from plcql_bench.suite.envs.tasks import UnknownTaskError, get_task

__all__ = ["support", "registered_names", "n_agents"]

# Agents per task where the task registry cannot say: the paper's SMAC map names (and the tasks
# whose env stack is not installed here).
KNOWN_N_AGENTS = {"mpe-cn": 3, "mpe-pp": 3, "mpe-world": 3, "mamujoco-halfcheetah-2x3": 2,
                  "2s3z": 5, "3s_vs_5z": 3, "5m_vs_6m": 5, "6h_vs_8z": 6}


def support(algo: str, discrete_task: bool) -> str:
    """"yes", "no" (no implementation for the task's action type) or "unknown" (the suite does
    not implement the algorithm). A name may have a continuous and a discrete implementation."""
    impls = implementations(algo)
    if not impls:
        return "unknown"
    return "yes" if ("discrete" if discrete_task else "continuous") in impls else "no"


@cache
def registered_names() -> frozenset[str]:
    return frozenset(load_all())


def n_agents(task: str) -> int | None:
    try:
        return int(get_task(task).spec.n_agents)
    except (UnknownTaskError, ImportError):  # a paper-only name, or an env stack not installed here
        pass
    tail = task.partition("-")[2]
    for name, n in KNOWN_N_AGENTS.items():
        if task == name or tail.lower().replace("-", "_") == name.lower():
            return n
    return None
