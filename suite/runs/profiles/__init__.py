"""Profiles name a budget: dataset sizes, update rounds, evaluation schedule and the default
run matrix. `smoke` is seconds per run; `paper` is the references' budgets. A profile is a YAML
file shipped here, or any YAML path with the same keys."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any, Iterable

import yaml

from plcql_bench.suite.core.errors import BenchError
from plcql_bench.suite.core.validate import (ConfigError, config_fields, did_you_mean, excerpt, field_problem, is_int,
                                             load_user_yaml, unknown_key)
from plcql_bench.suite.envs.tasks import known_task_ids
from plcql_bench.algorithms.base import all_algorithm_classes
from plcql_bench.datasets.generations import DEFAULT_GENERATION, GENERATIONS
from plcql_bench.suite.envs.tasks import ALL_TIERS, get_task


@dataclass(frozen=True)
class Profile:
    name: str
    description: str
    dataset_episodes: dict[str, int]
    updates: dict[str, int]
    eval_every: dict[str, int]  # per 'task/tier', 'task', 'default' like `updates`
    eval_episodes: dict[str, int]
    final_eval_episodes: dict[str, int]
    checkpoint_every: dict[str, int]  # a multiple of the cell's eval_every (checked on load)
    matrix: dict[str, list]
    source: str
    # Config overrides for every algorithm that has the field (e.g. a smaller batch for smoke).
    algo_overrides: dict[str, Any] = field(default_factory=dict)
    # The profile whose datasets this one trains on (its own name unless `datasets: {from: X}`).
    data_profile: str = ""
    # The dataset generation its continuous tasks' tiers are built with (datasets/generations.py).
    generation: str = "v1"
    # `datasets: {import: {<task>/<tier>: {format, path, uid, seed}}}`: tiers imported (an OG-MARL vault, OMAR
    # .npy, CFCQL .h5) when missing, instead of collected; path made absolute (relative to the profile file).
    dataset_imports: dict[str, dict] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not self.data_profile:
            object.__setattr__(self, "data_profile", self.name)

    def import_for(self, task_id: str, tier: str) -> dict | None:
        """The import that makes task/tier's dataset (datasets.import), or None: it is built."""
        return self.dataset_imports.get(f"{task_id}/{tier}")

    def episodes_for(self, task_id: str, tier: str) -> int:
        return _lookup(self.dataset_episodes, task_id, tier)

    def updates_for(self, task_id: str, tier: str) -> int:
        return _lookup(self.updates, task_id, tier)

    def checkpoint_every_for(self, task_id: str, tier: str) -> int:
        return _lookup(self.checkpoint_every, task_id, tier)

    def train_budget(self, task_id: str, tier: str) -> dict[str, int]:
        """The part of the profile that changes a run's result (it enters the run key)."""
        return {
            "updates": self.updates_for(task_id, tier),
            "eval_every": _lookup(self.eval_every, task_id, tier),
            "eval_episodes": _lookup(self.eval_episodes, task_id, tier),
            "final_eval_episodes": _lookup(self.final_eval_episodes, task_id, tier),
        }


def _lookup(table: dict[str, int], task_id: str, tier: str) -> int:
    """Most specific key wins: 'task/tier', then 'task', then 'default'."""
    for key in (f"{task_id}/{tier}", task_id, "default"):
        if key in table:
            return int(table[key])
    raise BenchError(f"profile table has no entry for {task_id}/{tier} and no 'default'")


def builtin_profiles() -> list[str]:
    return sorted(p.name[:-5] for p in resources.files(__name__).iterdir() if p.name.endswith(".yaml"))


def load_profile(name_or_path: str) -> Profile:
    """A built-in profile by name or a YAML file, validated (suite/runs/profiles: SCHEMA); BenchError
    ``<file>: <field>: <problem>`` on anything malformed, before anything is written."""
    path = Path(name_or_path)
    if path.suffix in (".yaml", ".yml") and path.is_file():
        try:
            text, source = path.read_text(), str(path)
        except (OSError, UnicodeDecodeError) as exc:
            raise BenchError(f"{path}: cannot read profile: {type(exc).__name__}: {exc}") from None
    elif name_or_path in builtin_profiles():
        text = resources.files(__name__).joinpath(f"{name_or_path}.yaml").read_text()
        source = f"builtin:{name_or_path}"
    else:
        known = ", ".join(builtin_profiles())
        missing = " (no such file)" if path.suffix in (".yaml", ".yml") else ""
        raise BenchError(f"unknown profile {name_or_path!r}{missing} (built in: {known}; or pass a .yaml path)")
    return _parse(load_user_yaml(text, source), source)


