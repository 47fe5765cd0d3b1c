"""Tests for the continuous algorithms (bc, cfcql, plcql and its variants) and their shared pieces."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from plcql_bench.algorithms.base import Batch, load_all, make_config
from plcql_bench.algorithms.common.continuous import cf_cql_penalty
from plcql_bench.algorithms.common.continuous import (
    EnsembleCritic,
    counterfactual_joint,
    host_floats,
    mean_metrics,
)
from plcql_bench.algorithms.common.nets import StackedMLP, clip_grad_norm_stacked_
from plcql_bench.algorithms.common.speed import SyntheticBuffer
from plcql_bench.algorithms.plcql import PLCQL, par_mask
from plcql_bench.suite.core.spec import TaskSpec

# Tiny tensors: one thread is faster and immune to oversubscription on a busy machine.
torch.set_num_threads(1)

SPEC = TaskSpec("mpe-cn", "mpe", n_agents=3, obs_dim=6, state_dim=10, act_dim=2, discrete=False,
                episode_limit=25, tiers=("expert", "medium", "medium-replay", "random"))
TINY = {"batch_size": 32, "hidden": 16}
CONTINUOUS = sorted(n for n, c in load_all().items() if c.discrete is False and n in
                    {"bc", "cfcql", "plcql", "plcql-k1", "plcql-kn", "plcql-w1"})


def build(name: str, seed: int = 0, **over):
    cls = load_all()[name]
    return cls(SPEC, make_config(cls, {**TINY, **over}), seed)


@pytest.fixture(scope="module")
def buf():
    return SyntheticBuffer(SPEC, size=2000, seed=0)


def test_all_expected_registered():
    reg = load_all()
    for name in ["bc", "cfcql", "plcql", "plcql-k1", "plcql-kn", "plcql-w1"]:
        assert name in reg and reg[name].name == name and reg[name].discrete is False
    assert reg["plcql-k1"].Config().fixed_k == 1
    assert reg["plcql-kn"].Config().fixed_k == "n"
    assert reg["plcql-w1"].Config().uncertainty_weight is False
    assert reg["plcql"].Config().fixed_k is None and reg["plcql"].Config().n_critics == 10


@pytest.mark.parametrize("name", CONTINUOUS)
def test_trains_finite_and_acts(name, buf):
    torch.manual_seed(0)
    algo = build(name)
    for _ in range(3):
        m = algo.update(buf)
        assert m and all(isinstance(v, float) and math.isfinite(v) for v in m.values()), m
    obs = np.random.default_rng(0).normal(size=(7, 3, 6)).astype(np.float32)
    a = algo.act(obs)
    assert a.shape == (7, 3, 2) and a.dtype == np.float32
    assert np.all(a >= -1) and np.all(a <= 1)


def test_round_metrics_average_per_key_and_come_back_as_floats():
    ms = [{"a": torch.tensor(1.0), "b": 2.0}, {"a": torch.tensor(3.0)}, {"a": torch.tensor(5.0), "b": torch.tensor(4.0)}]
    means = mean_metrics(ms)
    out = host_floats({"z": torch.tensor([7.5]), **means, "y": 1})
    assert list(out) == ["z", "a", "b", "y"]  # order kept
    assert out == {"z": 7.5, "a": 3.0, "b": 3.0, "y": 1.0}  # b: mean over the two updates that logged it
    assert all(type(v) is float for v in out.values())


@pytest.mark.parametrize("name", ["plcql", "plcql-k1", "plcql-kn"])
def test_par_metrics_logged(name, buf):
    m = build(name).update(buf)
    ps = [m[f"par/p_k{i}"] for i in (1, 2, 3)]
    assert abs(sum(ps) - 1) < 1e-5 and 1 <= m["par/E_k"] <= 3
    if name == "plcql-k1":
        assert ps[0] == 1.0 and m["par/E_k"] == 1.0
    if name == "plcql-kn":
        assert ps[2] == 1.0 and m["par/E_k"] == 3.0


def test_task_overrides():
    from plcql_bench.algorithms.cfcql import CFCQL

    cn = CFCQL.task_overrides(SPEC, "medium")
    assert cn["cql_alpha"] == 5.0 and cn["lr"] == 0.01 and cn["hidden"] == 64 and cn["gamma"] == 0.95
    pp = TaskSpec("mpe-pp", "mpe", 3, 16, 48, 2, False, 25, ("expert",))
    assert CFCQL.task_overrides(pp, "expert") == dict(hidden=64, batch_size=1024, lr=0.001, tau=0.01,
                                                       gamma=0.95, cql_alpha=2.0)
    hc = TaskSpec("mamujoco-halfcheetah-2x3", "mamujoco", 2, 12, 17, 3, False, 1000, ("expert",))
    o = PLCQL.task_overrides(hc, "random")
    assert o["cql_alpha"] == 0.1 and o["hidden"] == 256 and o["batch_size"] == 256 and o["tau"] == 0.005
    for name, cls in load_all().items():  # every override set is accepted by the class's Config
        if name in CONTINUOUS:
            make_config(cls, cls.task_overrides(hc, "medium"))


# ----------------------------------------------------------------------------------- losses fall


def test_bc_mse_falls():
    # learnable toy: each agent's dataset action is a fixed tanh-linear function of its observation
    buf = SyntheticBuffer(SPEC, size=2000, seed=2)
    W = torch.randn(6, 2, generator=torch.Generator().manual_seed(0))
    buf.data["actions"] = torch.tanh(buf.data["obs"] @ W)
    algo = build("bc", hidden=32, lr=3e-3)
    first = algo.update(buf)["bc/mse"]
    for _ in range(100):
        last = algo.update(buf)["bc/mse"]
    assert last < 0.3 * first


def test_critic_td_loss_falls_on_fixed_data():
    torch.manual_seed(0)
    fixed = SyntheticBuffer(SPEC, size=64, seed=1)
    batch = fixed(64)
    algo = build("cfcql", cql_alpha=0.0, lr=3e-3, hidden=32)
    first = None
    for _ in range(120):
        loss, stats = algo.critic_loss(batch, algo.td_target(batch))
        algo.critic_step(loss)
        first = first if first is not None else float(stats["critic/td_loss"])
    assert float(stats["critic/td_loss"]) < 0.2 * first


# ------------------------------------------------------------------------------------ PAR target


def test_par_mask_counts_and_invalid():
    g = torch.Generator().manual_seed(0)
    k = torch.tensor([1, 2, 3, 1, 2, 3, 1])
    valid = torch.tensor([1, 1, 1, 1, 1, 1, 0.0])
    m = par_mask(k, valid, 3, g)
    assert m.sum(1).tolist() == [1, 2, 3, 1, 2, 3, 3]
    # uniform choice of the replaced agent for k = 1
    big = par_mask(torch.ones(30000, dtype=torch.long), torch.ones(30000), 3, g).float().mean(0)
    assert torch.allclose(big, torch.full((3,), 1 / 3), atol=0.02)


@pytest.mark.parametrize("replace_with", ["online", "target"])
def test_par_target_hand_computed(replace_with):
    """The online actors output 0.5 for every agent, the target actors 0.25 (Algorithm 1 line 184 samples
    from the current policy: "online"); dataset next actions are -1; a fake target critic returns member
    j's value c_j * sum(joint action) + state[0]. Check Y by hand."""
    spec = TaskSpec("toy", "mpe", n_agents=3, obs_dim=2, state_dim=1, act_dim=1, discrete=False,
                    episode_limit=5, tiers=("expert",))
    cls = load_all()["plcql"]
    algo = cls(spec, make_config(cls, {"n_critics": 2, "hidden": 8, "target_noise": 0.0, "gamma": 0.5,
                                       "replace_with": replace_with}), 0)
    assert cls.Config().replace_with == "online"  # the default follows Algorithm 1

    algo.actors = lambda obs: torch.full((obs.shape[0], 3, 1), 0.5)
    algo.target_actors = lambda obs: torch.full((obs.shape[0], 3, 1), 0.25)
    pi = 0.5 if replace_with == "online" else 0.25
    coefs = torch.tensor([1.0, 2.0])

    def fake_critic(state, actions, members=None):
        return coefs.view(2, 1, 1) * actions.sum(-1).unsqueeze(0) + state[:, :1].unsqueeze(0)

    algo.target_critic = fake_critic
    B = 3
    batch = Batch(obs=torch.zeros(B, 3, 2), state=torch.zeros(B, 1), actions=torch.zeros(B, 3, 1),
                  rewards=torch.tensor([1.0, 0.0, 2.0]), next_obs=torch.zeros(B, 3, 2),
                  next_state=torch.tensor([[0.0], [1.0], [0.0]]), next_actions=-torch.ones(B, 3, 1),
                  next_actions_valid=torch.tensor([1.0, 1.0, 0.0]), terminals=torch.tensor([0.0, 0.0, 1.0]))
    k = torch.tensor([1, 2, 1])
    joint, mask = algo.par_next_actions(batch, k)
    assert mask.sum(1).tolist() == [1, 2, 3]  # row 2: next action unknown -> all replaced
    # replaced agents take the chosen actors' action, anchored agents keep the dataset's
    assert torch.equal(joint[..., 0], torch.where(mask, torch.tensor(pi), torch.tensor(-1.0)))
    y = algo.par_target(batch, joint)
    # row 0: k=1: sum = pi - 2 ; members c_j * sum ; min = 2 (pi - 2) (negative) ; Y = 1 + 0.5 * min
    # row 1: k=2: sum = 2 pi - 1 ; + state 1 -> members (2 pi - 1) + 1, 2 (2 pi - 1) + 1 ; Y = 0.5 * min
    # row 2: terminal -> Y = r = 2
    s1 = 2 * pi - 1
    y1 = 0.5 * min(s1 + 1, 2 * s1 + 1)
    assert torch.allclose(y, torch.tensor([1 + 0.5 * 2 * (pi - 2), y1, 2.0]))


