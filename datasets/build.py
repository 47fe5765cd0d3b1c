"""Build a dataset (task x tier) by rolling out its behaviour policy in batched envs.

Deterministic for a given generator seed: env seeds come from suite.protocol.collection_seeds and
the policy noise from a Generator seeded with (generator_seed, tier index).

A task family whose env is not a Python `BatchedEnv` loop (SMAX: jax vmap + scan) brings its own
collector and reference returns in its dataset recipe (datasets/recipes.py); otherwise the
references are measured with `protocol.rollout_returns`.
"""

from __future__ import annotations

import json
import platform
from pathlib import Path

import numpy as np

from plcql_bench.datasets.cards import write_card
from plcql_bench.datasets import format as fmt
from plcql_bench.datasets import manifest
from plcql_bench.datasets.generations import generation, prey_for
from plcql_bench.datasets.recipes import recipe_for
from plcql_bench.datasets.behaviour import (
    GENERATOR_VERSION,
    Behaviour,
    behaviour_for,
    references_for,
)
from plcql_bench.suite.envs import protocol
from plcql_bench.suite.core.errors import BenchError
from plcql_bench.suite.core.spec import Policy, Task
from plcql_bench.suite.envs.tasks import ALL_TIERS, get_task
from plcql_bench.datasets import scripted
from plcql_bench.datasets.behaviour import replay_part_policy, unavailable
from plcql_bench.datasets.imported import _episode_next_actions
from plcql_bench.datasets.matd3 import training_env_seeds
from plcql_bench.suite.core.schema import cpu_isa, hardware_info

COLLECT_BATCH = 256


class DatasetUnavailable(BenchError):
    """Nothing can build task/tier here; `reason` says why and `fix` is the command that helps."""

    def __init__(self, task_id: str, tier: str, gen: str | None = None):
        self.reason, self.fix = unavailable(task_id, tier, gen) or ("no behaviour policy", "")
        super().__init__(f"{task_id}/{tier}: no behaviour policy available: {self.reason}"
                         + (f" (fix: {self.fix})" if self.fix else ""))


def collect(task: Task, policy: Policy, seeds: np.ndarray, agent_rewards: bool = False) -> dict[str, np.ndarray]:
    """Roll out one episode per seed; return the format's arrays, episode-major. agent_rewards: also
    each agent's reward (format v2; the env's info["agent_rewards"], or the team reward for every agent
    where the task's reward is shared and the env reports none)."""
    parts = [_collect_batch(task, policy, seeds[i : i + COLLECT_BATCH], agent_rewards)
             for i in range(0, len(seeds), COLLECT_BATCH)]
    return _concat_episodes(parts)


def _collect_batch(task: Task, policy: Policy, seeds: np.ndarray, agent_rewards: bool = False) -> dict[str, np.ndarray]:
    env = task.make_env(len(seeds))
    step = env.reset(seeds)
    alive = np.ones(len(seeds), dtype=bool)
    rows: list[dict[str, np.ndarray]] = []
    action = policy(step)
    while alive.any():
        nxt = env.step(action)
        next_action = policy(nxt)  # also the dataset's a' at the final next state
        rows.append(_row(step, action, nxt, next_action, alive, task.spec.n_agents if agent_rewards else 0))
        alive = alive & ~nxt.done
        step, action = nxt, next_action
    return _to_episode_major(rows, discrete=task.spec.discrete)


def _row(step, action, nxt, next_action, alive, n_agents: int = 0) -> dict[str, np.ndarray]:
    """One step of every env; with n_agents > 0 also the per-agent rewards [B, n_agents]."""
    row = {
        "obs": step.obs, "state": step.state, "actions": action, "rewards": nxt.reward,
        "next_obs": nxt.obs, "next_state": nxt.state, "next_actions": next_action,
        "terminals": nxt.terminal, "timeouts": nxt.timeout, "alive": alive.copy(),
    }
    if n_agents:
        per_agent = nxt.info.get(fmt.AGENT_REWARDS)
        row[fmt.AGENT_REWARDS] = (np.repeat(np.asarray(nxt.reward)[:, None], n_agents, axis=1)
                                  if per_agent is None else per_agent)
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
             "timeouts": np.uint8, "episode_ids": np.int64, "steps": np.int32, fmt.AGENT_REWARDS: np.float32,
             "actions": np.int64 if discrete else np.float32}
    casts["next_actions"] = casts["actions"]
    return {k: v.astype(casts.get(k, v.dtype), copy=False) for k, v in out.items()}


_REF_CACHE: dict[tuple, dict[str, float]] = {}