# ----------------------------------------------------------------------------- the schema
# A profile's keys: required ones map to None, optional ones to their default.
TOP_KEYS = {"name": None, "description": "", "datasets": None, "train": None, "matrix": None, "algo_overrides": {}}
TRAIN_KEYS = ("updates", "eval_every", "eval_episodes", "final_eval_episodes", "checkpoint_every")
MATRIX_KEYS = ("algos", "tasks", "tiers", "seeds")
# Results live under <results>/<name>/: a plain identifier, never a path.
NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]{0,63}")


def _keys(obj: Any, allowed: Iterable[str], required: Iterable[str], source: str, path: str) -> dict:
    """``obj`` is a mapping with every required key and no unknown one (with a suggestion)."""
    if not isinstance(obj, dict):
        what = "the file is empty" if obj is None and not path else f"got {_kind(obj)}"
        raise BenchError(f"{source}: {path.rstrip('.') or 'profile'}: must be a mapping ({what})")
    for key in obj:
        if key not in allowed:
            raise unknown_key(source, str(key), allowed, path=path)
    for key in required:
        if key not in obj:
            raise BenchError(f"{source}: {path}{key}: required key missing")
    return obj


def _kind(v: Any) -> str:
    return "nothing" if v is None else f"{type(v).__name__} {excerpt(v)}"


def _count(v: Any, source: str, field: str, minimum: int = 1) -> int:
    """An integer >= minimum (an integral float such as 20.0 is read as 20, as before)."""
    if isinstance(v, float) and v.is_integer():
        v = int(v)
    if not is_int(v):
        raise BenchError(f"{source}: {field}: must be an integer, got {_kind(v)}")
    if v < minimum:
        raise BenchError(f"{source}: {field}: must be >= {minimum}, got {v}")
    return int(v)


def _table_keys() -> tuple[set[str], set[str]]:
    """Task ids a per-task table may name (the registered tasks and their StarCraft II twins) and tiers."""

    return set(known_task_ids()), set(ALL_TIERS)


def _table(value: Any, source: str, field: str, minimum: int = 1) -> dict[str, int]:
    """A per-task table: one integer for every task, or a mapping 'default' / '<task>' /
    '<task>/<tier>' -> integer."""
    if not isinstance(value, dict):
        return {"default": _count(value, source, field, minimum)}
    tasks, tiers = _table_keys()
    out = {}
    for key, v in value.items():
        key = str(key)
        task, _, tier = key.partition("/")
        if key != "default" and task not in tasks:
            raise unknown_key(source, key, ["default", *sorted(tasks)], what="unknown task", path=f"{field}.")
        if tier and tier not in tiers:
            raise unknown_key(source, key, [f"{task}/{q}" for q in sorted(tiers)], what="unknown tier",
                              path=f"{field}.")
        out[key] = _count(v, source, f"{field}.{key}", minimum)
    return out


def _names(value: Any, source: str, field: str) -> list[str]:
    if not isinstance(value, list) or not value or not all(isinstance(v, str) and v for v in value):
        raise BenchError(f"{source}: {field}: must be a non-empty list of names, got {_kind(value)}")
    return list(value)


def _seeds(value: Any, source: str, field: str) -> list[int]:
    if not isinstance(value, list) or not value:
        raise BenchError(f"{source}: {field}: must be a non-empty list of integers, got {_kind(value)}")
    return [_count(v, source, f"{field}[{i}]", minimum=0) for i, v in enumerate(value)]


