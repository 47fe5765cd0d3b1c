"""Task registry: task id -> factory. Env stacks are imported only when a task is used, so the
core CLI works without the optional extras installed."""

from __future__ import annotations

import importlib
import os
from functools import cache

from plcql_bench.suite.core.errors import BenchError
from plcql_bench.suite.core.spec import Task

# task id -> (module, factory function returning a Task, positional arguments for it)
_FACTORIES: dict[str, tuple] = {
    "mpe-cn": ("plcql_bench.suite.envs.mpe", "cn_task"),
    "mpe-pp": ("plcql_bench.suite.envs.mpe", "pp_task"),
    "mpe-world": ("plcql_bench.suite.envs.mpe", "world_task"),
    "smax-2s3z": ("plcql_bench.suite.envs.smax", "make_task", "2s3z"),
    "smax-3s_vs_5z": ("plcql_bench.suite.envs.smax", "make_task", "3s_vs_5z"),
    "smax-5m_vs_6m": ("plcql_bench.suite.envs.smax", "make_task", "5m_vs_6m"),
    "smax-6h_vs_8z": ("plcql_bench.suite.envs.smax", "make_task", "6h_vs_8z"),
    "mamujoco-halfcheetah-2x3": ("plcql_bench.suite.envs.mamujoco", "halfcheetah_task"),
}
# Real StarCraft II (suite/envs/smac.py): registered only where SC2 is installed, i.e. when the
# StarCraft II image sets PLCQL_SMAC_TASKS=1; elsewhere smac-* stays unknown.
SMAC_TASKS_ENV = "PLCQL_SMAC_TASKS"
_SMAC_FACTORIES = {f"smac-{m}": ("plcql_bench.suite.envs.smac", "make_task", m)
                   for m in ("2s3z", "3s_vs_5z", "5m_vs_6m", "6h_vs_8z")}


def _factories() -> dict[str, tuple]:
    return {**_FACTORIES, **_SMAC_FACTORIES} if os.environ.get(SMAC_TASKS_ENV) == "1" else _FACTORIES

# Quality tiers, in the paper's order.
CONTINUOUS_TIERS = ("expert", "medium", "medium-replay", "random")
SMAC_TIERS = ("medium", "medium-replay", "expert", "mixed")
ALL_TIERS = ("expert", "medium", "medium-replay", "random", "mixed")


class UnknownTaskError(BenchError, KeyError):
    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0])


def task_tiers(task_id: str) -> tuple[str, ...]:
    """A task's dataset tiers without importing its env stack (the matrix crosses tasks with
    tiers and keeps only the pairs that exist: SMAC maps have no random tier, MPE no mixed)."""
    return SMAC_TIERS if task_id.startswith(("smax-", "smac-")) else CONTINUOUS_TIERS


def task_ids() -> list[str]:
    return list(_factories())


def known_task_ids() -> list[str]:
    """Task ids a config table may name: the registered tasks and their StarCraft II (smac-) twins."""
    ids = task_ids()
    return ids + [f"smac-{t[len('smax-'):]}" for t in ids if t.startswith("smax-")]


# Tasks whose fixed opponent (the prey) is a choice: "suite" (the shipped prey) or "omar" (OMAR's
# pretrained prey, which the originals' data and the `v2` dataset generation use; suite/envs/prey.py).
PREY_TASKS = ("mpe-pp", "mpe-world")


def get_task(task_id: str, prey: str = "suite") -> Task:
    """The task `task_id`; for PP and World with the prey `prey` ("suite" or "omar"; other tasks
    have no prey and ignore it). One Task object per (task, prey) in a process."""
    return _get_task(task_id, prey if task_id in PREY_TASKS else "suite")


@cache
def _get_task(task_id: str, prey: str) -> Task:
    factories = _factories()
    if task_id not in factories:
        raise UnknownTaskError(f"unknown task {task_id!r} (known: {', '.join(factories)})")
    module, factory, *args = factories[task_id]
    return getattr(importlib.import_module(module), factory)(*args, **({"prey": prey} if prey != "suite" else {}))
