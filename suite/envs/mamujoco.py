"""Batched MaMuJoCo Half-Cheetah 2x3 in OMAR's setup (gymnasium-robotics + mujoco).

OMAR (and CFCQL's continuous code, which reuses its data) run `HalfCheetah-v2` split into 2 agents
of 3 joints (`agent_conf="2x3"`) with `agent_obsk=0` and no global categories, 1000-step episodes.
This module reproduces that on gymnasium-robotics' `mamujoco_v1` (HalfCheetah-v5 underneath):

* agents: agent 0 = back leg (bthigh, bshin, bfoot), agent 1 = front leg (fthigh, fshin, ffoot);
  the partition is gymnasium-robotics' own for "2x3".
* observation per agent (6): for each of the agent's joints, ordered by joint name (bfoot, bshin,
  bthigh / ffoot, fshin, fthigh), its qpos then its qvel; exactly what `mamujoco_v1` with
  `agent_obsk=0, global_categories=()` returns (and what OMAR's obsk.py built: nodes sorted by
  label, local categories qpos, qvel). No root coordinates, no agent id.
* action per agent: 3-d in [-1, 1] (HalfCheetah's actuator range, so no rescaling), mapped to the
  6-d joint action by the partition's actuator ids. Actions are clipped to [-1, 1].
* global state (17): the single-agent HalfCheetah observation (qpos[1:], qvel) = `env.state()`.
* reward: the single-agent HalfCheetah reward (forward velocity − 0.1·|a|²), shared by both agents.
* episodes: 1000 steps (`episode_limit`), ended by timeout=True; HalfCheetah never terminates, so
  terminal is never set.
* reset: gymnasium's HalfCheetah reset seeded with seeds[b] (qpos + U(−0.1, 0.1), qvel + 0.1·N(0,1)).

Two backends step the same task:

* backend="mujoco" (default): one gymnasium-robotics env per sub-env, reset through its API; a step
  writes `data.ctrl` and calls `mujoco.mj_step(nstep=frame_skip)` directly and reads obs, state
  and reward from `qpos`/`qvel` with index arrays taken from the gymnasium-robotics partition.
  Skipping the wrappers' per-step dicts is what makes it ~2x faster.
* backend="gym": every sub-env stepped through `mamujoco_v1.parallel_env.step`; the reference the
  default backend is tested against (identical arrays).

MuJoCo version: the official OMAR data was generated with MuJoCo 2.0 (mujoco_py 200) and gym's
HalfCheetah-v2; CFCQL's README warns that scores shift on MuJoCo >= 2.1. Our dynamics are those of
the installed `mujoco` package and HalfCheetah-v5's model; `env_versions` records both versions
in every dataset and result, and numbers are not comparable with the paper's.
"""

from __future__ import annotations

import argparse
import contextlib
import time
import warnings
from functools import partial
from importlib.metadata import PackageNotFoundError, version

import numpy as np

from plcql_bench.suite.core.spec import Step, Task, TaskSpec

TASK_ID = "mamujoco-halfcheetah-2x3"
EPISODE_LIMIT = 1000
N_AGENTS, OBS_DIM, STATE_DIM, ACT_DIM = 2, 6, 17, 3
TIERS = ("expert", "medium", "medium-replay", "random")
BACKENDS = ("mujoco", "gym")


def _mujoco_warning(msg: str) -> None:
    # HalfCheetah's XML uses the `settotalmass` compiler attribute, deprecated in mujoco 4; the
    # default handler prints it and appends it to ./MUJOCO_LOG.TXT on every model load.
    if "settotalmass" not in msg:
        warnings.warn(f"mujoco: {msg}", RuntimeWarning, stacklevel=2)


@contextlib.contextmanager
def quiet_mujoco():
    """While loading HalfCheetah models: drop the `settotalmass` deprecation warning."""
    import mujoco

    previous = mujoco.get_mju_user_warning()
    mujoco.set_mju_user_warning(_mujoco_warning)
    try:
        yield
    finally:
        mujoco.set_mju_user_warning(previous)


