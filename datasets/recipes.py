"""Dataset recipes: how a task family's datasets are made where the default does not fit.

The default (no recipe) rolls the behaviour policy out in the task's Python `BatchedEnv`
(datasets/build.py: `collect`), looks the behaviour up in datasets/behaviour.py and measures the
reference returns with `protocol.rollout_returns`. A family that needs more registers a `Recipe`
here, keyed by task-id prefix; the env layer (suite/envs) knows nothing of datasets.

    behaviours(task_id, tier) -> Behaviour | None
        the family's own behaviour policies (SMAX: the committed MAPPO checkpoints)
    collect(task, behaviour, seeds [E] int64, rng) -> format-v1 arrays
        one episode per seed with `behaviour.make(rng)`, episode-major, episodes in seed order
        (obs, state, actions, rewards, next_obs, next_state, next_actions, next_actions_valid,
        terminals, timeouts, episode_ids, steps, avail_actions/next_avail_actions for discrete
        tasks); may add `episode_won` (bool [E]), which build stores as `win_rate`
    references(task) -> {"random": float, "expert": float}
        the reference returns (NaN for win-rate tasks)
    bench(task, episodes, workers) -> {"env_steps", "seconds", "workers"}
        `datasets bench`: the family's own collection benchmark (warm-up excluded)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np

from plcql_bench.suite.core.spec import Policy, Task
from plcql_bench.datasets import smax_behaviour as sb
from plcql_bench.datasets.smax_collect import bench, workers_from_env
from plcql_bench.datasets.smax_tiers import collect_smax_tier
from plcql_bench.suite.envs.smax import TIERS, map_of


@dataclass(frozen=True)
class Behaviour:
    """A behaviour policy that generates a tier: what a recipe's `behaviours` returns and datasets/behaviour.py
    looks up (it lives here because behaviour.py imports the recipes)."""

    policy_id: str
    make: Callable[[np.random.Generator], Policy]
    note: str = ""
    # "policy": roll out make(rng); "replay": read the training replay file `replay["file"]`;
    # "parts": roll out `replay["parts"]` in order (medium-replay rebuilt from checkpoints)
    kind: str = "policy"
    replay: dict | None = None  # medium-replay: {"episodes", "up_to_env_step", "file" | "parts", ...}


@dataclass(frozen=True)
class Recipe:
    behaviours: Callable[[str, str], Behaviour | None] | None = None
    collect: Callable[[Task, Behaviour, np.ndarray, np.random.Generator], dict[str, np.ndarray]] | None = None
    references: Callable[[Task], dict[str, float]] | None = None
    bench: Callable[[Task, int, int], dict[str, float]] | None = None


DEFAULT = Recipe()


def recipe_for(task_id: str) -> Recipe:
    """The recipe of the longest task-id prefix in RECIPES that `task_id` starts with, else DEFAULT."""
    keys = [k for k in RECIPES if task_id.startswith(k)]
    return RECIPES[max(keys, key=len)] if keys else DEFAULT


# --------------------------------------------------------------------------------------------- SMAX
def _smax_behaviours(task_id: str, tier: str) -> Behaviour | None:
    """The Behaviour generating (task, tier) from the committed MAPPO checkpoints
    (datasets/smax_behaviour.py), or None when there is no card yet."""

    if tier not in TIERS:
        return None
    try:
        card = sb.read_card(task_id)
    except FileNotFoundError:
        return None
    return Behaviour(sb.policy_id(card, tier), lambda rng: tier,
                     f"MAPPO checkpoints, {tier} (see docs/smax.md)")


def _smax_collect(task: Task, behaviour: Behaviour, seeds: np.ndarray, rng) -> dict[str, np.ndarray]:
    """vmap + scan collection; adds episode_won [E]. Runs in ``PLCQL_SMAX_WORKERS`` processes
    (default 1; `datasets build --workers N` sets it), which changes the dataset for
    mixed/medium-replay and may change it in the last bits otherwise (see docs/smax.md)."""

    arrays, meta, _ = collect_smax_tier(task.spec.task_id, behaviour.make(rng), seeds,
                                        workers=workers_from_env())
    arrays["episode_won"] = meta["won"]
    return arrays


def _smax_bench(task: Task, episodes: int, workers: int = 1) -> dict[str, float]:
    """Random-policy collection speed, compile excluded (smax_collect.bench); this map's result."""

    return bench([map_of(task.spec.task_id)], episodes, log=None, workers=workers)[task.spec.task_id]


def _no_references(task: Task) -> dict[str, float]:
    return {"random": float("nan"), "expert": float("nan")}  # win-rate task: no normalisation


RECIPES: dict[str, Recipe] = {
    "smax-": Recipe(behaviours=_smax_behaviours, collect=_smax_collect, references=_no_references,
                    bench=_smax_bench),
}