@pytest.mark.parametrize("ddof", [0, 1])
def test_par_reward_weight(ddof):
    """u_Q = sqrt(Var_j Q_j): population variance by default (Algorithm 1 line 189); u_ddof=1 is the
    sample std."""
    spec = TaskSpec("toy", "mpe", 2, 2, 1, 1, False, 5, ("expert",))
    cls = load_all()["plcql"]
    over = {"n_critics": 3, "hidden": 8, "temperature": 2.0}
    if ddof:
        over["u_ddof"] = 1
    algo = cls(spec, make_config(cls, over), 0)
    vals = torch.tensor([[4.0, -2.0], [5.0, -2.0], [6.0, -2.0]])  # [E, B]
    algo.critic = lambda s, a, members=None: vals.unsqueeze(-1)
    b = Batch(obs=torch.zeros(2, 2, 2), state=torch.zeros(2, 1), actions=torch.zeros(2, 2, 1),
              rewards=torch.zeros(2), next_obs=torch.zeros(2, 2, 2), next_state=torch.zeros(2, 1),
              next_actions=torch.zeros(2, 2, 1), next_actions_valid=torch.ones(2), terminals=torch.zeros(2))
    r, u, w = algo.par_reward(b, torch.zeros(2, 2, 1))
    u0 = math.sqrt(2 / 3) if ddof == 0 else 1.0  # ((4-5)^2 + 0 + (6-5)^2) / (3 - ddof)
    assert torch.allclose(u, torch.tensor([u0, 0.0]))
    w_exp = torch.tensor([1 / (1 + math.exp(2.0 * u0)) + 0.5, 1.0])
    assert torch.allclose(w, w_exp) and torch.allclose(r, w_exp * torch.tensor([4.0, -2.0]))


