"""Discrete-action baselines (maicq, omar, iql, awac on SMAX/SMAC): training, available actions,
seeding and resume, and one behavioural check each (ICQ weights, OMAR rectification, IQL expectile,
AWAC/IQL advantage weights)."""

from __future__ import annotations

import math

import pytest
import torch

from plcql_bench.algorithms.base import get_algorithm, make_config
from plcql_bench.algorithms.common.discrete_critics import (
    TwinAgentQ, batch_softmax_weights, clipped_exp_weights, expectile_loss, policy_expectation)
from plcql_bench.datasets.episodes import EpisodeSampler

from test_discrete_machinery import SPEC, check_acts_available, check_seeding_and_resume, ragged, random_masks

torch.set_num_threads(1)
BASELINES = ["maicq", "omar", "iql", "awac"]
TINY = {"batch_episodes": 4, "hidden": 8, "critic_hidden": 16}
EXTRA = {"maicq": {"mixing_embed": 4, "hypernet_embed": 8, "target_update_interval": 6},
         "omar": {"target_update_interval": 2},
         "iql": {},
         "awac": {}}
CHANGED = {"maicq": ("actor", "critic", "mixer"), "omar": ("actor", "critic"), "iql": ("actor", "critic", "value"),
           "awac": ("actor", "critic")}


def build(name, seed=0, spec=SPEC, **over):
    cls = get_algorithm(name, discrete=True)
    return cls(spec, make_config(cls, {**TINY, **EXTRA.get(name, {}), **over}), seed)


@pytest.fixture(scope="module")
def arrays():
    return ragged(lens=(5, 2, 4, 1, 3, 5, 2, 4))


def _params(algo, key):
    return [p.detach().clone() for p in algo.modules()[key].parameters()]


@pytest.mark.parametrize("name", BASELINES)
def test_trains_finite_and_acts_available(name, arrays):
    algo = build(name)
    assert algo.discrete is True and algo.batch_kind == "episodes"
    assert type(algo).__module__.endswith(f"{name}_discrete")
    s = EpisodeSampler(arrays, seed=0)
    before = {k: _params(algo, k) for k in CHANGED[name]}
    keys = None
    for _ in range(4):
        m = algo.update(s)
        assert m and all(isinstance(v, float) and math.isfinite(v) for v in m.values()), m
        assert keys is None or set(m) == keys  # every round reports the same metrics
        keys = set(m)
    for k, ps in before.items():
        assert any(not torch.equal(a, b) for a, b in zip(ps, algo.modules()[k].parameters())), k
    check_acts_available(algo)


@pytest.mark.parametrize("name", BASELINES)
def test_seeding_and_resume(name, arrays, tmp_path):
    check_seeding_and_resume(lambda seed: build(name, seed=seed), arrays, tmp_path)


def test_masked_helpers():
    g = torch.Generator().manual_seed(0)
    avail = random_masks(g, (20, 3, 6))
    q = torch.randn(20, 3, 6, generator=g)
    q_big = torch.where(avail > 0, q, torch.full_like(q, 1e6))  # unavailable actions must not count
    logits = torch.randn(20, 3, 6, generator=g)
    v = policy_expectation(logits, q_big, avail)
    p = torch.softmax(logits.masked_fill(avail == 0, float("-inf")), -1)
    assert torch.allclose(v, (p * q).sum(-1), atol=1e-5)
    # twins sharing the output layer (the references' bug) vs independent heads
    tw = TwinAgentQ(4, 5, 3, 6, hidden=8, shared_head=True)
    assert tw.q2.head is None
    q1, q2 = tw.both(torch.randn(2, 4), torch.randn(2, 3, 5))
    assert q1.shape == q2.shape == (2, 3, 6) and not torch.equal(q1, q2)


# ---------------------------------------------------------------------------------- MAICQ


