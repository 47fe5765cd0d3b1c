"""The evaluation protocol (docs/protocol.md): fixed evaluation seeds, batched rollouts, scores.

Seed ranges are disjoint by construction:
  * evaluation episodes use env seeds EVAL_SEED_BASE + i (the same for every algorithm);
  * dataset collection uses COLLECT_SEED_BASE + 1e6·generator_seed + 1e5·tier_index + i;
  * training seeds (0, 1, 2, ...) only seed torch/numpy, never an env.
"""

from __future__ import annotations

from typing import Callable

import numpy as np

from plcql_bench.suite.core.spec import Step, Task

PROTOCOL_VERSION = 1
EVAL_SEED_BASE = 1_000_000
COLLECT_SEED_BASE = 10_000_000
REFERENCE_EPISODES = 100  # episodes used to measure the random and expert reference returns
MAX_EVAL_BATCH = 256


def eval_seeds(episodes: int) -> np.ndarray:
    return EVAL_SEED_BASE + np.arange(episodes, dtype=np.int64)


def collection_seeds(generator_seed: int, tier_index: int, start: int, count: int) -> np.ndarray:
    base = COLLECT_SEED_BASE + 1_000_000 * generator_seed + 100_000 * tier_index
    return base + np.arange(start, start + count, dtype=np.int64)


def rollout_returns(task: Task, policy: Callable[[Step], np.ndarray], seeds: np.ndarray,
                    begin: Callable[[int], None] | None = None) -> dict:
    """Run one episode per seed with `policy` (batched) and return per-episode results.

    `begin(num_envs)`, when given (a recurrent algorithm's `begin_episodes`), is called before the
    first step of every batch of episodes, so the policy can reset its per-env state (GRU hidden
    state, last actions). The policy is called for every env of the batch at every step until all
    are done: an env that already finished is frozen (BatchedEnv contract), its actions are
    ignored and its reward and win flag are masked here, so whatever a recurrent policy carries
    for it cannot change the results.

    Returns {"returns": float64 [E], "won": bool [E]}. The return is the sum of the task's
    reported team reward over the episode."""
    returns, won = [], []
    for start in range(0, len(seeds), MAX_EVAL_BATCH):
        chunk = seeds[start : start + MAX_EVAL_BATCH]
        env = task.make_env(len(chunk))
        step = env.reset(chunk)
        if begin is not None:
            begin(len(chunk))
        total = np.zeros(len(chunk))
        alive = np.ones(len(chunk), dtype=bool)
        chunk_won = np.zeros(len(chunk), dtype=bool)
        while alive.any():
            step = env.step(policy(step))
            total += np.where(alive, step.reward, 0.0)
            if "won" in step.info:
                chunk_won |= alive & step.info["won"].astype(bool)
            alive &= ~step.done
        returns.append(total)
        won.append(chunk_won)
    return {"returns": np.concatenate(returns), "won": np.concatenate(won)}
