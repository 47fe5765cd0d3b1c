"""Batched MPE tasks in OMAR's 2022 variant: Cooperative Navigation, Predator-Prey, World.

The scenarios follow OMAR's fork of multiagent-particle-envs (ling-pan/OMAR@0e52ad6,
multiagent-particle-envs/multiagent/{core.py,environment.py,scenarios/*.py}), which produced the
OMAR datasets that CFCQL, MADiff and DoF reuse. Two backends step the same task:

* backend="numpy" (default): all B envs at once as arrays [B, entities, 2].
* backend="mpe2": one real `mpe2._mpe_utils.core.World` per env, advanced by `World.step()`; the
  reference the numpy backend is tested against.

Choices and deviations (OMAR's code is the reference unless said otherwise):

1. Physics. OMAR's core.py differs from mpe2's core in two formulas, and OMAR's is what generated the
   datasets, so physics="omar" is the default:
   - action force: OMAR applies `mass * accel * u` where u was already scaled by the sensitivity
     (= accel, or 5.0 when accel is None) in environment.py, so PP/World agents get accel**2
     (predators 9, prey 16 per unit action); CN agents (accel None) get 5. mpe2 applies `u` only.
   - integration: OMAR is semi-implicit Euler (v <- v(1-damping) + F/m dt, clip to max_speed, then
     p <- p + v dt); mpe2 1.1 moves p with the old v first, then updates v.
   physics="mpe2" selects mpe2's formulas exactly (stock `World.step`). For physics="omar" the mpe2
   backend uses `OmarWorld`, an mpe2 World subclass that overrides only those two methods; contact
   forces (force 1e2, margin 1e-3, softplus penetration) are mpe2's, identical to OMAR's for the
   unit masses used here. dt 0.1, damping 0.25 in both.
2. Actions are clipped to [-1, 1] (OMAR does not clip in the env, but its policies end in tanh).
3. Episodes are 25 steps (OMAR's --episode_length); step 25 has timeout=True; terminal is never set.
4. Rewards. CN: OMAR's modified per-agent reward, sum over landmarks of min(1/min agent distance,
   10) minus 5 per other agent the agent overlaps (distance < sum of sizes); team reward = mean over
   agents (OMAR's eval). PP/World: OMAR's shaped adversary reward, shared by all predators:
   -0.1 * sum over predators of the distance to the nearest prey, plus 10 (PP) / 5 (World) per
   colliding (prey, predator) pair; team reward = predator 0's reward (all equal).
   info["agent_rewards"] [B, 3] holds the per-agent rewards (OMAR's datasets store them per agent).
5. Observations are OMAR's scenario observations for the 3 learners (CN 18, PP 16, World 24; in
   World every agent is a "leader", so other agents are always visible). The prey (PP/World) acts
   from its own observation (PP 14, World 22) with the fixed prey network (suite/envs/prey.py).
6. Global state: CN = the 3 agents' obs concatenated (54). PP/World = the 3 predators' obs then the
   prey's obs (PP 48+14 = 62, World 72+22 = 94); OMAR's datasets store the prey's obs as agent 3,
   so this state can be rebuilt from them.
7. Reset draws positions in OMAR's order from one numpy Generator per env, seeded with seeds[b]
   (World draws every landmark, then food and forests again, overwriting, as OMAR's reset_world).
   Velocities start at zero. Steps are deterministic (no motor noise).
"""

from __future__ import annotations

import argparse
import time
from dataclasses import dataclass
from functools import partial
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Callable

import numpy as np

from plcql_bench.suite.envs import prey as prey_mod
from plcql_bench.suite.core.spec import Step, Task, TaskSpec

EPISODE_LIMIT = 25
DT, DAMPING = 0.1, 0.25
CONTACT_FORCE, CONTACT_MARGIN = 1e2, 1e-3
TIERS = ("expert", "medium", "medium-replay", "random")
PHYSICS = ("omar", "mpe2")
N_LEARNERS = 3

PreyFn = Callable[[np.ndarray], np.ndarray]  # prey obs [B, d] -> action [B, 2]


# --------------------------------------------------------------------------- scenarios


