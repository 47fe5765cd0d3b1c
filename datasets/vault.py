"""OG-MARL Vaults (flashbax) in and out: `datasets import --format vault`, `datasets export --format vault`.

A Vault is a folder `<name>.vlt/<uid>/` written by flashbax (the optional extra `vault`). OG-MARL ships one
vault per task and one uid per dataset tier. Its experience is a tree of arrays with a leading batch axis of
1 and a time axis T; the keys OG-MARL uses:

    observations [1,T,n,obs]   actions [1,T,n,act] (continuous) or [1,T,n] (discrete)   rewards [1,T,n]
    terminals [1,T,n]          truncations [1,T,n]          infos: {state [1,T,S], legals [1,T,n,A] (discrete)}

Import (an OG-MARL vault): rows are transitions in time order; an episode ends where every agent is terminal
(a terminal) or truncated (a timeout), and the vault's last row ends one (a timeout) if nothing does. The
team reward is the mean of the agents' rewards (equal in the cooperative tasks; CN's per-agent rewards are
kept as the extra array `agent_rewards`). A vault holds no observation after an episode's last step: there
`next_obs`/`next_state` repeat the step's own (`attrs.vault_next_at_episode_end = "repeated"`; a terminal
never bootstraps from it, a timeout does). `next_actions` follow the format's rule (valid inside an
episode, zero and invalid at its last step).

Export (one of our tiers): the same OG-MARL keys, so OG-MARL's loaders read it (rewards per agent: the
file's `agent_rewards` when it has them, else the team reward for each agent), plus every other array of
the file under `plcql/` and the file's attributes in the vault's metadata, so an import of our own export
gives back the same arrays exactly (tests/test_vault.py). Both directions go through datasets/format.py
(`load_dataset`, and `write_dataset` via the importers' writer, which also records the manifest and card).
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import shutil
from pathlib import Path
from typing import Any

import numpy as np

from plcql_bench.datasets import format as fmt
from plcql_bench.datasets.format import DatasetError
from plcql_bench.suite.core.spec import TaskSpec
from plcql_bench.datasets.imported import _base_attrs, _episode_next_actions, _write, normalise_tier

OURS = "plcql"  # the experience subtree holding the file's other arrays in our own export
ATTRS_KEY = "plcql_attrs"  # the vault metadata entry holding the file's attributes (JSON)
IN_OGMARL_KEYS = ("obs", "actions", "state", "avail_actions")  # stored exactly under OG-MARL's keys
INSTALL = "pip install 'plcql-bench[vault]'"


def _flashbax():
    try:
        from flashbax.buffers.trajectory_buffer import TrajectoryBufferState
        from flashbax.vault import Vault
    except ImportError:
        raise DatasetError("flashbax", "import", f"Vaults need flashbax: {INSTALL}") from None
    return Vault, TrajectoryBufferState


def _open(path: Path, uid: str, **kwargs):
    """flashbax's Vault at <path>/<uid> (it prints where it is: kept off our output)."""
    Vault, _ = _flashbax()
    with contextlib.redirect_stdout(io.StringIO()):
        return Vault(vault_name=path.name, rel_dir=str(path.parent.resolve()), vault_uid=uid, **kwargs)


def vault_uids(path: str | Path) -> list[str]:
    """The uids (dataset folders) of the vault at `path`."""
    path = Path(path)
    if not path.is_dir():
        raise DatasetError(path, "vault", "not found (expected the <name>.vlt folder of an OG-MARL vault)")
    return sorted(p.name for p in path.iterdir() if (p / "metadata.json").is_file())


def pick_uid(path: str | Path, tier: str, uid: str | None) -> str:
    """`uid`, else the vault's uid that names `tier` (case, '-' and '_' aside: Medium-Replay, medium_replay)."""
    uids = vault_uids(path)
    if uid is None:
        norm = {u.lower().replace("_", "-"): u for u in uids}
        uid = norm.get(tier.lower().replace("_", "-"))
        if uid is None:
            raise DatasetError(path, "uid", f"no uid names tier {tier!r} (uids: {', '.join(uids) or 'none'}); "
                               "pass --uid")
    elif uid not in uids:
        raise DatasetError(path, "uid", f"{uid!r} not in the vault (uids: {', '.join(uids) or 'none'})")
    return uid


