"""Dataset format v2 (reads v1 too): one HDF5 file per task x quality tier (``<data_dir>/<task_id>/<tier>.h5``).

v2 adds one array, ``agent_rewards`` float32 [N, n_agents] (each agent's own reward; ``rewards`` stays
the team reward, their mean over agents). A file is written as v2 exactly when it has
``agent_rewards``, so data without per-agent rewards (SMAX, the v1 generation) keeps its v1 bytes.

The written specification is docs/dataset-format.md; this module is its only implementation.

    write_dataset(path, arrays, attrs, spec=None, compression=None) -> sha256
    load_dataset(path, spec=None, expected_sha256=None, check_episodes=True) -> Dataset
    validate(arrays, attrs, spec=None, path="<arrays>", check_episodes=True)
    sha256_file(path) -> str
    episode_returns(rewards, episode_ids) -> float64 [E]
    normalised_score(ret, attrs_or_refs) -> float | ndarray
    synthetic_dataset(spec, n_episodes, episode_len, seed) -> (arrays, attrs)

Every problem is reported as a DatasetError whose message is one line,
``<path>: <field>: <problem>``.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

import h5py
import numpy as np

from plcql_bench.suite.core.spec import TaskSpec
from plcql_bench.suite.core.store import new_temp_file
from plcql_bench.suite.core.validate import excerpt

FORMAT_VERSION = 2
SUPPORTED_VERSIONS = (1, 2)
AGENT_REWARDS = "agent_rewards"  # v2: float32 [N, n_agents]; rewards == its mean over agents
_TEAM_REWARD_TOL = 1e-5  # |rewards - mean(agent_rewards)| allowed, relative to max(1, |rewards|)

# Arrays common to both action types.
FLOAT_ARRAYS = ("obs", "state", "rewards", "next_obs", "next_state")
FLAG_ARRAYS = ("next_actions_valid", "terminals", "timeouts")
COMMON_ARRAYS = (
    "obs", "state", "actions", "rewards", "next_obs", "next_state", "next_actions",
    "next_actions_valid", "terminals", "timeouts", "episode_ids", "steps",
)  # fmt: skip
DISCRETE_ARRAYS = ("avail_actions", "next_avail_actions")

# Attributes the writer requires from the caller (the rest it derives from the arrays).
CALLER_ATTRS = (
    "task_id", "env_versions", "quality", "behaviour_policy_id", "generator_version",
    "generator_seed", "ref_return_random", "ref_return_expert",
)  # fmt: skip
DERIVED_ATTRS = (
    "format_version", "n_agents", "obs_dim", "state_dim", "act_dim", "discrete",
    "n_transitions", "n_episodes", "return_mean", "return_std", "return_min", "return_max",
)  # fmt: skip
REQUIRED_ATTRS = CALLER_ATTRS + DERIVED_ATTRS

_STR_ATTRS = ("task_id", "quality", "behaviour_policy_id", "generator_version")
_INT_ATTRS = (
    "format_version", "generator_seed", "n_agents", "obs_dim", "state_dim", "act_dim",
    "n_transitions", "n_episodes",
)  # fmt: skip
# ref returns may be NaN ("no reference", e.g. win-rate tasks); return stats must be finite.
_FLOAT_ATTRS = ("ref_return_random", "ref_return_expert", "return_mean", "return_std",
                "return_min", "return_max", "win_rate")  # fmt: skip
_STAT_TOL = 1e-4  # relative tolerance when checking stored return statistics

COMPRESSIONS = (None, "lzf", "gzip")
_CHUNK_BYTES = 1 << 20  # target chunk size when compressing


class DatasetError(Exception):
    """A dataset (or manifest) problem; str() is one line: ``<path>: <field>: <problem>``."""

    def __init__(self, path: str | os.PathLike, field: str, problem: str) -> None:
        self.path = str(path)
        self.field = field
        self.problem = " ".join(str(problem).split())  # force one line
        super().__init__(f"{self.path}: {field}: {self.problem}")


# --------------------------------------------------------------------------------------------
# Dataset object


@dataclass
class Dataset:
    """A loaded dataset: numpy arrays in memory plus normalised attributes.

    attrs values are plain Python (str, int, float, bool); ``env_versions`` is a dict.
    """

    arrays: dict[str, np.ndarray]
    attrs: dict[str, Any]
    path: str
    _sha256: str | None = field(default=None, repr=False)

    @property
    def sha256(self) -> str:
        """sha256 of the file (computed on first access unless load_dataset verified it)."""
        if self._sha256 is None:
            self._sha256 = sha256_file(self.path)
        return self._sha256

    @property
    def n_transitions(self) -> int:
        return int(self.arrays["rewards"].shape[0])

    @property
    def n_episodes(self) -> int:
        ids = self.arrays["episode_ids"]
        return int(ids[-1]) + 1 if ids.size else 0

    @property
    def discrete(self) -> bool:
        return bool(self.attrs["discrete"])

    def episode_returns(self) -> np.ndarray:
        return episode_returns(self.arrays["rewards"], self.arrays["episode_ids"])

    @property
    def has_agent_rewards(self) -> bool:
        return AGENT_REWARDS in self.arrays

    def agent_rewards(self) -> np.ndarray:
        """float32 [N, n_agents]: each agent's reward (v2), or the team reward for every agent (v1)."""
        if self.has_agent_rewards:
            return self.arrays[AGENT_REWARDS]
        n = int(self.attrs["n_agents"])
        return np.repeat(self.arrays["rewards"][:, None], n, axis=1)


