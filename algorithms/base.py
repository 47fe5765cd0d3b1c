"""The algorithm contract the runner drives (`Algorithm`), and the algorithm registry.

An algorithm file defines a config dataclass and a class that derives from `Algorithm` (through
`Checkpointable`, algorithms/common/checkpoint.py) and
  * is built from (TaskSpec, config, seed, device),
  * consumes batches of transitions in `update()` and returns a dict of float metrics,
  * acts in the env through `act()` (deterministic at evaluation),
  * saves and restores everything needed to resume (`state_dict()` / `load_state_dict()`).
The runner owns data loading, evaluation, seeding, checkpoints and results. `Algorithm` declares every
attribute and hook the runner, the evaluation protocol and the tools read, each with its default, so
nothing is probed with hasattr.
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib
import json
import pkgutil
import re
from typing import TYPE_CHECKING, Any, ClassVar, Sequence

import numpy as np

if TYPE_CHECKING:
    import torch

# The batch types are the runner's (suite/core/batch.py); algorithms import them from here.
from plcql_bench.suite.core.batch import Batch, BatchSampler, EpisodeBatch  # noqa: F401
from plcql_bench.suite.core.spec import TaskSpec
import plcql_bench.algorithms as package


class Algorithm:
    """The contract. Required: `name`, `Config`, `__init__`, `update`, `act`, `state_dict`, `load_state_dict`;
    every other member has the default written here, which an algorithm overrides when it needs to.
    (A Config dataclass may declare `key_neutral: ClassVar[dict]`: see `identity_config`.)"""

    name: ClassVar[str]
    Config: ClassVar[type]
    discrete: ClassVar[bool | None] = None  # the action kind it handles: False, True, or None = both
    # What `update(sample)` receives: "transitions" -> sample(batch_size) returns a Batch;
    # "episodes" -> sample(batch_size) returns an EpisodeBatch of whole padded episodes
    # (datasets/episodes.py: EpisodeSampler).
    batch_kind: ClassVar[str] = "transitions"
    # The reward its Bellman targets use, following its reference (docs/algorithms/<name>.md): "team" (the
    # dataset's `rewards`), "agent0" (agent 0's own reward, as CFCQL's central critic) or "per_agent"
    # (each agent's own, [B, n], as OMAR's per-agent critics). On data without per-agent rewards (format
    # v1) every choice is the team reward, [B].
    reward: ClassVar[str] = "team"
    # checkpoint key of an earlier version -> today's key (algorithms/common/checkpoint.py)
    legacy_keys: ClassVar[dict[str, str]] = {}
    # A registered variant (`register_variant`, a sweep): the algorithm it is built on and the config
    # defaults it changes; a sweep variant's field -> value, applied after the task's and profile's values.
    variant_of: ClassVar[str | None] = None
    variant_defaults: ClassVar[dict[str, Any]] = {}
    sweep: ClassVar[dict[str, Any]] = {}
    # Set by `load_state_dict`: the generators whose saved stream could not continue on this device kind.
    reseeded_generators: Sequence[str] = ()

    def __init__(self, spec: TaskSpec, config: Any, seed: int, device: str = "cpu") -> None:
        raise NotImplementedError

    @classmethod
    def task_overrides(cls, spec: TaskSpec, tier: str) -> dict[str, Any]:
        """The config values for a task and tier (its YAML table, algorithms/configs/); default: none."""
        return {}

    def update(self, sample: "BatchSampler") -> dict[str, float]:
        """One update round (the unit the profile's `updates` counts). Draws its own batches
        from `sample(batch_size)` so rounds with several critic updates get fresh batches."""
        raise NotImplementedError

    def act(self, obs: np.ndarray, avail: np.ndarray | None = None) -> np.ndarray:
        """Deterministic (greedy) actions for evaluation. obs [B, n, obs_dim] -> actions."""
        raise NotImplementedError

    def begin_episodes(self, num_envs: int) -> None:
        """Called by the evaluation protocol before the first `act()` of every batch of num_envs episodes,
        so a recurrent `act()` can keep per-env state (GRU hidden state, last actions); default: nothing."""

    def evaluating(self) -> contextlib.AbstractContextManager:
        """A context the whole of one evaluation runs in (runner.evaluate_policy), so a mode switch costs once
        per evaluation, not at every `act()` (DeterministicActors: the actors in evaluation mode); default:
        nothing."""
        return contextlib.nullcontext()

    def diagnostics(self, probe: Any) -> dict[str, float]:
        """Values logged at every evaluation point, computed on a fixed probe batch (the same rows at every
        point; it must not touch the training random streams); default: none."""
        return {}

    def run_warnings(self, history: list[dict]) -> tuple[list[str], dict[str, Any]]:
        """Warnings for final.json from the run's metric rows, and extra fields for it (PLCQL: PAR collapsed
        to one k); default: none."""
        return [], {}

    def state_dict(self) -> dict[str, Any]:
        raise NotImplementedError

    def load_state_dict(self, state: dict[str, Any]) -> None:
        raise NotImplementedError


REWARDS = ("team", "agent0", "per_agent")


def reward_kind(cls_or_algo: Any) -> str:
    """"team" (default), "agent0" or "per_agent": the reward the algorithm's targets use."""
    kind = cls_or_algo.reward
    if kind not in REWARDS:
        raise ValueError(f"{getattr(cls_or_algo, 'name', cls_or_algo)}: unknown reward {kind!r} (known: {REWARDS})")
    return kind


