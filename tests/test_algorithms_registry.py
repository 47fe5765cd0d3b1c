"""Every registered continuous algorithm: trains a few rounds with finite metrics, acts in [-1, 1],
seeds reproducibly, resumes bitwise; per-task tables load; MACQL's joint penalty by hand."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from plcql_bench.algorithms.base import load_all, make_config
from plcql_bench.algorithms.common.configs import tier_table
from plcql_bench.algorithms.common.speed import SyntheticBuffer
from plcql_bench.suite.core.spec import TaskSpec

torch.set_num_threads(1)
CN = TaskSpec("mpe-cn", "mpe", n_agents=3, obs_dim=6, state_dim=10, act_dim=2, discrete=False,
              episode_limit=25, tiers=("expert", "medium", "medium-replay", "random"))
# HalfCheetah 2x3 as the tasks helper defines it (n=2, obs 6, state 17, act 3)
HC = TaskSpec("mamujoco-halfcheetah-2x3", "mamujoco", n_agents=2, obs_dim=6, state_dim=17, act_dim=3,
              discrete=False, episode_limit=1000, tiers=("expert", "medium", "medium-replay", "random"))
TINY = {"batch_size": 32, "hidden": 16}
ALL = sorted(n for n, c in load_all().items() if c.discrete is False)
EXPECTED = {"bc", "cfcql", "plcql", "spacql", "macql", "omar", "matd3bc", "iql", "awac", "dof", "dof-qgrad", "maicq"}


def build(name, spec=CN, seed=0, tier="medium", **over):
    cls = load_all()[name]
    ov = {**cls.task_overrides(spec, tier), **TINY, **over} if hasattr(cls, "task_overrides") else {**TINY, **over}
    return cls(spec, make_config(cls, ov), seed)


def test_expected_registered():
    assert EXPECTED <= set(ALL)


@pytest.mark.parametrize("spec", [CN, HC], ids=["cn", "hc"])
@pytest.mark.parametrize("name", ALL)
def test_trains_finite(name, spec):
    if spec is HC and name.startswith("plcql-"):
        pytest.skip("variants share plcql's code")
    algo = build(name, spec)
    buf = SyntheticBuffer(spec, size=300, seed=0)
    for _ in range(2):
        m = algo.update(buf)
        assert m and all(math.isfinite(v) for v in m.values()), m
    a = algo.act(np.zeros((4, spec.n_agents, spec.obs_dim), np.float32))
    assert a.shape == (4, spec.n_agents, spec.act_dim) and np.all(np.abs(a) <= 1)


@pytest.mark.parametrize("name", sorted(EXPECTED - {"bc", "cfcql", "plcql"}))
def test_seeding_and_resume(name, tmp_path):
    def first(seed):
        torch.manual_seed(123)
        algo = build(name, seed=seed)
        return algo, algo.update(SyntheticBuffer(CN, 200, seed=0))

    a0, m0 = first(0)
    _, m0b = first(0)
    _, m1 = first(1)
    assert m0 == m0b and m0 != m1
    torch.save(a0.state_dict(), tmp_path / "c.pt")
    fresh = build(name, seed=7)
    fresh.load_state_dict(torch.load(tmp_path / "c.pt", weights_only=False))
    assert a0.update(SyntheticBuffer(CN, 200, seed=3)) == fresh.update(SyntheticBuffer(CN, 200, seed=3))


# CFCQL continuous `env_config_map` (maddpg_cc.py ~l.643): cql_alpha per task and dataset tier, as published;
# algorithms/configs/cfcql.yaml is the one copy the code reads.
CFCQL_ALPHA: dict[str, dict[str, float]] = {
    "mpe-cn": {"random": 0.5, "medium-replay": 1.0, "medium": 5.0, "expert": 2.5},
    "mpe-pp": {"random": 0.5, "medium-replay": 0.5, "medium": 0.6, "expert": 2.0},
    "mpe-world": {"random": 0.5, "medium-replay": 0.5, "medium": 0.32, "expert": 0.3},
    "mamujoco": {"random": 0.1, "medium-replay": 0.4, "medium": 1.0, "expert": 1.7},
}


def test_tables():
    for task, row in CFCQL_ALPHA.items():
        spec = HC if task == "mamujoco" else TaskSpec(task, "mpe", 3, 6, 10, 2, False, 25, ("expert",))
        for tier, alpha in row.items():
            assert tier_table("cfcql", spec, tier) == {"cql_alpha": alpha}
    cls = load_all()["omar"]
    assert cls.task_overrides(CN, "medium")["cql_alpha"] == 5.0
    hc = cls.task_overrides(HC, "expert")
    assert hc["omar_coe"] == 0.5 and hc["omar_mode"] == "cem" and hc["hidden"] == 256
    for name in ALL:  # every override set is accepted by the class's Config
        c = load_all()[name]
        for spec in (CN, HC):
            make_config(c, c.task_overrides(spec, "medium-replay"))


def test_macql_joint_penalty_by_hand():
    algo = build("macql", n_critics=2, cql_alpha=1.0, n_sampled_actions=4)
    b = SyntheticBuffer(CN, 50, seed=1)(8)
    g_state = algo.gen.get_state()
    loss, st = algo.critic_loss(b, torch.zeros(8))
    algo.gen.set_state(g_state)
    joint = torch.rand(8, 4, 6, generator=algo.gen) * 2 - 1
    with torch.no_grad():
        q = algo.critic(b.state, b.actions.reshape(8, 1, -1))[:, :, 0]
        qs = algo.critic(b.state, joint) - 6 * math.log(0.5)
        pen = (torch.logsumexp(qs, -1) - q).mean(-1).sum()
    assert torch.allclose(st["cql/penalty"], pen, atol=1e-4)


def test_dof_guidance_gradient_only_in_qgrad():
    buf = SyntheticBuffer(CN, 200, seed=0)
    a, b = build("dof", eta=50.0), build("dof-qgrad", eta=50.0)
    a.update(buf), b.update(SyntheticBuffer(CN, 200, seed=0))
    pa = torch.cat([p.flatten() for p in a.actors.parameters()])
    pb = torch.cat([p.flatten() for p in b.actors.parameters()])
    assert not torch.equal(pa, pb)  # same seed and batch: only the guidance gradient differs


def test_fused_trunk_matches_autograd_and_refuses_second_backward():
    from plcql_bench.algorithms.common.continuous import EnsembleCritic

    crit = EnsembleCritic(3, 4, 6, 8, False, torch.Generator().manual_seed(0))
    s, a = torch.randn(5, 4), torch.randn(5, 7, 6, requires_grad=True)
    q = crit(s, a)
    q.pow(2).sum().backward(retain_graph=True)
    g_fused = [p.grad.clone() for p in crit.parameters()] + [a.grad.clone()]
    with pytest.raises(RuntimeError):
        q.pow(2).sum().backward()
    crit.zero_grad(), a.grad.zero_()
    X = torch.cat([s.unsqueeze(1).expand(5, 7, 4), a], -1).reshape(35, 10)
    h = torch.relu(torch.baddbmm(crit.l1.bias, X.expand(3, -1, -1), crit.l1.weight))
    h = torch.relu(torch.baddbmm(crit.l2.bias, h, crit.l2.weight))
    torch.baddbmm(crit.l3.bias, h, crit.l3.weight).pow(2).sum().backward()
    for x, p in zip(g_fused, list(crit.parameters()) + [a]):
        assert torch.allclose(x, p.grad, atol=1e-4, rtol=1e-4)


def test_halfcheetah_cql_uses_policy_samples():
    """HalfCheetah branch: agent i's CQL candidates = 10 uniform + 10 noisy current-policy + 10 noisy
    next-policy actions, each corrected by its own log-density."""
    from plcql_bench.algorithms.common.continuous import cf_cql_penalty
    from plcql_bench.algorithms.common.continuous import counterfactual_joint

    algo = build("cfcql", HC, n_critics=2)
    assert algo.cfg.sample_action_class == "1-1-1" and algo.cfg.other_action_jitter == 1e-5
    b = SyntheticBuffer(HC, 50, seed=1)(6)
    extra = algo.policy_cql_samples(b)
    assert extra[0].shape == (6, 2, 20, 3) and extra[1].shape == (6, 2, 20)
    q = algo.critic(b.state, b.actions.reshape(6, 1, -1))[:, :, 0]
    g = torch.Generator().manual_seed(5)
    pen, _ = cf_cql_penalty(algo.critic, b.state, b.actions, q, 10, g, extra=extra)
    g = torch.Generator().manual_seed(5)
    own = torch.cat([torch.rand(6, 2, 10, 3, generator=g) * 2 - 1, extra[0]], 2)
    logp = torch.cat([torch.full((6, 2, 10), 3 * math.log(0.5)), extra[1]], 2)
    qc = algo.critic(b.state, counterfactual_joint(b.actions, own)).view(2, 6, 2, 30) - logp
    exp = (torch.logsumexp(qc, -1).mean(-1) - q).mean(-1)
    assert torch.allclose(pen, exp, atol=1e-4)
    m = build("macql", HC).update(SyntheticBuffer(HC, 200, seed=0))
    assert math.isfinite(m["cql/penalty"])


def test_at_most_one_level_of_algorithm_base_class():
    """Every implementation derives from at most one algorithm base class (CentralCriticAlgorithm,
    IndependentBase, DiscreteAlgorithm), which itself derives from protocol pieces only: shared parts are
    components it holds (the discrete CFCQL backbone, PAR) or functions. A variant (register_variant) is
    its algorithm with other config defaults."""
    from plcql_bench.algorithms.base import Algorithm, all_algorithm_classes
    from plcql_bench.algorithms.common.discrete import RecurrentActing
    from plcql_bench.algorithms.common.checkpoint import Checkpointable, DeterministicActors

    pieces = {Algorithm, Checkpointable, DeterministicActors, RecurrentActing, object}
    registered = set(all_algorithm_classes())
    for cls in all_algorithm_classes():
        if getattr(cls, "variant_of", None):
            assert len(cls.__bases__) == 1 and cls.__bases__[0].name == cls.variant_of, cls
            cls = cls.__bases__[0]
        bases = [b for b in cls.__mro__[1:] if b not in pieces]
        assert len(bases) <= 1, f"{cls.__name__}: {[b.__name__ for b in bases]}"
        assert not set(bases) & registered, f"{cls.__name__} derives from a registered algorithm"