def test_icq_weights_sum_to_one_and_favour_higher_values():
    g = torch.Generator().manual_seed(0)
    vals = torch.randn(8, 5, 3, generator=g)
    mask = torch.ones(8, 5, 3)
    mask[5:, 3:] = 0  # padding: three episodes ended before step 3
    w = batch_softmax_weights(vals, mask, beta=0.5)
    assert torch.allclose(w.sum(0), torch.ones(5, 3)) and (w[mask == 0] == 0).all()
    # within a column, a higher value gets a higher weight
    for t in range(5):
        for i in range(3):
            ok = mask[:, t, i] > 0
            order_v = vals[ok, t, i].argsort()
            assert torch.equal(order_v, w[ok, t, i].argsort())
    assert torch.allclose(batch_softmax_weights(vals, mask, beta=1e9)[:, 0, 0], torch.full((8,), 1 / 8))
    empty = batch_softmax_weights(vals, torch.zeros_like(mask), 0.1)
    assert torch.isfinite(empty).all() and (empty == 0).all()


def test_maicq_actor_favours_higher_q_data_actions(arrays):
    """With a fixed critic in which the data action of the first episode is much better than the
    policy's average, the ICQ actor loss concentrates its weight there and raises log π(a_data) of
    that episode most."""
    algo = build("maicq")
    b = EpisodeSampler(arrays, seed=0)(4)
    T = b.max_t
    logits = algo.actor.unroll(b)[:, :T]
    q = torch.zeros(4, T, 3, 6)
    q[0].scatter_(-1, b.actions[0].unsqueeze(-1), 5.0)  # episode 0's data actions: Q 5, others 0
    k = torch.full((4, T, 3), 1.0 / 3)
    loss, stats = algo.actor_loss(b, logits, q, k)
    loss.backward()
    opt = torch.optim.SGD(algo.actor.parameters(), lr=0.5)
    with torch.no_grad():
        from plcql_bench.algorithms.common.discrete import masked_log_softmax
        lp0 = masked_log_softmax(logits, b.avail[:, :T]).gather(-1, b.actions[..., None])[..., 0]
    opt.step()
    with torch.no_grad():
        lp1 = masked_log_softmax(algo.actor.unroll(b)[:, :T], b.avail[:, :T]).gather(-1, b.actions[..., None])[..., 0]
    m = b.mask > 0
    gain = (lp1 - lp0)
    assert gain[0][m[0]].mean() > 0
    assert stats["actor/weight_max"] > 1.0


# ---------------------------------------------------------------------------------- behaviour of the rest: below

# ---------------------------------------------------------------------------------- OMAR


@pytest.mark.parametrize("search", ["argmax", "sampled"])
def test_omar_rectification_moves_policy_to_best_available_action(search, arrays):
    """Toy Q: action 3 is the best AVAILABLE action everywhere, action 0 (unavailable) is higher
    still. The target is always 3, never 0, and pure rectification steps (omar_coe 1) raise π(3)."""
    algo = build("omar", omar_search=search, omar_coe=1.0, omar_iters=3, omar_num_samples=40, lr=1e-2)
    b = EpisodeSampler(arrays, seed=0)(4)
    T = b.max_t
    b.avail[:] = 1.0
    b.avail[..., 0] = 0.0
    q = torch.zeros(4, T, 3, 6)
    q[..., 0], q[..., 3], q[..., 5] = 10.0, 2.0, 1.0
    target = algo.rectify_target(q, b.avail[:, :T], algo.actor.unroll(b)[:, :T].detach())
    assert (target == 3).all()
    def p3():
        with torch.no_grad():
            return torch.softmax(algo.actor.unroll(b)[:, :T].masked_fill(b.avail[:, :T] == 0, -1e10), -1)[..., 3]
    m = b.mask > 0
    before = p3()[m].mean()
    for _ in range(15):
        loss, _ = algo.actor_loss(b, algo.actor.unroll(b)[:, :T], q)
        algo.actor_opt.zero_grad()
        loss.backward()
        algo.actor_opt.step()
    assert p3()[m].mean() > before + 0.2