def per_agent_rewards(rewards: "torch.Tensor") -> "torch.Tensor":
    """A batch's rewards as a column per agent for per-agent critics: [B, n] as given, [B] as [B, 1]."""
    return rewards if rewards.dim() == 2 else rewards.unsqueeze(1)


def batch_kind(cls_or_algo: Any) -> str:
    """"transitions" (default) or "episodes"."""
    kind = cls_or_algo.batch_kind
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
    return (False, True) if cls.discrete is None else (bool(cls.discrete),)


def register(cls: type) -> type:
    """Class decorator: makes an algorithm available to the CLI under `cls.name`. A name may be
    registered once per action kind (see IMPLEMENTATIONS)."""
    if not (isinstance(cls, type) and issubclass(cls, Algorithm)):
        raise TypeError(f"@register: {cls!r} does not derive from algorithms.base.Algorithm (through Checkpointable)")
    for kind in _kinds(cls):
        if cls.name in IMPLEMENTATIONS[kind]:
            what = "discrete" if kind else "continuous"
            raise ValueError(f"algorithm {cls.name!r} registered twice ({what}-action implementation)")
    for kind in _kinds(cls):
        IMPLEMENTATIONS[kind][cls.name] = cls
    REGISTRY[cls.name] = IMPLEMENTATIONS[False].get(cls.name) or IMPLEMENTATIONS[True][cls.name]
    return cls


def _by_kind(name: str) -> dict[bool, type]:
    """{discrete: class} of a registered algorithm or of a sweep variant (registered on first use)."""
    load_all()
    for table in (IMPLEMENTATIONS, SWEEPS):
        found = {kind: reg[name] for kind, reg in table.items() if name in reg}
        if found:
            return found
    return _register_sweep(name)


def implementations(name: str) -> dict[str, type]:
    """{"continuous": cls, "discrete": cls} for the kinds `name` is implemented for ({} if unknown)."""
    return {("discrete" if kind else "continuous"): cls for kind, cls in _by_kind(name).items()}


def get_algorithm(name: str, discrete: bool | None = None) -> type:
    """The class registered as `name` (or the sweep variant it names); with `discrete` given (the task's
    `spec.discrete`), the implementation for that action kind. KeyError with a one-line message when there
    is none."""
    found = _by_kind(name)
    if not found:
        known = ", ".join(sorted(REGISTRY))
        raise KeyError(f"unknown algorithm {name!r} (known: {known})")
    if discrete is None:
        return found.get(False) or found[True]
    cls = found.get(bool(discrete))
    if cls is None:
        kind = "discrete" if discrete else "continuous"
        raise KeyError(f"{name} has no {kind}-action implementation")
    return cls


# Modules of this package that define no algorithm; every other module in algorithms/ is one (or two:
# continuous and discrete) and is imported by `load_all`, so a new file registers itself.
NOT_ALGORITHMS = frozenset({"base", "cli"})


def algorithm_modules() -> list[str]:
    """The algorithm modules of this package (algorithms/*.py but base and cli), sorted by name."""

    return sorted(m.name for m in pkgutil.iter_modules(package.__path__)
                  if not m.ispkg and m.name not in NOT_ALGORITHMS)


def load_all() -> dict[str, type]:
    """Import every algorithm module (discovered in the package) so their @register decorators run."""

    for name in algorithm_modules():
        importlib.import_module(f"plcql_bench.algorithms.{name}")
    return REGISTRY


def all_algorithm_classes() -> list[type]:
    """Every registered implementation (both action kinds, variants included)."""
    load_all()
    return list(dict.fromkeys(c for reg in IMPLEMENTATIONS.values() for c in reg.values()))


def identity_config(config: Any) -> dict[str, Any]:
    """The config as a run's identity (its run key, config.json, final.json) records it: every field,
    except the fields a Config declares key-neutral (`key_neutral: ClassVar[dict]`, field -> value) while
    they hold that value. A field added after results existed is key-neutral at the value that does what
    the code did before it, so adding an option does not re-key, and so re-run, the finished runs; any
    other value is recorded and keys the run as usual. A reader of a recorded config takes an absent
    key-neutral field as its neutral value."""
    neutral = getattr(type(config), "key_neutral", {})
    return {k: v for k, v in dataclasses.asdict(config).items() if not (k in neutral and v == neutral[k])}


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
    return register(_variant_class(base, name, doc, defaults))