def test_ppo_step_moves_probabilities():
    spec = TaskSpec("toy", "mpe", 3, 2, 4, 1, False, 5, ("expert",))
    cls = load_all()["plcql"]
    algo = cls(spec, make_config(cls, {"hidden": 8, "ppo_epochs": 1, "entropy_coef": 0.0, "par_lr": 1e-2,
                                       "advantage_norm": "none"}), 0)
    s = torch.randn(64, 4)
    with torch.no_grad():
        p0 = torch.softmax(algo.par.logits(s), -1)
    k = torch.tensor([1] * 32 + [3] * 32)
    logp_old = torch.log(p0.gather(1, (k - 1)[:, None])[:, 0])
    adv = torch.tensor([1.0] * 32 + [-1.0] * 32)
    algo.par.ppo_update(s, k, logp_old, adv, torch.ones(64))
    with torch.no_grad():
        p1 = torch.softmax(algo.par.logits(s), -1)
    assert p1[:, 0].mean() > p0[:, 0].mean()  # positive advantage -> more likely
    assert p1[:, 2].mean() < p0[:, 2].mean()  # negative advantage -> less likely


# --------------------------------------------------------------------------------------- CF-CQL


def test_counterfactual_joint_layout():
    B, n, M, A = 2, 3, 4, 2
    data = torch.randn(B, n, A)
    own = torch.randn(B, n, M, A)
    j = counterfactual_joint(data, own).view(B, n, M, n, A)
    for i in range(n):
        for jj in range(n):
            exp = own[:, i] if i == jj else data[:, jj].unsqueeze(1).expand(B, M, A)
            assert torch.equal(j[:, i, :, jj], exp)