def test_omar_sampled_search_keeps_a_better_greedy_action():
    """The sampled search returns the policy's greedy action when it beats every sample, and only
    available actions otherwise."""
    algo = build("omar", omar_search="sampled", omar_iters=2, omar_num_samples=3)
    g = torch.Generator().manual_seed(0)
    avail = random_masks(g, (50, 3, 6))
    q = torch.randn(50, 3, 6, generator=g)
    logits = torch.randn(50, 3, 6, generator=g)
    t = algo.rectify_target(q, avail, logits)
    assert (avail.gather(-1, t[..., None]) == 1).all()
    best_logits = torch.where(avail > 0, q, torch.full_like(q, -1e9)) * 100  # greedy = argmax Q
    t2 = algo.rectify_target(q, avail, best_logits)
    assert torch.equal(t2, torch.where(avail > 0, q, torch.full_like(q, -1e9)).argmax(-1))

# ---------------------------------------------------------------------------------- IQL and AWAC


def test_expectile_loss_recovers_the_expectile():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(4000, generator=g).exp()  # skewed samples
    v = torch.zeros((), requires_grad=True)
    opt = torch.optim.Adam([v], lr=0.05)
    for _ in range(1500):
        loss = expectile_loss(x - v, 0.7).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    # the 0.7-expectile e solves 0.7·E[(x − e)+] = 0.3·E[(e − x)+]
    lo, hi = x.min().item(), x.max().item()
    for _ in range(100):
        e = (lo + hi) / 2
        if 0.7 * (x - e).clamp_min(0).mean() > 0.3 * (e - x).clamp_min(0).mean():
            lo = e
        else:
            hi = e
    assert abs(v.item() - e) < 0.01 and v.item() > x.mean().item()


def test_advantage_weights_are_clipped_not_normalised():
    adv = torch.tensor([-5.0, -0.1, 0.0, 0.2, 2.0, 100.0])
    w = clipped_exp_weights(adv, beta=3.0)
    expect = torch.exp(3.0 * adv).clamp(max=100.0)
    assert torch.allclose(w, expect) and w[-1] == 100.0 and w[2] == 1.0 and w[-2] == 100.0
    assert torch.allclose(w[:4], torch.exp(3.0 * adv[:4]))  # below the cap: exp(β·A), not rescaled


@pytest.mark.parametrize("name", ["iql", "awac"])
def test_advantage_weighted_policy_prefers_the_better_data_action(name, arrays):
    """One weighted-BC step with weights from a toy advantage (large on episode 0's data actions,
    small elsewhere) raises log π(a_data) on episode 0 more than anywhere else."""
    from plcql_bench.algorithms.iql_discrete import weighted_bc_loss

    algo = build(name)
    b = EpisodeSampler(arrays, seed=0)(4)
    T = b.max_t
    adv = torch.full((4, T, 3), -1.0)
    adv[0] = 1.0
    w = clipped_exp_weights(adv, algo.cfg.beta, algo.cfg.max_weight)
    loss, lp0 = weighted_bc_loss(algo.actor.unroll(b)[:, :T], b, w)
    opt = torch.optim.SGD(algo.actor.parameters(), lr=0.05)
    loss.backward()
    opt.step()
    with torch.no_grad():
        _, lp1 = weighted_bc_loss(algo.actor.unroll(b)[:, :T], b, w)
    gain = lp1 - lp0.detach()
    m = b.mask > 0
    assert gain[0][m[0]].mean() > gain[1:][m[1:]].mean()


def test_awac_value_is_the_policy_expectation_over_available_actions(arrays):
    algo = build("awac")
    b = EpisodeSampler(arrays, seed=0)(4)
    logits = algo.actor.unroll(b).detach()
    v, _ = algo.values(b, logits)
    tq = algo.target_critic(b.state, b.obs)
    p = torch.softmax(logits.masked_fill(b.avail == 0, float("-inf")), -1).nan_to_num(0.0)
    ok = b.avail.sum(-1) > 0
    assert torch.allclose(v[ok], (p * tq).sum(-1)[ok], atol=1e-5)