def uniform_random_return(task: Task, episodes: int = protocol.REFERENCE_EPISODES) -> float:
    policy = scripted.random_policy(np.random.default_rng(0), task.spec.act_dim)
    return float(protocol.rollout_returns(task, policy, protocol.eval_seeds(episodes))["returns"].mean())


# Episodes that measure a generation's reference returns: v1 kept its 100 (its files stay byte-identical);
# v2 measures over 1,000, on the first 1,000 evaluation seeds.
REFERENCE_EPISODES = {"v1": protocol.REFERENCE_EPISODES, "v2": 1000}


def reference_returns(task: Task, gen: str | None = None) -> dict[str, float]:
    """Random and expert reference returns, measured on the protocol's evaluation seeds (cached
    per process by the reference policies' ids)."""
    hook = recipe_for(task.spec.task_id).references
    if hook is not None:
        return dict(hook(task))
    refs_b = references_for(task.spec.task_id, gen)
    if refs_b is None:
        raise BenchError(f"{task.spec.task_id}: no reference policies defined yet (generation {generation(gen).name})")
    episodes = REFERENCE_EPISODES[generation(gen).name]
    key = (task.spec.task_id, task.spec.episode_limit, refs_b[0].policy_id, refs_b[1].policy_id, episodes,
           task.spec.description)
    if key not in _REF_CACHE:
        seeds = protocol.eval_seeds(episodes)
        refs = {}
        for name, behaviour in zip(("random", "expert"), refs_b):
            policy = behaviour.make(np.random.default_rng(0))
            refs[name] = float(protocol.rollout_returns(task, policy, seeds)["returns"].mean())
        _REF_CACHE[key] = refs
    return dict(_REF_CACHE[key])