@pytest.mark.parametrize("input_norm", [False, True])
def test_cf_cql_penalty_matches_loop(input_norm):
    torch.manual_seed(0)
    B, n, A, S, M, E = 5, 3, 2, 4, 6, 2
    critic = EnsembleCritic(E, S, n * A, 8, input_norm, torch.Generator().manual_seed(0))
    with torch.no_grad():  # non-trivial affine parameters for the input normaliser
        if input_norm:
            critic.norm.weight.uniform_(0.5, 1.5)
            critic.norm.bias.uniform_(-0.5, 0.5)
    state, actions = torch.randn(B, S), torch.rand(B, n, A) * 2 - 1
    q_data = critic(state, actions.reshape(B, 1, -1))[:, :, 0]
    g = torch.Generator().manual_seed(3)
    pen, _ = cf_cql_penalty(critic, state, actions, q_data, M, g)
    samples = torch.rand(B, n, M, A, generator=torch.Generator().manual_seed(3)) * 2 - 1

    # slow reference: one concatenated input row at a time, plain per-member MLP, loops everywhere
    rows = []  # all counterfactual inputs in one "batch" as the reference builds them
    for i in range(n):
        for m in range(M):
            for b in range(B):
                a = actions[b].clone()
                a[i] = samples[b, i, m]
                rows.append((i, m, b, torch.cat([state[b], a.reshape(-1)])))
    X = torch.stack([r[3] for r in rows])
    X_data = torch.cat([state, actions.reshape(B, -1)], 1)

    def mlp(e, x):
        if input_norm:
            mu, var = x.mean(0), x.var(0, unbiased=False)
            x = (x - mu) / torch.sqrt(var + 1e-5) * critic.norm.weight[e, 0] + critic.norm.bias[e, 0]
        h = torch.relu(x @ critic.l1.weight[e] + critic.l1.bias[e, 0])
        h = torch.relu(h @ critic.l2.weight[e] + critic.l2.bias[e, 0])
        return (h @ critic.l3.weight[e] + critic.l3.bias[e, 0])[:, 0]

    for e in range(E):
        qx = mlp(e, X)
        qd = mlp(e, X_data)
        assert torch.allclose(qd, q_data[e], atol=1e-5)
        total = 0.0
        for b in range(B):
            per_agent = []
            for i in range(n):
                vals = [qx[r] - math.log(0.5 ** A) for r, (ii, m, bb, _) in enumerate(rows) if ii == i and bb == b]
                per_agent.append(torch.logsumexp(torch.stack(vals), 0))
            total = total + sum(per_agent) / n - qd[b]
        assert torch.allclose(pen[e], total / B, atol=1e-4), (e, pen[e], total / B)


def test_stacked_clip_per_member():
    net = StackedMLP(3, 4, 2, hidden=5)
    x = torch.randn(3, 7, 4)
    (net(x) * torch.tensor([1.0, 100.0, 0.001]).view(3, 1, 1)).sum().backward()
    params = list(net.parameters())
    norms = clip_grad_norm_stacked_(params, 0.5, 3)
    after = torch.stack([p.grad.reshape(3, -1).pow(2).sum(1) for p in params]).sum(0).sqrt()
    for e in range(3):
        assert math.isclose(float(after[e]), min(float(norms[e]), 0.5), rel_tol=1e-4)