def read_vault(path: str | Path, uid: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """(experience as a tree of numpy arrays without the batch axis, the vault's metadata)."""
    import jax

    path = Path(path)
    vault = _open(path, uid)
    with contextlib.redirect_stdout(io.StringIO()):
        state = vault.read()
    experience = jax.tree_util.tree_map(lambda a: np.asarray(a)[0], state.experience)
    metadata = json.loads((path / uid / "metadata.json").read_text())
    return experience, metadata


# ----------------------------------------------------------------------------- import


def vault_arrays(experience: dict, spec: TaskSpec, where: str) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    """Format-v1 arrays (and attributes it adds) from a vault's experience; `where` names it in errors."""

    ours = experience.get(OURS)
    if isinstance(ours, dict):  # our own export: every other array is stored as it was
        arrays = {name: np.asarray(a) for name, a in ours.items()}
        arrays.update(_core(experience, spec, where)[0])
        return arrays, {}
    arrays, clipped = _core(experience, spec, where)
    added: dict[str, Any] = {"vault_next_at_episode_end": "repeated"}
    if not spec.discrete:
        added["actions_clipped"] = clipped
    terminals, truncations = (_flags(experience, key, spec, where) for key in ("terminals", "truncations"))
    ends = terminals | truncations
    ends[-1] = True  # the vault's last row ends an episode (a timeout when nothing says otherwise)
    episode_ids = np.concatenate([[0], np.cumsum(ends[:-1])]).astype(np.int64)
    starts = np.flatnonzero(np.concatenate([[True], ends[:-1]]))
    steps = (np.arange(len(ends)) - np.repeat(starts, np.diff(np.append(starts, len(ends))))).astype(np.int32)
    rewards = _field(experience, "rewards", where).astype(np.float32)
    if rewards.ndim != 2 or rewards.shape[1] != spec.n_agents:
        raise DatasetError(where, "rewards", f"shape {rewards.shape}: expected [T, {spec.n_agents}] (one per agent)")
    arrays.update(
        rewards=rewards.mean(axis=1, dtype=np.float32), agent_rewards=rewards,
        terminals=(ends & terminals).astype(np.uint8), timeouts=(ends & ~terminals).astype(np.uint8),
        episode_ids=episode_ids, steps=steps)
    for name in ("obs", "state", "avail_actions"):
        if name in arrays:
            arrays[f"next_{name}"] = _next_rows(arrays[name], ends)
    arrays["next_actions"], arrays["next_actions_valid"] = _episode_next_actions(arrays["actions"], ends)
    return arrays, added


def _core(experience: dict, spec: TaskSpec, where: str) -> tuple[dict[str, np.ndarray], int]:
    """obs, actions, state (and avail_actions) from OG-MARL's keys; and how many action components were
    clipped into [-1, 1]."""
    infos = experience.get("infos") or {}
    arrays = {"obs": _field(experience, "observations", where), "actions": _field(experience, "actions", where)}
    if "state" not in infos:
        raise DatasetError(where, "infos.state", "missing: the suite's critics need the global state")
    arrays["state"] = np.asarray(infos["state"])
    clipped = 0
    if not spec.discrete:  # OMAR's behaviour actions were not clipped by the env (as the omar-npy importer)
        inside = np.clip(arrays["actions"], -1.0, 1.0)
        clipped, arrays["actions"] = int((inside != arrays["actions"]).sum()), inside
    else:
        if "legals" not in infos:
            raise DatasetError(where, "infos.legals", "missing: a discrete task needs the available actions")
        arrays["avail_actions"] = _whole(np.asarray(infos["legals"]), np.uint8)
        actions = arrays["actions"].reshape(arrays["actions"].shape[:2])  # [T, n, 1] -> [T, n]
        arrays["actions"] = _whole(actions, np.int64)
    return arrays, clipped


def _whole(values: np.ndarray, dtype) -> np.ndarray:
    """Float flags or indices (OG-MARL stores some as float32) as `dtype` when every value is a whole number;
    else as they are, for the format's check to name."""
    if values.dtype.kind == "f" and np.array_equal(values, np.round(values)):
        return values.astype(dtype)
    return values


def _field(experience: dict, key: str, where: str) -> np.ndarray:
    if key not in experience:
        raise DatasetError(where, key, f"missing (keys: {', '.join(sorted(experience))})")
    return np.asarray(experience[key])


def _flags(experience: dict, key: str, spec: TaskSpec, where: str) -> np.ndarray:
    """An episode flag per row: set for every agent (OG-MARL's convention)."""
    flags = _field(experience, key, where)
    return flags.reshape(len(flags), -1).astype(bool).all(axis=1)


def _next_rows(values: np.ndarray, ends: np.ndarray) -> np.ndarray:
    """values[t+1] inside an episode; values[t] itself at its last step (the vault has no later row)."""
    out = values.copy()
    inner = np.flatnonzero(~ends)
    out[inner] = values[inner + 1]
    return out


def import_vault(src: str | Path, spec: TaskSpec, tier: str, data_dir: str | Path, *, profile: str,
                 uid: str | None = None) -> dict:
    """Import the vault at `src` (uid `uid`, or the one that names `tier`) as TASK/TIER into data_dir; returns
    the manifest entry (the manifest and the dataset card are written, as for every import)."""

    src, tier = Path(src), normalise_tier(tier)
    uid = pick_uid(src, tier, uid)
    where = str(src / uid)
    experience, metadata = read_vault(src, uid)
    arrays, added = vault_arrays(experience, spec, where)
    versions = dict(spec.env_versions())
    versions["data"] = f"OG-MARL vault {src.name}/{uid}"
    attrs = _base_attrs(spec, tier, f"vault/{src.name}/{uid}", f"vault:{src.resolve()}#{uid}", versions)
    ours = metadata.get(ATTRS_KEY)
    if ours:  # our own export: its attributes (references, behaviour policy, generator) come back
        kept = json.loads(ours)
        attrs.update({k: v for k, v in kept.items() if k not in ("task_id", "quality", "source")})
    attrs.update(added)
    return _write(arrays, attrs, spec, Path(data_dir), tier, profile, attrs["source"])


# ----------------------------------------------------------------------------- export


def export_vault(dataset_path: str | Path, spec: TaskSpec, out_dir: str | Path, *, uid: str,
                 vault_name: str | None = None, expected_sha256: str | None = None, force: bool = False) -> Path:
    """Write the dataset file at `dataset_path` as the vault `<out_dir>/<vault_name>/<uid>` (default name
    `<task>.vlt`); returns that folder. Written beside it first and moved into place, so a failed export
    leaves no half vault; an existing uid is refused unless `force`."""
    data = fmt.load_dataset(dataset_path, spec=spec, expected_sha256=expected_sha256)
    vault = Path(out_dir) / (vault_name or f"{spec.task_id}.vlt")
    dest = vault / uid
    if dest.exists() and not force:
        raise DatasetError(dest, "uid", "exists already (--force replaces it)")
    experience = ogmarl_experience(data.arrays, spec)
    tmp_uid = f".{uid}.tmp-{os.getpid()}"
    shutil.rmtree(vault / tmp_uid, ignore_errors=True)
    vault.mkdir(parents=True, exist_ok=True)
    try:
        _write_vault(vault, tmp_uid, experience, {ATTRS_KEY: json.dumps(_json_attrs(data.attrs), sort_keys=True),
                                                  "plcql_source": str(dataset_path), "plcql_sha256": data.sha256})
        if dest.exists():
            shutil.rmtree(dest)
        os.replace(vault / tmp_uid, dest)
    finally:
        shutil.rmtree(vault / tmp_uid, ignore_errors=True)
    return dest


def ogmarl_experience(arrays: dict[str, np.ndarray], spec: TaskSpec) -> dict[str, Any]:
    """A dataset's arrays in OG-MARL's layout (no batch axis), with the rest under `plcql/`."""
    n, rows = spec.n_agents, len(arrays["rewards"])
    per_agent = arrays.get("agent_rewards")
    if per_agent is None:
        per_agent = np.repeat(arrays["rewards"][:, None], n, axis=1)
    infos = {"state": arrays["state"]}
    if "avail_actions" in arrays:
        infos["legals"] = arrays["avail_actions"]
    return {
        "observations": arrays["obs"], "actions": arrays["actions"], "rewards": per_agent.astype(np.float32),
        "terminals": np.repeat(arrays["terminals"].astype(bool)[:, None], n, axis=1),
        "truncations": np.repeat(arrays["timeouts"].astype(bool)[:, None], n, axis=1),
        "infos": infos,
        OURS: {name: a for name, a in arrays.items() if name not in IN_OGMARL_KEYS and len(a) == rows},
    }


def _write_vault(vault: Path, uid: str, experience: dict, metadata: dict) -> None:
    import jax
    import jax.numpy as jnp

    Vault, TrajectoryBufferState = _flashbax()
    rows = len(experience["rewards"])
    batched = jax.tree_util.tree_map(lambda a: jnp.asarray(a)[None], experience)
    state = TrajectoryBufferState(experience=batched, current_index=jnp.asarray(rows), is_full=jnp.asarray(False))
    with contextlib.redirect_stdout(io.StringIO()):
        Vault(vault_name=vault.name, rel_dir=str(vault.parent.resolve()), vault_uid=uid,
              experience_structure=batched, metadata=metadata).write(state, source_interval=(0, rows))


def _json_attrs(attrs: dict[str, Any]) -> dict[str, Any]:
    """The attributes as JSON values (numpy scalars as Python ones; NaN stays NaN, which json reads back)."""
    return {key: value.item() if hasattr(value, "item") else value for key, value in attrs.items()}
