"""SMAX tasks and fast collection (jaxmarl). Kept small: 2s3z only, a 3-step limit for the env,
few episodes for the collector; each jitted function compiles once per session."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("jaxmarl")


from plcql_bench.datasets import format as fmt  # noqa: E402
from plcql_bench.datasets.smax_collect import (  # noqa: E402
    collect_smax, concat_collections, random_policy)
from plcql_bench.suite.envs import smax  # noqa: E402
from plcql_bench.suite.envs.tasks import get_task, task_ids  # noqa: E402

TASK = "smax-2s3z"


def test_registry_and_shapes():
    for m in smax.MAPS:
        tid = "smax-" + m
        assert tid in task_ids()
        spec = get_task(tid).spec
        core = smax._core(m)
        assert (spec.n_agents, spec.obs_dim, spec.state_dim, spec.act_dim) == (
            core.n_agents, core.obs_dim, core.state_dim, core.n_actions)
        assert spec.discrete and spec.domain == "smax" and spec.score == "win_rate"
        assert spec.episode_limit == smax.EPISODE_LIMITS[m]
        assert spec.tiers == ("medium", "medium-replay", "expert", "mixed")
    v = get_task(TASK).spec.env_versions()
    assert {"jax", "jaxlib", "jaxmarl"} <= set(v) and v["episode_limit"] == "120"


def _random_actions(rng, avail):
    return np.array([[rng.choice(np.flatnonzero(a)) for a in env] for env in avail])


def test_env_timeout_freeze_and_won():
    spec = get_task(TASK).spec
    env = smax.SmaxEnv(spec, "2s3z", 4, episode_limit=3)
    s = env.reset(np.arange(4))
    assert s.obs.shape == (4, 5, 127) and s.obs.dtype == np.float32
    assert s.state.shape == (4, 100) and s.avail.shape == (4, 5, 10) and s.avail.dtype == np.uint8
    assert (s.avail[..., smax.STOP_ACTION] == 1).all()
    rng = np.random.default_rng(0)
    for t in range(3):
        assert not s.done.any()
        s = env.step(_random_actions(rng, s.avail))
    assert s.timeout.all() and not s.terminal.any() and not s.info["won"].any()
    # frozen after done: same final obs, reward 0, flags kept, actions ignored
    s2 = env.step(_random_actions(rng, s.avail))
    np.testing.assert_array_equal(s2.obs, s.obs)
    np.testing.assert_array_equal(s2.state, s.state)
    np.testing.assert_array_equal(s2.avail, s.avail)
    assert (s2.reward == 0).all() and s2.timeout.all() and not s2.terminal.any()
    # same seeds -> same episode start
    again = env.reset(np.arange(4))
    np.testing.assert_array_equal(again.obs, env.reset(np.arange(4)).obs)

    # won from the unit state: kill all enemies in envs 0,1; all allies in env 2
    n = spec.n_agents
    es = env._carry.env_state
    health = es.state.unit_health
    health = health.at[:2, n:].set(0.0).at[2, :n].set(0.0)
    env._carry = env._carry._replace(env_state=es.replace(state=es.state.replace(unit_health=health)))
    s = env.step(np.full((4, n), smax.STOP_ACTION))
    assert s.info["won"].tolist() == [True, True, False, False]
    assert s.terminal.tolist() == [True, True, True, False]
    assert not s.timeout[:3].any()
    assert (s.reward[:2] >= 1.0).all()  # SMAX's win bonus is in the reward too
    # a dead unit can only stop
    assert (s.avail[2].sum(-1) == 1).all() and (s.avail[2, :, smax.STOP_ACTION] == 1).all()


def _attrs(spec, meta):
    return dict(format_version=1, task_id=spec.task_id, env_versions=spec.env_versions(),
                quality="random", behaviour_policy_id="random", generator_version="test",
                generator_seed=0, ref_return_random=float("nan"),
                ref_return_expert=float("nan"), win_rate=meta["win_rate"])


def test_collect_validates_and_is_deterministic(tmp_path):
    spec = get_task(TASK).spec
    seeds = np.arange(6) + 123
    arrays, meta = collect_smax(TASK, random_policy, seeds, batch=4)  # 2 batches, one padded
    fmt.write_dataset(tmp_path / "r.h5", arrays, _attrs(spec, meta), spec=spec)  # validates
    fmt.load_dataset(tmp_path / "r.h5", spec=spec)
    n = len(arrays["rewards"])
    assert n == meta["env_steps"] == meta["lengths"].sum()
    assert arrays["actions"].dtype == np.int64 and arrays["avail_actions"].dtype == np.uint8
    assert (arrays["next_actions_valid"] == 1).all()
    ends = np.flatnonzero(np.diff(np.append(arrays["episode_ids"], -1)))
    assert (arrays["terminals"][ends] | arrays["timeouts"][ends]).all()
    assert not (arrays["terminals"][ends] & arrays["timeouts"][ends]).any()
    np.testing.assert_allclose(
        meta["returns"], np.bincount(arrays["episode_ids"], arrays["rewards"]), rtol=1e-6)
    # won only where the episode ended in a terminal
    assert not (meta["won"] & ~arrays["terminals"][ends].astype(bool)).any()
    again, meta2 = collect_smax(TASK, random_policy, seeds, batch=4)
    for k in arrays:
        np.testing.assert_array_equal(arrays[k], again[k], err_msg=k)
    both, meta_both = concat_collections([(arrays, meta), (again, meta2)])
    assert meta_both["lengths"].tolist() == meta["lengths"].tolist() * 2
    fmt.write_dataset(tmp_path / "both.h5", both, _attrs(spec, meta_both), spec=spec)


def test_inputs_are_scaled_as_smac_scales_them():
    """The state is rebuilt from the unit state as SMAC scales its own (docs/smax.md): per unit
    health fraction, position relative to the map centre over the map size, cooldown fraction and
    a one-hot type; dead units are zero rows. The observations are SMAX's own, already scaled."""
    spec = get_task(TASK).spec
    env = smax.SmaxEnv(spec, "2s3z", 2)
    s = env.reset(np.arange(2))
    rng = np.random.default_rng(1)
    for _ in range(5):
        s = env.step(_random_actions(rng, s.avail))
    u = env._carry.env_state.state  # the raw SMAX unit state behind the emitted step
    n_units = spec.n_agents + 5
    rows = s.state.reshape(2, n_units, 10)
    alive = np.asarray(u.unit_alive)
    health = np.asarray(u.unit_health) / np.array([45.0, 125.0, 160, 150, 35, 80])[np.asarray(u.unit_types)]
    np.testing.assert_allclose(rows[..., 0][alive], health[alive], rtol=1e-6)
    pos = (np.asarray(u.unit_positions) - 16.0) / 32.0
    np.testing.assert_allclose(rows[..., 1:3][alive], pos[alive], rtol=1e-5, atol=1e-6)
    onehot = np.eye(6)[np.asarray(u.unit_types)]
    np.testing.assert_array_equal(rows[..., 4:][alive], onehot[alive])
    assert (rows[~alive] == 0).all()
    assert ((rows[..., 3] >= 0) & (rows[..., 3] <= 1)).all()
    # raw SMAX world_state has positions up to 32 and integer types; ours stays in [-1, 1]
    assert np.abs(s.state).max() <= 1.0 and np.abs(s.obs).max() <= 1.0
    assert s.state.shape[-1] == spec.state_dim == 10 * n_units
    # a dead unit's row is zero (SMAC zeroes dead units' state too)
    import jax

    one = jax.tree.map(lambda x: x[0], u)
    dead = one.replace(unit_alive=one.unit_alive.at[1].set(False))
    st = np.asarray(smax._core("2s3z").smac_state(dead)).reshape(n_units, 10)
    assert (st[1] == 0).all() and st[0, 0] > 0
