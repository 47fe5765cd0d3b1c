"""Importers: official dataset files -> format v1 (docs/dataset-format.md, docs/datasets.md).

Two source formats here (and OG-MARL's Vaults in datasets/vault.py, `vault`):

* ``omar-npy``: OMAR's per-agent NumPy layout (MPE CN/PP/World and MaMuJoCo Half-Cheetah 2x3;
  reused by CFCQL's continuous code, MADiff and DoF)::

      <dir>/seed_<k>_data/obs_<i>.npy  acs_<i>.npy  rews_<i>.npy  next_obs_<i>.npy  dones_<i>.npy
      (Half-Cheetah also states_<i>.npy, next_states_<i>.npy: the 17-d global state)

  Rows are stored episode by episode with no padding; every episode has the task's episode
  length (MPE 25, Half-Cheetah 1000), so episodes are cut every `episode_limit` rows. Only the
  learners are imported (agents 0..2 for MPE, 0..1 for Half-Cheetah); the PP/World prey is not a
  learner. The global state is rebuilt the way our env builds it: CN = the 3 obs concatenated;
  PP/World = the 3 predators' obs then the prey's obs, the prey's obs taken from
  ``obs_3.npy`` when present and otherwise recomputed from the predators' obs (they contain
  every position and velocity it needs). The team reward is the mean of the learners' rewards (each
  learner's own is kept as `agent_rewards`, dataset format v2)
  (CN: OMAR's evaluation; PP/World/Half-Cheetah: all equal). Neither MPE nor Half-Cheetah has
  true terminals: the last step of each episode is a timeout. A ``dones`` flag inside an
  episode is an error. OMAR's behaviour actions were not clipped by the env; values outside
  [-1, 1] are clipped and counted in ``attrs.actions_clipped``.
  ``pretrained_adv_model.pt`` (PP/World) is checked, copied next to the dataset and named in
  ``env_versions`` (the data was generated against that prey, not our shipped one).

* ``cfcql-h5``: CFCQL's SMAC files ``<map>_<quality>.h5`` (pymarl EpisodeBatch dump): episode-
  major arrays padded to ``episode_limit + 1`` slots with keys ``state [E,T+1,S]``,
  ``obs [E,T+1,n,d]``, ``actions [E,T+1,n,1]``, ``avail_actions [E,T+1,n,A]``,
  ``probs [E,T+1,n,A]``, ``reward [E,T+1,1]``, ``terminated [E,T+1,1]``, ``filled [E,T+1,1]``.
  pymarl marks ``filled`` for the L transitions of an episode *and* for slot L, which holds the
  final state/obs/avail; so L = sum(filled) − 1 and ``next_X[t] = X[t+1]`` for t < L. A
  ``terminated`` flag must sit at slot L−1 (true end: terminal); episodes without one ended by
  the time limit (timeout). ``probs`` is kept as the extra array ``behaviour_probs``.

Both: ``next_actions[t] = actions[t+1]`` inside an episode; at an episode's last step the next
action is unknown (``next_actions_valid = 0``, zero-filled), never the next episode's first.
Reference returns are the paper-convention values (MADiff App. G.1 for MPE, an unattributed script
for Half-Cheetah; see docs/reference-implementations.md), named in
``attrs.ref_return_source``; SMAC tasks have none (NaN; the score is the win rate). The files do
not record wins, so imported SMAC datasets carry no ``win_rate``.

Every problem raises a one-line DatasetError ``<source file>: <field>: <problem>``.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import h5py
import numpy as np

from plcql_bench.datasets.format import DatasetError
from plcql_bench.suite.core.spec import TaskSpec
from plcql_bench.datasets.imported import (
    _base_attrs,
    _episode_next_actions,
    _write,
    normalise_tier,
)
from plcql_bench.datasets.vault import import_vault
from plcql_bench.suite.envs import mpe, prey as prey_mod

FORMATS = ("omar-npy", "cfcql-h5", "vault")


def detect_format(src: str | Path) -> str:
    src = Path(src)
    if src.suffix == ".vlt":  # an OG-MARL vault (datasets/vault.py)
        return "vault"
    if src.is_dir():
        return "omar-npy"
    if src.suffix in (".h5", ".hdf5"):
        return "cfcql-h5"
    raise DatasetError(src, "file", "cannot tell the format: give a seed_<k>_data directory "
                       "(omar-npy), an .h5 file (cfcql-h5) or a <name>.vlt folder (vault), or pass --format")


# ------------------------------------------------------------------------------ checks


def _check_next(src: Path, name: str, cur: np.ndarray, nxt: np.ndarray, last: np.ndarray) -> None:
    """Inside episodes the stored next_X[t] must equal X[t+1] (the format requires it)."""
    inner = np.flatnonzero(~last[:-1])
    if inner.size:
        bad = np.any(nxt[inner] != cur[inner + 1], axis=tuple(range(1, cur.ndim)))
        if bad.any():
            row = int(inner[np.argmax(bad)])
            raise DatasetError(src, name, f"row {row}: next value differs from row {row + 1}'s "
                               "current value inside an episode (wrong episode length or layout?)")


# ------------------------------------------------------------------------------ OMAR .npy


def _load_npy(path: Path, field: str) -> np.ndarray:
    if not path.is_file():
        raise DatasetError(path, "file", f"missing ({field} of OMAR's per-agent layout)")
    try:
        return np.load(path, allow_pickle=False)
    except Exception as err:  # noqa: BLE001 - any unreadable file is a user error
        raise DatasetError(path, "file", f"cannot be read as .npy ({type(err).__name__}: {err})") from None


def _rows(path: Path, a: np.ndarray, n: int | None, width: int | None, what: str) -> np.ndarray:
    """Check a per-agent array: numeric, finite, [N] / [N, 1] (width None) or [N, width]."""
    if a.dtype.kind not in "fiub":
        raise DatasetError(path, what, f"dtype {a.dtype} is not numeric")
    if width is None:
        if a.ndim == 2 and a.shape[1] == 1:
            a = a[:, 0]
        if a.ndim != 1:
            raise DatasetError(path, what, f"shape {a.shape}: expected [N] or [N, 1]")
    elif a.ndim != 2 or a.shape[1] != width:
        raise DatasetError(path, what, f"shape {a.shape}: expected [N, {width}]")
    if n is not None and a.shape[0] != n:
        raise DatasetError(path, what, f"{a.shape[0]} rows, but obs_0.npy has {n}")
    if a.dtype.kind == "f" and not np.isfinite(a).all():
        raise DatasetError(path, what, "contains NaN or inf")
    return a


def _seed_dir(src: Path, seed: int) -> Path:
    if (src / "obs_0.npy").exists():
        return src
    cand = src / f"seed_{seed}_data"
    if not cand.is_dir():
        raise DatasetError(src, "file", f"no obs_0.npy and no seed_{seed}_data/ directory")
    return cand


def _mpe_prey_obs(task_id: str, obs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Rebuild every entity from the 3 predators' obs [N, 3, d]; return (prey obs [N, dp], the
    predators' obs recomputed from the rebuilt entities, for a layout check)."""

    sc = mpe.SCENARIOS[task_id]
    o = obs.astype(np.float64)
    n_lm = len(sc.landmark_size)
    pos_pred, vel_pred = o[:, :, 2:4], o[:, :, 0:2]
    lm = pos_pred[:, :1] + o[:, 0, 4:4 + 2 * n_lm].reshape(-1, n_lm, 2)
    others = 4 + 2 * n_lm  # agent 0's others: predators 1, 2, then the prey
    prey_pos = pos_pred[:, 0] + o[:, 0, others + 4:others + 6]
    prey_vel = o[:, 0, others + 6:others + 8]
    pos = np.concatenate([pos_pred, prey_pos[:, None]], axis=1)
    vel = np.concatenate([vel_pred, prey_vel[:, None]], axis=1)
    learners, prey = mpe.observe(sc, pos, vel, lm)
    return prey.astype(np.float32), learners


