"""SMAC adapter conversions against a fake StarCraft2Env (no SC2 here)."""

from __future__ import annotations

import numpy as np
import pytest

from plcql_bench.suite.envs import smac


class FakeSC2:
    """Mimics the parts of smac.env.StarCraft2Env the adapter uses, including how SMAC (d6aab33,
    starcraft2.py lines 527-531) reports a timeout: `terminated` at the limit, and
    info["episode_limit"] only when the env was built with continuing_episode=True (SMAC's default
    is False). `ends` = (step the episode ends at, battle won, the end is the time limit)."""

    def __init__(self, map_name, seed, shapes=None, ends=((3, True, False),), continuing_episode=False,
                 **smac_kwargs):
        self.n, self.obs_dim, self.state_dim, self.n_act = shapes or smac.SHAPES[map_name]
        self.limit = smac.EPISODE_LIMITS[map_name]
        self.seed, self.t, self.closed, self.steps_taken = seed, 0, False, []
        self.end_t, self.won, self.limit_hit = ends[0]
        self.continuing_episode, self.kwargs = continuing_episode, smac_kwargs

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
        if done and not self.limit_hit:
            info = {"battle_won": self.won}
        elif done:  # SMAC: no battle_won key at the limit, episode_limit only if continuing
            info = {"episode_limit": True} if self.continuing_episode else {}
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

    def factory(m, seed, **kwargs):
        made.append(FakeSC2(m, seed, ends=(ends[seed % 2],), **kwargs))
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
    task = smac.make_task("5m_vs_6m", env_factory=lambda m, s, **kw: FakeSC2(m, s, shapes=(5, 56, 98, 12), **kw))
    with pytest.raises(RuntimeError, match="expects"):
        task.make_env(1).reset(np.array([0]))


def test_all_maps_specs():
    for m in smac.EPISODE_LIMITS:
        spec = smac.make_spec(m)
        assert spec.episode_limit == smac.EPISODE_LIMITS[m] and spec.score == "win_rate"
        assert spec.env_versions()["smac"] in ("not-installed",) or spec.env_versions()["smac"]


def test_timeouts_are_reported_like_smax():
    """A real SMAC env flags the limit only with continuing_episode=True; the adapter must ask for
    it, or every timeout would arrive as a terminal (the opposite of the SMAX tasks' report)."""
    made = []

    def factory(m, seed, **kwargs):
        made.append(FakeSC2(m, seed, ends=((2, False, True),), **kwargs))
        return made[-1]

    env = smac.make_task("2s3z", env_factory=factory).make_env(1)
    env.reset(np.array([0]))
    assert made[0].continuing_episode is True
    assert {k: v for k, v in made[0].kwargs.items()} == {
        k: v for k, v in smac.SMAC_KWARGS.items() if k != "continuing_episode"}
    env.step(np.zeros((1, 5), np.int64))
    s = env.step(np.zeros((1, 5), np.int64))
    assert s.timeout.tolist() == [True] and s.terminal.tolist() == [False]
    assert s.info["won"].tolist() == [False]
    # without the flag (SMAC's default, the old adapter) the same episode reads as a terminal
    plain = FakeSC2("2s3z", 0, ends=((1, False, True),))
    assert smac.convert_step(*plain.step([0] * 5))[1:3] == (True, False)
