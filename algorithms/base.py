"""The small protocol the runner drives, and the algorithm registry.

An algorithm file defines a config dataclass and a class that
  * is built from (TaskSpec, config, seed, device),
  * consumes batches of transitions in `update()` and returns a dict of float metrics,
  * acts in the env through `act()` (deterministic at evaluation),
  * saves and restores everything needed to resume (`state_dict()` / `load_state_dict()`).
The runner owns data loading, evaluation, seeding, checkpoints and results.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, ClassVar, Protocol

import numpy as np
import torch

from plcql_bench.suite.spec import TaskSpec


@dataclass
class Batch:
    """A batch of B transitions as torch tensors on the algorithm's device.

    obs            float32 [B, n, obs_dim]      next_obs          float32 [B, n, obs_dim]
    state          float32 [B, state_dim]       next_state        float32 [B, state_dim]
    actions        float32 [B, n, act_dim]  (continuous)  or int64 [B, n] (discrete)
    next_actions   like actions: the dataset's next joint action a'
    next_actions_valid float32 [B]: 1 where a' is known; 0 at the last step of an episode whose
                   next action the dataset could not record (PAR targets then replace every agent)
    rewards        float32 [B]   team reward
    terminals      float32 [B]   1 = true terminal (no bootstrap); time-limit cuts are NOT terminal
    avail, next_avail  float32 [B, n, n_actions] for discrete tasks, else None
    """

    obs: torch.Tensor
    state: torch.Tensor
    actions: torch.Tensor
    rewards: torch.Tensor
    next_obs: torch.Tensor
    next_state: torch.Tensor
    next_actions: torch.Tensor
    next_actions_valid: torch.Tensor
    terminals: torch.Tensor
    avail: torch.Tensor | None = None
    next_avail: torch.Tensor | None = None

    @property
    def size(self) -> int:
        return self.rewards.shape[0]


class Algorithm(Protocol):
    name: ClassVar[str]
    Config: ClassVar[type]
    discrete: ClassVar[bool | None]  # None = both

    def __init__(self, spec: TaskSpec, config: Any, seed: int, device: str = "cpu") -> None: ...

    def update(self, sample: "BatchSampler") -> dict[str, float]:
        """One update round (the unit the profile's `updates` counts). Draws its own batches
        from `sample(batch_size)` so rounds with several critic updates get fresh batches."""
        ...

    def act(self, obs: np.ndarray, avail: np.ndarray | None = None) -> np.ndarray:
        """Deterministic (greedy) actions for evaluation. obs [B, n, obs_dim] -> actions."""
        ...

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: dict[str, Any]) -> None: ...


class BatchSampler(Protocol):
    def __call__(self, batch_size: int) -> Batch: ...


REGISTRY: dict[str, type] = {}


def register(cls: type) -> type:
    """Class decorator: makes an algorithm available to the CLI under `cls.name`."""
    if cls.name in REGISTRY:
        raise ValueError(f"algorithm {cls.name!r} registered twice")
    REGISTRY[cls.name] = cls
    return cls


def get_algorithm(name: str) -> type:
    load_all()
    if name not in REGISTRY:
        known = ", ".join(sorted(REGISTRY))
        raise KeyError(f"unknown algorithm {name!r} (known: {known})")
    return REGISTRY[name]


def load_all() -> dict[str, type]:
    """Import every algorithm module so their @register decorators run."""
    from plcql_bench.algorithms import (  # noqa: F401
        awac, bc, cfcql, dof, iql, macql, maicq, matd3bc, omar, plcql, spacql,
    )

    return REGISTRY


def make_config(cls: type, overrides: dict[str, Any]) -> Any:
    """Build cls.Config with overrides, rejecting unknown fields with a clear message."""
    fields = {f.name for f in dataclasses.fields(cls.Config)}
    unknown = sorted(set(overrides) - fields)
    if unknown:
        raise KeyError(f"{cls.name}: unknown config field(s) {unknown}; known: {sorted(fields)}")
    return cls.Config(**overrides)


def register_variant(base: type, name: str, doc: str = "", **defaults: Any) -> type:
    """Register `name` as a variant of the algorithm class `base`: a subclass whose Config has
    different defaults (e.g. an ablation such as PLCQL with k fixed to 1). Overrides passed to
    `make_config` still apply on top. Returns the new class (`variant_of` names the base)."""
    fields = {f.name: f for f in dataclasses.fields(base.Config)}
    unknown = sorted(set(defaults) - set(fields))
    if unknown:
        raise KeyError(f"{name}: unknown config field(s) {unknown} for {base.name}")
    new_fields = [(k, fields[k].type, dataclasses.field(default=v)) for k, v in defaults.items()]
    config = dataclasses.make_dataclass(f"{base.Config.__name__}_{name.replace('-', '_')}", new_fields,
                                        bases=(base.Config,))
    config.__module__ = base.__module__
    cls = type(f"{base.__name__}_{name.replace('-', '_')}", (base,),
               {"name": name, "Config": config, "variant_of": base.name, "variant_defaults": dict(defaults),
                "__doc__": doc or f"{base.name} with {defaults}", "__module__": base.__module__})
    return register(cls)