def read_omar(src: str | Path, spec: TaskSpec, seed: int = 0) -> tuple[dict[str, np.ndarray], dict]:
    """Convert one OMAR seed directory to format-v1 arrays; returns (arrays, info)."""
    d = _seed_dir(Path(src), seed)
    n_ag, od, ad, T = spec.n_agents, spec.obs_dim, spec.act_dim, spec.episode_limit
    obs0 = _load_npy(d / "obs_0.npy", "obs")
    if obs0.ndim != 2:
        raise DatasetError(d / "obs_0.npy", "obs", f"shape {obs0.shape}: expected [N, {od}]")
    n = obs0.shape[0]
    if n == 0 or n % T:
        raise DatasetError(d / "obs_0.npy", "rows", f"{n} rows is not a positive multiple of the "
                           f"episode length {T} of {spec.task_id}")
    cols: dict[str, list[np.ndarray]] = {k: [] for k in ("obs", "next_obs", "acs", "rews", "dones")}
    for i in range(n_ag):
        for key, width in (("obs", od), ("next_obs", od), ("acs", ad), ("rews", None), ("dones", None)):
            p = d / f"{key}_{i}.npy"
            cols[key].append(_rows(p, _load_npy(p, key), n, width, key))
    obs, next_obs = np.stack(cols["obs"], 1), np.stack(cols["next_obs"], 1)
    actions = np.stack(cols["acs"], 1).astype(np.float32)
    per_agent = np.stack(cols["rews"], 1).astype(np.float32)  # OMAR's files hold each learner's own reward
    rewards = np.mean(per_agent.astype(np.float64), axis=1)
    last = np.zeros(n, bool)
    last[T - 1::T] = True
    for i, dn in enumerate(cols["dones"]):
        inside = np.flatnonzero((dn != 0) & ~last)
        if inside.size:
            raise DatasetError(d / f"dones_{i}.npy", "dones", f"row {int(inside[0])}: done inside "
                               f"a {T}-step episode (episodes must be stored contiguously)")
    _check_next(d / "next_obs_0.npy", "next_obs", obs, next_obs, last)

    info: dict[str, Any] = {"seed_dir": str(d)}
    if spec.domain == "mamujoco":
        state = _rows(d / "states_0.npy", _load_npy(d / "states_0.npy", "states"), n,
                      spec.state_dim, "states")
        next_state = _rows(d / "next_states_0.npy", _load_npy(d / "next_states_0.npy", "next_states"),
                           n, spec.state_dim, "next_states")
    elif spec.task_id == "mpe-cn":
        state, next_state = obs.reshape(n, -1), next_obs.reshape(n, -1)
    elif spec.task_id in ("mpe-pp", "mpe-world"):
        prey_p = d / f"obs_{n_ag}.npy"
        prey_dim = spec.state_dim - n_ag * od
        if prey_p.exists():
            prey = _rows(prey_p, _load_npy(prey_p, "obs"), n, prey_dim, "obs")
            prey_next_p = d / f"next_obs_{n_ag}.npy"
            prey_next = _rows(prey_next_p, _load_npy(prey_next_p, "next_obs"), n, prey_dim, "next_obs")
            info["prey_obs"] = "obs_3.npy"
        else:
            prey, learners = _mpe_prey_obs(spec.task_id, obs)
            err = np.abs(learners - obs).max()
            if err > 1e-3:
                raise DatasetError(d / "obs_0.npy", "obs", f"layout does not match {spec.task_id}'s "
                                   f"observations (rebuilt obs differ by {err:.3g})")
            prey_next, _ = _mpe_prey_obs(spec.task_id, next_obs)
            info["prey_obs"] = "recomputed from the predators' obs"
        state = np.concatenate([obs.reshape(n, -1), prey], axis=1)
        next_state = np.concatenate([next_obs.reshape(n, -1), prey_next], axis=1)
    else:
        raise DatasetError(d, "task", f"{spec.task_id} is not an OMAR task (MPE or Half-Cheetah)")
    # inside an episode next_state[t] is state[t+1] by construction of the source data
    inner = np.flatnonzero(~last[:-1])
    _check_next(d / ("next_states_0.npy" if spec.domain == "mamujoco" else "next_obs_0.npy"),
                "next_state", state, next_state, last)
    next_state = next_state.copy()
    next_state[inner] = state[inner + 1]

    clipped = int(np.count_nonzero(np.abs(actions) > 1.0))
    actions = np.clip(actions, -1.0, 1.0)
    next_actions, valid = _episode_next_actions(actions, last)
    e = n // T
    arrays = {
        "obs": obs.astype(np.float32), "next_obs": next_obs.astype(np.float32),
        "state": state.astype(np.float32), "next_state": next_state.astype(np.float32),
        "actions": actions, "next_actions": next_actions, "next_actions_valid": valid,
        "rewards": rewards.astype(np.float32), "agent_rewards": per_agent,  # format v2
        "terminals": np.zeros(n, np.uint8), "timeouts": last.astype(np.uint8),
        "episode_ids": np.repeat(np.arange(e, dtype=np.int64), T),
        "steps": np.tile(np.arange(T, dtype=np.int32), e),
    }
    info["actions_clipped"] = clipped
    return arrays, info


