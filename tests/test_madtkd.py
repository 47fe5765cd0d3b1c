"""MADTKD (discrete): teacher then student phases, distillation on a toy dataset, masked greedy acting
that matches the training forward, seeding, resume, tables."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from plcql_bench.algorithms.base import get_algorithm, make_config
from plcql_bench.datasets.episodes import EpisodeSampler
from plcql_bench.suite.core.spec import TaskSpec

from test_discrete_machinery import SPEC, random_masks, ragged

torch.set_num_threads(1)
TINY = {"batch_episodes": 4, "embed": 8, "heads": 2, "layers": 2, "context": 3, "teacher_rounds": 2}


def build(seed=0, spec=SPEC, **over):
    cls = get_algorithm("madtkd", discrete=True)
    return cls(spec, make_config(cls, {**TINY, **over}), seed)


@pytest.fixture(scope="module")
def arrays():
    return ragged(lens=(5, 2, 4, 1, 3, 5, 2, 4))


def params(m):
    return [p.detach().clone() for p in m.parameters()]


def changed(before, m):
    return any(not torch.equal(a, b) for a, b in zip(before, m.parameters()))


def test_teacher_then_student_phases(arrays):
    algo = build()
    assert algo.discrete is True and algo.batch_kind == "episodes" and algo.name == "madtkd"
    s = EpisodeSampler(arrays, seed=0)
    t0, s0 = params(algo.teacher), params(algo.student)
    keys = None
    for r in range(4):
        if r == 2:  # the teacher phase is over: only the teacher moved
            assert changed(t0, algo.teacher) and not changed(s0, algo.student)
            t0 = params(algo.teacher)
        m = algo.update(s)
        assert all(isinstance(v, float) and math.isfinite(v) for v in m.values()), m
        assert m["madtkd/teacher_phase"] == (1.0 if r < 2 else 0.0)
        keys = keys or set(m)
        assert set(m) == keys  # every round reports every metric (the runner averages them)
    assert changed(s0, algo.student) and not changed(t0, algo.teacher)  # the teacher is frozen
    assert m["student/kl"] >= 0 and m["student/relation"] >= 0
    best = max(arrays["rewards"][arrays["episode_ids"] == e].sum() for e in range(8))
    assert math.isfinite(m["madtkd/best_return"]) and m["madtkd/best_return"] <= best + 1e-5


def toy(seed=0, n_ep=24, length=6):
    """A dataset whose actions are a deterministic function of each agent's observation: the argmax
    over the available actions of the first A observation entries."""
    arrays = ragged(lens=(length,) * n_ep, seed=seed)
    A = SPEC.act_dim
    obs, avail = arrays["obs"], arrays["avail_actions"].astype(np.float32)
    score = np.where(avail > 0, obs[..., :A], -np.inf)
    arrays["actions"] = score.argmax(-1).astype(arrays["actions"].dtype)
    return arrays


def test_student_learns_a_deterministic_policy():
    algo = build(lr=1e-2, embed=32, batch_episodes=24, teacher_rounds=40, grad_clip=0.0, weight_decay=0.0)
    s = EpisodeSampler(toy(), seed=0)
    for _ in range(40):
        m = algo.update(s)
    assert m["teacher/cross_entropy"] < 0.7 * math.log(SPEC.act_dim)
    first = algo.update(s)["student/cross_entropy"]
    for _ in range(60):
        m = algo.update(s)
    assert m["madtkd/teacher_phase"] == 0.0
    assert m["student/cross_entropy"] < 0.5 * first, (first, m)
    assert m["student/teacher_agreement"] > 0.6


def test_act_is_masked_and_matches_the_training_forward(arrays):
    """Greedy acting keeps the episode's context per env (only the receptive field) and gives the
    same logits as the training forward over the whole episode; begin_episodes resets it."""
    algo = build(teacher_rounds=0)
    s = EpisodeSampler(arrays, seed=0)
    for _ in range(3):
        algo.update(s)
    algo.cfg.target_return = 0.7
    g = torch.Generator().manual_seed(1)
    E, L, n, A = 5, 9, SPEC.n_agents, SPEC.act_dim
    assert algo.student.receptive_steps() == 5 < L  # the history is truncated inside the episode
    rng = np.random.default_rng(0)
    for _episode in range(2):
        algo.begin_episodes(E)
        obs = rng.normal(size=(E, L, n, SPEC.obs_dim)).astype(np.float32)
        avail = random_masks(g, (E, L, n, A)).numpy().astype(np.uint8)
        acts = np.stack([algo.act(obs[:, t], avail[:, t]) for t in range(L)], 1)  # [E, L, n]
        assert acts.dtype == np.int64 and acts.shape == (E, L, n)
        assert (np.take_along_axis(avail, acts[..., None], -1) == 1).all()
        prev = torch.cat([torch.full((E, 1, n), A), torch.as_tensor(acts[:, :-1])], 1)
        with torch.no_grad():
            logits, _ = algo.student(torch.as_tensor(obs), prev, torch.full((E,), 0.7),
                                     torch.arange(L).expand(E, L), torch.ones(E, L, dtype=torch.bool))
        full = logits.masked_fill(torch.as_tensor(avail) == 0, float("-inf")).argmax(-1)
        np.testing.assert_array_equal(full.numpy(), acts)
    # a fresh batch size starts fresh episodes without begin_episodes
    a = algo.act(obs[:3, 0], avail[:3, 0])
    assert a.shape == (3, n) and algo._hist["t"] == 1


def test_masks_hold_in_the_losses():
    """Unavailable actions get no probability: the KL and the cross-entropies are finite with masks
    where many rows have a single available action, and the logits' gradients on unavailable
    entries are exactly 0."""
    arrays = ragged(lens=(5, 3, 4, 5))
    g = torch.Generator().manual_seed(3)
    m = random_masks(g, arrays["avail_actions"].shape).numpy().astype(arrays["avail_actions"].dtype)
    arrays["avail_actions"] = m
    arrays["next_avail_actions"] = random_masks(g, m.shape).numpy().astype(m.dtype)
    arrays["actions"] = torch.multinomial(torch.as_tensor(m.reshape(-1, m.shape[-1])).float(), 1,
                                          generator=g).reshape(m.shape[:-1]).numpy()
    algo = build(teacher_rounds=1)
    s = EpisodeSampler(arrays, seed=0)
    for _ in range(3):
        out = algo.update(s)
        assert all(math.isfinite(v) for v in out.values()), out
    b = s(4)
    x = algo.inputs(b, SPEC.act_dim)
    logits, _ = algo.student(**x)
    logits.retain_grad()
    from plcql_bench.algorithms.common.discrete import bc_cross_entropy
    bc_cross_entropy(logits, b).backward()
    assert (logits.grad[b.avail[:, :b.max_t] == 0] == 0).all()


def test_seeding_and_resume(arrays, tmp_path):
    def run(seed, rounds=3):
        torch.manual_seed(123)
        algo = build(seed=seed)
        s = EpisodeSampler(arrays, seed=0)
        return algo, [algo.update(s) for _ in range(rounds)]

    a0, m0 = run(0)
    _, m0b = run(0)
    _, m1 = run(1)
    assert m0 == m0b and m0 != m1
    torch.save(a0.state_dict(), tmp_path / "c.pt")
    fresh = build(seed=7)
    fresh.load_state_dict(torch.load(tmp_path / "c.pt", weights_only=False))
    assert fresh.best_return == a0.best_return and fresh.rounds == 3
    s1, s2 = EpisodeSampler(arrays, seed=3), EpisodeSampler(arrays, seed=3)
    for _ in range(2):  # student rounds after the teacher phase
        assert a0.update(s1) == fresh.update(s2)
    obs = np.random.default_rng(0).normal(size=(4, 3, 7)).astype(np.float32)
    a0.begin_episodes(4)
    fresh.begin_episodes(4)
    np.testing.assert_array_equal(a0.act(obs), fresh.act(obs))


def test_tables_and_target_return():
    cls = get_algorithm("madtkd", discrete=True)
    mk = lambda tid: TaskSpec(tid, tid.split("-")[0], 5, 7, 9, 11, True, 10, ("medium",))  # noqa: E731
    assert cls.task_overrides(mk("smac-2s3z"), "medium") == {"return_scale": 20.0, "teacher_rounds": 850}
    assert cls.task_overrides(mk("smax-6h_vs_8z"), "expert") == {"return_scale": 1.0, "teacher_rounds": 1000}
    assert cls.task_overrides(mk("smax-3m"), "expert") == {"return_scale": 1.0}
    # the teacher gets half of the paper profile's budget on every SMAX map, the students the rest
    from plcql_bench.suite.runs.profiles import load_profile

    paper = load_profile("paper")
    for m in ("2s3z", "3s_vs_5z", "5m_vs_6m", "6h_vs_8z"):
        budget = paper.updates_for(f"smax-{m}", "medium")
        assert 2 * cls.task_overrides(mk(f"smax-{m}"), "medium")["teacher_rounds"] == budget
    for tid in ("smax-2s3z", "smax-3s_vs_5z", "smax-5m_vs_6m", "smax-6h_vs_8z", "smac-6h_vs_8z"):
        for tier in ("medium", "medium-replay", "expert", "mixed"):
            make_config(cls, cls.task_overrides(mk(tid), tier))
    algo = build()
    assert algo.eval_return() == 0.0  # nothing seen yet
    algo.best_return = 1.5
    assert algo.eval_return() == 1.5
    algo.cfg.target_return = 2.0
    assert algo.eval_return() == 2.0
    with pytest.raises(KeyError, match="no continuous-action"):
        get_algorithm("madtkd", discrete=False)


def test_leaderboard_knows_madtkd_for_the_smac_table_only():
    from plcql_bench.leaderboard import build as lb

    paper = lb.load_paper_results()
    assert "madtkd" in paper["tables"]["starcraft_results"]["columns"]
    assert "madtkd" not in paper["tables"]["main_results"]["columns"]
    assert lb.support("madtkd", True) == "yes" and lb.support("madtkd", False) == "no"


@pytest.mark.parametrize("R,T,m,h,K", [(3, 11, 1, 2, 3), (2, 7, 4, 1, 4), (2, 3, 2, 2, 5), (1, 40, 1, 1, 1)])
def test_local_attention_equals_a_loop(R, T, m, h, K):
    """The blockwise band attention equals attention written token by token over the steps
    t-K+1 .. t that exist (plus the token's own step)."""
    from plcql_bench.algorithms.madtkd import local_attention

    g = torch.Generator().manual_seed(R * 100 + T)
    q, k, v = (torch.randn(R, T, m, h, 4, generator=g) for _ in range(3))
    valid = torch.rand(R, T, generator=g) < 0.8
    out = local_attention(q, k, v, valid, K)
    for r in range(R):
        for t in range(T):
            steps = [s for s in range(max(0, t - K + 1), t + 1) if valid[r, s] or s == t]
            keys, vals = k[r, steps].reshape(-1, h, 4), v[r, steps].reshape(-1, h, 4)  # [S·m, h, d]
            for i in range(m):
                att = torch.softmax(torch.einsum("hd,shd->hs", q[r, t, i], keys) / 2.0, -1)
                assert torch.allclose(out[r, t, i], torch.einsum("hs,shd->hd", att, vals), atol=1e-5)
