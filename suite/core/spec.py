"""The task interface every environment family implements.

A task is a fixed multi-agent problem (e.g. MPE Cooperative Navigation) with a fixed number of
agents, per-agent observation size, global state size and action space. Environments are
*batched*: one object steps B independent copies in lockstep, which is what both dataset
collection and evaluation need.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Protocol

import numpy as np


@dataclass(frozen=True)
class TaskSpec:
    """Static description of a task; datasets and algorithms are checked against it."""

    task_id: str  # e.g. "mpe-cn"
    domain: str  # "mpe" | "mamujoco" | "smax" | "smac"
    n_agents: int
    obs_dim: int  # per agent
    state_dim: int
    act_dim: int  # continuous: action dimensions per agent; discrete: number of actions
    discrete: bool
    episode_limit: int
    tiers: tuple[str, ...]  # dataset quality tiers the paper uses for this task
    # Name of the score on the leaderboard: "normalised" (100·(R−R_rand)/(R_exp−R_rand)) or
    # "win_rate" (SMAC).
    score: str = "normalised"
    description: str = ""
    # Versions of the packages that define the dynamics (recorded in datasets and results).
    env_versions: Callable[[], dict[str, str]] = field(default=lambda: {}, compare=False)

    @property
    def action_dtype(self) -> type:
        return np.int64 if self.discrete else np.float32


@dataclass
class Step:
    """What a batched env returns from reset() and step(); leading axis B = batch of envs.

    obs      float32 [B, n_agents, obs_dim]
    state    float32 [B, state_dim]
    avail    uint8   [B, n_agents, n_actions] for discrete tasks, else None
    reward   float32 [B]   team reward, as reported (0 on reset)
    terminal bool    [B]   true terminal (no bootstrapping)
    timeout  bool    [B]   episode cut by the time limit (bootstrapping allowed)
    info     extra per-env arrays, e.g. {"won": bool [B]}
    """

    obs: np.ndarray
    state: np.ndarray
    reward: np.ndarray
    terminal: np.ndarray
    timeout: np.ndarray
    avail: np.ndarray | None = None
    info: dict[str, np.ndarray] = field(default_factory=dict)

    @property
    def done(self) -> np.ndarray:
        return self.terminal | self.timeout


class BatchedEnv(Protocol):
    """B envs in lockstep. Once an env reports done it must not be stepped with meaningful
    actions again until the next reset(); callers mask its further output."""

    spec: TaskSpec
    num_envs: int

    def reset(self, seeds: np.ndarray) -> Step:
        """Reset all B envs; env b is seeded with seeds[b] (one int each)."""
        ...

    def step(self, actions: np.ndarray) -> Step:
        """actions: float32 [B, n_agents, act_dim] in [-1, 1], or int64 [B, n_agents]."""
        ...


# A policy maps the batched step to actions of the shape BatchedEnv.step expects.
Policy = Callable[[Step], np.ndarray]


@dataclass(frozen=True)
class Task:
    """A registered task: its spec and a factory for batched envs. Env settings (SMAX/SMAC map, MPE
    physics and prey) are the factory's bound arguments and are recorded, typed, in
    `spec.env_versions` (part of every result); dataset recipes and behaviour trainers are typed
    objects of datasets/ (datasets/recipes.py), not attributes of the task."""

    spec: TaskSpec
    make_env: Callable[[int], BatchedEnv]  # num_envs -> env