def import_omar(src: str | Path, spec: TaskSpec, tier: str, data_dir: str | Path, *, profile: str,
                seed: int = 0, prey_file: str | Path | None = None, base_versions=None) -> dict:
    """Import one OMAR seed directory (or its parent with seed_<seed>_data/) as TASK/TIER."""

    src, data_dir, tier = Path(src), Path(data_dir), normalise_tier(tier)
    arrays, info = read_omar(src, spec, seed)
    versions = dict(spec.env_versions() if base_versions is None else base_versions)
    versions["data"] = "OMAR official datasets (MuJoCo 2.0 / mujoco_py 200 for Half-Cheetah)"
    extra: dict[str, Path] = {}
    if spec.task_id in ("mpe-pp", "mpe-world"):
        if prey_file is None:
            cand = [src / "pretrained_adv_model.pt", src.parent / "pretrained_adv_model.pt",
                    src.parent.parent / "pretrained_adv_model.pt"]
            prey_file = next((c for c in cand if c.is_file()), None)
        if prey_file is not None:
            prey_file = Path(prey_file)
            try:
                prey_mod.load_prey(prey_file)
            except Exception as err:  # noqa: BLE001
                raise DatasetError(prey_file, "agent_params", str(err).split(": ", 1)[-1]) from None
            dest = data_dir / spec.task_id / f"{tier}.prey.pt"
            dest.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(prey_file, dest)
            versions["prey"] = f"{prey_file.name}:sha256={prey_mod.file_digest(prey_file)}"
            extra["prey_file"] = dest.relative_to(data_dir)
        else:
            versions["prey"] = "unknown (pretrained_adv_model.pt not given)"
    seed_name = Path(info["seed_dir"]).name
    attrs = _base_attrs(spec, tier, f"omar/{spec.task_id}/{tier}/{seed_name}",
                        f"omar-npy:{info['seed_dir']}", versions)
    attrs["actions_clipped"] = info["actions_clipped"]
    if "prey_obs" in info:
        attrs["prey_obs"] = info["prey_obs"]
    return _write(arrays, attrs, spec, data_dir, tier, profile, attrs["source"], extra)


