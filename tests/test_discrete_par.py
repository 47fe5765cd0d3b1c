"""Discrete SPaCQL / PLCQL (+ PLCQL ablations): the stacked QMIX ensemble, PAR on next actions by hand,
SPaCQL's inverse-std weights, a PPO step on π_par, training on a tiny SMAX-shaped dataset, seeding
and resume, and the registry rows of the ablations."""

from __future__ import annotations

import math

import pytest
import torch

from plcql_bench.algorithms.base import EpisodeBatch, get_algorithm, implementations, make_config
from plcql_bench.algorithms.common.discrete import QMixer, RNNAgent, last_action_onehot
from plcql_bench.algorithms.common.discrete_ensemble import StackedQMixer, StackedRNNAgent
from plcql_bench.algorithms.spacql import inverse_std_weights
from plcql_bench.datasets.episodes import EpisodeSampler
from plcql_bench.suite.core.spec import TaskSpec

from test_discrete_machinery import SPEC, check_acts_available, check_seeding_and_resume, ragged

torch.set_num_threads(1)
NAMES = ["spacql", "plcql", "plcql-k1", "plcql-k2", "plcql-kn", "plcql-w1", "plcql-uniform", "plcql-lcb"]
TINY = {"batch_episodes": 4, "hidden": 8, "mixing_embed": 4, "hypernet_embed": 8, "n_critics": 3,
        "behaviour_max_updates": 3, "softmax_temp": 1.0, "target_update_interval": 2, "par_hidden": 8}


def build(name, seed=0, spec=SPEC, **over):
    cls = get_algorithm(name, discrete=True)
    cfg = {**TINY, **over}
    if not name.startswith("plcql"):
        cfg.pop("par_hidden")
    return cls(spec, make_config(cls, cfg), seed)


@pytest.fixture(scope="module")
def arrays():
    return ragged(lens=(5, 2, 4, 1, 3, 5, 2, 4))


