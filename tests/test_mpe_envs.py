"""MPE tasks (OMAR variant): layouts and rewards on hand-built states, backend agreement,
episode length, determinism, shapes."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

from plcql_bench.datasets import scripted
from plcql_bench.suite.envs import mpe
from plcql_bench.suite.envs.tasks import get_task

TASKS = ("mpe-cn", "mpe-pp", "mpe-world")
DIMS = {"mpe-cn": (18, 54), "mpe-pp": (16, 62), "mpe-world": (24, 94)}
S2 = np.sqrt(2.0)


def _env(task_id, num_envs=1, **kw):
    return get_task(task_id).make_env(num_envs, **kw)


# ------------------------------------------------------------------ hand-built states


def test_cn_obs_and_reward_by_hand():
    env = _env("mpe-cn")
    pos = [[[0.0, 0.0], [0.2, 0.0], [1.0, 1.0]]]
    vel = [[[0.1, -0.2], [0.0, 0.0], [0.0, 0.0]]]
    lm = [[[0.0, 0.05], [0.5, 0.0], [-1.0, -1.0]]]
    step = env.set_state(pos, lm, vel)
    want0 = [0.1, -0.2, 0, 0, 0, 0.05, 0.5, 0, -1, -1, 0.2, 0, 1, 1, 0, 0, 0, 0]
    np.testing.assert_allclose(step.obs[0, 0], want0, atol=1e-6)
    want2 = [0, 0, 1, 1, -1, -0.95, -0.5, -1, -2, -2, -1, -1, -0.8, -1, 0, 0, 0, 0]
    np.testing.assert_allclose(step.obs[0, 2], want2, atol=1e-6)
    np.testing.assert_allclose(step.state[0], step.obs[0].reshape(-1))
    # landmark 0: nearest 0.05 -> capped at 10; landmark 1: nearest 0.3 (agent 1); landmark 2:
    # nearest sqrt(2) (agent 0). Agents 0 and 1 overlap (0.2 < 0.15 + 0.15): -5 each.
    cover = 10.0 + 1 / 0.3 + 1 / S2
    r = mpe.rewards(mpe.CN, np.array(pos), np.array(lm))
    np.testing.assert_allclose(r[0], [cover - 5, cover - 5, cover], rtol=1e-12)


def test_cn_step_reward_without_contact():
    env = _env("mpe-cn")
    pos = [[[-0.5, 0.0], [0.5, 0.0], [0.0, 0.8]]]
    lm = [[[-0.5, 0.5], [0.5, -0.25], [0.0, 0.8]]]  # agent 2 sits on landmark 2
    env.set_state(pos, lm)
    step = env.step(np.zeros((1, 3, 2), np.float32))  # nothing moves: no force, no velocity
    cover = 1 / 0.5 + 1 / 0.25 + 10.0
    np.testing.assert_allclose(step.reward, [cover], rtol=1e-6)
    np.testing.assert_allclose(step.info["agent_rewards"], [[cover] * 3], rtol=1e-6)


def _predator_prey_state():
    pos = [[[0.0, 0.0], [0.5, 0.0], [-0.5, 0.5], [0.1, 0.0]]]
    vel = [[[0.0, 0.0], [0.0, 0.0], [0.0, 0.0], [0.3, -0.1]]]
    return pos, vel


def test_pp_obs_and_reward_by_hand():
    env = _env("mpe-pp")
    pos, vel = _predator_prey_state()
    lm = [[[0.8, 0.8], [-0.8, -0.8]]]
    step = env.set_state(pos, lm, vel)
    want0 = [0, 0, 0, 0, 0.8, 0.8, -0.8, -0.8, 0.5, 0, -0.5, 0.5, 0.1, 0, 0.3, -0.1]
    np.testing.assert_allclose(step.obs[0, 0], want0, atol=1e-6)
    prey = [0.3, -0.1, 0.1, 0, 0.7, 0.8, -0.9, -0.8, -0.1, 0, 0.4, 0, -0.6, 0.5]
    np.testing.assert_allclose(step.state[0, 48:], prey, atol=1e-6)
    np.testing.assert_allclose(step.state[0, :48], step.obs[0].reshape(-1))
    # predator 0 catches the prey (0.1 < 0.075 + 0.05); shaping over distances 0.1, 0.4, 0.781
    want = 10.0 - 0.1 * (0.1 + 0.4 + np.sqrt(0.61))
    r = mpe.rewards(mpe.PP, np.array(pos), np.array(lm))
    np.testing.assert_allclose(r[0], [want] * 3, rtol=1e-12)


def test_world_obs_and_reward_by_hand():
    env = _env("mpe-world")
    pos, vel = _predator_prey_state()
    # obstacle, food 0, food 1, forest 0, forest 1
    lm = [[[0.8, 0.8], [0.5, 0.5], [-0.5, -0.5], [0.0, 0.2], [-0.9, -0.9]]]
    step = env.set_state(pos, lm, vel)
    # predator 0 is inside forest 0 (0.2 < 0.075 + 0.3), predator 1 is not (0.539)
    want0 = [0, 0, 0, 0, 0.8, 0.8, 0.5, 0.5, -0.5, -0.5, 0, 0.2, -0.9, -0.9,
             0.5, 0, -0.5, 0.5, 0.1, 0, 0.3, -0.1, 1, -1]
    np.testing.assert_allclose(step.obs[0, 0], want0, atol=1e-6)
    np.testing.assert_allclose(step.obs[0, 1, 22:], [-1, -1])
    prey = step.state[0, 72:]
    assert prey.shape == (22,)
    np.testing.assert_allclose(prey[:4], [0.3, -0.1, 0.1, 0], atol=1e-6)
    np.testing.assert_allclose(prey[14:], [-0.1, 0, 0.4, 0, -0.6, 0.5, 1, -1], atol=1e-6)
    want = 5.0 - 0.1 * (0.1 + 0.4 + np.sqrt(0.61))  # catch radius 0.075 + 0.045
    r = mpe.rewards(mpe.WORLD, np.array(pos), np.array(lm))
    np.testing.assert_allclose(r[0], [want] * 3, rtol=1e-12)


# ------------------------------------------------------------------ dynamics


def test_action_force_matches_omar():
    """From rest: v = accel**2 * a * dt, then p += v * dt (OMAR order); max_speed clipping."""
    env = _env("mpe-pp")
    pos = [[[-0.6, -0.6], [0.6, -0.6], [-0.6, 0.6], [0.6, 0.6]]]
    env.set_state(pos, [[[0.0, 0.3], [0.0, -0.3]]])
    env.prey = lambda o: np.zeros((len(o), 2), np.float32)
    act = np.zeros((1, 3, 2), np.float32)
    act[0, 0] = [0.05, 0.0]  # small enough to stay under max_speed: 3*3*0.05*0.1 = 0.045
    step = env.step(act)
    np.testing.assert_allclose(step.obs[0, 0, :4], [0.045, 0, -0.6 + 0.0045, -0.6], atol=1e-7)
    act[0, 0] = [1.0, 1.0]  # v = (0.75*0.045 + 0.9, 0.9), speed 1.30: scaled to max_speed 1
    step = env.step(act)
    v = np.array([0.75 * 0.045 + 0.9, 0.9])
    np.testing.assert_allclose(step.obs[0, 0, :2], v / np.linalg.norm(v), atol=1e-6)


@pytest.mark.parametrize("physics", mpe.PHYSICS)
@pytest.mark.parametrize("task_id", TASKS)
def test_backends_agree(task_id, physics):
    task = mpe.make_task(task_id, physics=physics)
    envs = [task.make_env(6, backend=b) for b in ("numpy", "mpe2")]
    seeds = np.arange(6) + 40
    steps = [e.reset(seeds) for e in envs]
    rng = np.random.default_rng(3)
    policy = (scripted.random_policy(rng) if task_id == "mpe-cn"
              else scripted.chase_policy(task_id, noise_std=0.5, rng=rng))
    for _ in range(mpe.EPISODE_LIMIT):
        np.testing.assert_allclose(steps[0].obs, steps[1].obs, atol=1e-5)
        np.testing.assert_allclose(steps[0].state, steps[1].state, atol=1e-5)
        act = policy(steps[0])
        steps = [e.step(act) for e in envs]
        np.testing.assert_allclose(steps[0].reward, steps[1].reward, atol=1e-5)
        np.testing.assert_allclose(steps[0].info["agent_rewards"], steps[1].info["agent_rewards"],
                                   atol=1e-5)


def test_physics_variants_differ():
    a, b = (mpe.make_task("mpe-cn", physics=p).make_env(2) for p in mpe.PHYSICS)
    act = np.ones((2, 3, 2), np.float32)
    a.reset(np.arange(2)), b.reset(np.arange(2))
    assert not np.allclose(a.step(act).obs, b.step(act).obs)


# ------------------------------------------------------------------ episodes, seeds, shapes


@pytest.mark.parametrize("task_id", TASKS)
def test_episode_is_25_steps_and_shapes(task_id):
    spec = get_task(task_id).spec
    obs_dim, state_dim = DIMS[task_id]
    assert (spec.obs_dim, spec.state_dim, spec.n_agents, spec.act_dim) == (obs_dim, state_dim, 3, 2)
    assert spec.domain == "mpe" and not spec.discrete and spec.episode_limit == 25
    assert spec.tiers == ("expert", "medium", "medium-replay", "random")
    versions = spec.env_versions()
    assert versions["mpe_variant"] == "omar-2022" and "mpe2" in versions
    env = _env(task_id, 5)
    step = env.reset(np.arange(5))
    rng = np.random.default_rng(0)
    for t in range(1, 26):
        assert step.obs.shape == (5, 3, obs_dim) and step.obs.dtype == np.float32
        assert step.state.shape == (5, state_dim) and step.state.dtype == np.float32
        assert step.reward.shape == (5,) and step.reward.dtype == np.float32
        assert step.terminal.dtype == bool and step.timeout.dtype == bool and step.avail is None
        assert not step.terminal.any()
        assert not step.timeout.any()
        step = env.step(rng.uniform(-1, 1, (5, 3, 2)).astype(np.float32))
    assert step.timeout.all() and not step.terminal.any()


@pytest.mark.parametrize("task_id", TASKS)
def test_env_depends_only_on_its_seed(task_id):
    big, small = _env(task_id, 3), _env(task_id, 1)
    sb, ss = big.reset(np.array([7, 8, 9])), small.reset(np.array([8]))
    rng = np.random.default_rng(1)
    for _ in range(mpe.EPISODE_LIMIT):
        np.testing.assert_array_equal(sb.obs[1], ss.obs[0])
        np.testing.assert_array_equal(sb.state[1], ss.state[0])
        act = rng.uniform(-1, 1, (3, 3, 2)).astype(np.float32)
        sb, ss = big.step(act), small.step(act[1:2])
        np.testing.assert_array_equal(sb.reward[1], ss.reward[0])
    assert not np.allclose(sb.obs[0], sb.obs[1])


def test_reset_distribution_ranges():
    env = _env("mpe-world", 200)
    env.reset(np.arange(200))
    pos, vel, lm = env.sim.arrays()
    assert np.all(np.abs(pos) <= 1.0) and np.all(vel == 0) and np.all(np.abs(lm) <= 0.9)


# ------------------------------------------------------------------ scripted policies


def test_cn_expert_beats_random():
    env = _env("mpe-cn", 32)
    totals = []
    for policy in (scripted.random_policy(np.random.default_rng(0)), scripted.cn_expert_policy()):
        step, total = env.reset(np.arange(32)), np.zeros(32)
        for _ in range(mpe.EPISODE_LIMIT):
            step = env.step(policy(step))
            total += step.reward
        totals.append(total.mean())
    assert totals[1] > totals[0] + 250


def test_cn_assignment_is_shared_by_agents():
    env = _env("mpe-cn", 50)
    step = env.reset(np.arange(50))
    pos, _, lm = env.sim.arrays()
    target = scripted.cn_targets(step.obs) + pos[:, :, :]  # absolute landmark positions
    chosen = np.argmin(np.linalg.norm(target[:, :, None] - lm[:, None], axis=-1), axis=-1)
    assert all(len(set(row)) == 3 for row in chosen)


def test_noisy_policies_stay_in_range():
    step = _env("mpe-pp", 4).reset(np.arange(4))
    act = scripted.chase_policy("mpe-pp", noise_std=2.0, rng=np.random.default_rng(0))(step)
    assert act.shape == (4, 3, 2) and act.dtype == np.float32 and np.abs(act).max() <= 1.0


# ------------------------------------------------------------------ against OMAR's own code

def _omar_multiagent(monkeypatch, checkout: str):
    """OMAR's multiagent package from a checkout, with a stand-in for the old `gym` it imports (only class and
    function names: the env's continuous path uses none of gym's behaviour)."""
    import sys
    import types

    gym = types.ModuleType("gym")
    spaces = types.ModuleType("gym.spaces")
    for name in ("Box", "Discrete", "MultiDiscrete", "Tuple"):
        setattr(spaces, name, type(name, (), {"__init__": lambda self, *a, **k: None}))
    envs, registration = types.ModuleType("gym.envs"), types.ModuleType("gym.envs.registration")
    registration.register, registration.EnvSpec = (lambda *a, **k: None), type("EnvSpec", (), {})
    gym.Env, gym.spaces, gym.envs, envs.registration = type("Env", (), {}), spaces, envs, registration
    for name, mod in {"gym": gym, "gym.spaces": spaces, "gym.envs": envs, "gym.envs.registration": registration}.items():
        monkeypatch.setitem(sys.modules, name, mod)
    for name in [m for m in sys.modules if m == "multiagent" or m.startswith("multiagent.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.syspath_prepend(str(Path(checkout) / "multiagent-particle-envs"))
    import multiagent.environment
    import multiagent.scenarios
    return multiagent.environment.MultiAgentEnv, multiagent.scenarios


@pytest.mark.filterwarnings("ignore::DeprecationWarning")  # OMAR's scenarios/__init__.py imports `imp`
@pytest.mark.skipif(not os.environ.get("PLCQL_OFFICIAL_OMAR"),
                    reason="set PLCQL_OFFICIAL_OMAR to a checkout of ling-pan/OMAR")
@pytest.mark.parametrize("task_id, scenario", [("mpe-cn", "simple_spread.py"), ("mpe-pp", "simple_tag.py"),
                                               ("mpe-world", "simple_world.py")])
def test_steps_as_omars_own_env_code(monkeypatch, capsys, task_id, scenario):
    """From OMAR's own reset, with the same actions for every agent (the prey's too), this suite's env gives OMAR's
    environment.py + scenario code's observations (learners' and prey's) and per-agent rewards to float32 precision."""
    env_class, scenarios = _omar_multiagent(monkeypatch, os.environ["PLCQL_OFFICIAL_OMAR"])
    sc = scenarios.load(scenario).Scenario()
    world = sc.make_world()
    omar = env_class(world, sc.reset_world, sc.reward, sc.observation)
    prey_action = [np.zeros((1, 2))]
    ours = _env(task_id, prey=lambda obs: prey_action[0])  # the prey (PP, World) takes OMAR's prey action
    n, rng = len(world.policy_agents), np.random.default_rng(0)
    prey_dim = mpe.SCENARIOS[task_id].prey_obs_dim  # the state ends with the prey's observation
    for episode in range(20):
        np.random.seed(episode)
        obs = omar._reset()
        step = ours.set_state(np.stack([a.state.p_pos for a in world.agents])[None],
                              np.stack([lm.state.p_pos for lm in world.landmarks])[None])
        np.testing.assert_allclose(np.stack(obs[:3]), step.obs[0], atol=1e-6)
        for _ in range(mpe.EPISODE_LIMIT):
            actions = rng.uniform(-1.0, 1.0, (n, 2))
            obs, rewards, _, _ = omar._step([a.copy() for a in actions])
            prey_action[0] = actions[3:4]
            step = ours.step(actions[None, :3])
            np.testing.assert_allclose(np.stack(obs[:3]), step.obs[0], atol=1e-6)
            np.testing.assert_allclose(np.array(rewards[:3]), step.info["agent_rewards"][0], atol=1e-5)
            if n > 3:
                np.testing.assert_allclose(obs[3], step.state[0, -prey_dim:], atol=1e-6)
    capsys.readouterr()  # OMAR's scenarios print their sizes
