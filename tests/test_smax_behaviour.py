"""SMAX behaviour policies: tier selection and the committed checkpoints (no training here)."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("jaxmarl")

from plcql_bench.datasets import smax_behaviour as sb  # noqa: E402
from plcql_bench.datasets import smax_tiers as st  # noqa: E402
from plcql_bench.suite.envs import smax  # noqa: E402


def _log(prefix, wins, step=10):
    return [{"ckpt": f"{prefix}c{i}", "win_rate": w, "env_steps": step * (i + 1)} for i, w in enumerate(wins)]


def test_tiers_by_the_reference_yardstick():
    """medium = the ladder checkpoint closest to expert's win rate x BC(medium) / BC(expert) of the
    reference (2s3z: 0.16 / 0.97); medium-replay = the ladder up to medium; the expert is the best
    of all runs, the expert run's on ties."""
    expert_run = _log("", [0.0, 0.66, 1.0, 1.0])
    ladder = _log("ladder/", [0.0, 0.0, 0.05, 0.12, 0.2, 0.41], step=1)
    sel = st.select("2s3z", expert_run, ladder)
    assert sel["expert"]["ckpt"] == "c3"  # latest of the ties
    assert sel["target"] == pytest.approx(0.16 / 0.97)
    assert sel["medium"]["ckpt"] == "ladder/c4"  # |0.2 - 0.165| < |0.12 - 0.165|
    assert [e["ckpt"] for e in sel["replay"]] == [f"ladder/c{i}" for i in range(5)]
    # no ladder: the expert run's checkpoints before its expert
    sel = st.select("6h_vs_8z", _log("", [0.0, 0.7, 0.93, 1.0]), [])
    assert sel["target"] == pytest.approx(0.4 / 0.6) and sel["medium"]["ckpt"] == "c1"
    assert [e["ckpt"] for e in sel["replay"]] == ["c0", "c1"]


def test_labels_say_what_a_weak_expert_is():
    assert st.labels("5m_vs_6m", {"win_rate": 0.125}) == {
        "expert": "best reachable on SMAX, greedy win rate 0.125"}
    assert st.labels("2s3z", {"win_rate": 1.0}) == {}
    card = {"task_id": "smax-5m_vs_6m", "algo_version": st.TIERS_VERSION,
            "tiers": {"expert": "e", "medium": "m", "medium-replay": ["a", "m"]},
            "labels": st.labels("5m_vs_6m", {"win_rate": 0.125})}
    assert "best reachable on SMAX" in sb.policy_id(card, "expert")
    assert "best reachable on SMAX" in sb.policy_id(card, "mixed")
    assert "best reachable" not in sb.policy_id(card, "medium")
    assert sb.policy_id(card, "medium-replay").endswith("replay(a..m):eps-greedy(1->0.05,2 parts)")
    assert smax.INPUTS_VERSION in sb.policy_id(card, "medium")


def test_parse_budget():
    assert sb.parse_budget("3M") == 3_000_000 and sb.parse_budget("500k") == 500_000
    assert sb.parse_budget(1234) == 1234


@pytest.mark.parametrize("m", smax.MAPS)
def test_committed_checkpoints_load(m):
    tid = "smax-" + m
    card = sb.read_card(tid)
    n, obs_dim, _, n_act = smax.SHAPES[m]
    assert card["expert"]["win_rate"] >= card["medium"]["win_rate"]
    assert card["algo_version"] == st.TIERS_VERSION
    target = card["selection"]["medium_target_win_rate"]
    assert target == pytest.approx(card["expert"]["win_rate"] * st.relative(m, "medium"), abs=1e-4)
    for tier in ("expert", "medium"):
        policy, params = sb.load_policy(tid, tier)
        assert params[0]["w"].shape == (obs_dim + n, params[0]["w"].shape[1])
        assert params[-1]["w"].shape[1] == n_act
        avail = np.zeros((n, n_act), np.uint8)
        avail[:, smax.STOP_ACTION] = 1
        a = np.asarray(policy(params, np.zeros((n, obs_dim), np.float32), avail, None))
        assert (a == smax.STOP_ACTION).all()  # masked argmax respects avail
    src = sb.replay_sources(tid)
    assert len(src) == max(2, len(card["tiers"]["medium-replay"]))  # one part per checkpoint
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
    assert [c for c, _ in sb.replay_schedule(ck)] == ck  # default: one part per checkpoint
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
    from plcql_bench.datasets.smax_tiers import _replay_parts

    big = _replay_parts(np.arange(45), 20)
    assert [len(c) for c in big] == [3] * 5 + [2] * 15  # np.array_split: the built datasets
    small = _replay_parts(np.arange(5), 20)
    assert [lv for lv, c in enumerate(small) if len(c)] == [0, 5, 10, 14, 19]  # both ends kept
    assert np.concatenate(small).tolist() == list(range(5))  # every seed once, in order


