"""Scripted behaviour policies for the MPE tasks.

Every policy maps a batched `Step` to actions float32 [B, n_agents, 2] in [-1, 1], and each agent
acts only from its own observation row (decentralised). Observation layouts are OMAR's (see
suite/envs/mpe.py):

  CN     vel 0:2, pos 2:4, landmarks 4:10, other agents 10:14, comm 14:18
  PP     vel 0:2, pos 2:4, obstacles 4:8, other agents 8:14 (prey last, 12:14), prey vel 14:16
  World  vel 0:2, pos 2:4, obstacle/food/forests 4:14, other agents 14:20 (prey last, 18:20),
         prey vel 20:22, own in-forest flags 22:24
"""

from __future__ import annotations

from itertools import permutations

import numpy as np

from plcql_bench.suite.core.spec import Policy, Step

_PERMS = np.array(list(permutations(range(3))))  # [6, 3]: perm[k][agent] = landmark

# PD gains for CN, tuned on the OMAR dynamics (v' = 0.75 v + 0.5 a, p' = p + 0.1 v').
CN_KP, CN_KD = 4.0, 1.0
# Chase gains for the predators (PP/World), with a short lead on the prey's velocity.
CHASE_KP, CHASE_KD, CHASE_LEAD = 4.0, 0.5, 0.3


def random_policy(rng: np.random.Generator, act_dim: int = 2) -> Policy:
    """Uniform actions in [-1, 1]."""

    def act(step: Step) -> np.ndarray:
        b, n = step.obs.shape[:2]
        return rng.uniform(-1.0, 1.0, (b, n, act_dim)).astype(np.float32)

    return act


def cn_targets(obs: np.ndarray) -> np.ndarray:
    """Relative position of each agent's assigned landmark, [..., 2], from its own obs [..., 18].

    Each agent places itself at the origin and the others at their relative positions, then picks
    the agent->landmark permutation with the least total distance. The optimal matching is a
    property of the set of positions, so all agents agree on it without knowing their indices."""
    lead = obs.shape[:-1]
    lm = obs[..., 4:10].reshape(*lead, 3, 2).astype(np.float64)
    agents = np.concatenate([np.zeros((*lead, 1, 2)),
                             obs[..., 10:14].reshape(*lead, 2, 2).astype(np.float64)], axis=-2)
    dist = np.linalg.norm(agents[..., :, None, :] - lm[..., None, :, :], axis=-1)  # [..., a, l]
    cost = dist[..., np.arange(3)[None, :], _PERMS].sum(axis=-1)  # [..., 6]
    mine = _PERMS[np.argmin(cost, axis=-1), 0]  # landmark of the agent at the origin (itself)
    return np.take_along_axis(lm, mine[..., None, None].repeat(2, axis=-1), axis=-2)[..., 0, :]


def cn_expert_policy(noise_std: float = 0.0, rng: np.random.Generator | None = None) -> Policy:
    """Assignment + PD controller for Cooperative Navigation, plus optional Gaussian noise."""
    if noise_std > 0 and rng is None:
        raise ValueError("noise_std > 0 needs an rng")

    def act(step: Step) -> np.ndarray:
        obs = step.obs
        u = CN_KP * cn_targets(obs) - CN_KD * obs[..., 0:2]
        return _noisy(u, noise_std, rng)

    return act


def chase_policy(task_id: str, noise_std: float = 0.0,
                 rng: np.random.Generator | None = None) -> Policy:
    """Predators (PP/World) steer to where the prey is heading, plus optional Gaussian noise."""
    prey, prey_vel = {"mpe-pp": (12, 14), "mpe-world": (18, 20)}[task_id]
    if noise_std > 0 and rng is None:
        raise ValueError("noise_std > 0 needs an rng")

    def act(step: Step) -> np.ndarray:
        obs = step.obs
        aim = obs[..., prey:prey + 2] + CHASE_LEAD * obs[..., prey_vel:prey_vel + 2]
        return _noisy(CHASE_KP * aim - CHASE_KD * obs[..., 0:2], noise_std, rng)

    return act


def _noisy(u: np.ndarray, noise_std: float, rng: np.random.Generator | None) -> np.ndarray:
    u = np.clip(u, -1.0, 1.0)  # saturate before noise so noise_std means the same everywhere
    if noise_std > 0:
        u = u + rng.normal(0.0, noise_std, u.shape)
    return np.clip(u, -1.0, 1.0).astype(np.float32)
