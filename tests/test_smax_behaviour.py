"""SMAX behaviour policies: tier selection and the committed checkpoints (no training here)."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("jaxmarl")

from plcql_bench.datasets import smax_behaviour as sb  # noqa: E402
from plcql_bench.suite.envs import smax  # noqa: E402


def test_select_tiers():
    log = [{"ckpt": f"c{i}", "win_rate": w} for i, w in enumerate([0.0, 0.2, 0.45, 0.7, 0.9, 0.9])]
    t = sb.select_tiers(log)
    assert t["expert"] == "c5" and t["medium"] == "c2"
    assert t["medium-replay"] == ["c0", "c1", "c2"]


def test_parse_budget():
    assert sb.parse_budget("3M") == 3_000_000 and sb.parse_budget("500k") == 500_000
    assert sb.parse_budget(1234) == 1234


@pytest.mark.parametrize("m", smax.MAPS)
def test_committed_checkpoints_load(m):
    tid = "smax-" + m
    card = sb.read_card(tid)
    n, obs_dim, _, n_act = smax.SHAPES[m]
    assert card["expert"]["win_rate"] >= card["medium"]["win_rate"]
    for tier in ("expert", "medium"):
        policy, params = sb.load_policy(tid, tier)
        assert params[0]["w"].shape == (obs_dim + n, params[0]["w"].shape[1])
        assert params[-1]["w"].shape[1] == n_act
        avail = np.zeros((n, n_act), np.uint8)
        avail[:, smax.STOP_ACTION] = 1
        a = np.asarray(policy(params, np.zeros((n, obs_dim), np.float32), avail, None))
        assert (a == smax.STOP_ACTION).all()  # masked argmax respects avail
    src = sb.replay_sources(tid)
    assert len(src) == sb.REPLAY_LEVELS
    assert src[-1][0] == f"{card['tiers']['medium']}@eps0.050"
    assert float(src[0][2][1]) == 1.0
    with pytest.raises(ValueError):
        sb.load_policy(tid, "mixed")


def test_replay_schedule_ramps_to_medium():
    ck = ["c1", "c2", "c3"]
    sched = sb.replay_schedule(ck, levels=5)
    eps = [e for _, e in sched]
    assert eps[0] == pytest.approx(1.0) and eps[-1] == pytest.approx(0.05)
    assert all(a > b for a, b in zip(eps, eps[1:]))  # exploration only falls
    used = [c for c, _ in sched]
    assert used[-1] == "c3" and used[0] == "c1" and used == sorted(used)  # training order
    assert [c for c, _ in sb.replay_schedule(["m"], levels=3)] == ["m"] * 3
    with pytest.raises(ValueError):
        sb.replay_schedule([], levels=3)


def test_epsilon_greedy_policy_masks_and_interpolates():
    import jax

    n, obs_dim, n_act = 5, 7, 6
    actor = sb._init_mlp(jax.random.PRNGKey(0), [obs_dim + n, 16, n_act], last_scale=1.0)
    obs = np.random.default_rng(0).normal(size=(n, obs_dim)).astype(np.float32)
    avail = np.ones((n, n_act), np.uint8)
    avail[:, 0] = 0  # never available
    greedy = np.asarray(sb.greedy_policy(actor, obs, avail, None))
    keys = jax.random.split(jax.random.PRNGKey(1), 400)
    draw = jax.vmap(lambda k, e: sb.epsilon_greedy_policy((actor, e), obs, avail, k), (0, None))
    at0, at1 = np.asarray(draw(keys, 0.0)), np.asarray(draw(keys, 1.0))
    assert (at0 == greedy).all()
    assert (at1 != 0).all() and (np.asarray(draw(keys, 0.5)) != 0).all()
    assert set(np.unique(at1)) == set(range(1, n_act))  # uniform over the available ones
    assert 0.05 < (at1 == greedy).mean() < 0.4  # ~1/5 by chance, not greedy


def test_replay_parts_keep_the_ramp_for_small_tiers():
    from plcql_bench.datasets.smax_collect import _replay_parts

    big = _replay_parts(np.arange(45), 20)
    assert [len(c) for c in big] == [3] * 5 + [2] * 15  # np.array_split: the built datasets
    small = _replay_parts(np.arange(5), 20)
    assert [lv for lv, c in enumerate(small) if len(c)] == [0, 5, 10, 14, 19]  # both ends kept
    assert np.concatenate(small).tolist() == list(range(5))  # every seed once, in order