def test_refine_brackets_jumps_and_interpolates(tmp_path):
    """Where the greedy win rate jumps over the medium target between two consecutive checkpoints,
    interpolated policies fill the gap; their log entries sort between the two checkpoints."""
    log = _log("", [0.0, 0.016, 0.328, 0.6], step=4096)
    assert st.bracket(log, 0.165) == (1, 2)
    assert st.bracket(log, 0.31) is None  # 0.328 is within the tolerance
    assert st.bracket(log, 0.9) is None  # nothing straddles it
    a = [{"w": np.zeros((2, 3)), "b": np.ones(3)}]
    b = [{"w": np.full((2, 3), 4.0), "b": np.full(3, 3.0)}]
    mid = st.interpolate(a, b, 0.25)
    assert np.allclose(mid[0]["w"], 1.0) and np.allclose(mid[0]["b"], 1.5)
    (tmp_path / "log.jsonl").write_text("".join(
        f'{{"ckpt": "{e["ckpt"]}", "env_steps": {e["env_steps"]}, "win_rate": {e["win_rate"]}}}\n' for e in log))
    (tmp_path / st.REFINE_LOG).write_text(
        '{"ckpt": "interp_a_b_0.500", "env_steps": 10240.0, "win_rate": 0.17, "interpolated": ["c1", "c2", 0.5]}\n')
    (tmp_path / st.CONFIRM_LOG).write_text('{"ckpt": "c2", "win_rate": 0.2, "eval_episodes": 512}\n')
    merged = st.read_log(tmp_path, "ladder/")
    assert merged[3]["win_rate"] == 0.2 and merged[3]["eval_episodes"] == 512  # the longer evaluation wins
    assert [e["ckpt"] for e in merged] == ["ladder/c0", "ladder/c1", "ladder/interp_a_b_0.500", "ladder/c2",
                                           "ladder/c3"]
    sel = st.select("2s3z", _log("", [1.0], step=10**7), merged)
    assert sel["medium"]["ckpt"] == "ladder/interp_a_b_0.500" and len(sel["replay"]) == 3
    sel = st.select("2s3z", _log("", [1.0], step=10**7), [e for e in merged if "interp" not in e["ckpt"]])
    assert sel["medium"]["ckpt"] == "ladder/c2"  # 0.2 after confirmation, not its first 0.328


def test_tier_table_puts_the_reference_beside_ours():
    def entry(tier, ret, win, n=5000):
        return {"task_id": "smax-2s3z", "quality": tier, "n_episodes": n, "return_mean": ret, "win_rate": win}

    text = st.tier_table({"a": entry("expert", 2.0, 1.0), "b": entry("medium", 1.0, 0.15),
                          "c": entry("medium-replay", 0.5, 0.01, 1976), "x": {"task_id": "mpe-cn"}})
    rows = text.splitlines()[2:]
    assert [r.split(" | ")[1] for r in rows] == ["expert", "medium", "medium-replay"]
    assert "| 2s3z | medium | 5,000 | 1.00 (0.50) | 0.150 (0.15) | 5,000 | 12.76 (0.64) | 0.16 (0.16) |" in text
    assert "1,976 | 0.50 (0.25) | 0.010 (0.01) | 1,976 | 7.94 (0.40) | 0.33 (0.34) |" in text


