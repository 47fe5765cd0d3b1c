"""Real SMAC (StarCraft II) behind the suite's task interface: task ids ``smac-<map>``.

**This adapter has NOT been run against StarCraft II here.** Neither SC2 4.10 nor the ``smac``
package can be installed on the development machine; only the conversions below are unit-tested,
against a fake SMAC env object (tests/test_smac_adapter.py). It is meant for the StarCraft II
container image, with ``smac`` from oxwhirl's repository (CFCQL pins commit d6aab33) and SC2 4.10.

Settings follow CFCQL's ``envs/sc2.yaml`` (the source of the SMAC datasets the paper uses):
difficulty "7", reward_only_positive, reward_scale with reward_scale_rate 20 (max return about 20),
obs_last_action=False, state_last_action=True; SMAC's own episode limits (2s3z 120, 3s_vs_5z 250,
5m_vs_6m 70, 6h_vs_8z 150). Agent-id / last-action inputs are the algorithm's business.

One deliberate difference: ``continuing_episode=True`` (sc2.yaml: False). SMAC (d6aab33,
starcraft2.py lines 527-531) puts ``episode_limit`` into the step's info only when
``continuing_episode`` is set, and the flag changes nothing else; without it a timeout arrives as
a plain ``terminated`` and could not be told from the end of a battle. With it the adapter reports
``timeout`` exactly as the SMAX tasks do, the datasets keep both flags, and the learners count a
timeout as terminal, as the references do, unless their config sets ``bootstrap_timeouts``
(algorithms/common/discrete.py). The factory receives these settings (``SMAC_KWARGS``) as keyword
arguments.

Conversions (one ``StarCraft2Env`` = one SC2 process per batch slot, stepped in turn):
* obs   ``env.get_obs()`` (list of n arrays)          -> float32 [n, obs_dim]
* state ``env.get_state()``                           -> float32 [state_dim]
* avail ``env.get_avail_actions()`` (n lists of 0/1)  -> uint8 [n, n_actions]
* actions int [n]                                     -> list of Python ints for ``env.step``
* ``reward, terminated, info = env.step(actions)``: team reward as reported;
  timeout = terminated and info["episode_limit"] (set by SMAC only because of
  ``continuing_episode=True``, see above); terminal = terminated and not timeout;
  won = info["battle_won"] (SMAC's own flag).
* After done a slot is frozen: its final obs/state/avail are returned again, reward 0, the flags
  kept, and its actions ignored (same contract as the SMAX env).
* Seeds: SMAC takes its seed at construction, so a slot whose seed changes is closed and
  re-created with ``seed=seeds[b]`` (slow: restarts SC2). SC2 is not bit-deterministic anyway.

Shapes are SMAC's feature rules for these settings (obs dims agree with OG-MARL's CFCQL cards:
80, 48, 55, 78); they are checked against ``env.get_env_info()`` when an env is created.
"""

from __future__ import annotations

from functools import partial
from importlib.metadata import PackageNotFoundError, version
from typing import Any, Callable

import numpy as np

from plcql_bench.suite.core.spec import Step, Task, TaskSpec

EPISODE_LIMITS = {"2s3z": 120, "3s_vs_5z": 250, "5m_vs_6m": 70, "6h_vs_8z": 150}
TIERS = ("medium", "medium-replay", "expert", "mixed")
# map: (n_agents, obs_dim, state_dim, n_actions) under the settings above
SHAPES = {
    "2s3z": (5, 80, 120, 11),
    "3s_vs_5z": (3, 48, 68, 11),
    "5m_vs_6m": (5, 55, 98, 12),
    "6h_vs_8z": (6, 78, 140, 14),
}
SMAC_KWARGS = dict(difficulty="7", reward_only_positive=True, reward_scale=True,
                   reward_scale_rate=20, obs_last_action=False, state_last_action=True,
                   continuing_episode=True)  # True: SMAC flags timeouts (module docstring)
PREFIX = "smac-"


def _default_factory(map_name: str, seed: int, **kwargs):
    try:
        from smac.env import StarCraft2Env
    except ImportError as e:  # pragma: no cover - needs the SC2 image
        raise ImportError("smac-* tasks need the `smac` package and StarCraft II 4.10 "
                          "(use the StarCraft II container image)") from e
    return StarCraft2Env(map_name=map_name, seed=int(seed), **kwargs)


def convert_obs(env) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    obs = np.asarray(np.stack([np.asarray(o, np.float32) for o in env.get_obs()]), np.float32)
    state = np.asarray(env.get_state(), np.float32)
    avail = np.asarray(env.get_avail_actions(), np.uint8)
    return obs, state, avail


def convert_actions(actions: np.ndarray) -> list[int]:
    return [int(a) for a in np.asarray(actions).reshape(-1)]