def test_stacked_ensemble_equals_its_members():
    g = torch.Generator().manual_seed(0)
    n, o, A, S, E = 3, 7, 6, 9, 4
    agents = [RNNAgent(n, o, A, 8) for _ in range(E)]
    mixers = [QMixer(n, S, 4, 8) for _ in range(E)]
    st_a, st_m = StackedRNNAgent(agents), StackedQMixer(mixers)
    obs = torch.randn(2, 5, n, o, generator=g)
    acts = torch.randint(0, A, (2, 4, n), generator=g)
    last = last_action_onehot(acts, A)
    state = torch.randn(2, 5, S, generator=g)
    out, hT = st_a(obs, last)
    qs = torch.randn(E, 2, 5, n, A, generator=g)
    cf = st_m.counterfactual(qs[:, :, :4], acts, state[:, :4])
    mixed = st_m(qs[..., 0], state)
    for j in range(E):
        ref, ref_h = agents[j](obs, last)
        torch.testing.assert_close(out[j], ref, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(hT[j], ref_h, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(mixed[j], mixers[j](qs[j, ..., 0], state), rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(cf[j], mixers[j].counterfactual(qs[j, :, :4], acts, state[:, :4]), rtol=1e-5, atol=1e-5)
    # one recurrent step from the carried hidden state continues the unroll
    o2, _ = st_a.step(obs[:, 4], last[:, 4], st_a(obs[:, :4], last[:, :4])[1])
    torch.testing.assert_close(o2, out[:, :, 4], rtol=1e-5, atol=1e-5)


def hand_batch():
    """B = 1 episode of length 2 (T = 2, indices 0..2), n = 3 agents, A = 6 actions."""
    n, A, T = 3, 6, 2
    avail = torch.ones(1, T + 1, n, A)
    avail[0, 1, 0, 5] = 0  # agent 0's best action at index 1 is unavailable
    avail[0, 2, 2, 5] = 0  # agent 2's best action at the final index is unavailable
    actions = torch.tensor([[[0, 1, 2], [3, 3, 3]]])  # a_1 = (3, 3, 3) are the dataset's next actions
    return EpisodeBatch(obs=torch.zeros(1, T + 1, n, 7), state=torch.zeros(1, T + 1, 9), avail=avail,
                        actions=actions, rewards=torch.zeros(1, T), terminals=torch.zeros(1, T),
                        mask=torch.ones(1, T), lengths=torch.tensor([T]))


def hand_q(E=3):
    """Online individual Qs whose member-mean is maximised at action 5 (next-best 4, then 2)."""
    base = torch.tensor([0.0, 0.1, 0.3, 0.0, 0.5, 1.0])
    q = base.expand(E, 1, 3, 3, 6).clone()
    q[0] += 0.05 * torch.randn(1, 3, 3, 6, generator=torch.Generator().manual_seed(0))
    return q


@pytest.mark.parametrize("fixed_k", [1, 2, "n", None])
def test_par_replacement_by_hand(fixed_k):
    algo = build("plcql", fixed_k=fixed_k)
    b, q = hand_batch(), hand_q()
    greedy = algo.backbone.greedy_actions(b, q)
    expect_greedy = torch.full((1, 3, 3), 5)
    expect_greedy[0, 1, 0] = 4  # 5 unavailable -> next best available
    expect_greedy[0, 2, 2] = 4
    assert torch.equal(greedy, expect_greedy)
    for _ in range(20):
        info = algo.par_joint_actions(b, q)
        joint, mask, k = info["joint"], info["mask"], info["k"]
        kk = {1: 1, 2: 2, "n": 3}.get(fixed_k)
        if kk is not None:
            assert (k == kk).all()
        # index 1 (dataset next action known): exactly k agents replaced by their greedy AVAILABLE action,
        # the others keep the dataset's action 3
        assert int(mask[0, 1].sum()) == int(k[0, 1])
        for i in range(3):
            assert int(joint[0, 1, i]) == (int(expect_greedy[0, 1, i]) if mask[0, 1, i] else 3)
        assert bool(b.avail[0, 1].gather(-1, joint[0, 1, :, None]).all())
        # final next observation (no next action in the data): every agent replaced, whatever k
        assert mask[0, 2].all() and torch.equal(joint[0, 2], expect_greedy[0, 2])
        assert bool(b.avail[0, 2].gather(-1, joint[0, 2, :, None]).all())


def test_spacql_par_actions_every_k_by_hand():
    algo = build("spacql")
    b, q = hand_batch(), hand_q()
    joint, masks, boot = algo.par_joint_actions(b, q)  # [1, 3, n_k, n]
    assert torch.equal(masks[0, 1].sum(-1), torch.tensor([1, 2, 3]))
    g = torch.tensor([4, 5, 5])
    assert torch.equal(joint[0, 1], torch.where(masks[0, 1], g, torch.tensor(3)))
    assert masks[0, 2].all() and (joint[0, 2] == torch.tensor([5, 5, 4])).all()
    assert torch.equal(boot, torch.tensor([[0.0, 1.0, 1.0]]))


def test_spacql_weights_by_hand():
    u = torch.tensor([[1.0, 2.0, 4.0], [1.0, 1.0, 1.0]])
    w = inverse_std_weights(u, "sample", 0.0, rows=torch.ones(2))
    torch.testing.assert_close(w[0], torch.tensor([1.0, 0.5, 0.25]) / 1.75)
    torch.testing.assert_close(w[1], torch.full((3,), 1 / 3))
    torch.testing.assert_close(w.sum(-1), torch.ones(2))
    # per batch: the mean u_k over the real rows only (row 2 is padding and ignored)
    u3 = torch.cat([u, torch.tensor([[100.0, 100.0, 0.01]])])
    wb = inverse_std_weights(u3, "batch", 0.0, rows=torch.tensor([1.0, 1.0, 0.0]))
    inv = 1 / torch.tensor([1.0, 1.5, 2.5])
    torch.testing.assert_close(wb, (inv / inv.sum()).expand(3, 3))


def test_spacql_target_matches_weighted_min(arrays):
    algo = build("spacql")
    b = EpisodeSampler(arrays, seed=0)(4)
    y, info = algo.compute_target(b)
    with torch.no_grad():
        tq = algo.backbone.unroll(b, target=True)
        qk = algo.backbone.member_q_tot(tq, info["joint"], b.state, target=True)
        u = qk.std(0, correction=0)
        w = (1 / (u + 1e-6)) / (1 / (u + 1e-6)).sum(-1, keepdim=True)
        v = (w * qk.min(0).values).sum(-1)
    from plcql_bench.algorithms.common.discrete import td_lambda_targets
    c = algo.cfg
    ref = td_lambda_targets(b.rewards, b.terminals, b.mask, v, c.gamma, c.td_lambda)
    assert (b.mask == 0).any()  # padded steps present: their targets are meaningless (masked), so not compared
    torch.testing.assert_close(y * b.mask, ref * b.mask)
    s = info["stats"]
    assert abs(sum(float(s[f"spacql/w_k{i}"]) for i in (1, 2, 3)) - 1.0) < 1e-5


def test_ppo_step_raises_probability_of_positive_advantage():
    algo = build("plcql", ppo_epochs=4, entropy_coef=0.0, par_lr=1e-2)
    s = torch.randn(1, SPEC.state_dim).expand(64, -1).contiguous()
    k = torch.tensor([2, 1] * 32)
    adv = torch.tensor([1.0, -1.0] * 32)
    with torch.no_grad():
        logp_all = torch.log_softmax(algo.par.logits(s), -1)
    logp_old = logp_all.gather(1, (k - 1)[:, None])[:, 0]
    p_before = logp_all.exp()[0]
    algo.par.ppo_update(s, k, logp_old, adv, torch.ones(64))
    with torch.no_grad():
        p_after = torch.softmax(algo.par.logits(s), -1)[0]
    assert p_after[1] > p_before[1] and p_after[0] < p_before[0]


@pytest.mark.parametrize("name", NAMES)
def test_trains_finite_and_acts_available(name, arrays):
    algo = build(name)
    assert algo.discrete is True and algo.batch_kind == "episodes"
    s = EpisodeSampler(arrays, seed=0)
    params0 = [p.detach().clone() for p in algo.backbone.critic.parameters()]
    keys = []
    for _ in range(3):
        m = algo.update(s)
        keys.append(set(m))
        assert m and all(isinstance(v, float) and math.isfinite(v) for v in m.values()), m
    assert keys[0] == keys[1] == keys[2]
    assert any(not torch.equal(a, b) for a, b in zip(params0, algo.backbone.critic.parameters()))
    if name.startswith("plcql"):
        assert {"par/E_k", "par/p_k1", "par/p_k3", "par/k_sampled", "par/r_par"} <= keys[0]
        assert abs(sum(m[f"par/p_k{i}"] for i in (1, 2, 3)) - 1.0) < 1e-5
        assert {"plcql-k1": 1.0, "plcql-k2": 2.0, "plcql-kn": 3.0}.get(name, m["par/E_k"]) == m["par/E_k"]
        assert ("ppo/loss" in m) == (name in ("plcql", "plcql-w1", "plcql-lcb"))
    else:
        assert {"spacql/E_k_weighted", "spacql/w_k1", "spacql/u_k3"} <= keys[0]
    check_acts_available(algo)


@pytest.mark.parametrize("name", ["spacql", "plcql"])
def test_seeding_and_resume(name, arrays, tmp_path):
    check_seeding_and_resume(lambda seed: build(name, seed=seed), arrays, tmp_path)


def test_ablations_resolve_for_smax():
    mk = lambda tid: TaskSpec(tid, tid.split("-")[0], 6, 7, 9, 11, True, 10, ("medium",))  # noqa: E731
    cf = get_algorithm("cfcql", discrete=True)
    for name, field, value in [("plcql-k1", "fixed_k", 1), ("plcql-kn", "fixed_k", "n"),
                               ("plcql-w1", "uncertainty_weight", False)]:
        assert set(implementations(name)) == {"continuous", "discrete"}
        cls = get_algorithm(name, discrete=True)
        assert cls.discrete is True and cls.variant_of == "plcql" and getattr(cls.Config(), field) == value
        assert cls.task_overrides(mk("smax-6h_vs_8z"), "medium") == cf.task_overrides(mk("smax-6h_vs_8z"), "medium")
    for name in ("spacql", "plcql"):
        cls = get_algorithm(name, discrete=True)
        assert cls.Config().n_critics == 10
        for tid in ("smax-2s3z", "smax-6h_vs_8z", "smac-5m_vs_6m"):
            make_config(cls, cls.task_overrides(mk(tid), "expert"))


def test_discrete_diagnostics_keys_and_no_side_effects(arrays):
    """The probe diagnostics of discrete PLCQL: per-k values for every k, π_par's marginal, and no change
    to the training generator."""
    algo = build("plcql")
    probe = EpisodeSampler(arrays, seed=5)(4)
    state = algo.gen.get_state()
    d = algo.diagnostics(probe)
    assert torch.equal(algo.gen.get_state(), state)
    assert {f"diag/{x}_k{k}" for x in ("q1", "qmean", "u", "w", "rpar", "dmean", "dstd", "p")
            for k in (1, 2, 3)} <= set(d)
    assert abs(sum(d[f"diag/p_k{k}"] for k in (1, 2, 3)) - 1) < 1e-5
    assert all(math.isfinite(v) for v in d.values())
    assert d == algo.diagnostics(probe)  # deterministic on a fixed probe