def _variant_class(base: type, name: str, doc: str, defaults: dict[str, Any]) -> type:
    fields = {f.name: f for f in dataclasses.fields(base.Config)}
    unknown = sorted(set(defaults) - set(fields))
    if unknown:
        raise KeyError(f"{name}: unknown config field(s) {unknown} for {base.name}")
    new_fields = [(k, fields[k].type, dataclasses.field(default=v)) for k, v in defaults.items()]
    config = dataclasses.make_dataclass(f"{base.Config.__name__}_{name.replace('-', '_')}", new_fields,
                                        bases=(base.Config,))
    config.__module__ = base.__module__
    return type(f"{base.__name__}_{name.replace('-', '_')}", (base,),
                {"name": name, "Config": config, "variant_of": base.name, "variant_defaults": dict(defaults),
                 "__doc__": doc or f"{base.name} with {defaults}", "__module__": base.__module__})


# ----------------------------------------------------------------------------- sweep variants
# `all --set ALGO.FIELD=V1,V2` trains one variant per value, named `<algo>-<field>-<value>` (e.g.
# plcql-temperature-0.5). The name alone defines it, so any process (a spawned worker, `plan`, the
# leaderboard) makes it on first use (get_algorithm): no registry file, nothing to pass along.
SWEEP_NAME = re.compile(r"[A-Za-z0-9._+-]+")


def sweep_name(base: str, field: str, value: Any) -> str:
    """The variant of algorithm `base` with config `field` = `value`; ValueError when the value cannot be
    written in a name (a path component, and one `--only` and marl-eval can take: no commas)."""
    text = value if isinstance(value, str) else json.dumps(value)
    name = f"{base}-{field}-{text}"
    if not SWEEP_NAME.fullmatch(name) or parse_sweep_value(text) != value:
        raise ValueError(f"{field}={value!r} cannot name a variant (a sweep value is a number, true/false, "
                         "null or a word of letters, digits and . _ + -)")
    return name


def parse_sweep_value(text: str) -> Any:
    """A value as `--set` reads it: JSON when it parses, else the string."""
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text


def parse_sweep_name(name: str) -> tuple[str, str, Any] | None:
    """(base algorithm, field, value) of a sweep variant's name, or None when it names none: the longest
    registered name that prefixes it (plcql-k1 before plcql), then one of that algorithm's config fields."""
    if not SWEEP_NAME.fullmatch(name):
        return None
    load_all()
    for base in sorted(REGISTRY, key=len, reverse=True):
        if not name.startswith(base + "-"):
            continue
        field, sep, text = name[len(base) + 1:].partition("-")
        if sep and text and field in _fields_of(base):
            return base, field, parse_sweep_value(text)
    return None


# Sweep variants by action kind, apart from the registry: they are not algorithms of the suite (not listed,
# not documented), only what a name given to `all --set` (or found in a results folder) stands for.
SWEEPS: dict[bool, dict[str, type]] = {False: {}, True: {}}


def _register_sweep(name: str) -> dict[bool, type]:
    """{discrete: class} of the sweep variant `name` (each action kind its base has the field for), made
    now; {} when `name` names no sweep. Its value applies after the task's and the profile's config
    (suite/runs/runner.py: resolve_config), as `--set` does, so a field the task tables set still varies."""
    parsed = parse_sweep_name(name)
    if parsed is None:
        return {}
    base, field, value = parsed
    if sweep_name(base, field, value) != name:  # e.g. "1.50" for 1.5: one variant has one name
        return {}
    for cls in _implementations_with(base, field):
        variant = _variant_class(cls, name, f"{base} with {field} = {value!r} (a sweep: all --set)", {field: value})
        variant.sweep = {field: value}
        for kind in _kinds(variant):
            SWEEPS[kind][name] = variant
    return {kind: reg[name] for kind, reg in SWEEPS.items() if name in reg}


def _implementations_with(base: str, field: str) -> list[type]:
    """The implementations of `base` (per action kind) whose Config has `field`."""
    classes = dict.fromkeys(IMPLEMENTATIONS[kind][base] for kind in (False, True) if base in IMPLEMENTATIONS[kind])
    return [cls for cls in classes if field in {f.name for f in dataclasses.fields(cls.Config)}]


def _fields_of(base: str) -> set[str]:
    """Config fields of any implementation of `base`."""
    return {f.name for kind in (False, True) if base in IMPLEMENTATIONS[kind]
            for f in dataclasses.fields(IMPLEMENTATIONS[kind][base].Config)}