def _make_mamujoco():
    """One gymnasium-robotics MaMuJoCo env in OMAR's configuration."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # gymnasium_robotics warns about Adroit versions on import
        from gymnasium_robotics import mamujoco_v1
    with quiet_mujoco():
        return mamujoco_v1.parallel_env("HalfCheetah", "2x3", agent_obsk=0, global_categories=())


def layout(env) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(qpos ids [2, 3], qvel ids [2, 3], actuator ids [2, 3]) per agent, in observation order.

    Taken from the gymnasium-robotics partition: each agent's joints sorted by label (the order
    its obsk builder uses), and the actuators in partition order (how it maps local actions)."""
    qpos, qvel, acts = [], [], []
    for part in env.agent_action_partitions:
        nodes = sorted(part, key=lambda n: n.label)
        qpos.append([n.qpos_ids for n in nodes])
        qvel.append([n.qvel_ids for n in nodes])
        acts.append([n.act_ids for n in part])
    return np.array(qpos), np.array(qvel), np.array(acts)


class MaMuJoCoEnv:
    """B Half-Cheetah 2x3 envs in lockstep (implements suite.core.spec.BatchedEnv)."""

    def __init__(self, spec: TaskSpec, num_envs: int, backend: str = "mujoco"):
        if backend not in BACKENDS:
            raise ValueError(f"backend must be one of {BACKENDS}, not {backend!r}")
        self.spec, self.num_envs, self.backend = spec, int(num_envs), backend
        self.envs = [_make_mamujoco() for _ in range(self.num_envs)]
        self.agents = list(self.envs[0].possible_agents)
        qpos, qvel, acts = layout(self.envs[0])
        nq = self.envs[0].single_agent_env.unwrapped.model.nq
        # obs[i] = [qpos_j0, qvel_j0, qpos_j1, qvel_j1, ...] over the agent's sorted joints, read
        # from the concatenation [qpos, qvel] (qvel ids offset by nq; ids may be negative).
        qpos_ids = np.where(qpos < 0, qpos + nq, qpos)
        nv = self.envs[0].single_agent_env.unwrapped.model.nv
        qvel_ids = np.where(qvel < 0, qvel + nv, qvel) + nq
        self.obs_index = np.stack([qpos_ids, qvel_ids], axis=-1).reshape(N_AGENTS, OBS_DIM)
        self.act_index = acts.reshape(-1)  # joint action[act_index] = concatenated agent actions
        # The simulators and HalfCheetah's constants, looked up once: through the wrappers' properties they cost
        # as much Python time per step as mj_step itself
        self._sims = [(self._unwrapped(b).model, self._unwrapped(b).data) for b in range(self.num_envs)]
        u = self._unwrapped(0)
        self._frame_skip, self._dt = u.frame_skip, u.dt
        self._forward_weight, self._ctrl_weight = u._forward_reward_weight, u._ctrl_cost_weight
        self._nq = nq
        self._t = 0

    def _unwrapped(self, b: int):
        return self.envs[b].single_agent_env.unwrapped

    def reset(self, seeds: np.ndarray) -> Step:
        seeds = np.asarray(seeds).reshape(-1)
        if len(seeds) != self.num_envs:
            raise ValueError(f"expected {self.num_envs} seeds, got {len(seeds)}")
        for env, s in zip(self.envs, seeds):
            env.reset(seed=int(s))
        self._t = 0
        return self._make_step(np.zeros(self.num_envs))

    def step(self, actions: np.ndarray) -> Step:
        act = np.clip(np.asarray(actions, dtype=np.float64), -1.0, 1.0)
        if act.shape != (self.num_envs, N_AGENTS, ACT_DIM):
            raise ValueError(f"actions must be [{self.num_envs}, {N_AGENTS}, {ACT_DIM}], got {act.shape}")
        reward = np.empty(self.num_envs)
        if self.backend == "gym":
            for b, env in enumerate(self.envs):
                _, rew, _, _, _ = env.step({a: act[b, i] for i, a in enumerate(self.agents)})
                reward[b] = rew[self.agents[0]]
        else:
            import mujoco

            joint = np.empty((self.num_envs, N_AGENTS * ACT_DIM))
            joint[:, self.act_index] = act.reshape(self.num_envs, -1)
            for b, (model, data) in enumerate(self._sims):
                x_before = data.qpos[0]
                data.ctrl[:] = joint[b]
                mujoco.mj_step(model, data, nstep=self._frame_skip)
                x_velocity = (data.qpos[0] - x_before) / self._dt
                reward[b] = self._forward_weight * x_velocity - self._ctrl_weight * np.sum(np.square(joint[b]))
        self._t += 1
        return self._make_step(reward)

    def _make_step(self, reward: np.ndarray) -> Step:
        b, nq = self.num_envs, self._nq
        qq = np.empty((b, nq + self._sims[0][1].qvel.shape[0]))  # [B, nq + nv]
        for i, (_, data) in enumerate(self._sims):
            qq[i, :nq], qq[i, nq:] = data.qpos, data.qvel
        return Step(
            obs=qq[:, self.obs_index].astype(np.float32),
            state=qq[:, 1:].astype(np.float32),  # HalfCheetah obs: qpos without x, then qvel
            reward=reward.astype(np.float32),
            terminal=np.zeros(b, dtype=bool),
            timeout=np.full(b, self._t >= self.spec.episode_limit),
            info={"x_position": qq[:, 0].astype(np.float32)},
        )


