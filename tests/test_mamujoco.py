"""MaMuJoCo Half-Cheetah 2x3 (OMAR setup): shapes, obs layout vs qpos/qvel, reward equals the
single-agent HalfCheetah reward, backends agree, timeout, determinism."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("gymnasium_robotics")
pytest.importorskip("mujoco")

from plcql_bench.suite.envs import mamujoco  # noqa: E402
from plcql_bench.suite.envs.tasks import get_task  # noqa: E402

TID = mamujoco.TASK_ID


def _actions(rng, b, t):
    return rng.uniform(-1, 1, (t, b, 2, 3)).astype(np.float32)


def test_registered_spec():
    spec = get_task(TID).spec
    assert (spec.n_agents, spec.obs_dim, spec.state_dim, spec.act_dim) == (2, 6, 17, 3)
    assert not spec.discrete and spec.episode_limit == 1000 and spec.domain == "mamujoco"
    v = spec.env_versions()
    assert v["mujoco"] and v["gymnasium-robotics"] and v["mujoco"] != "not-installed"


def test_shapes_and_obs_layout():
    env = get_task(TID).make_env(3)
    step = env.reset(np.array([0, 1, 2]))
    assert step.obs.shape == (3, 2, 6) and step.obs.dtype == np.float32
    assert step.state.shape == (3, 17) and step.reward.shape == (3,)
    step = env.step(_actions(np.random.default_rng(0), 3, 1)[0])
    for b in range(3):
        d = env.envs[b].single_agent_env.unwrapped.data
        qpos, qvel = d.qpos, d.qvel  # rootx rootz rooty bthigh bshin bfoot fthigh fshin ffoot
        # agent 0 = back leg, joints by name: bfoot (5), bshin (4), bthigh (3); qpos then qvel
        want0 = [qpos[5], qvel[5], qpos[4], qvel[4], qpos[3], qvel[3]]
        want1 = [qpos[8], qvel[8], qpos[7], qvel[7], qpos[6], qvel[6]]
        np.testing.assert_allclose(step.obs[b, 0], want0, rtol=1e-6)
        np.testing.assert_allclose(step.obs[b, 1], want1, rtol=1e-6)
        np.testing.assert_allclose(step.state[b], np.concatenate([qpos[1:], qvel]), rtol=1e-6)
        # and exactly what gymnasium-robotics itself reports
        mj = env.envs[b]
        gym_obs = mj._get_obs()
        for i, a in enumerate(mj.possible_agents):
            np.testing.assert_allclose(step.obs[b, i], gym_obs[a], rtol=1e-6)
        np.testing.assert_allclose(step.state[b], mj.state(), rtol=1e-6)


def test_backends_agree_and_reward_is_single_agent_reward():
    import gymnasium as gym

    rng = np.random.default_rng(1)
    acts = _actions(rng, 2, 30)
    fast = get_task(TID).make_env(2)
    ref = get_task(TID).make_env(2, backend="gym")
    with mamujoco.quiet_mujoco():
        single = [gym.make("HalfCheetah-v5") for _ in range(2)]
    seeds = np.array([5, 6])
    a, b = fast.reset(seeds), ref.reset(seeds)
    s_obs = [e.reset(seed=int(s))[0] for e, s in zip(single, seeds)]
    np.testing.assert_array_equal(a.obs, b.obs)
    np.testing.assert_allclose(a.state, np.array(s_obs, np.float32))
    joint_index = fast.act_index
    for t in range(30):
        a, b = fast.step(acts[t]), ref.step(acts[t])
        np.testing.assert_array_equal(a.obs, b.obs)
        np.testing.assert_array_equal(a.state, b.state)
        np.testing.assert_allclose(a.reward, b.reward, rtol=1e-6)
        for k, e in enumerate(single):
            joint = np.empty(6)
            joint[joint_index] = acts[t, k].reshape(-1)
            o, r, term, _, _ = e.step(joint)
            assert not term
            np.testing.assert_allclose(a.reward[k], r, rtol=1e-5, atol=1e-6)
            np.testing.assert_allclose(a.state[k], o, rtol=1e-5, atol=1e-6)


def test_timeout_not_terminal():
    task = mamujoco.make_task(episode_limit=7)
    env = task.make_env(2)
    env.reset(np.array([0, 1]))
    rng = np.random.default_rng(0)
    for t in range(7):
        step = env.step(_actions(rng, 2, 1)[0])
        assert not step.terminal.any()
        assert step.timeout.all() == (t == 6)
    assert task.spec.episode_limit == 7


def test_deterministic_reset_and_clip():
    e1, e2 = get_task(TID).make_env(1), get_task(TID).make_env(1)
    np.testing.assert_array_equal(e1.reset(np.array([3])).obs, e2.reset(np.array([3])).obs)
    big = np.full((1, 2, 3), 5.0, np.float32)
    s1, s2 = e1.step(big), e2.step(np.ones((1, 2, 3), np.float32))
    np.testing.assert_array_equal(s1.obs, s2.obs)
    np.testing.assert_array_equal(s1.reward, s2.reward)
