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

from plcql_bench.suite.spec import TaskSpec

CONFIG_DIR = Path(__file__).resolve().parent.parent / "configs"


@lru_cache(maxsize=None)
def load_table(algo: str) -> dict[str, Any]:
    path = CONFIG_DIR / f"{algo}.yaml"
    if not path.exists():
        return {}
    return yaml.safe_load(path.read_text()) or {}


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