def _block(raw: Any, source: str, path: str, extra_allowed: bool) -> dict[str, list]:
    allowed = MATRIX_KEYS + (("extra",) if extra_allowed else ())
    _keys(raw, allowed, MATRIX_KEYS, source, path)
    return {"algos": _names(raw["algos"], source, f"{path}algos"),
            "tasks": _names(raw["tasks"], source, f"{path}tasks"),
            "tiers": _names(raw["tiers"], source, f"{path}tiers"),
            "seeds": _seeds(raw["seeds"], source, f"{path}seeds")}


def _matrix(raw: Any, source: str) -> dict[str, list]:
    matrix = _block(raw, source, "matrix.", extra_allowed=True)
    extra = raw.get("extra")
    if extra is not None:
        if not isinstance(extra, list):
            raise BenchError(f"{source}: matrix.extra: must be a list of blocks, got {_kind(extra)}")
        matrix["extra"] = [_block(b, source, f"matrix.extra[{i}].", extra_allowed=False) for i, b in enumerate(extra)]
    return matrix


def _datasets(raw: Any, source: str) -> tuple[dict[str, int], str | None, str]:
    """(episodes table, the built-in profile whose datasets are reused or None, dataset generation)."""
    _keys(raw, ("episodes", "from", "import", "generation"), (), source, "datasets.")
    if "from" in raw:  # reuse another built-in profile's datasets (same files, same sizes)
        if "episodes" in raw or "import" in raw or "generation" in raw:
            raise BenchError(f"{source}: datasets: give either 'from: <profile>' or 'episodes' (and 'import', "
                             "'generation'), not both")
        data_profile = raw["from"]
        if data_profile not in builtin_profiles():
            raise BenchError(f"{source}: datasets.from: unknown built-in profile {data_profile!r}"
                             f"{did_you_mean(str(data_profile), builtin_profiles())} "
                             f"(built in: {', '.join(builtin_profiles())})")
        other = yaml.safe_load(resources.files(__name__).joinpath(f"{data_profile}.yaml").read_text())
        return (_table(other["datasets"]["episodes"], f"builtin:{data_profile}", "datasets.episodes"), data_profile,
                _generation(other["datasets"], f"builtin:{data_profile}"))
    if "episodes" not in raw:
        if "import" in raw:  # every dataset it trains on is imported (a tier it would build has no size)
            return {}, None, _generation(raw, source)
        raise BenchError(f"{source}: datasets.episodes: required key missing (or datasets.from)")
    return _table(raw["episodes"], source, "datasets.episodes"), None, _generation(raw, source)


def _generation(raw: dict, source: str) -> str:
    name = raw.get("generation", DEFAULT_GENERATION)
    if name not in GENERATIONS:
        raise BenchError(f"{source}: datasets.generation: unknown generation {_kind(name)}"
                         f"{did_you_mean(str(name), GENERATIONS)} (known: {', '.join(GENERATIONS)})")
    return name


IMPORT_KEYS = ("format", "path", "uid", "seed")


def _imports(raw: Any, source: str) -> dict[str, dict]:
    """datasets.import: '<task>/<tier>' -> {format (auto, vault, omar-npy, cfcql-h5), path, uid, seed}; a
    relative path is taken from the profile file's folder (the working directory for a built-in)."""

    if raw is None:
        return {}
    if not isinstance(raw, dict):
        raise BenchError(f"{source}: datasets.import: must be a mapping of '<task>/<tier>' -> source, got {_kind(raw)}")
    base = Path(source).parent if Path(source).suffix in (".yaml", ".yml") else Path.cwd()
    tasks, _ = _table_keys()
    out = {}
    for key, spec in raw.items():
        task, _, tier = str(key).partition("/")
        if task not in tasks:
            raise unknown_key(source, task, sorted(tasks), what="unknown task", path="datasets.import.")
        tiers = get_task(task).spec.tiers
        if tier not in tiers:
            raise unknown_key(source, f"{task}/{tier}", [f"{task}/{q}" for q in tiers], what="unknown tier",
                              path="datasets.import.")
        _keys(spec, IMPORT_KEYS, ("path",), source, f"datasets.import.{key}.")
        fmt_name = spec.get("format", "auto")
        if fmt_name not in ("auto", "vault", "omar-npy", "cfcql-h5"):
            raise BenchError(f"{source}: datasets.import.{key}.format: must be auto, vault, omar-npy or cfcql-h5, "
                             f"got {_kind(fmt_name)}")
        path = spec["path"]
        if not isinstance(path, str) or not path:
            raise BenchError(f"{source}: datasets.import.{key}.path: must be a path, got {_kind(path)}")
        out[f"{task}/{tier}"] = {"format": fmt_name, "path": str((base / path).resolve()),
                                 "uid": spec.get("uid"), "seed": _count(spec.get("seed", 0), source,
                                                                        f"datasets.import.{key}.seed", minimum=0)}
    return out