# ------------------------------------------------------------------------------ CFCQL .h5

_H5_KEYS = ("state", "obs", "actions", "avail_actions", "reward", "terminated", "filled")


def read_cfcql_h5(path: str | Path, spec: TaskSpec) -> dict[str, np.ndarray]:
    """Convert a CFCQL/pymarl SMAC .h5 to format-v1 arrays (see the module docstring)."""

    path = Path(path)
    if not path.is_file():
        raise DatasetError(path, "file", "missing")
    try:
        with h5py.File(path, "r") as f:
            missing = [k for k in _H5_KEYS if k not in f]
            if missing:
                raise DatasetError(path, missing[0], "missing (CFCQL .h5 needs keys "
                                   f"{', '.join(_H5_KEYS)})")
            raw = {k: f[k][()] for k in _H5_KEYS}
            if "probs" in f:
                raw["probs"] = f["probs"][()]
    except DatasetError:
        raise
    except Exception as err:  # noqa: BLE001
        raise DatasetError(path, "file", f"cannot be read as HDF5 ({type(err).__name__})") from None
    n_ag, od, sd, na = spec.n_agents, spec.obs_dim, spec.state_dim, spec.act_dim

    def shape(name: str, want: tuple) -> np.ndarray:
        a = raw[name]
        if name in ("actions", "reward", "terminated", "filled") and a.ndim == len(want) + 1 and a.shape[-1] == 1:
            a = a[..., 0]
        if a.ndim != len(want) or any(w is not None and s != w for s, w in zip(a.shape, want)):
            pretty = "[" + ", ".join("*" if w is None else str(w) for w in want) + "]"
            raise DatasetError(path, name, f"shape {a.shape}: expected {pretty} for {spec.task_id}")
        if a.dtype.kind not in "fiub":
            raise DatasetError(path, name, f"dtype {a.dtype} is not numeric")
        if a.dtype.kind == "f" and not np.isfinite(a).all():
            raise DatasetError(path, name, "contains NaN or inf")
        return a

    filled = shape("filled", (None, None))
    e, t1 = filled.shape
    state = shape("state", (e, t1, sd))
    obs = shape("obs", (e, t1, n_ag, od))
    actions = shape("actions", (e, t1, n_ag))
    avail = shape("avail_actions", (e, t1, n_ag, na))
    reward = shape("reward", (e, t1))
    term = shape("terminated", (e, t1)) != 0
    probs = shape("probs", (e, t1, n_ag, na)) if "probs" in raw else None
    if t1 - 1 > spec.episode_limit:
        raise DatasetError(path, "filled", f"{t1} slots per episode exceed episode_limit + 1 = "
                           f"{spec.episode_limit + 1} of {spec.task_id}")
    filled = filled != 0
    n_filled = filled.sum(1)
    prefix = filled == (np.arange(t1)[None, :] < n_filled[:, None])
    if not prefix.all() or (n_filled < 2).any():
        ep = int(np.flatnonzero(~prefix.all(1) | (n_filled < 2))[0])
        raise DatasetError(path, "filled", f"episode {ep}: filled must be a prefix of at least 2 "
                           "slots (the transitions, then the final state)")
    lengths = n_filled - 1
    keep = np.arange(t1)[None, :] < lengths[:, None]  # transitions t < L
    last_slot = lengths - 1
    bad_term = term & keep & (np.arange(t1)[None, :] != last_slot[:, None])
    if bad_term.any():
        ep = int(np.flatnonzero(bad_term.any(1))[0])
        raise DatasetError(path, "terminated", f"episode {ep}: terminated before its last transition")
    ended = term[np.arange(e), last_slot]
    act = actions.astype(np.int64)
    if act[keep].min(initial=0) < 0 or act[keep].max(initial=0) >= na:
        raise DatasetError(path, "actions", f"values outside [0, {na})")
    def cur(x):
        return x[keep]

    def nxt(x):
        return x[:, 1:][keep[:, :-1]]  # slot t+1 for t < L (slot L holds the final state)

    n = int(keep.sum())
    ep_ids = np.repeat(np.arange(e, dtype=np.int64), lengths)
    steps = np.concatenate([np.arange(L, dtype=np.int32) for L in lengths])
    is_last = np.zeros(n, bool)
    is_last[np.cumsum(lengths) - 1] = True
    cur_act = cur(act)
    next_actions, valid = _episode_next_actions(cur_act, is_last)
    next_avail = nxt(avail).astype(np.uint8)
    arrays = {
        "obs": cur(obs).astype(np.float32), "next_obs": nxt(obs).astype(np.float32),
        "state": cur(state).astype(np.float32), "next_state": nxt(state).astype(np.float32),
        "actions": cur_act, "next_actions": next_actions, "next_actions_valid": valid,
        "avail_actions": cur(avail).astype(np.uint8), "next_avail_actions": next_avail,
        "rewards": cur(reward).astype(np.float32),
        "terminals": (is_last & np.repeat(ended, lengths)).astype(np.uint8),
        "timeouts": (is_last & ~np.repeat(ended, lengths)).astype(np.uint8),
        "episode_ids": ep_ids, "steps": steps,
    }
    if probs is not None:
        arrays["behaviour_probs"] = cur(probs).astype(np.float32)
    for name in ("avail_actions",):
        if not np.isin(arrays[name], (0, 1)).all():
            raise DatasetError(path, name, "values other than 0/1")
    chosen = np.take_along_axis(arrays["avail_actions"], cur_act[..., None], -1)[..., 0]
    if (chosen == 0).any():
        row = int(np.flatnonzero((chosen == 0).any(1))[0])
        raise DatasetError(path, "actions", f"transition {row}: action not available under avail_actions")
    return arrays