# --------------------------------------------------------------------------------------------
# Helpers


def sha256_file(path: str | os.PathLike, chunk_size: int = 1 << 22) -> str:
    """Streamed sha256 hex digest of a file."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk_size):
            h.update(block)
    return h.hexdigest()


def episode_returns(rewards: np.ndarray, episode_ids: np.ndarray) -> np.ndarray:
    """Undiscounted return of each episode (float64 [E]); episodes must be contiguous."""
    rewards = np.asarray(rewards)
    if rewards.size == 0:
        return np.zeros(0, np.float64)
    ids = np.asarray(episode_ids)
    starts = np.flatnonzero(np.r_[True, ids[1:] != ids[:-1]])
    return np.add.reduceat(rewards.astype(np.float64), starts)


def return_stats(returns: np.ndarray) -> dict[str, float]:
    returns = np.asarray(returns, np.float64)
    return {
        "return_mean": float(returns.mean()),
        "return_std": float(returns.std()),
        "return_min": float(returns.min()),
        "return_max": float(returns.max()),
    }


def normalised_score(ret: Any, attrs_or_refs: Any) -> Any:
    """100 * (R - R_random) / (R_expert - R_random), the D4RL/OMAR normalised score.

    attrs_or_refs: a dataset's attrs (or manifest entry) holding ``ref_return_random`` and
    ``ref_return_expert``, an object with such ``.attrs`` (a Dataset), or a pair
    ``(R_random, R_expert)``. ``ret`` may be a scalar (returns float) or an array.
    """
    refs = getattr(attrs_or_refs, "attrs", attrs_or_refs)
    if isinstance(refs, Mapping):
        try:
            r_rand, r_exp = refs["ref_return_random"], refs["ref_return_expert"]
        except KeyError as e:
            raise ValueError(f"normalised_score: reference return {e.args[0]!r} missing") from None
    else:
        r_rand, r_exp = refs
    r_rand, r_exp = float(r_rand), float(r_exp)
    if not (math.isfinite(r_rand) and math.isfinite(r_exp)):
        raise ValueError(
            f"normalised_score: reference returns not defined (random={r_rand}, expert={r_exp})"
        )
    if r_exp == r_rand:
        raise ValueError(f"normalised_score: expert and random reference returns are equal ({r_exp})")
    out = 100.0 * (np.asarray(ret, np.float64) - r_rand) / (r_exp - r_rand)
    return float(out) if out.ndim == 0 else out


# --------------------------------------------------------------------------------------------
# Validation


def _expected_dtype(name: str, discrete: bool) -> np.dtype:
    if name in FLOAT_ARRAYS or name == AGENT_REWARDS:
        return np.dtype(np.float32)
    if name in ("actions", "next_actions"):
        return np.dtype(np.int64 if discrete else np.float32)
    if name in FLAG_ARRAYS or name in DISCRETE_ARRAYS:
        return np.dtype(np.uint8)
    if name == "episode_ids":
        return np.dtype(np.int64)
    if name == "steps":
        return np.dtype(np.int32)
    raise KeyError(name)


def _normalise_attr(name: str, value: Any) -> Any:
    """h5py/numpy attribute value -> plain Python value."""
    if isinstance(value, bytes):
        value = value.decode("utf-8")
    if isinstance(value, np.ndarray) and value.ndim == 0:
        value = value[()]
    if isinstance(value, np.generic):
        value = value.item()
    if name == "env_versions" and isinstance(value, str):
        value = json.loads(value)
    return value


def _check_attrs(path: str, attrs: dict[str, Any]) -> None:
    missing = [k for k in REQUIRED_ATTRS if k not in attrs]
    if missing:
        raise DatasetError(path, f"attrs.{missing[0]}", "required attribute missing"
                           + (f" (also missing: {', '.join(missing[1:])})" if missing[1:] else ""))
    version = attrs["format_version"]
    if not isinstance(version, int) or isinstance(version, bool) or version not in SUPPORTED_VERSIONS:
        raise DatasetError(path, "attrs.format_version",
                           f"unsupported format version {version!r} (supported: {SUPPORTED_VERSIONS})")
    for k in _STR_ATTRS:
        if not isinstance(attrs[k], str) or not attrs[k]:
            raise DatasetError(path, f"attrs.{k}", f"must be a non-empty string, got {attrs[k]!r}")
    for k in _INT_ATTRS:
        if not isinstance(attrs[k], int) or isinstance(attrs[k], bool):
            raise DatasetError(path, f"attrs.{k}", f"must be an integer, got {attrs[k]!r}")
    for k in _FLOAT_ATTRS:
        if k not in attrs:
            continue
        v = attrs[k]
        if not isinstance(v, (int, float)) or isinstance(v, bool):
            raise DatasetError(path, f"attrs.{k}", f"must be a number, got {v!r}")
        if not k.startswith("ref_return") and not math.isfinite(v):
            raise DatasetError(path, f"attrs.{k}", f"must be finite, got {v!r}")
    if "win_rate" in attrs and not 0.0 <= attrs["win_rate"] <= 1.0:
        raise DatasetError(path, "attrs.win_rate", f"must be in [0, 1], got {attrs['win_rate']!r}")
    if not isinstance(attrs["discrete"], bool):
        raise DatasetError(path, "attrs.discrete", f"must be a boolean, got {attrs['discrete']!r}")
    ev = attrs["env_versions"]
    if not isinstance(ev, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in ev.items()):
        raise DatasetError(path, "attrs.env_versions", "must be a JSON object of string -> string")


def _first(mask: np.ndarray) -> int:
    """Index of the first True along axis 0 of a (possibly multi-dim) mask."""
    if mask.ndim > 1:
        mask = mask.reshape(mask.shape[0], -1).any(axis=1)
    return int(np.argmax(mask))


Layout = Mapping[str, "tuple[tuple[int, ...], np.dtype]"]  # array name -> (shape, dtype)


def _layout_of(a: Any) -> tuple[tuple[int, ...], np.dtype]:
    return tuple(np.shape(a)), (a.dtype if hasattr(a, "dtype") else np.asarray(a).dtype)


def _expected_shapes(n: int, attrs: Mapping[str, Any]) -> dict[str, tuple[int, ...]]:
    """The shape of every array the format declares with more than one dimension, for N = n rows (the
    others are [N])."""
    n_agents, obs_dim, state_dim, act_dim = attrs["n_agents"], attrs["obs_dim"], attrs["state_dim"], attrs["act_dim"]
    act_shape = (n, n_agents) if attrs["discrete"] else (n, n_agents, act_dim)
    return {
        "obs": (n, n_agents, obs_dim), "next_obs": (n, n_agents, obs_dim),
        "state": (n, state_dim), "next_state": (n, state_dim),
        "actions": act_shape, "next_actions": act_shape,
        "avail_actions": (n, n_agents, act_dim), "next_avail_actions": (n, n_agents, act_dim),
    }  # fmt: skip


def _check_layout(path: str, layout: Layout, attrs: dict[str, Any], spec: TaskSpec | None) -> None:
    """Every array's shape and dtype against the task and the header (attrs already checked by
    _check_attrs): the same checks whether ``layout`` comes from arrays in memory or from what a file
    declares before any array is read (load_dataset)."""
    discrete = attrs["discrete"]
    # The spec first: a dataset for another task should say so, not fail on a shape.
    if spec is not None:
        _check_against_spec(path, layout, attrs, spec)
    names = COMMON_ARRAYS + (DISCRETE_ARRAYS if discrete else ())
    for name in names:
        if name not in layout:
            raise DatasetError(path, name, "required array missing")
    if not discrete:
        for name in DISCRETE_ARRAYS:
            if name in layout:
                raise DatasetError(path, name, "present in a continuous dataset")

    rewards_shape = layout["rewards"][0]
    n = int(rewards_shape[0]) if rewards_shape else -1
    if n < 1:
        raise DatasetError(path, "rewards", f"must have shape [N] with N >= 1, got {rewards_shape}")
    shapes = _expected_shapes(n, attrs)
    for name in names:
        shape, dtype = layout[name]
        want = _expected_dtype(name, discrete)
        if dtype != want:
            raise DatasetError(path, name, f"dtype {dtype}, expected {want}")
        if tuple(shape) != shapes.get(name, (n,)):
            raise DatasetError(path, name, f"shape {tuple(shape)}, expected {shapes.get(name, (n,))} (N={n}, "
                               + ", ".join(f"{k}={attrs[k]}" for k in ("n_agents", "obs_dim", "state_dim", "act_dim"))
                               + ")")
    for name, (shape, _dtype) in layout.items():
        if name not in names and (len(shape) == 0 or shape[0] != n):
            raise DatasetError(path, name, f"extra array must have leading dimension N={n}, got shape {tuple(shape)}")
    if attrs["n_transitions"] != n:
        raise DatasetError(path, "attrs.n_transitions", f"is {attrs['n_transitions']}, arrays hold {n}")
    if AGENT_REWARDS in layout:  # v2 (declared before it is read, as every other array)
        shape, dtype = layout[AGENT_REWARDS]
        if dtype != np.float32:
            raise DatasetError(path, AGENT_REWARDS, f"dtype {dtype}, expected float32")
        if tuple(shape) != (n, attrs["n_agents"]):
            raise DatasetError(path, AGENT_REWARDS, f"shape {tuple(shape)}, expected {(n, attrs['n_agents'])}")


def _check_against_spec(path: str, layout: Layout, attrs: dict[str, Any], spec: TaskSpec) -> None:
    """The header's task, action kind and sizes, and the arrays' trailing dimensions, are the task's."""
    if attrs["task_id"] != spec.task_id:
        raise DatasetError(path, "attrs.task_id", f"dataset is for {attrs['task_id']!r}, expected {spec.task_id!r}")
    if attrs["discrete"] != spec.discrete:
        raise DatasetError(path, "attrs.discrete", f"is {attrs['discrete']}, task {spec.task_id} has discrete={spec.discrete}")
    # Arrays against the spec, naming the array (trailing dimensions; N is free).
    for name, want in _expected_shapes(0, {**attrs, **{k: getattr(spec, k) for k in _SPEC_SIZES}}).items():
        if name in layout and tuple(layout[name][0][1:]) != want[1:]:
            raise DatasetError(path, name, f"shape {tuple(layout[name][0])}, task {spec.task_id} "
                               f"expects (N, {', '.join(map(str, want[1:]))})")
    for k in _SPEC_SIZES:
        if attrs[k] != getattr(spec, k):
            raise DatasetError(path, f"attrs.{k}", f"is {attrs[k]}, task {spec.task_id} has {k}={getattr(spec, k)}")