def test_stacked_mlp_members_independent():
    net = StackedMLP(4, 3, 2, hidden=6)
    x = torch.randn(4, 5, 3)
    y = net(x)
    for e in range(4):
        h = torch.relu(x[e] @ net.hidden[0].weight[e] + net.hidden[0].bias[e])
        h = torch.relu(h @ net.hidden[1].weight[e] + net.hidden[1].bias[e])
        assert torch.allclose(y[e], h @ net.out.weight[e] + net.out.bias[e], atol=1e-6)


# ------------------------------------------------------------------------------ seeding, checkpoints


def _params(algo):
    return torch.cat([p.detach().flatten() for m in algo.modules().values() for p in m.parameters()])


@pytest.mark.parametrize("name", ["cfcql", "plcql"])
def test_seeding(name):
    def run(seed):
        torch.manual_seed(123)  # global RNG differs from the algorithm seed on purpose
        algo = build(name, seed=seed)
        p = _params(algo)
        m = algo.update(SyntheticBuffer(SPEC, size=500, seed=0))
        return p, m

    p0, m0 = run(0)
    p0b, m0b = run(0)
    p1, m1 = run(1)
    assert torch.equal(p0, p0b) and m0 == m0b
    assert not torch.equal(p0, p1) and m0["critic/loss"] != m1["critic/loss"]


def test_bc_seeding():
    a, b, c = build("bc", seed=0), build("bc", seed=0), build("bc", seed=1)
    pa = [p.detach().clone() for p in a.actors.parameters()]
    assert all(torch.equal(x, y) for x, y in zip(pa, b.actors.parameters()))
    assert not all(torch.equal(x, y) for x, y in zip(pa, c.actors.parameters()))


@pytest.mark.parametrize("name", ["bc", "cfcql", "plcql"])
def test_state_dict_round_trip(name, buf, tmp_path):
    algo = build(name)
    for _ in range(2):
        algo.update(buf)
    path = tmp_path / "ckpt.pt"
    torch.save(algo.state_dict(), path)
    fresh = build(name, seed=99)
    fresh.load_state_dict(torch.load(path, weights_only=False))
    obs = np.random.default_rng(1).normal(size=(4, 3, 6)).astype(np.float32)
    np.testing.assert_array_equal(algo.act(obs), fresh.act(obs))
    if name != "bc":  # the continued training is identical too (same RNG and optimiser state)
        b1, b2 = SyntheticBuffer(SPEC, 300, seed=5), SyntheticBuffer(SPEC, 300, seed=5)
        assert algo.update(b1) == fresh.update(b2)


@pytest.mark.parametrize("input_norm", [False, True])
def test_split_critic_gradients_match_concatenated(input_norm):
    """The split first layer + in-place broadcast add gives the same parameter gradients as the
    plain per-member MLP on the concatenated (state, joint action) input."""
    B, R, S, nA, E = 4, 5, 3, 4, 2
    critic = EnsembleCritic(E, S, nA, 6, input_norm, torch.Generator().manual_seed(0))
    state, acts = torch.randn(B, S), torch.randn(B, R, nA)
    critic(state, acts).pow(2).sum().backward()
    g_split = [p.grad.clone() for p in critic.parameters()]
    critic.zero_grad()
    X = torch.cat([state.unsqueeze(1).expand(B, R, S), acts], -1).reshape(B * R, S + nA)
    if input_norm:
        X = (X - X.mean(0)) / torch.sqrt(X.var(0, unbiased=False) + 1e-5)
        X = X.unsqueeze(0) * critic.norm.weight + critic.norm.bias
    else:
        X = X.unsqueeze(0).expand(E, -1, -1)
    h = torch.relu(torch.baddbmm(critic.l1.bias, X, critic.l1.weight))
    h = torch.relu(torch.baddbmm(critic.l2.bias, h, critic.l2.weight))
    q = torch.baddbmm(critic.l3.bias, h, critic.l3.weight)
    q.pow(2).sum().backward()
    for a, p in zip(g_split, critic.parameters()):
        assert torch.allclose(a, p.grad, atol=1e-4, rtol=1e-4)