def _concat_episodes(parts: list[dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
    out = {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}
    offsets = np.cumsum([0] + [int(p["episode_ids"].max()) + 1 for p in parts[:-1]])
    out["episode_ids"] = np.concatenate([p["episode_ids"] + o for p, o in zip(parts, offsets)])
    return out


def _from_replay(behaviour: Behaviour, episodes: int) -> dict[str, np.ndarray]:
    """`episodes` episodes of a MATD3 training replay up to the medium checkpoint: all of them
    when the profile asks for at least that many (paper), else evenly spaced ones (smoke)."""

    rep = behaviour.replay
    total = int(rep["episodes"])
    chosen = np.unique(np.linspace(0, total - 1, min(int(episodes), total)).round().astype(np.int64))
    with np.load(rep["file"]) as z:
        ids = z["episode_ids"]
        keep = np.isin(ids, chosen)
        arrays = {k: z[k][keep] for k in z.files if k != "env_step"}
    arrays["episode_ids"] = np.searchsorted(chosen, arrays["episode_ids"]).astype(np.int64)
    n = len(arrays["rewards"])
    last = np.zeros(n, bool)
    last[np.flatnonzero(np.diff(arrays["episode_ids"]))] = True
    last[-1] = True
    arrays["next_actions"], arrays["next_actions_valid"] = _episode_next_actions(arrays["actions"], last)
    starts = np.concatenate([[0], np.flatnonzero(last)[:-1] + 1])
    lengths = np.diff(np.concatenate([starts, [n]]))
    arrays["steps"] = (np.arange(n) - np.repeat(starts, lengths)).astype(np.int32)
    return arrays


def _from_parts(task: Task, behaviour: Behaviour, episodes: int, generator_seed: int,
                tier_index: int, agent_rewards: bool = False) -> dict[str, np.ndarray]:
    """A medium-replay rebuilt from its checkpoint sequence: training episode j is rolled out on
    the trainer's env seed j with the policy of the part that holds it (parts in training order).
    All episodes when the profile asks for at least that many (paper), else evenly spaced ones
    (smoke), as `_from_replay` picks them. Each part's noise has its own generator, so a part
    collects the same episodes whatever the others do."""

    rep = behaviour.replay
    total = int(rep["episodes"])
    chosen = np.unique(np.linspace(0, total - 1, min(int(episodes), total)).round().astype(np.int64))
    seeds = training_env_seeds(int(rep["train_seed"]), 0, total)
    out, first = [], 0
    for i, part in enumerate(rep["parts"]):
        idx = chosen[(chosen >= first) & (chosen < first + part["episodes"])]
        first += part["episodes"]
        if len(idx):
            rng = np.random.default_rng([generator_seed, tier_index, i])
            policy = replay_part_policy(part, float(rep["noise"]), task.spec.act_dim, rng)
            out.append(collect(task, policy, seeds[idx], agent_rewards))
    return _concat_episodes(out)


def _collect_tier(task: Task, behaviour: Behaviour, seeds: np.ndarray, rng: np.random.Generator,
                  agent_rewards: bool = False):
    hook = recipe_for(task.spec.task_id).collect
    if hook is not None:
        return hook(task, behaviour, seeds, rng)
    return collect(task, behaviour.make(rng), seeds, agent_rewards)


def _built_on() -> dict:
    return {"cpu": hardware_info("cpu")["cpu"], "cpu_isa": cpu_isa(), "machine": platform.machine()}


def _agent0_returns(arrays: dict[str, np.ndarray]) -> dict[str, float]:
    """Statistics of agent 0's episode returns (the originals' cards report these; datasets/originals.py)."""
    stats = fmt.return_stats(fmt.episode_returns(arrays[fmt.AGENT_REWARDS][:, 0], arrays["episode_ids"]))
    return {k.removeprefix("return_"): v for k, v in stats.items()}


def build_dataset(task_id: str, tier: str, episodes: int, data_dir: Path, *, profile: str,
                  generator_seed: int = 0, generation_name: str | None = None) -> dict:
    """Collect, validate, write atomically and record in the manifest. Returns the entry.
    generation_name: the dataset generation (datasets/generations.py; None = v1): which behaviour
    policies, prey, random tier and reward arrays the continuous tasks' tiers get."""
    gen = generation(generation_name)
    task = get_task(task_id, prey=prey_for(task_id, gen.name))
    if tier not in task.spec.tiers:
        raise BenchError(f"unknown tier {tier!r} for {task_id} (tiers: {', '.join(task.spec.tiers)})")
    tier_index = ALL_TIERS.index(tier)
    rng = np.random.default_rng([generator_seed, tier_index])
    seeds = protocol.collection_seeds(generator_seed, tier_index, 0, episodes)
    own_recipe = recipe_for(task_id).collect is not None  # SMAX: one recipe in every generation
    per_agent = gen.agent_rewards and not own_recipe
    behaviour = behaviour_for(task_id, tier, gen.name)
    if behaviour is None and tier == "mixed":
        # mixed = equal halves of medium and expert episodes (CFCQL tools/mixed.py)
        halves = [behaviour_for(task_id, t, gen.name) for t in ("medium", "expert")]
        if None in halves:
            raise BenchError(f"{task_id}/mixed: needs medium and expert behaviour policies")
        k = episodes // 2
        arrays = _concat_episodes([_collect_tier(task, halves[0], seeds[:k], rng, per_agent),
                                   _collect_tier(task, halves[1], seeds[k:], rng, per_agent)])
        policy_id = f"mixed({halves[0].policy_id}|{halves[1].policy_id})"
    elif behaviour is None:
        raise DatasetUnavailable(task_id, tier, gen.name)
    elif behaviour.kind == "replay":
        arrays, policy_id = _from_replay(behaviour, episodes), behaviour.policy_id
    elif behaviour.kind == "parts":
        arrays = _from_parts(task, behaviour, episodes, generator_seed, tier_index, per_agent)
        policy_id = behaviour.policy_id
    else:
        arrays, policy_id = _collect_tier(task, behaviour, seeds, rng, per_agent), behaviour.policy_id
    won = arrays.pop("episode_won", None)
    refs = reference_returns(task, gen.name)
    attrs = {
        "task_id": task_id, "quality": tier, "behaviour_policy_id": policy_id,
        "generator_version": GENERATOR_VERSION, "generator_seed": generator_seed,
        "env_versions": json.dumps(task.spec.env_versions(), sort_keys=True),
        "ref_return_random": refs["random"], "ref_return_expert": refs["expert"],
        "profile": profile,
    }
    if gen.name != "v1" and not own_recipe:
        attrs["generation"] = gen.name
    if won is not None:
        attrs["win_rate"] = float(np.mean(won))
    path = manifest.dataset_path(data_dir, task_id, tier)
    path.parent.mkdir(parents=True, exist_ok=True)
    sha = fmt.write_dataset(path, arrays, attrs)
    fmt.load_dataset(path, spec=task.spec, expected_sha256=sha)  # read back: what we wrote loads
    # where it was built (manifest only, not in the file: its bytes must not depend on it); another CPU's
    # build may differ in the last bits (datasets/cards.py, dataset_identity)
    extra = {"agent0_returns": _agent0_returns(arrays)} if fmt.AGENT_REWARDS in arrays else {}
    entry = manifest.make_entry(data_dir, path.relative_to(data_dir), sha, profile, built_on=_built_on(), **extra)
    manifest.record(data_dir, entry)
    write_card(data_dir, entry)
    return entry