_SPEC_SIZES = ("n_agents", "obs_dim", "state_dim", "act_dim")


def validate(
    arrays: Mapping[str, np.ndarray],
    attrs: Mapping[str, Any],
    spec: TaskSpec | None = None,
    path: str | os.PathLike = "<arrays>",
    check_episodes: bool = True,
) -> None:
    """All v1 checks except the checksum. attrs must already be plain Python values."""
    path = str(path)
    attrs = dict(attrs)
    _check_attrs(path, attrs)
    _check_layout(path, {name: _layout_of(a) for name, a in arrays.items()}, attrs, spec)
    discrete = attrs["discrete"]
    n, act_dim = int(np.shape(arrays["rewards"])[0]), attrs["act_dim"]
    _check_agent_rewards(path, arrays, attrs, n)

    # Values.
    float_names = list(FLOAT_ARRAYS) + ([] if discrete else ["actions", "next_actions"])
    for name in float_names:
        bad = ~np.isfinite(arrays[name])
        if bad.any():
            i = _first(bad)
            raise DatasetError(path, name, f"non-finite value (NaN or inf) at row {i}")
    for name in FLAG_ARRAYS + (DISCRETE_ARRAYS if discrete else ()):
        if (arrays[name] > 1).any():
            i = _first(arrays[name] > 1)
            raise DatasetError(path, name, f"must be 0 or 1, got {arrays[name][i].max()} at row {i}")
    valid = arrays["next_actions_valid"].astype(bool)
    if discrete:
        for name in ("actions", "next_actions"):
            a = arrays[name]
            bad = (a < 0) | (a >= act_dim)
            if name == "next_actions":
                bad &= valid[:, None]
            if bad.any():
                i = _first(bad)
                raise DatasetError(path, name, f"action out of range [0, {act_dim}) at row {i}")
        for name, avail_name, rows in (("actions", "avail_actions", None), ("next_actions", "next_avail_actions", valid)):
            a = arrays[name]
            avail = np.take_along_axis(arrays[avail_name], np.clip(a, 0, act_dim - 1)[..., None], axis=-1)[..., 0]
            bad = avail == 0
            if rows is not None:
                bad &= rows[:, None]
            if bad.any():
                i = _first(bad)
                agent = int(np.argmax(bad[i]))
                raise DatasetError(path, name, f"action {int(a[i, agent])} of agent {agent} at row {i} "
                                   f"is not available under {avail_name}")
    else:
        for name in ("actions", "next_actions"):
            bad = np.abs(arrays[name]) > 1.0
            if bad.any():
                i = _first(bad)
                raise DatasetError(path, name, f"continuous action outside [-1, 1] at row {i}")
    zero_fill = ~valid
    if zero_fill.any() and (arrays["next_actions"][zero_fill] != 0).any():
        i = _first(zero_fill & (arrays["next_actions"].reshape(n, -1) != 0).any(axis=1))
        raise DatasetError(path, "next_actions", f"must be zero-filled where next_actions_valid is 0 (row {i})")

    if check_episodes:
        _check_episodes(path, arrays, attrs, spec, discrete)


