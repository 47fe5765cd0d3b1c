"""SMAC adapter conversions against a fake StarCraft2Env (no SC2 here)."""

from __future__ import annotations

import numpy as np
import pytest

from plcql_bench.suite.envs import smac


class FakeSC2:
    """Mimics the parts of smac.env.StarCraft2Env the adapter uses."""

    def __init__(self, map_name, seed, shapes=None, ends=((3, True, False),)):
        self.n, self.obs_dim, self.state_dim, self.n_act = shapes or smac.SHAPES[map_name]
        self.limit = smac.EPISODE_LIMITS[map_name]
        self.seed, self.t, self.closed, self.steps_taken = seed, 0, False, []
        self.end_t, self.won, self.limit_hit = ends[0]

    def get_env_info(self):
        return dict(n_agents=self.n, obs_shape=self.obs_dim, state_shape=self.state_dim,
                    n_actions=self.n_act, episode_limit=self.limit)

    def reset(self):
        self.t = 0

    def get_obs(self):
        return [np.full(self.obs_dim, 100 * self.seed + 10 * self.t + i, np.float64) for i in range(self.n)]

    def get_state(self):
        return np.full(self.state_dim, self.t, np.float64)

    def get_avail_actions(self):
        return [[1] * 6 + [int(self.t % 2 == 0)] * (self.n_act - 6) for _ in range(self.n)]

    def step(self, actions):
        assert isinstance(actions, list) and all(type(a) is int for a in actions)
        self.steps_taken.append(actions)
        self.t += 1
        done = self.t >= self.end_t
        info = {}
        if done:
            info = {"battle_won": self.won, "episode_limit": self.limit_hit}
        return 0.5 * self.t, done, info

    def close(self):
        self.closed = True


def test_convert_step_flags():
    assert smac.convert_step(1.0, True, {"battle_won": True, "episode_limit": False}) == (1.0, True, False, True)
    assert smac.convert_step(0.0, True, {"battle_won": False, "episode_limit": True}) == (0.0, False, True, False)
    assert smac.convert_step(0.2, False, {}) == (0.2, False, False, False)


def test_batched_env_conversions_and_freeze():
    made = []
    ends = {0: (2, True, False), 1: (3, False, True)}

    def factory(m, seed):
        made.append(FakeSC2(m, seed, ends=(ends[seed % 2],)))
        return made[-1]

    task = smac.make_task("2s3z", env_factory=factory)
    spec = task.spec
    assert spec.task_id == "smac-2s3z" and spec.domain == "smac" and spec.discrete
    assert (spec.n_agents, spec.obs_dim, spec.state_dim, spec.act_dim) == (5, 80, 120, 11)
    env = task.make_env(2)
    s = env.reset(np.array([10, 11]))
    assert s.obs.shape == (2, 5, 80) and s.obs.dtype == np.float32
    assert s.state.shape == (2, 120) and s.avail.shape == (2, 5, 11) and s.avail.dtype == np.uint8
    assert s.obs[1, 3, 0] == 100 * 11 + 3
    act = np.zeros((2, 5), np.int64)
    s = env.step(act)
    assert s.reward.tolist() == [0.5, 0.5] and not s.done.any()
    s = env.step(act)  # env 0 wins at t=2
    assert s.terminal.tolist() == [True, False] and s.info["won"].tolist() == [True, False]
    final0 = s.obs[0].copy()
    s = env.step(act + 1)  # env 1 hits the limit at t=3; env 0 frozen
    assert s.timeout.tolist() == [False, True] and s.terminal.tolist() == [True, False]
    assert s.reward.tolist() == [0.0, 1.5]
    np.testing.assert_array_equal(s.obs[0], final0)
    assert len(made[0].steps_taken) == 2 and made[1].steps_taken[-1] == [1] * 5
    # same seeds: envs reused; a new seed re-creates the slot
    env.reset(np.array([10, 13]))
    assert len(made) == 3 and made[1].closed and not made[0].closed
    with pytest.raises(ValueError):
        env.step(np.zeros((2, 4), np.int64))


def test_shape_mismatch_is_reported():
    task = smac.make_task("5m_vs_6m", env_factory=lambda m, s: FakeSC2(m, s, shapes=(5, 56, 98, 12)))
    with pytest.raises(RuntimeError, match="expects"):
        task.make_env(1).reset(np.array([0]))


def test_all_maps_specs():
    for m in smac.EPISODE_LIMITS:
        spec = smac.make_spec(m)
        assert spec.episode_limit == smac.EPISODE_LIMITS[m] and spec.score == "win_rate"
        assert spec.env_versions()["smac"] in ("not-installed",) or spec.env_versions()["smac"]
