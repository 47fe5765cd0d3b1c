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


@dataclass
class EpisodeBatch:
    """A batch of B whole episodes, padded to T steps (T = the longest episode in the dataset), as
    torch tensors on the algorithm's device. Index t in 0..T-1 is a transition; the extra index T
    (and index len for an episode of length len < T) holds the final next observation.

    obs       float32 [B, T+1, n, obs_dim]   o_t; o_len = the episode's last next_obs; zeros after
    state     float32 [B, T+1, state_dim]    s_t, same layout
    avail     float32 [B, T+1, n, n_actions] availability at t (index len: next_avail of the last
                                             step); all zeros on padding (no action available)
    actions   int64   [B, T, n]              a_t (0 on padding)
    rewards   float32 [B, T]                 team reward r_t (0 on padding)
    terminals float32 [B, T]                 1 at a true terminal (no bootstrap); timeouts are 0
    mask      float32 [B, T]                 1 on real steps t < len, 0 on padding
    lengths   int64   [B]                    len of each episode
    timeouts  float32 [B, T] or None         1 where the time limit cut the episode (a learner that
                                             follows the references counts it as terminal:
                                             DiscreteAlgorithm.scaled, `bootstrap_timeouts`)
    """

    obs: torch.Tensor
    state: torch.Tensor
    avail: torch.Tensor
    actions: torch.Tensor
    rewards: torch.Tensor
    terminals: torch.Tensor
    mask: torch.Tensor
    lengths: torch.Tensor
    timeouts: torch.Tensor | None = None

    @property
    def size(self) -> int:
        return self.rewards.shape[0]

    @property
    def max_t(self) -> int:
        return self.rewards.shape[1]


class Algorithm(Protocol):
    name: ClassVar[str]
    Config: ClassVar[type]
    discrete: ClassVar[bool | None]  # None = both
    # What `update(sample)` receives: "transitions" -> sample(batch_size) returns a Batch;
    # "episodes" -> sample(batch_size) returns an EpisodeBatch of whole padded episodes
    # (suite/episodes.py: EpisodeSampler). Optional; absent means "transitions".
    batch_kind: ClassVar[str]

    def __init__(self, spec: TaskSpec, config: Any, seed: int, device: str = "cpu") -> None: ...

    def update(self, sample: "BatchSampler") -> dict[str, float]:
        """One update round (the unit the profile's `updates` counts). Draws its own batches
        from `sample(batch_size)` so rounds with several critic updates get fresh batches."""
        ...

    def act(self, obs: np.ndarray, avail: np.ndarray | None = None) -> np.ndarray:
        """Deterministic (greedy) actions for evaluation. obs [B, n, obs_dim] -> actions."""
        ...

    # Optional (recurrent policies): `begin_episodes(num_envs)` is called by the evaluation
    # protocol before the first `act()` of every batch of num_envs episodes, so `act()` can keep
    # per-env state (GRU hidden state, last actions) between the steps of those episodes.
    # def begin_episodes(self, num_envs: int) -> None: ...

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: dict[str, Any]) -> None: ...


class BatchSampler(Protocol):
    def __call__(self, batch_size: int) -> Batch: ...  # EpisodeBatch for batch_kind "episodes"


def batch_kind(cls_or_algo: Any) -> str:
    """"transitions" (default) or "episodes"."""
    kind = getattr(cls_or_algo, "batch_kind", "transitions")
    if kind not in ("transitions", "episodes"):
        raise ValueError(f"{getattr(cls_or_algo, 'name', cls_or_algo)}: unknown batch_kind {kind!r}")
    return kind


# One name may have two implementations: a continuous-action class (discrete=False) and a
# discrete-action class (discrete=True), e.g. "cfcql" on MPE and on SMAX, so a leaderboard row is one
# algorithm across domains. A class with discrete=None handles both kinds. IMPLEMENTATIONS holds
# both kinds; REGISTRY maps each name to one representative class (the continuous or both-kinds
# class when there is one, else the discrete one), which is what `load_all()` returns.
REGISTRY: dict[str, type] = {}
IMPLEMENTATIONS: dict[bool, dict[str, type]] = {False: {}, True: {}}


def _kinds(cls: type) -> tuple[bool, ...]:
    d = getattr(cls, "discrete", None)
    return (False, True) if d is None else (bool(d),)


def register(cls: type) -> type:
    """Class decorator: makes an algorithm available to the CLI under `cls.name`. A name may be
    registered once per action kind (see IMPLEMENTATIONS)."""
    for kind in _kinds(cls):
        if cls.name in IMPLEMENTATIONS[kind]:
            what = "discrete" if kind else "continuous"
            raise ValueError(f"algorithm {cls.name!r} registered twice ({what}-action implementation)")
    for kind in _kinds(cls):
        IMPLEMENTATIONS[kind][cls.name] = cls
    REGISTRY[cls.name] = IMPLEMENTATIONS[False].get(cls.name) or IMPLEMENTATIONS[True][cls.name]
    return cls


def implementations(name: str) -> dict[str, type]:
    """{"continuous": cls, "discrete": cls} for the kinds `name` is implemented for ({} if unknown)."""
    load_all()
    return {("discrete" if kind else "continuous"): reg[name]
            for kind, reg in IMPLEMENTATIONS.items() if name in reg}


def get_algorithm(name: str, discrete: bool | None = None) -> type:
    """The class registered as `name`; with `discrete` given (the task's `spec.discrete`), the
    implementation for that action kind. KeyError with a one-line message when there is none."""
    load_all()
    if name not in REGISTRY:
        known = ", ".join(sorted(REGISTRY))
        raise KeyError(f"unknown algorithm {name!r} (known: {known})")
    if discrete is None:
        return REGISTRY[name]
    cls = IMPLEMENTATIONS[bool(discrete)].get(name)
    if cls is None:
        kind = "discrete" if discrete else "continuous"
        raise KeyError(f"{name} has no {kind}-action implementation")
    return cls


def load_all() -> dict[str, type]:
    """Import every algorithm module so their @register decorators run."""
    from plcql_bench.algorithms import (  # noqa: F401
        awac, bc, cfcql, dof, iql, macql, maicq, matd3bc, omar, plcql, spacql,
    )
    from plcql_bench.algorithms import (  # noqa: F401  (discrete-action implementations)
        bc_discrete, cfcql_discrete, macql_discrete, plcql_discrete, spacql_discrete,
    )
    from plcql_bench.algorithms import maicq_discrete  # noqa: F401
    from plcql_bench.algorithms import omar_discrete  # noqa: F401
    from plcql_bench.algorithms import iql_discrete  # noqa: F401
    from plcql_bench.algorithms import awac_discrete  # noqa: F401
    from plcql_bench.algorithms import madtkd  # noqa: F401

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