def _check_agent_rewards(path: str, arrays: Mapping[str, np.ndarray], attrs: Mapping[str, Any], n: int) -> None:
    """v2 files hold `agent_rewards` [N, n_agents] (float32, finite) whose mean over agents is the team
    reward `rewards`; v1 files hold none."""
    version = attrs["format_version"]
    if AGENT_REWARDS not in arrays:
        if version >= 2:
            raise DatasetError(path, AGENT_REWARDS, f"required array missing (format version {version})")
        return
    if version < 2:
        raise DatasetError(path, AGENT_REWARDS, "present in a format version 1 file (per-agent rewards are v2)")
    a = arrays[AGENT_REWARDS]
    if a.dtype != np.float32:
        raise DatasetError(path, AGENT_REWARDS, f"dtype {a.dtype}, expected float32")
    if tuple(a.shape) != (n, attrs["n_agents"]):
        raise DatasetError(path, AGENT_REWARDS, f"shape {tuple(a.shape)}, expected {(n, attrs['n_agents'])}")
    bad = ~np.isfinite(a)
    if bad.any():
        raise DatasetError(path, AGENT_REWARDS, f"non-finite value (NaN or inf) at row {_first(bad)}")
    team = arrays["rewards"].astype(np.float64)
    off = np.abs(a.astype(np.float64).mean(axis=1) - team) > _TEAM_REWARD_TOL * np.maximum(1.0, np.abs(team))
    if off.any():
        i = _first(off)
        raise DatasetError(path, AGENT_REWARDS, f"row {i}: mean over agents {float(a[i].mean())!r} is not the team "
                           f"reward rewards[{i}] = {float(team[i])!r}")