# --------------------------------------------------------------------------- task


def versions(episode_limit: int = EPISODE_LIMIT) -> dict[str, str]:
    out = {}
    for pkg in ("mujoco", "gymnasium-robotics", "gymnasium"):
        try:
            out[pkg] = version(pkg)
        except PackageNotFoundError:
            out[pkg] = "not-installed"
    out.update({"mamujoco_env": "HalfCheetah-v5 2x3 agent_obsk=0", "episode_limit": str(episode_limit)})
    return out


def make_task(episode_limit: int = EPISODE_LIMIT) -> Task:
    """The task; `episode_limit` other than 1000 is for tests only."""
    spec = TaskSpec(
        task_id=TASK_ID, domain="mamujoco", n_agents=N_AGENTS, obs_dim=OBS_DIM,
        state_dim=STATE_DIM, act_dim=ACT_DIM, discrete=False, episode_limit=int(episode_limit),
        tiers=TIERS,
        description="MaMuJoCo Half-Cheetah 2x3 (OMAR setup: agent_obsk=0, obs 6, state 17, "
                    "shared reward, 1000 steps) on gymnasium-robotics + mujoco",
        env_versions=partial(versions, int(episode_limit)),
    )
    return Task(spec=spec, make_env=partial(_make_env, spec))


def _make_env(spec: TaskSpec, num_envs: int, backend: str = "mujoco") -> MaMuJoCoEnv:
    return MaMuJoCoEnv(spec, num_envs, backend=backend)


def halfcheetah_task(**kw) -> Task:
    return make_task(**kw)


# --------------------------------------------------------------------------- benchmark


def bench(num_envs: int = 16, steps: int = 200, backend: str = "mujoco") -> float:
    """Env-steps per second with uniform random actions (policy time excluded)."""
    env = make_task().make_env(num_envs, backend=backend)
    rng = np.random.default_rng(0)
    acts = rng.uniform(-1, 1, (steps, num_envs, N_AGENTS, ACT_DIM)).astype(np.float32)
    env.reset(np.arange(num_envs))
    start = time.perf_counter()
    for t in range(steps):
        env.step(acts[t])
    return steps * num_envs / (time.perf_counter() - start)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--num-envs", type=int, default=16)
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--backend", default="mujoco", choices=BACKENDS)
    args = p.parse_args(argv)
    sps = bench(args.num_envs, args.steps, args.backend)
    print(f"{TASK_ID} B={args.num_envs} backend={args.backend}: {sps:,.0f} env-steps/s")


if __name__ == "__main__":
    main()
