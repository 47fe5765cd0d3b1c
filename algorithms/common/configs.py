"""Per-task, per-tier hyperparameter tables read from `algorithms/configs/<algo>.yaml`.

File layout (every value is a fact copied from the named source; see each file's `source:` keys):

    source: "<repo@commit:path, what>"
    tasks:
      <task key>:            # a task id (mpe-cn) or a family prefix (mamujoco)
        all: {field: value}            # every tier
        <tier>: {field: value}         # random | medium-replay | medium | expert
        source: "..."                  # optional, per task

A task id matches its own key first, then the longest key that is a prefix of it
(`mamujoco` matches `mamujoco-halfcheetah-2x3`).
"""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path
from typing import Any

import yaml

from plcql_bench.suite.core.spec import TaskSpec
from plcql_bench.suite.core.validate import ConfigError, unknown_key
from plcql_bench.algorithms.base import all_algorithm_classes
from plcql_bench.suite.core.validate import config_fields
from plcql_bench.suite.envs.tasks import ALL_TIERS, known_task_ids

CONFIG_DIR = Path(__file__).resolve().parent.parent / "configs"


@lru_cache(maxsize=None)
def load_table(algo: str) -> dict[str, Any]:
    path = CONFIG_DIR / f"{algo}.yaml"
    if not path.exists():
        return {}
    try:
        table = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: invalid YAML: {' '.join(str(exc).split())}") from None
    check_table(table, str(path))
    return table


def check_table(table: Any, where: str) -> None:
    """The file's layout (see the module docstring); every field a config field of some algorithm.
    Values are checked against each algorithm's own config when it resolves (suite/core/validate.py)."""

    if not isinstance(table, dict):
        raise ConfigError(f"{where}: must be a mapping with 'source' and 'tasks'")
    for key in table:
        if key not in ("source", "tasks"):
            raise unknown_key(where, str(key), ("source", "tasks"))
    fields = {f for cls in all_algorithm_classes() for f in config_fields(cls)}
    tasks = table.get("tasks") or {}
    if not isinstance(tasks, dict):
        raise ConfigError(f"{where}: tasks: must be a mapping of task -> tiers")
    for task, entry in tasks.items():
        if not any(t.startswith(str(task)) for t in known_task_ids()):
            raise unknown_key(where, str(task), known_task_ids(), what="matches no task id", path="tasks.")
        if not isinstance(entry, dict):
            raise ConfigError(f"{where}: tasks.{task}: must be a mapping of tier -> fields")
        for tier, values in entry.items():
            path = f"tasks.{task}."
            if tier == "source":
                continue
            if tier not in ("all", *ALL_TIERS):
                raise unknown_key(where, str(tier), ("all", "source", *ALL_TIERS), what="unknown tier", path=path)
            if not isinstance(values, dict):
                raise ConfigError(f"{where}: {path}{tier}: must be a mapping of config field -> value")
            for name in values:
                if name not in fields:
                    raise unknown_key(where, str(name), fields, what="not a config field of any algorithm",
                                      path=f"{path}{tier}.")


def _task_entry(tasks: dict[str, Any], task_id: str) -> dict[str, Any]:
    if task_id in tasks:
        return tasks[task_id]
    keys = [k for k in tasks if task_id.startswith(k)]
    return tasks[max(keys, key=len)] if keys else {}


def tier_table(algo: str, spec: TaskSpec, tier: str) -> dict[str, Any]:
    """The config overrides for (algo, task, tier) from the algorithm's YAML file ({} if none)."""
    entry = _task_entry(load_table(algo).get("tasks", {}) or {}, spec.task_id)
    out = dict(entry.get("all", {}) or {})
    out.update(entry.get(tier, {}) or {})
    return out