def convert_step(reward, terminated, info: dict) -> tuple[float, bool, bool, bool]:
    """-> (reward, terminal, timeout, won)."""
    timeout = bool(terminated) and bool(info.get("episode_limit", False))
    return float(reward), bool(terminated) and not timeout, timeout, bool(info.get("battle_won", False))


class SmacEnv:
    """B real SMAC envs (implements suite.core.spec.BatchedEnv). See the module docstring."""

    def __init__(self, spec: TaskSpec, map_name: str, num_envs: int,
                 env_factory: Callable[..., Any] | None = None):
        self.spec, self.map_name, self.num_envs = spec, map_name, int(num_envs)
        self._factory = env_factory or _default_factory
        self._envs: list[Any] = [None] * self.num_envs
        self._seeds: list[int | None] = [None] * self.num_envs
        self._last: list[tuple] = []
        self._flags: np.ndarray = np.zeros((self.num_envs, 3), bool)  # terminal, timeout, won

    def _check(self, env) -> None:
        info = env.get_env_info()
        got = (info["n_agents"], info["obs_shape"], info["state_shape"], info["n_actions"])
        want = SHAPES[self.map_name]
        if tuple(int(x) for x in got) != want:
            raise RuntimeError(f"{self.spec.task_id}: SMAC reports (n_agents, obs, state, actions)"
                               f"={got}, the suite expects {want}; check the smac settings")
        if int(info["episode_limit"]) != EPISODE_LIMITS[self.map_name]:
            raise RuntimeError(f"{self.spec.task_id}: episode_limit {info['episode_limit']}")

    def _stack(self, reward, flags) -> Step:
        obs, state, avail = (np.stack(x) for x in zip(*self._last))
        return Step(obs=obs, state=state, avail=avail, reward=np.asarray(reward, np.float32),
                    terminal=flags[:, 0].copy(), timeout=flags[:, 1].copy(),
                    info={"won": flags[:, 2].copy()})

    def reset(self, seeds: np.ndarray) -> Step:
        seeds = np.asarray(seeds).reshape(-1)
        if len(seeds) != self.num_envs:
            raise ValueError(f"expected {self.num_envs} seeds, got {len(seeds)}")
        self._last = []
        for b, s in enumerate(seeds):
            if self._envs[b] is None or self._seeds[b] != int(s):
                if self._envs[b] is not None:
                    self._envs[b].close()
                self._envs[b] = self._factory(self.map_name, int(s), **SMAC_KWARGS)
                self._seeds[b] = int(s)
                self._check(self._envs[b])
            self._envs[b].reset()
            self._last.append(convert_obs(self._envs[b]))
        self._flags = np.zeros((self.num_envs, 3), bool)
        return self._stack(np.zeros(self.num_envs, np.float32), self._flags)

    def step(self, actions: np.ndarray) -> Step:
        act = np.asarray(actions)
        if act.shape != (self.num_envs, self.spec.n_agents):
            raise ValueError(f"actions must be [{self.num_envs}, {self.spec.n_agents}], got {act.shape}")
        reward = np.zeros(self.num_envs, np.float32)
        for b, env in enumerate(self._envs):
            if self._flags[b, 0] or self._flags[b, 1]:
                continue  # frozen
            r, terminal, timeout, won = convert_step(*env.step(convert_actions(act[b])))
            reward[b] = r
            self._flags[b] = (terminal, timeout, won)
            self._last[b] = convert_obs(env)
        return self._stack(reward, self._flags)

    def close(self) -> None:
        for env in self._envs:
            if env is not None:
                env.close()
        self._envs = [None] * self.num_envs


def env_versions(map_name: str) -> dict[str, str]:
    v = {"smac_map": map_name, "simulator": "StarCraft II (expected 4.10)",
         "episode_limit": str(EPISODE_LIMITS[map_name]),
         "smac_settings": ",".join(f"{k}={v}" for k, v in sorted(SMAC_KWARGS.items()))}
    for pkg in ("smac", "pysc2"):
        try:
            v[pkg] = version(pkg)
        except PackageNotFoundError:
            v[pkg] = "not-installed"
    return v


def make_spec(map_name: str) -> TaskSpec:
    n, obs_dim, state_dim, n_actions = SHAPES[map_name]
    return TaskSpec(
        task_id=PREFIX + map_name, domain="smac", n_agents=n, obs_dim=obs_dim,
        state_dim=state_dim, act_dim=n_actions, discrete=True,
        episode_limit=EPISODE_LIMITS[map_name], tiers=TIERS, score="win_rate",
        description=f"SMAC {map_name} on StarCraft II (needs the SC2 image; untested here)",
        env_versions=partial(env_versions, map_name),
    )


def make_task(map_name: str, env_factory: Callable[..., Any] | None = None) -> Task:
    spec = make_spec(map_name)
    return Task(spec=spec, make_env=partial(SmacEnv, spec, map_name, env_factory=env_factory))
