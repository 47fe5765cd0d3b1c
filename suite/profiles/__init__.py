"""Profiles name a budget: dataset sizes, update rounds, evaluation schedule and the default
run matrix. `smoke` is seconds per run; `paper` is the references' budgets. A profile is a YAML
file shipped here, or any YAML path with the same keys."""

from __future__ import annotations

from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

import yaml

from plcql_bench.suite.errors import BenchError


@dataclass(frozen=True)
class Profile:
    name: str
    description: str
    dataset_episodes: dict[str, int]
    updates: dict[str, int]
    eval_every: int
    eval_episodes: dict[str, int]  # per 'task/tier', 'task', 'default' like `updates`
    final_eval_episodes: dict[str, int]
    checkpoint_every: int
    matrix: dict[str, list]
    source: str
    # Config overrides for every algorithm that has the field (e.g. a smaller batch for smoke).
    algo_overrides: dict[str, Any] = field(default_factory=dict)
    # The profile whose datasets this one trains on (its own name unless `datasets: {from: X}`).
    data_profile: str = ""

    def __post_init__(self) -> None:
        if not self.data_profile:
            object.__setattr__(self, "data_profile", self.name)

    def episodes_for(self, task_id: str, tier: str) -> int:
        return _lookup(self.dataset_episodes, task_id, tier)

    def updates_for(self, task_id: str, tier: str) -> int:
        return _lookup(self.updates, task_id, tier)

    def train_budget(self, task_id: str, tier: str) -> dict[str, int]:
        """The part of the profile that changes a run's result (it enters the run key)."""
        return {
            "updates": self.updates_for(task_id, tier),
            "eval_every": self.eval_every,
            "eval_episodes": _lookup(self.eval_episodes, task_id, tier),
            "final_eval_episodes": _lookup(self.final_eval_episodes, task_id, tier),
        }


def _lookup(table: dict[str, int], task_id: str, tier: str) -> int:
    """Most specific key wins: 'task/tier', then 'task', then 'default'."""
    for key in (f"{task_id}/{tier}", task_id, "default"):
        if key in table:
            return int(table[key])
    raise BenchError(f"profile table has no entry for {task_id}/{tier} and no 'default'")


def _table(value: Any) -> dict[str, int]:
    """A per-task table from YAML: a mapping, or one number for every task."""
    if isinstance(value, dict):
        return {str(k): int(v) for k, v in value.items()}
    return {"default": int(value)}


def builtin_profiles() -> list[str]:
    return sorted(p.name[:-5] for p in resources.files(__name__).iterdir() if p.name.endswith(".yaml"))


def load_profile(name_or_path: str) -> Profile:
    path = Path(name_or_path)
    if path.suffix in (".yaml", ".yml") and path.exists():
        text, source = path.read_text(), str(path)
    elif name_or_path in builtin_profiles():
        text = resources.files(__name__).joinpath(f"{name_or_path}.yaml").read_text()
        source = f"builtin:{name_or_path}"
    else:
        known = ", ".join(builtin_profiles())
        raise BenchError(f"unknown profile {name_or_path!r} (built in: {known}; or pass a .yaml path)")
    try:
        raw = yaml.safe_load(text)
        return _parse(raw, source)
    except (yaml.YAMLError, KeyError, TypeError, ValueError) as exc:
        msg = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise BenchError(f"{source}: invalid profile: {msg}") from None


def _parse(raw: dict[str, Any], source: str) -> Profile:
    train = raw["train"]
    if int(train["checkpoint_every"]) % int(train["eval_every"]):
        raise ValueError("train.checkpoint_every must be a multiple of train.eval_every")
    datasets, data_profile = raw["datasets"], str(raw["name"])
    if "from" in datasets:  # reuse another built-in profile's datasets (same files, same sizes)
        if set(datasets) != {"from"}:
            raise ValueError("datasets: give either 'from: <profile>' or 'episodes', not both")
        data_profile = str(datasets["from"])
        if data_profile not in builtin_profiles():
            raise ValueError(f"datasets.from: unknown built-in profile {data_profile!r}")
        datasets = yaml.safe_load(resources.files(__name__).joinpath(f"{data_profile}.yaml").read_text())["datasets"]
    return Profile(
        name=str(raw["name"]),
        description=str(raw.get("description", "")),
        data_profile=data_profile,
        dataset_episodes={k: int(v) for k, v in datasets["episodes"].items()},
        updates=_table(train["updates"]),
        eval_every=int(train["eval_every"]),
        eval_episodes=_table(train["eval_episodes"]),
        final_eval_episodes=_table(train["final_eval_episodes"]),
        checkpoint_every=int(train["checkpoint_every"]),
        matrix={k: list(v) for k, v in raw["matrix"].items()},
        source=source,
        algo_overrides=dict(raw.get("algo_overrides") or {}),
    )