@dataclass(frozen=True)
class Scenario:
    """Entity properties of one scenario; agents are the 3 learners then the prey (if any)."""

    task_id: str
    agent_size: tuple[float, ...]
    agent_accel: tuple[float | None, ...]
    agent_max_speed: tuple[float | None, ...]
    landmark_size: tuple[float, ...]
    landmark_collide: tuple[bool, ...]
    obs_dim: int
    prey_obs_dim: int = 0
    catch_bonus: float = 0.0  # predator reward per (prey, predator) collision

    @property
    def n_agents(self) -> int:
        return len(self.agent_size)

    @property
    def has_prey(self) -> bool:
        return self.n_agents > N_LEARNERS

    @property
    def state_dim(self) -> int:
        return N_LEARNERS * self.obs_dim + self.prey_obs_dim


CN = Scenario("mpe-cn", (0.15,) * 3, (None,) * 3, (None,) * 3,
              (0.05,) * 3, (False,) * 3, obs_dim=18)
PP = Scenario("mpe-pp", (0.075,) * 3 + (0.05,), (3.0,) * 3 + (4.0,), (1.0,) * 3 + (1.3,),
              (0.2, 0.2), (True, True), obs_dim=16, prey_obs_dim=14, catch_bonus=10.0)
# World landmarks: obstacle, food 0, food 1, forest 0, forest 1 (OMAR's world.landmarks order).
WORLD = Scenario("mpe-world", (0.075,) * 3 + (0.045,), (3.0,) * 3 + (4.0,), (1.0,) * 3 + (1.3,),
                 (0.2, 0.03, 0.03, 0.3, 0.3), (True, False, False, False, False),
                 obs_dim=24, prey_obs_dim=22, catch_bonus=5.0)
SCENARIOS = {s.task_id: s for s in (CN, PP, WORLD)}
FORESTS = slice(3, 5)  # World landmark indices of the two forests