def test_long_ladders_replay_evenly_spaced_checkpoints():
    run = _log("ladder/", [0.0] * 99 + [0.08], step=4096)
    sel = st.select("3s_vs_5z", _log("", [1.0], step=10**8), run)
    assert sel["medium"]["ckpt"] == "ladder/c99"
    names = [e["ckpt"] for e in sel["replay"]]
    assert len(names) == st.REPLAY_MAX_PARTS and names[0] == "ladder/c0" and names[-1] == "ladder/c99"
    assert names == sorted(names, key=lambda n: int(n.split("c")[-1]))  # training order
    assert st.spread(run[:5]) == run[:5]


def test_docs_tier_table_is_the_committed_cards():
    """docs/smax.md's tier table is the one `smax_tiers --table` prints from the committed paper
    cards (their .json files are manifest entries): every map, every tier, no stale number."""
    import json
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    cards = {str(f): json.loads(f.read_text()) for f in (root / "datasets/cards/paper").glob("smax-*/*.json")}
    table = st.tier_table(cards)
    assert {(e["task_id"], e["quality"]) for e in cards.values()} == {
        (f"smax-{m}", t) for m in st.REFERENCE for t in st.TABLE_TIERS}
    assert table in (root / "docs/smax.md").read_text()


def test_pqn_lambda_returns_by_hand():
    """Q(lambda) on one env: an episode ends in a terminal at t=1 (no bootstrap), a new one is cut
    by the rollout at t=3 (bootstrap from max Q_tot of the next state)."""
    import jax.numpy as jnp

    from plcql_bench.datasets.smax_pqn import lambda_returns

    g0, lam = 0.9, 0.5
    r = jnp.array([[1.0], [2.0], [0.5], [0.25]])
    term = jnp.array([[0.0], [1.0], [0.0], [0.0]])
    done = term > 0
    qn = jnp.array([[10.0], [7.0], [4.0], [8.0]])
    g = np.asarray(lambda_returns(r, term, done, qn, g0, lam))[:, 0]
    g3 = 0.25 + g0 * 8.0
    g2 = 0.5 + g0 * ((1 - lam) * 4.0 + lam * g3)
    g1 = 2.0  # terminal: neither Q nor the next episode's return
    g0_ = 1.0 + g0 * ((1 - lam) * 10.0 + lam * g1)
    np.testing.assert_allclose(g, [g0_, g1, g2, g3], rtol=1e-6)
    timeout = np.asarray(lambda_returns(r, term * 0, done, qn, g0, lam))[:, 0]
    assert timeout[1] == pytest.approx(2.0 + g0 * 7.0)  # a time-limit cut bootstraps from its next state


def test_pqn_checkpoint_is_a_greedy_behaviour_policy(tmp_path):
    """A PQN-VDN Q-network (LayerNorm layers) saves and loads like a MAPPO actor, and the greedy
    behaviour policy is the argmax of its masked Q-values."""
    import jax
    import jax.numpy as jnp

    from plcql_bench.datasets import smax_pqn

    core = smax._core("3s_vs_5z")
    q = smax_pqn.init_params(jax.random.PRNGKey(0), core, dict(hidden=16))["actor"]
    q[0]["ln_g"] = q[0]["ln_g"] * 2.0  # a trained gain, so a lost LayerNorm would show
    sb.save_actor(tmp_path / "q.npz", q)
    back = sb.load_actor(tmp_path / "q.npz")
    assert [sorted(layer) for layer in back] == [["b", "ln_b", "ln_g", "w"]] * 2 + [["b", "w"]]
    obs = jax.random.normal(jax.random.PRNGKey(1), (core.n_agents, core.obs_dim))
    avail = jnp.ones((core.n_agents, core.n_actions), jnp.uint8).at[:, 5:].set(0)
    qv = sb.actor_logits(back, obs, avail)
    np.testing.assert_allclose(qv[:, :5], sb.actor_logits(q, obs, avail)[:, :5], rtol=1e-5)
    act = sb.greedy_policy(back, obs, avail, None)
    assert (act < 5).all() and (act == jnp.argmax(qv, -1)).all()
    mappo = sb.init_params(jax.random.PRNGKey(0), core, 16)["actor"]
    sb.save_actor(tmp_path / "a.npz", mappo)
    assert [sorted(layer) for layer in sb.load_actor(tmp_path / "a.npz")] == [["b", "w"]] * 3