def import_cfcql_h5(src: str | Path, spec: TaskSpec, tier: str, data_dir: str | Path, *,
                    profile: str) -> dict:
    src, tier = Path(src), normalise_tier(tier)
    arrays = read_cfcql_h5(src, spec)
    versions = dict(spec.env_versions())
    versions["data"] = "CFCQL official SMAC datasets (StarCraft II 4.10, QMIX behaviour)"
    attrs = _base_attrs(spec, tier, f"cfcql/{src.name}", f"cfcql-h5:{src}", versions)
    return _write(arrays, attrs, spec, Path(data_dir), tier, profile, attrs["source"])


def import_dataset(fmt_name: str, src: str | Path, spec: TaskSpec, tier: str,
                   data_dir: str | Path, *, profile: str, seed: int = 0,
                   prey_file: str | Path | None = None, uid: str | None = None) -> dict:
    if fmt_name == "auto":
        fmt_name = detect_format(src)
    if fmt_name == "vault":
        return import_vault(src, spec, tier, data_dir, profile=profile, uid=uid)
    if fmt_name == "omar-npy":
        return import_omar(src, spec, tier, data_dir, profile=profile, seed=seed, prey_file=prey_file)
    if fmt_name == "cfcql-h5":
        return import_cfcql_h5(src, spec, tier, data_dir, profile=profile)
    raise DatasetError(src, "format", f"unknown format {fmt_name!r} (known: {', '.join(FORMATS)})")