def sample_initial(sc: Scenario, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """Initial (agent positions [A, 2], landmark positions [L, 2]) in OMAR's draw order."""
    agents = np.stack([rng.uniform(-1.0, 1.0, 2) for _ in range(sc.n_agents)])
    n_lm = len(sc.landmark_size)
    if sc is CN:  # boundary 1 for <= 3 agents
        return agents, np.stack([rng.uniform(-1.0, 1.0, 2) for _ in range(n_lm)])
    landmarks = np.stack([rng.uniform(-0.9, 0.9, 2) for _ in range(n_lm)])
    if sc is WORLD:  # OMAR redraws food, then forests, after drawing all landmarks
        landmarks[1:3] = np.stack([rng.uniform(-0.9, 0.9, 2) for _ in range(2)])
        landmarks[3:5] = np.stack([rng.uniform(-0.9, 0.9, 2) for _ in range(2)])
    return agents, landmarks


def _others(n: int) -> np.ndarray:
    """others[i] = indices of the agents other than i, in order ([n, n-1])."""
    return np.array([[j for j in range(n) if j != i] for i in range(n)])


def observe(sc: Scenario, pos: np.ndarray, vel: np.ndarray, lm: np.ndarray):
    """OMAR observations. pos/vel [B, A, 2], lm [B, L, 2] -> (learner obs [B, 3, d], prey obs
    [B, dp] or None), float64."""
    b, n = pos.shape[:2]
    rel_lm = (lm[:, None, :, :] - pos[:, :, None, :]).reshape(b, n, -1)
    rel_oth = (pos[:, _others(n)] - pos[:, :, None, :]).reshape(b, n, -1)
    base = np.concatenate([vel, pos, rel_lm, rel_oth], axis=-1)
    if sc is CN:
        comm = np.zeros((b, n, 4))  # silent agents: other agents' comm states are zeros
        return np.concatenate([base, comm], axis=-1), None
    prey_vel = np.broadcast_to(vel[:, None, 3], (b, N_LEARNERS, 2))
    extra_pred, extra_prey = [prey_vel], []
    if sc is WORLD:
        dist_forest = np.linalg.norm(pos[:, :, None] - lm[:, None, FORESTS], axis=-1)
        in_forest = np.where(dist_forest < np.asarray(sc.agent_size)[:, None] + 0.3, 1.0, -1.0)
        extra_pred.append(in_forest[:, :N_LEARNERS])
        extra_prey.append(in_forest[:, N_LEARNERS])
    learners = np.concatenate([base[:, :N_LEARNERS]] + extra_pred, axis=-1)
    prey = np.concatenate([base[:, N_LEARNERS]] + extra_prey, axis=-1)
    return learners, prey


def rewards(sc: Scenario, pos: np.ndarray, lm: np.ndarray) -> np.ndarray:
    """Per-learner rewards [B, 3] (float64) after a step."""
    size = np.asarray(sc.agent_size)
    if sc is CN:
        d_lm = np.linalg.norm(pos[:, :, None] - lm[:, None], axis=-1)  # [B, agent, landmark]
        nearest = d_lm.min(axis=1)
        cover = np.minimum(1.0 / np.maximum(nearest, 1e-300), 10.0).sum(axis=1)
        d_aa = np.linalg.norm(pos[:, :, None] - pos[:, None], axis=-1)
        hit = (d_aa < size[:, None] + size[None, :]) & ~np.eye(len(size), dtype=bool)
        return cover[:, None] - 5.0 * hit.sum(axis=2)
    pred, prey = pos[:, :N_LEARNERS], pos[:, N_LEARNERS:]
    d = np.linalg.norm(pred[:, :, None] - prey[:, None], axis=-1)  # [B, predator, prey]
    caught = d < size[:N_LEARNERS, None] + size[None, N_LEARNERS:]
    shared = -0.1 * d.min(axis=2).sum(axis=1) + sc.catch_bonus * caught.sum(axis=(1, 2))
    return np.repeat(shared[:, None], N_LEARNERS, axis=1)


# --------------------------------------------------------------------------- physics backends


def action_gain(sc: Scenario, physics: str) -> np.ndarray:
    """Force per unit action for each agent, [A] (see the module docstring, point 1)."""
    sens = np.array([5.0 if a is None else a for a in sc.agent_accel])
    if physics == "mpe2":
        return sens
    return np.array([s * (1.0 if a is None else a) for s, a in zip(sens, sc.agent_accel)])


class NumpyPhysics:
    """Vectorised physics for B envs: agent pos/vel [B, A, 2], landmark pos [B, L, 2]."""

    def __init__(self, sc: Scenario, physics: str):
        self.sc, self.physics = sc, physics
        self.gain = action_gain(sc, physics)
        self.max_speed = np.array([np.inf if m is None else m for m in sc.agent_max_speed])
        coll = np.asarray(sc.landmark_collide)
        self.collider_lm = np.flatnonzero(coll)
        sizes = np.concatenate([sc.agent_size, np.asarray(sc.landmark_size)[coll]])
        self.dist_min = np.asarray(sc.agent_size)[:, None] + sizes[None, :]  # [A, C]
        n = sc.n_agents
        self.not_self = ~np.eye(n, len(sizes), dtype=bool)  # an agent never pushes itself

    def set_state(self, pos: np.ndarray, lm: np.ndarray, vel: np.ndarray | None = None) -> None:
        self.pos, self.lm = np.array(pos, np.float64), np.array(lm, np.float64)
        self.vel = np.zeros_like(self.pos) if vel is None else np.array(vel, np.float64)

    def arrays(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        return self.pos, self.vel, self.lm

    def contact_forces(self) -> np.ndarray:
        colliders = np.concatenate([self.pos, self.lm[:, self.collider_lm]], axis=1)
        delta = self.pos[:, :, None] - colliders[:, None]  # [B, A, C, 2]
        dist = np.sqrt(np.sum(np.square(delta), axis=-1))
        dist = np.where(self.not_self, dist, 1.0)  # avoid 0/0 on the masked diagonal
        k = CONTACT_MARGIN
        pen = np.logaddexp(0.0, -(dist - self.dist_min) / k) * k
        force = CONTACT_FORCE * delta / dist[..., None] * pen[..., None]
        return np.sum(force * self.not_self[..., None], axis=2)

    def step(self, actions: np.ndarray) -> None:
        force = self.gain[:, None] * actions + self.contact_forces()
        if self.physics == "mpe2":
            self.pos = self.pos + self.vel * DT
        vel = self.vel * (1 - DAMPING) + force * DT  # all masses are 1
        speed = np.sqrt(np.square(vel[..., 0]) + np.square(vel[..., 1]))
        too_fast = speed > self.max_speed
        scale = np.where(too_fast, self.max_speed / np.where(too_fast, speed, 1.0), 1.0)
        self.vel = vel * scale[..., None]
        if self.physics == "omar":
            self.pos = self.pos + self.vel * DT


def _omar_world_class():
    """mpe2 World with OMAR's action force and integration order (docstring point 1)."""
    from mpe2._mpe_utils.core import World

    class OmarWorld(World):
        def apply_action_force(self, p_force):
            for i, agent in enumerate(self.agents):
                if agent.movable:
                    scale = agent.mass * agent.accel if agent.accel is not None else agent.mass
                    p_force[i] = scale * agent.action.u
            return p_force

        def integrate_state(self, p_force):
            for i, entity in enumerate(self.entities):
                if not entity.movable:
                    continue
                entity.state.p_vel = entity.state.p_vel * (1 - self.damping)
                if p_force[i] is not None:
                    entity.state.p_vel = entity.state.p_vel + (p_force[i] / entity.mass) * self.dt
                if entity.max_speed is not None:
                    speed = np.sqrt(np.sum(np.square(entity.state.p_vel)))
                    if speed > entity.max_speed:
                        entity.state.p_vel = entity.state.p_vel / speed * entity.max_speed
                entity.state.p_pos = entity.state.p_pos + entity.state.p_vel * self.dt

    return OmarWorld


class Mpe2Physics:
    """Reference backend: one mpe2 World per env, stepped by World.step()."""

    def __init__(self, sc: Scenario, physics: str):
        from mpe2._mpe_utils import core

        self.sc, self.core = sc, core
        self.world_cls = _omar_world_class() if physics == "omar" else core.World
        self.worlds: list = []

    def _build(self, pos: np.ndarray, lm: np.ndarray, vel: np.ndarray):
        sc, core = self.sc, self.core
        world = self.world_cls()
        world.dim_c = 4 if sc is WORLD else 2
        for i in range(sc.n_agents):
            a = core.Agent()
            a.name, a.collide, a.silent = f"agent {i}", True, True
            a.size, a.accel, a.max_speed = sc.agent_size[i], sc.agent_accel[i], sc.agent_max_speed[i]
            a.state.p_pos, a.state.p_vel = pos[i].astype(np.float64), vel[i].astype(np.float64)
            a.state.c = np.zeros(world.dim_c)
            world.agents.append(a)
        for j in range(len(sc.landmark_size)):
            lmk = core.Landmark()
            lmk.name, lmk.movable = f"landmark {j}", False
            lmk.size, lmk.collide = sc.landmark_size[j], sc.landmark_collide[j]
            lmk.state.p_pos, lmk.state.p_vel = lm[j].copy(), np.zeros(2)
            world.landmarks.append(lmk)
        return world

    def set_state(self, pos: np.ndarray, lm: np.ndarray, vel: np.ndarray | None = None) -> None:
        vel = np.zeros_like(pos) if vel is None else vel
        self.worlds = [self._build(p, q, v) for p, q, v in zip(pos, lm, vel)]

    def arrays(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        pos = np.array([[a.state.p_pos for a in w.agents] for w in self.worlds])
        vel = np.array([[a.state.p_vel for a in w.agents] for w in self.worlds])
        lm = np.array([[m.state.p_pos for m in w.landmarks] for w in self.worlds])
        return pos, vel, lm

    def step(self, actions: np.ndarray) -> None:
        for world, act in zip(self.worlds, actions):
            for agent, u in zip(world.agents, act):
                # environment.py: u <- action * sensitivity (accel, or 5.0 when accel is None)
                agent.action.u = u * (5.0 if agent.accel is None else agent.accel)
                agent.action.c = np.zeros(world.dim_c)
            world.step()


# --------------------------------------------------------------------------- batched env


class MPEEnv:
    """B MPE envs in lockstep (implements suite.core.spec.BatchedEnv)."""

    def __init__(self, spec: TaskSpec, sc: Scenario, num_envs: int, backend: str = "numpy",
                 physics: str = "omar", prey: PreyFn | None = None):
        if backend not in ("numpy", "mpe2"):
            raise ValueError(f"backend must be 'numpy' or 'mpe2', not {backend!r}")
        if physics not in PHYSICS:
            raise ValueError(f"physics must be one of {PHYSICS}, not {physics!r}")
        if sc.has_prey and prey is None:
            raise ValueError(f"{sc.task_id} needs a prey policy")
        self.spec, self.sc, self.num_envs = spec, sc, int(num_envs)
        self.backend, self.physics, self.prey = backend, physics, prey
        self.sim = NumpyPhysics(sc, physics) if backend == "numpy" else Mpe2Physics(sc, physics)
        self._t = 0
        self._prey_obs: np.ndarray | None = None

    def reset(self, seeds: np.ndarray) -> Step:
        seeds = np.asarray(seeds).reshape(-1)
        if len(seeds) != self.num_envs:
            raise ValueError(f"expected {self.num_envs} seeds, got {len(seeds)}")
        rngs = [np.random.default_rng(int(s)) for s in seeds]
        init = [sample_initial(self.sc, r) for r in rngs]
        return self.set_state(np.stack([a for a, _ in init]), np.stack([lm for _, lm in init]))

    def set_state(self, pos: np.ndarray, lm: np.ndarray, vel: np.ndarray | None = None) -> Step:
        """Start an episode from given agent positions/velocities [B, A, 2] (learners, then the
        prey) and landmark positions [B, L, 2]; for tests and tools. Returns the first Step."""
        pos = np.asarray(pos, np.float64)
        if pos.shape != (self.num_envs, self.sc.n_agents, 2):
            raise ValueError(f"pos must be [{self.num_envs}, {self.sc.n_agents}, 2]")
        self.sim.set_state(pos, np.asarray(lm, np.float64), vel)
        self._t = 0
        return self._make_step(np.zeros((self.num_envs, N_LEARNERS)))

    def step(self, actions: np.ndarray) -> Step:
        act = np.clip(np.asarray(actions, dtype=np.float64), -1.0, 1.0)
        if act.shape != (self.num_envs, N_LEARNERS, 2):
            raise ValueError(f"actions must be [{self.num_envs}, {N_LEARNERS}, 2], got {act.shape}")
        if self.sc.has_prey:  # the prey acts on its pre-step observation, like OMAR's loop
            prey_act = np.clip(self.prey(self._prey_obs.astype(np.float32)), -1.0, 1.0)
            act = np.concatenate([act, np.asarray(prey_act, np.float64)[:, None]], axis=1)
        self.sim.step(act)
        self._t += 1
        pos, _, lm = self.sim.arrays()
        return self._make_step(rewards(self.sc, pos, lm))

    def _make_step(self, agent_rewards: np.ndarray) -> Step:
        pos, vel, lm = self.sim.arrays()
        obs, prey_obs = observe(self.sc, pos, vel, lm)
        self._prey_obs = prey_obs
        b = self.num_envs
        parts = [obs.reshape(b, -1)] + ([] if prey_obs is None else [prey_obs])
        team = agent_rewards.mean(axis=1) if self.sc is CN else agent_rewards[:, 0]
        return Step(
            obs=obs.astype(np.float32),
            state=np.concatenate(parts, axis=1).astype(np.float32),
            reward=team.astype(np.float32),
            terminal=np.zeros(b, dtype=bool),
            timeout=np.full(b, self._t >= EPISODE_LIMIT),
            info={"agent_rewards": agent_rewards.astype(np.float32)},
        )


# --------------------------------------------------------------------------- tasks


def _mpe2_version() -> str:
    try:
        return version("mpe2")
    except PackageNotFoundError:
        return "not-installed"


def _versions(physics: str, prey_path: Path | None, prey_version: str | None = None) -> dict[str, str]:
    v = {"mpe2": _mpe2_version(), "mpe_variant": "omar-2022", "mpe_physics": physics,
         "episode_limit": str(EPISODE_LIMIT)}
    if prey_version is not None:
        v["prey"] = prey_version
    elif prey_path is not None:
        v["prey"] = f"{prey_path.name}:sha256={prey_mod.file_digest(prey_path)}"
    return v


_DESCRIPTIONS = {
    "mpe-cn": "MPE Cooperative Navigation (simple_spread), OMAR's reward; 3 agents, 3 landmarks",
    "mpe-pp": "MPE Predator-Prey (simple_tag): 3 learned predators vs a fixed prey, 2 obstacles",
    "mpe-world": "MPE World (OMAR simple_world): 3 predators vs a fixed prey; forests, food",
}
PREYS = ("suite", "omar")  # the shipped prey (datasets/assets/PREY.md) or OMAR's pretrained one


def make_task(task_id: str, physics: str = "omar", prey_path: str | Path | None = None,
              prey: str = "suite") -> Task:
    """Build a Task. prey (PP/World): "suite", the shipped prey, or "omar", OMAR's pretrained prey
    (suite/envs/prey.py: omar_prey_path; found and checked when an env is made, so a task object
    exists without the file). prey_path overrides the shipped prey with a file of OMAR's layout."""
    if prey not in PREYS:
        raise ValueError(f"prey must be one of {PREYS}, got {prey!r}")
    sc = SCENARIOS[task_id]
    find_prey, version = None, None
    if sc.has_prey and prey == "omar":
        find_prey, version = partial(prey_mod.omar_prey_path, task_id), prey_mod.omar_prey_version(task_id)
    elif sc.has_prey:
        find_prey = partial(Path, prey_path if prey_path is not None else prey_mod.default_prey_path(task_id))
    description = _DESCRIPTIONS[task_id] + (" (OMAR's pretrained prey)" if version else "")
    spec = TaskSpec(
        task_id=task_id, domain="mpe", n_agents=N_LEARNERS, obs_dim=sc.obs_dim,
        state_dim=sc.state_dim, act_dim=2, discrete=False, episode_limit=EPISODE_LIMIT,
        tiers=TIERS, description=description,
        env_versions=partial(_versions, physics, None if version or not find_prey else find_prey(), version),
    )
    factory = partial(_make_env, spec, sc, physics, find_prey)
    return Task(spec=spec, make_env=factory)


def _make_env(spec: TaskSpec, sc: Scenario, physics: str, find_prey: Callable[[], Path] | None, num_envs: int,
              backend: str = "numpy", prey: PreyFn | None = None) -> MPEEnv:
    """Task.make_env: num_envs -> env. `prey` (a callable) replaces the prey network, for tools."""
    if sc.has_prey and prey is None:
        prey = _cached_prey(str(find_prey()))
    return MPEEnv(spec, sc, num_envs, backend=backend, physics=physics, prey=prey)


_PREY_CACHE: dict[str, prey_mod.PreyPolicy] = {}


def _cached_prey(path: str) -> prey_mod.PreyPolicy:
    if path not in _PREY_CACHE:
        _PREY_CACHE[path] = prey_mod.load_prey(path)
    return _PREY_CACHE[path]


def cn_task(**kw) -> Task:
    return make_task("mpe-cn", **kw)


def pp_task(**kw) -> Task:
    return make_task("mpe-pp", **kw)


def world_task(**kw) -> Task:
    return make_task("mpe-world", **kw)


# --------------------------------------------------------------------------- benchmark


def bench(task_id: str, num_envs: int = 64, episodes: int = 20, backend: str = "numpy") -> float:
    """Env-steps per second with uniform random actions (policy time excluded)."""
    env = make_task(task_id).make_env(num_envs, backend=backend)
    rng = np.random.default_rng(0)
    acts = rng.uniform(-1, 1, (EPISODE_LIMIT, num_envs, N_LEARNERS, 2)).astype(np.float32)
    start = time.perf_counter()
    for ep in range(episodes):
        env.reset(np.arange(num_envs) + ep * num_envs)
        for t in range(EPISODE_LIMIT):
            env.step(acts[t])
    return episodes * EPISODE_LIMIT * num_envs / (time.perf_counter() - start)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--bench", action="store_true", help="measure env-steps/s per task")
    p.add_argument("--num-envs", type=int, default=64)
    p.add_argument("--backend", default="numpy", choices=("numpy", "mpe2"))
    args = p.parse_args(argv)
    if args.bench:
        for task_id in SCENARIOS:
            sps = bench(task_id, args.num_envs, backend=args.backend)
            print(f"{task_id:10s} B={args.num_envs} backend={args.backend}: {sps:,.0f} env-steps/s")


if __name__ == "__main__":
    main()