def _check_episodes(path: str, arrays: Mapping[str, np.ndarray], attrs: Mapping[str, Any],
                    spec: TaskSpec | None, discrete: bool) -> None:
    ids = arrays["episode_ids"]
    n = ids.shape[0]
    if ids[0] != 0:
        raise DatasetError(path, "episode_ids", f"must start at 0, got {int(ids[0])}")
    d = np.diff(ids)
    if ((d != 0) & (d != 1)).any():
        i = int(np.argmax((d != 0) & (d != 1))) + 1
        raise DatasetError(path, "episode_ids", f"must be contiguous and non-decreasing by steps of 1; "
                           f"row {i} goes from {int(ids[i - 1])} to {int(ids[i])}")
    n_episodes = int(ids[-1]) + 1
    if attrs["n_episodes"] != n_episodes:
        raise DatasetError(path, "attrs.n_episodes", f"is {attrs['n_episodes']}, episode_ids hold {n_episodes}")
    new_ep = np.r_[True, d == 1]  # first row of an episode
    starts = np.flatnonzero(new_ep)
    is_last = np.r_[d == 1, True]  # last row of an episode
    expected_steps = np.arange(n, dtype=np.int64) - starts[ids]
    bad = arrays["steps"] != expected_steps
    if bad.any():
        i = _first(bad)
        raise DatasetError(path, "steps", f"episode {int(ids[i])} row {i}: step {int(arrays['steps'][i])}, "
                           f"expected {int(expected_steps[i])} (steps must run 0..len-1 per episode)")
    if spec is not None:
        lengths = np.diff(np.r_[starts, n])
        if (lengths > spec.episode_limit).any():
            e = int(np.argmax(lengths > spec.episode_limit))
            raise DatasetError(path, "steps", f"episode {e} has {int(lengths[e])} steps, "
                               f"more than the task's episode_limit {spec.episode_limit}")
    for name in ("terminals", "timeouts"):
        bad = (arrays[name] != 0) & ~is_last
        if bad.any():
            i = _first(bad)
            raise DatasetError(path, name, f"set at row {i} (episode {int(ids[i])} step {int(arrays['steps'][i])}) "
                               "which is not the episode's last step")
    ends = (arrays["terminals"] != 0) | (arrays["timeouts"] != 0)
    bad = is_last & ~ends
    if bad.any():
        i = _first(bad)
        raise DatasetError(path, "terminals", f"episode {int(ids[i])} ends at row {i} "
                           "with neither terminal nor timeout set")
    bad = ~is_last & (arrays["next_actions_valid"] == 0)
    if bad.any():
        i = _first(bad)
        raise DatasetError(path, "next_actions_valid", f"0 at row {i}, which is not the last step of episode "
                           f"{int(ids[i])} (the next action is actions[t+1] there)")
    inner = ~is_last[:-1]  # rows t with t+1 in the same episode
    pairs = [("next_obs", "obs"), ("next_state", "state"), ("next_actions", "actions")]
    if discrete:
        pairs.append(("next_avail_actions", "avail_actions"))
    for nxt, cur in pairs:
        a, b = arrays[nxt][:-1], arrays[cur][1:]
        neq = a != b
        if neq.ndim > 1:
            neq = neq.reshape(neq.shape[0], -1).any(axis=1)
        bad = neq & inner
        if bad.any():
            i = int(np.argmax(bad))
            raise DatasetError(path, nxt, f"{nxt}[{i}] != {cur}[{i + 1}] inside episode {int(ids[i])} "
                               f"(step {int(arrays['steps'][i])}); episodes do not reconstruct")
    stats = return_stats(episode_returns(arrays["rewards"], ids))
    for k, v in stats.items():
        if not math.isclose(attrs[k], v, rel_tol=_STAT_TOL, abs_tol=_STAT_TOL):
            raise DatasetError(path, f"attrs.{k}", f"is {attrs[k]!r}, rewards give {v!r}")


# --------------------------------------------------------------------------------------------
# Writing


def _coerce(path: str, name: str, value: Any, discrete: bool) -> np.ndarray:
    """Cast an input array to its v1 dtype when that is lossless in kind."""
    a = np.asarray(value)
    try:
        want = _expected_dtype(name, discrete)
    except KeyError:
        return np.ascontiguousarray(a)  # extra array: stored as given
    if a.dtype == want:
        return np.ascontiguousarray(a)
    ok = (want.kind == "f" and a.dtype.kind in "fiub") or (want.kind in "iu" and a.dtype.kind in "iub")
    if not ok:
        raise DatasetError(path, name, f"dtype {a.dtype} cannot be stored as {want}")
    if want.kind in "iu" and a.size and (a.min() < np.iinfo(want).min or a.max() > np.iinfo(want).max):
        raise DatasetError(path, name, f"values out of range for {want}")
    return np.ascontiguousarray(a.astype(want))