def _parse(raw: Any, source: str) -> Profile:
    _keys(raw, TOP_KEYS, [k for k, v in TOP_KEYS.items() if v is None], source, "")
    name = raw["name"]
    if not isinstance(name, str) or not NAME.fullmatch(name):
        raise BenchError(f"{source}: name: must be a plain identifier (letters, digits, '-', '_'; at most 64), "
                         f"got {_kind(name)}")
    description = raw.get("description") or ""
    if not isinstance(description, str):
        raise BenchError(f"{source}: description: must be a string, got {_kind(description)}")
    episodes, data_profile, generation = _datasets(raw["datasets"], source)
    train = _keys(raw["train"], TRAIN_KEYS, TRAIN_KEYS, source, "train.")
    eval_every = _table(train["eval_every"], source, "train.eval_every")
    checkpoint_every = _table(train["checkpoint_every"], source, "train.checkpoint_every")
    _check_checkpoints_on_evaluations(eval_every, checkpoint_every, source)
    return Profile(
        name=name,
        description=description,
        data_profile=data_profile or name,
        generation=generation,
        dataset_episodes=episodes,
        dataset_imports=_imports(raw["datasets"].get("import"), source),
        updates=_table(train["updates"], source, "train.updates"),
        eval_every=eval_every,
        eval_episodes=_table(train["eval_episodes"], source, "train.eval_episodes"),
        final_eval_episodes=_table(train["final_eval_episodes"], source, "train.final_eval_episodes"),
        checkpoint_every=checkpoint_every,
        matrix=_matrix(raw["matrix"], source),
        source=source,
        algo_overrides=check_algo_overrides(raw.get("algo_overrides"), source),
    )


def _check_checkpoints_on_evaluations(eval_every: dict[str, int], checkpoint_every: dict[str, int],
                                      source: str) -> None:
    """Every cell's checkpoint interval is a multiple of its evaluation interval (a resumed run then
    loses no partially averaged training metrics). Checked for every key either table names: the
    most specific entry of each table applies to it."""
    for key in sorted(set(eval_every) | set(checkpoint_every)):
        task, _, tier = key.partition("/")
        ev, ck = (_lookup(t, task, tier) if key != "default" else t.get("default") for t in (eval_every, checkpoint_every))
        if ev is None or ck is None:
            missing = "eval_every" if ev is None else "checkpoint_every"
            raise BenchError(f"{source}: train.{missing}: no 'default' entry (needed for {key})")
        if ck % ev:
            where = "" if key == "default" else f" for {key}"
            raise BenchError(f"{source}: train.checkpoint_every: must be a multiple of train.eval_every{where} "
                             f"({ck} is not a multiple of {ev})")


def check_algo_overrides(values: Any, where: str, path: str = "algo_overrides.") -> dict[str, Any]:
    """A profile's ``algo_overrides``: a mapping whose keys are config fields of at least one
    algorithm (it applies to those that have the field) and whose values are valid for each of them."""

    if values is None:
        return {}
    if not isinstance(values, dict):
        raise ConfigError(f"{where}: {path.rstrip('.')}: must be a mapping of config field -> value, "
                          f"got {type(values).__name__}")
    owners: dict[str, list[type]] = {}
    for cls in all_algorithm_classes():
        for name in config_fields(cls):
            owners.setdefault(name, []).append(cls)
    for key, value in values.items():
        if key not in owners:
            raise unknown_key(where, str(key), owners, what="not a config field of any algorithm", path=path)
        for cls in owners[key]:
            problem = field_problem(key, config_fields(cls)[key], value)
            if problem:
                raise ConfigError(f"{where}: {path}{key}: {problem} ({cls.name} config)")
    return dict(values)
