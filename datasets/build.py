"""Build a dataset (task x tier) by rolling out its behaviour policy in batched envs.

Deterministic for a given generator seed: env seeds come from suite.protocol.collection_seeds and
the policy noise from a Generator seeded with (generator_seed, tier index)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from plcql_bench.datasets import format as fmt
from plcql_bench.datasets import manifest
from plcql_bench.datasets.behaviour import GENERATOR_VERSION, REFERENCES, behaviour_for
from plcql_bench.suite import protocol
from plcql_bench.suite.errors import BenchError
from plcql_bench.suite.spec import Policy, Task
from plcql_bench.suite.tasks import ALL_TIERS, get_task

COLLECT_BATCH = 256


def collect(task: Task, policy: Policy, seeds: np.ndarray) -> dict[str, np.ndarray]:
    """Roll out one episode per seed; return format-v1 arrays, episode-major."""
    parts = [_collect_batch(task, policy, seeds[i : i + COLLECT_BATCH])
             for i in range(0, len(seeds), COLLECT_BATCH)]
    arrays = {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}
    offsets = np.cumsum([0] + [p["episode_ids"].max() + 1 for p in parts[:-1]])
    arrays["episode_ids"] = np.concatenate([p["episode_ids"] + o for p, o in zip(parts, offsets)])
    return arrays


def _collect_batch(task: Task, policy: Policy, seeds: np.ndarray) -> dict[str, np.ndarray]:
    env = task.make_env(len(seeds))
    step = env.reset(seeds)
    alive = np.ones(len(seeds), dtype=bool)
    rows: list[dict[str, np.ndarray]] = []
    action = policy(step)
    while alive.any():
        nxt = env.step(action)
        next_action = policy(nxt)  # also the dataset's a' at the final next state
        rows.append(_row(step, action, nxt, next_action, alive))
        alive = alive & ~nxt.done
        step, action = nxt, next_action
    return _to_episode_major(rows, discrete=task.spec.discrete)


def _row(step, action, nxt, next_action, alive) -> dict[str, np.ndarray]:
    row = {
        "obs": step.obs, "state": step.state, "actions": action, "rewards": nxt.reward,
        "next_obs": nxt.obs, "next_state": nxt.state, "next_actions": next_action,
        "terminals": nxt.terminal, "timeouts": nxt.timeout, "alive": alive.copy(),
    }
    if step.avail is not None:
        row["avail_actions"], row["next_avail_actions"] = step.avail, nxt.avail
    return row


def _to_episode_major(rows: list[dict], discrete: bool) -> dict[str, np.ndarray]:
    """[T][B] rows -> transitions ordered episode by episode, dropping post-episode steps."""
    stacked = {k: np.stack([r[k] for r in rows], axis=1) for k in rows[0]}  # [B, T, ...]
    alive = stacked.pop("alive")
    n_envs, horizon = alive.shape
    out = {k: v[alive] for k, v in stacked.items()}
    out["episode_ids"] = np.broadcast_to(np.arange(n_envs)[:, None], (n_envs, horizon))[alive]
    out["steps"] = np.broadcast_to(np.arange(horizon)[None, :], (n_envs, horizon))[alive]
    out["next_actions_valid"] = np.ones(len(out["rewards"]), dtype=np.uint8)
    casts = {"obs": np.float32, "state": np.float32, "next_obs": np.float32,
             "next_state": np.float32, "rewards": np.float32, "terminals": np.uint8,
             "timeouts": np.uint8, "episode_ids": np.int64, "steps": np.int32,
             "actions": np.int64 if discrete else np.float32}
    casts["next_actions"] = casts["actions"]
    return {k: v.astype(casts.get(k, v.dtype), copy=False) for k, v in out.items()}


def reference_returns(task: Task) -> dict[str, float]:
    """Random and expert reference returns, measured on the protocol's evaluation seeds."""
    if task.spec.task_id not in REFERENCES:
        raise BenchError(f"{task.spec.task_id}: no reference policies defined yet")
    seeds = protocol.eval_seeds(protocol.REFERENCE_EPISODES)
    refs = {}
    for name, behaviour in zip(("random", "expert"), REFERENCES[task.spec.task_id]):
        policy = behaviour.make(np.random.default_rng(0))
        refs[name] = float(protocol.rollout_returns(task, policy, seeds)["returns"].mean())
    return refs


def build_dataset(task_id: str, tier: str, episodes: int, data_dir: Path, *, profile: str,
                  generator_seed: int = 0) -> dict:
    """Collect, validate, write atomically and record in the manifest. Returns the entry."""
    task = get_task(task_id)
    if tier not in task.spec.tiers:
        raise BenchError(f"unknown tier {tier!r} for {task_id} (tiers: {', '.join(task.spec.tiers)})")
    behaviour = behaviour_for(task_id, tier)
    if behaviour is None:
        raise BenchError(f"{task_id}/{tier}: no behaviour policy available yet")
    tier_index = ALL_TIERS.index(tier)
    rng = np.random.default_rng([generator_seed, tier_index])
    seeds = protocol.collection_seeds(generator_seed, tier_index, 0, episodes)
    arrays = collect(task, behaviour.make(rng), seeds)
    refs = reference_returns(task)
    attrs = {
        "task_id": task_id, "quality": tier, "behaviour_policy_id": behaviour.policy_id,
        "generator_version": GENERATOR_VERSION, "generator_seed": generator_seed,
        "env_versions": json.dumps(task.spec.env_versions(), sort_keys=True),
        "ref_return_random": refs["random"], "ref_return_expert": refs["expert"],
        "profile": profile,
    }
    path = manifest.dataset_path(data_dir, task_id, tier)
    path.parent.mkdir(parents=True, exist_ok=True)
    sha = fmt.write_dataset(path, arrays, attrs)
    fmt.load_dataset(path, spec=task.spec, expected_sha256=sha)  # read back: what we wrote loads
    entry = manifest.make_entry(data_dir, path.relative_to(data_dir), sha, profile)
    manifest.record(data_dir, entry)
    return entry