def _derive_attrs(arrays: dict[str, np.ndarray], attrs: dict[str, Any]) -> dict[str, Any]:
    out = dict(attrs)
    obs, rewards = arrays.get("obs"), arrays.get("rewards")
    discrete = out.get("discrete")
    if discrete is None:
        discrete = "avail_actions" in arrays
    out.setdefault("discrete", bool(discrete))
    out.setdefault("format_version", FORMAT_VERSION if AGENT_REWARDS in arrays else 1)
    if obs is not None and np.ndim(obs) == 3:
        out.setdefault("n_agents", int(obs.shape[1]))
        out.setdefault("obs_dim", int(obs.shape[2]))
    if arrays.get("state") is not None and np.ndim(arrays["state"]) == 2:
        out.setdefault("state_dim", int(arrays["state"].shape[1]))
    if out["discrete"] and np.ndim(arrays.get("avail_actions")) == 3:
        out.setdefault("act_dim", int(arrays["avail_actions"].shape[2]))
    if not out["discrete"] and np.ndim(arrays.get("actions")) == 3:
        out.setdefault("act_dim", int(arrays["actions"].shape[2]))
    if rewards is not None and np.ndim(rewards) == 1:
        out.setdefault("n_transitions", int(rewards.shape[0]))
        ids = arrays.get("episode_ids")
        if ids is not None and np.shape(ids) == np.shape(rewards) and rewards.size:
            out.setdefault("n_episodes", int(ids[-1]) + 1)
            # Derived only when the caller gave none; given statistics are checked.
            if not any(k in attrs for k in ("return_mean", "return_std", "return_min", "return_max")):
                out.update(return_stats(episode_returns(rewards, ids)))
    return out


def _chunks(shape: tuple[int, ...], itemsize: int) -> tuple[int, ...]:
    row = max(1, int(np.prod(shape[1:], dtype=np.int64)) * itemsize)
    rows = int(max(1, min(shape[0], _CHUNK_BYTES // row)))
    return (rows,) + tuple(shape[1:])


def write_dataset(
    path: str | os.PathLike,
    arrays: Mapping[str, Any],
    attrs: Mapping[str, Any],
    spec: TaskSpec | None = None,
    compression: str | None = None,
) -> str:
    """Validate, then write a file atomically; returns its sha256. Format v2 when `arrays` hold
    `agent_rewards`, else v1 (the same bytes as before v2 existed).

    arrays: the arrays (cast to their v1 dtypes when lossless: e.g. bool flags -> uint8,
    float64 obs -> float32). attrs: at least CALLER_ATTRS (env_versions a dict or JSON
    string); the shape attributes, counts and return statistics are derived when absent and
    checked when given. compression: None (default, contiguous, fastest to load), "lzf"
    (+shuffle) or "gzip" (level 1, +shuffle). Identical input gives identical bytes.
    """

    path = Path(path)
    if compression not in COMPRESSIONS:
        raise ValueError(f"compression must be one of {COMPRESSIONS}, got {compression!r}")
    attrs = {k: _normalise_attr(k, v) for k, v in attrs.items()}
    discrete = attrs.get("discrete")
    if discrete is None:
        discrete = "avail_actions" in arrays
    arrays = {k: _coerce(str(path), k, v, bool(discrete)) for k, v in arrays.items()}
    attrs = _derive_attrs(arrays, attrs)
    validate(arrays, attrs, spec, path=path)

    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = new_temp_file(path)  # (deletes the temp files a killed build of this file left)
    os.close(fd)
    try:
        with h5py.File(tmp, "w", track_order=False) as f:
            for name in sorted(arrays):
                a = arrays[name]
                kw: dict[str, Any] = {"track_times": False}
                if compression is not None and a.size:
                    kw["chunks"] = _chunks(a.shape, a.dtype.itemsize)
                    kw["shuffle"] = True
                    kw["compression"] = compression
                    if compression == "gzip":
                        kw["compression_opts"] = 1
                f.create_dataset(name, data=a, **kw)
            for k in sorted(attrs):
                v = attrs[k]
                if isinstance(v, (dict, list)):
                    v = json.dumps(v, sort_keys=True)
                f.attrs[k] = v
        with open(tmp, "rb+") as fh:
            os.fsync(fh.fileno())
        digest = sha256_file(tmp)
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    try:  # make the rename durable
        dfd = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)
    except OSError:
        pass
    return digest


# --------------------------------------------------------------------------------------------
# Loading


def read_attrs(path: str | os.PathLike) -> dict[str, Any]:
    """Only the root attributes (cheap; no arrays read, no checks)."""

    if os.path.isdir(path):
        raise DatasetError(path, "file", "is a directory, not a dataset file")
    try:
        with h5py.File(path, "r") as f:
            return {k: _normalise_attr(k, v) for k, v in f.attrs.items()}
    except FileNotFoundError:
        raise DatasetError(path, "file", "does not exist") from None
    except (OSError, ValueError, KeyError):
        raise DatasetError(path, "file", "cannot be read as HDF5 (truncated or corrupt?)") from None


def load_dataset(
    path: str | os.PathLike,
    spec: TaskSpec | None = None,
    expected_sha256: str | None = None,
    check_episodes: bool = True,
) -> Dataset:
    """Load a v1 or v2 file into memory and check it (see docs/dataset-format.md, "Checks").

    The file is opened once: the sha256 (``Dataset.sha256``, checked against ``expected_sha256``) is of
    the very bytes the arrays are read from, so a file replaced meanwhile cannot train under the old
    file's checksum, and one changed in place while it is read is refused. What the file declares
    (shapes, dtypes, total size) is checked against the header and the task before any array is read."""
    path = str(path)
    if not os.path.exists(path):
        raise DatasetError(path, "file", "does not exist")
    if os.path.isdir(path):
        raise DatasetError(path, "file", "is a directory, not a dataset file")
    try:
        fh = open(path, "rb")
    except FileNotFoundError:
        raise DatasetError(path, "file", "does not exist") from None
    with fh:
        before = os.fstat(fh.fileno())
        digest = _sha256_of(fh)
        if expected_sha256 is not None and digest != expected_sha256.lower():
            raise DatasetError(path, "sha256", f"checksum mismatch: file has {digest}, "
                               f"expected {expected_sha256} (re-download or rebuild the dataset)")
        attrs, arrays = _read_checked(path, fh, spec)
        if _changed(before, os.fstat(fh.fileno())):
            raise DatasetError(path, "file", "changed while it was being read (another process writing it?); "
                               "nothing was trained on it, retry when the writer is done")
    validate(arrays, attrs, spec, path=path, check_episodes=check_episodes)
    return Dataset(arrays=arrays, attrs=attrs, path=path, _sha256=digest)


def _sha256_of(fh, chunk_size: int = 1 << 22) -> str:
    """sha256 of an open file's bytes from its start."""
    h = hashlib.sha256()
    fh.seek(0)
    while block := fh.read(chunk_size):
        h.update(block)
    return h.hexdigest()


def _changed(before: os.stat_result, after: os.stat_result) -> bool:
    """Whether the open file's content was written meanwhile (its size or modification time; not its ctime,
    which also moves when the file is only renamed away or deleted: we still hold the bytes we hashed)."""
    return (before.st_size, before.st_mtime_ns) != (after.st_size, after.st_mtime_ns)


def _h5_of(fh):
    """An h5py File reading the open file ``fh`` (never its path again): through /proc/self/fd where there
    is one (the same inode, at the native driver's speed), else through the file object (~8x slower;
    also when the file was deleted or replaced since it was opened: HDF5 resolves the link's path)."""

    proc = f"/proc/self/fd/{fh.fileno()}"
    if os.path.exists(proc):
        try:
            return h5py.File(proc, "r")
        except OSError:
            pass
    fh.seek(0)
    return h5py.File(fh, "r")


def _read_checked(path: str, fh, spec: TaskSpec | None) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    """(attrs, arrays) of the open file: the attributes, then what the file declares checked against
    them and the task (_check_declared), then the arrays."""

    current = "file"
    try:
        with _h5_of(fh) as f:
            attrs: dict[str, Any] = {}
            for k, v in f.attrs.items():
                current = f"attrs.{k}"
                try:
                    attrs[k] = _normalise_attr(k, v)
                except (json.JSONDecodeError, UnicodeDecodeError):
                    raise DatasetError(path, current, "cannot be decoded (env_versions must be a JSON object)") from None
            layout = {}
            for name, obj in f.items():
                current = name
                if not isinstance(obj, h5py.Dataset):
                    raise DatasetError(path, name, "unexpected group (v1 stores arrays at the root only)")
                layout[name] = (tuple(obj.shape), obj.dtype)
            current = "file"
            _check_declared(path, layout, attrs, spec, os.fstat(fh.fileno()).st_size)
            arrays: dict[str, np.ndarray] = {}
            for name in layout:
                current = name
                arrays[name] = _read_array(path, name, f[name])
    except DatasetError:
        raise
    except FileNotFoundError:
        raise DatasetError(path, "file", "does not exist") from None
    except (OSError, ValueError, KeyError, RuntimeError, TypeError):
        raise DatasetError(path, current, "cannot be read as HDF5 (truncated or corrupt?)") from None
    return attrs, arrays


# At most this many bytes of arrays per byte of file: real data compresses a few-fold at most (float
# observations), so a file declaring far more is a compression bomb or a corrupt header.
MAX_EXPANSION = 1000


def _check_declared(path: str, layout: Layout, attrs: dict[str, Any], spec: TaskSpec | None,
                    file_bytes: int) -> None:
    """What a file declares, before any array is read: the header (format version, attributes), every
    array's shape and dtype against the header and the task (_check_layout, as `validate` checks arrays
    in memory), and the arrays' total size against the file's size and this machine's memory."""
    if "format_version" not in attrs:
        raise DatasetError(path, "attrs.format_version", "missing (not a plcql-bench dataset?)")
    if attrs["format_version"] not in SUPPORTED_VERSIONS:
        raise DatasetError(path, "attrs.format_version",
                           f"unsupported format version {excerpt(attrs['format_version'])} (supported: {SUPPORTED_VERSIONS})")
    _check_attrs(path, attrs)
    _check_layout(path, layout, attrs, spec)
    sizes = {name: _declared_bytes(shape, dtype) for name, (shape, dtype) in layout.items()}
    total, largest = sum(sizes.values()), max(sizes, key=sizes.get)
    what = f"the arrays declare {_size_text(total)} ({largest} alone {_size_text(sizes[largest])})"
    if total > MAX_EXPANSION * max(file_bytes, 1):
        raise DatasetError(path, "arrays", f"{what} in a {_size_text(file_bytes)} file, more than {MAX_EXPANSION}x "
                           f"its size (a corrupt header or a compression bomb); no array was loaded")
    budget = _memory_budget()
    if budget is not None and total > budget:
        raise DatasetError(path, "arrays", f"{what}, more than this process may allocate ({_size_text(budget)}); "
                           f"no array was loaded")


def _declared_bytes(shape: tuple[int, ...], dtype: np.dtype) -> int:
    return math.prod(int(d) for d in shape) * int(dtype.itemsize)


def _memory_budget() -> int | None:
    """The bytes this process can hold at most: the machine's memory, or less under a ulimit."""
    limits = []
    try:
        limits.append(os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"))
    except (AttributeError, ValueError, OSError):
        pass
    try:
        import resource

        for which in (resource.RLIMIT_AS, resource.RLIMIT_DATA):
            soft = resource.getrlimit(which)[0]
            if soft != resource.RLIM_INFINITY:
                limits.append(soft)
    except (ImportError, OSError, ValueError):
        pass
    return min(limits) if limits else None


def _size_text(n: int) -> str:
    for unit, size in (("TB", 1e12), ("GB", 1e9), ("MB", 1e6), ("KB", 1e3)):
        if n >= size:
            return f"{n / size:.1f} {unit}"
    return f"{n} bytes"


def _read_array(path: str, name: str, obj) -> np.ndarray:
    try:
        return obj[()]
    except MemoryError:
        raise DatasetError(path, name, f"out of memory reading {_size_text(_declared_bytes(obj.shape, obj.dtype))}; "
                           "not loaded") from None


# --------------------------------------------------------------------------------------------
# Synthetic datasets for tests


def synthetic_dataset(
    spec: TaskSpec,
    n_episodes: int = 4,
    episode_len: int = 5,
    seed: int = 0,
    quality: str = "synthetic",
) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    """A small valid dataset for ``spec`` (arrays, attrs), ready for write_dataset.

    Every episode has ``episode_len`` steps. Even episodes end with a timeout and record the
    next joint action (next_actions_valid=1 at the last step); odd episodes end with a true
    terminal and leave it unknown (valid=0, zero-filled). The behaviour policy is a noisy
    fixed linear function of the observation and the team reward is higher the closer the
    agents act to that function, so the data carry a learnable signal. Rewards lie in [0, 1]
    per step; ref returns are 0 (random) and episode_len (expert).
    """
    if n_episodes < 1 or episode_len < 1:
        raise ValueError("synthetic_dataset needs n_episodes >= 1 and episode_len >= 1")
    rng = np.random.default_rng(seed)
    n_ag, od, sd, ad = spec.n_agents, spec.obs_dim, spec.state_dim, spec.act_dim
    T = episode_len
    w = rng.normal(0.0, 1.0 / math.sqrt(od), (od, ad)).astype(np.float32)  # fixed "expert" map
    # T+1 observations per episode: the extra one is the final next_obs.
    obs = rng.normal(0.0, 1.0, (n_episodes, T + 1, n_ag, od)).astype(np.float32)
    state = rng.normal(0.0, 1.0, (n_episodes, T + 1, sd)).astype(np.float32)
    scores = obs @ w  # [E, T+1, n, ad]
    if spec.discrete:
        avail = (rng.random((n_episodes, T + 1, n_ag, ad)) < 0.7).astype(np.uint8)
        avail[..., 0] = 1  # a no-op is always available
        masked = np.where(avail == 1, scores + rng.gumbel(0.0, 0.5, scores.shape), -np.inf)
        actions = masked.argmax(-1).astype(np.int64)  # [E, T+1, n]
        best = np.where(avail == 1, scores, -np.inf).argmax(-1)
        reward = (actions == best).mean(-1)
    else:
        target = np.tanh(scores)
        actions = np.clip(target + rng.normal(0.0, 0.3, target.shape), -1.0, 1.0).astype(np.float32)
        reward = np.exp(-((actions - target) ** 2).mean(axis=(-1, -2)))
    reward = reward[:, :T].astype(np.float32)  # [E, T]

    def cur(x: np.ndarray) -> np.ndarray:
        return x[:, :T].reshape((n_episodes * T,) + x.shape[2:])

    def nxt(x: np.ndarray) -> np.ndarray:
        return x[:, 1:].reshape((n_episodes * T,) + x.shape[2:])

    terminal_ep = np.arange(n_episodes) % 2 == 1
    last = np.zeros((n_episodes, T), bool)
    last[:, -1] = True
    terminals = (last & terminal_ep[:, None]).reshape(-1)
    timeouts = (last & ~terminal_ep[:, None]).reshape(-1)
    valid = ~terminals
    next_actions = nxt(actions).copy()
    next_actions[~valid] = 0
    arrays: dict[str, np.ndarray] = {
        "obs": cur(obs), "next_obs": nxt(obs), "state": cur(state), "next_state": nxt(state),
        "actions": cur(actions), "next_actions": next_actions,
        "next_actions_valid": valid.astype(np.uint8),
        "rewards": reward.reshape(-1),
        "terminals": terminals.astype(np.uint8), "timeouts": timeouts.astype(np.uint8),
        "episode_ids": np.repeat(np.arange(n_episodes, dtype=np.int64), T),
        "steps": np.tile(np.arange(T, dtype=np.int32), n_episodes),
    }  # fmt: skip
    if spec.discrete:
        arrays["avail_actions"] = cur(avail)
        arrays["next_avail_actions"] = nxt(avail)
    attrs: dict[str, Any] = {
        "task_id": spec.task_id,
        "env_versions": {"synthetic": "1"},
        "quality": quality,
        "behaviour_policy_id": "synthetic-linear",
        "generator_version": "synthetic-1",
        "generator_seed": int(seed),
        "ref_return_random": 0.0,
        "ref_return_expert": float(T),
    }
    return arrays, _derive_attrs(arrays, attrs)
