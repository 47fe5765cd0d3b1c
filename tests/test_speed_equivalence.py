"""The fast critic paths (algorithms/common/kernels.py: cache-blocked CF-CQL penalty `_BlockedLSE`,
`_FusedTrunk`, the workspace pool; continuous.py: folded input normalisation, two-pass statistics)
against a plain-autograd reference written from the formulas, and against the algorithms' own plain
path (the kernels switched off):

    concatenated input rows [s, a_joint] -> BatchNorm1d (training-mode statistics of the call's rows)
    -> per-member Linear/ReLU/Linear/ReLU/Linear, one member at a time;
    pen_j = mean_b [ sum_i lambda_i T logsumexp_m((Q_j(s, a_i^m, a_-i) - log p) / T) - Q_j(s, a) ].

Compared: the loss/penalty values and the gradients of EVERY critic parameter (float32: rtol 1e-4,
atol 1e-6 x the gradient's scale; float64: rtol 1e-9), with several state blocks (BLOCK_BYTES made
tiny so that the block loop, including a ragged last block, is exercised), for the MPE branch, the
HalfCheetah branch (extra policy candidates with their log-densities, jittered other actions,
soft_q off, lse_temp != 1), `members=` slices, weighted agents, no-grad calls, and the whole critic
loss of CFCQL (2 members), PLCQL and SPaCQL (10 members) with the algorithms' own random draws.
"""

from __future__ import annotations

import math
import os
import shutil

import pytest
import torch

import plcql_bench.algorithms.common.kernels as C
from plcql_bench.algorithms.common import native
from plcql_bench.algorithms.base import load_all, make_config
from plcql_bench.algorithms.common.continuous import cf_cql_penalty, lse_penalty
from plcql_bench.algorithms.common.continuous import EnsembleCritic, counterfactual_joint
from plcql_bench.algorithms.common.speed import SyntheticBuffer
from plcql_bench.suite.core.spec import TaskSpec

torch.set_num_threads(1)

CN = TaskSpec("mpe-cn", "mpe", n_agents=3, obs_dim=6, state_dim=10, act_dim=2, discrete=False,
              episode_limit=25, tiers=("expert", "medium", "medium-replay", "random"))
HC = TaskSpec("mamujoco-halfcheetah-2x3", "mamujoco", n_agents=2, obs_dim=6, state_dim=17, act_dim=3,
              discrete=False, episode_limit=1000, tiers=("expert", "medium", "medium-replay", "random"))


@pytest.fixture(autouse=True)
def small_blocks(monkeypatch):
    """A few states per block, so every test runs several blocks and a ragged last one."""
    monkeypatch.setattr(C, "BLOCK_BYTES", 4096)


needs_cc = pytest.mark.skipif(shutil.which(os.environ.get("CC", "cc")) is None, reason="no C compiler here")


@pytest.fixture
def block_forms(monkeypatch):
    """Counts which loop each `_BlockedLSE` call took: {"native": n, "torch": n} (its one decision,
    `_native_blocks`: the C kernels, or None for the torch loop)."""
    seen = {"native": 0, "torch": 0}
    real = C._native_blocks

    def spy(*args):
        nat = real(*args)
        seen["torch" if nat is None else "native"] += 1
        return nat

    monkeypatch.setattr(C, "_native_blocks", spy)
    return seen


# -- plain reference ----------------------------------------------------------------------------------


def ref_q(critic: EnsembleCritic, X: torch.Tensor, members: range | None = None) -> torch.Tensor:
    """X [N, S + nA] concatenated rows -> Q [E', N], member by member, BatchNorm over the N rows."""
    out = []
    for e in members if members is not None else range(critic.n_members):
        _, pre2 = preactivations(critic, X, e)
        out.append((torch.relu(pre2) @ critic.l3.weight[e] + critic.l3.bias[e])[:, 0])
    return torch.stack(out)


def preactivations(critic: EnsembleCritic, X: torch.Tensor, e: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Member e's first- and second-layer pre-activations on rows X [N, S + nA] (BatchNorm over the N rows)."""
    x = X
    if critic.input_norm:
        var, mean = torch.var_mean(X, dim=0, keepdim=True, correction=0)
        x = (X - mean) / torch.sqrt(var + 1e-5) * critic.norm.weight[e] + critic.norm.bias[e]
    pre1 = x @ critic.l1.weight[e] + critic.l1.bias[e]
    return pre1, torch.relu(pre1) @ critic.l2.weight[e] + critic.l2.bias[e]


def ref_lse(critic, state, joint, n, offset, weights, temp, members=None):
    """mean_b sum_i w_i T lse_m((Q - offset) / T) from concatenated rows: [E']."""
    B, R, _ = joint.shape
    q = ref_q(critic, critic_rows(state, joint), members).view(-1, B, n, R // n)
    z = q - offset if offset is not None else q
    lse = torch.logsumexp(z / temp, -1) * temp
    return (lse * weights).sum(-1).mean(-1), z.detach().sum((1, 2, 3))


def critic_rows(state: torch.Tensor, joint: torch.Tensor) -> torch.Tensor:
    """state [B, S] and joint actions [B, R, nA] -> the critic's input rows [B * R, S + nA]."""
    B, R, _ = joint.shape
    return torch.cat([state.unsqueeze(1).expand(B, R, state.shape[1]), joint], -1).reshape(B * R, -1)


def make_critic(E, S, nA, H, input_norm, dtype, seed=0):
    critic = EnsembleCritic(E, S, nA, H, input_norm, torch.Generator().manual_seed(seed)).to(dtype)
    with torch.no_grad():  # non-trivial normaliser affine parameters and larger output weights
        if input_norm:
            critic.norm.weight.uniform_(0.5, 1.5, generator=torch.Generator().manual_seed(seed + 1))
            critic.norm.bias.uniform_(-0.5, 0.5, generator=torch.Generator().manual_seed(seed + 2))
        critic.l3.weight.mul_(4.0)
    return critic


def grads(loss, params):
    return torch.autograd.grad(loss, params)


def assert_close_grads(got, exp, dtype, names=None):
    # atol relative to the gradient's largest entry: a weight gradient sums hundreds of rows (the CF-CQL
    # samples), so float32 summation order moves its small entries by ~1e-5 of its scale (measured: 3.3e-6
    # on PLCQL's output layer, whose largest entry is 0.38)
    rtol = 1e-4 if dtype == torch.float32 else 1e-9
    for i, (g, e) in enumerate(zip(got, exp)):
        scale = float(e.abs().max())
        atol = 2e-5 * scale + 1e-7 if dtype == torch.float32 else 1e-12 * max(1.0, scale)
        assert torch.allclose(g, e, rtol=rtol, atol=atol), (names[i] if names else i, (g - e).abs().max(), e.abs().max())


# -- the blocked penalty alone ------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["f32", "f64"])
@pytest.mark.parametrize("input_norm", [True, False], ids=["bn", "nobn"])
@pytest.mark.parametrize("case", ["mpe", "hc", "temp", "weights_n", "weights_bn", "members", "ten"])
def test_lse_penalty_matches_reference(case, input_norm, dtype):
    g = torch.Generator().manual_seed(7)
    E, B, S, n, A, M, H = 2, 13, 5, 3, 2, 4, 8
    offset_kind, temp, weights, members = "uniform", 1.0, None, None
    if case == "hc":
        n, A, M, H = 2, 3, 12, 16
        offset_kind = "random"
    if case == "temp":
        temp, offset_kind = 0.3, None
    if case == "weights_n":
        weights = torch.rand(n, generator=g)
    if case == "weights_bn":
        weights = torch.rand(B, n, generator=g)
    if case == "members":
        E, members = 5, slice(1, 4)
    if case == "ten":
        E = 10
    critic = make_critic(E, S, n * A, H, input_norm, dtype)
    state = (torch.randn(B, S, generator=g) * 2 + 1).to(dtype)
    data = (torch.rand(B, n, A, generator=g) * 2 - 1).to(dtype)
    own = (torch.rand(B, n, M, A, generator=g) * 2 - 1).to(dtype)
    joint = counterfactual_joint(data, own)
    offset = {"uniform": torch.full((B, n, M), A * math.log(0.5)), None: None,
              "random": torch.randn(B, n, M, generator=g) * 3}[offset_kind]
    offset = offset.to(dtype) if offset is not None else None
    w = weights.to(dtype) if weights is not None else torch.full((n,), 1.0 / n, dtype=dtype)
    params = list(critic.parameters())

    pol, zsum = lse_penalty(critic, state, joint, n, offset, w, temp, members=members)
    rng = range(*members.indices(E)) if members is not None else None
    pol_r, zsum_r = ref_lse(critic, state, joint, n, offset, w, temp, rng)
    rtol = 1e-5 if dtype == torch.float32 else 1e-10
    assert pol.shape == pol_r.shape and torch.allclose(pol, pol_r, rtol=rtol, atol=rtol)
    assert torch.allclose(zsum, zsum_r, rtol=rtol, atol=rtol * B * n * M)
    # a non-uniform upstream gradient per member (the backward scales each member's gradients)
    up = torch.arange(1, pol.shape[0] + 1, dtype=dtype)
    used = [p for p in params]
    got = torch.autograd.grad((pol * up).sum(), used, allow_unused=True)
    exp = torch.autograd.grad((pol_r * up).sum(), used, allow_unused=True)
    got = [torch.zeros_like(p) if x is None else x for p, x in zip(used, got)]
    exp = [torch.zeros_like(p) if x is None else x for p, x in zip(used, exp)]
    names = [n_ for n_, _ in critic.named_parameters()]
    assert_close_grads(got, exp, dtype, names)
    with torch.no_grad():  # the forward-only path gives the same values
        pol_ng, zsum_ng = lse_penalty(critic, state, joint, n, offset, w, temp, members=members)
    assert torch.allclose(pol_ng, pol.detach(), rtol=1e-6, atol=1e-6) and torch.allclose(zsum_ng, zsum)


@pytest.mark.parametrize("block_bytes", [1, 4096, 1 << 30], ids=["one-state", "several", "single-block"])
def test_block_size_does_not_change_the_result(block_bytes, monkeypatch):
    """One state per block, several, and one block for everything: same penalty and gradients."""
    monkeypatch.setattr(C, "BLOCK_BYTES", block_bytes)
    g = torch.Generator().manual_seed(3)
    critic = make_critic(2, 6, 6, 8, True, torch.float64)
    state, data = torch.randn(9, 6, generator=g, dtype=torch.float64), torch.rand(9, 3, 2, generator=g, dtype=torch.float64)
    joint = counterfactual_joint(data, torch.rand(9, 3, 5, 2, generator=g, dtype=torch.float64))
    w = torch.full((3,), 1 / 3, dtype=torch.float64)
    pol, _ = lse_penalty(critic, state, joint, 3, None, w)
    pol_r, _ = ref_lse(critic, state, joint, 3, None, w, 1.0)
    assert torch.allclose(pol, pol_r, rtol=1e-12)
    assert_close_grads(grads(pol.sum(), list(critic.parameters())), grads(pol_r.sum(), list(critic.parameters())),
                       torch.float64)


def test_lse_penalty_action_gradients_fall_back():
    """Actions that carry gradient take the plain (autograd) path, with the same values."""
    g = torch.Generator().manual_seed(1)
    critic = make_critic(2, 4, 4, 8, True, torch.float64)
    state = torch.randn(5, 4, generator=g, dtype=torch.float64)
    joint = (torch.rand(5, 6, 4, generator=g, dtype=torch.float64) * 2 - 1).requires_grad_()
    w = torch.full((2,), 0.5, dtype=torch.float64)
    pol, _ = lse_penalty(critic, state, joint, 2, None, w)
    pol_r, _ = ref_lse(critic, state, joint, 2, None, w, 1.0)
    assert torch.allclose(pol, pol_r, rtol=1e-10)
    ga, = torch.autograd.grad(pol.sum(), [joint])
    gr, = torch.autograd.grad(pol_r.sum(), [joint])
    assert torch.allclose(ga, gr, rtol=1e-9, atol=1e-12)


def test_fused_trunk_and_forward_match_reference():
    """The plain critic call (R = 1 TD path and R > 1, with and without members=) against the reference,
    including the gradient with respect to actions (the actor's path)."""
    g = torch.Generator().manual_seed(2)
    critic = make_critic(4, 7, 6, 8, True, torch.float64)
    state = torch.randn(11, 7, generator=g, dtype=torch.float64)
    for R, members in [(1, None), (3, slice(0, 1)), (3, slice(1, 4))]:
        acts = (torch.rand(11, R, 6, generator=g, dtype=torch.float64) * 2 - 1).requires_grad_()
        q = critic(state, acts, members=members)
        X = torch.cat([state.unsqueeze(1).expand(11, R, 7), acts], -1).reshape(11 * R, -1)
        rng = range(*(members or slice(None)).indices(4))
        qr = ref_q(critic, X, rng).view(-1, 11, R)
        assert torch.allclose(q, qr, rtol=1e-10)
        up = torch.randn(q.shape, generator=g, dtype=torch.float64)
        params = list(critic.parameters()) + [acts]
        got = torch.autograd.grad((q * up).sum(), params, allow_unused=True)
        exp = torch.autograd.grad((qr * up).sum(), params, allow_unused=True)
        got = [torch.zeros_like(p) if x is None else x for p, x in zip(params, got)]
        exp = [torch.zeros_like(p) if x is None else x for p, x in zip(params, exp)]
        assert_close_grads(got, exp, torch.float64)
        # frozen=True (the actors' loss): the same values and action gradients, no parameter gradients
        qf = critic(state, acts, members=members, frozen=True)
        assert torch.equal(qf, q.detach()) or torch.allclose(qf, q, rtol=1e-12)
        ga, = torch.autograd.grad((qf * up).sum(), [acts])
        assert torch.allclose(ga, exp[-1], rtol=1e-9, atol=1e-12)
        assert all(p.grad is None for p in critic.parameters())
        # state_part= (one state GEMM shared by several calls on the same states): same values and gradients
        qs = critic(state, acts, members=members, state_part=critic.state_part(state, members))
        assert torch.allclose(qs, q, rtol=1e-12)
        gs = torch.autograd.grad((qs * up).sum(), params, allow_unused=True)
        gs = [torch.zeros_like(p) if x is None else x for p, x in zip(params, gs)]
        assert_close_grads(gs, exp, torch.float64)


# -- whole critic losses of the algorithms ------------------------------------------------------------


def _build(name, spec, **over):
    cls = load_all()[name]
    ov = {**cls.task_overrides(spec, "medium"), "batch_size": 24, "hidden": 16, **over}
    return cls(spec, make_config(cls, ov), 0)


def _ref_critic_loss(algo, batch, target, own, extra, jitter):
    """TD + cql_alpha * CF-CQL from concatenated rows, with the random draws given."""
    B, n, A = batch.actions.shape
    X = torch.cat([batch.state, batch.actions.reshape(B, -1)], 1)
    q = ref_q(algo.critic, X)  # [E, B]
    td = (q - target.unsqueeze(0)).pow(2).mean(1).sum()
    M = own.shape[2]
    logp = torch.full((B, n, M), A * math.log(0.5))
    if extra is not None:
        own = torch.cat([own, extra[0]], 2)
        logp = torch.cat([logp, extra[1]], 2)
    others = batch.actions if jitter is None else batch.actions + jitter
    cfg = algo.cfg
    pol, _ = ref_lse(algo.critic, batch.state, counterfactual_joint(others, own), n,
                     logp if cfg.soft_q else None, torch.full((n,), 1.0 / n), cfg.lse_temp)
    return td + cfg.cql_alpha * (pol - q.mean(-1)).sum()


@pytest.mark.parametrize("name,spec,over", [
    ("cfcql", CN, {}),
    ("cfcql", HC, {"n_critics": 2}),  # HalfCheetah branch: policy candidates + jittered others
    ("cfcql", HC, {"n_critics": 2, "soft_q": False, "lse_temp": 0.5, "other_action_jitter": 0.1}),
    ("plcql", CN, {}),  # 10 members
    ("spacql", CN, {}),
], ids=["cfcql-cn", "cfcql-hc", "cfcql-hc-nosoft-temp", "plcql-cn", "spacql-cn"])
@pytest.mark.parametrize("native_on", [True, False], ids=["native", "torch-form"])
def test_algorithm_critic_loss_matches_reference(name, spec, over, native_on, monkeypatch):
    """(The native form runs where a C compiler is: hidden 16 is a size it takes.)"""
    monkeypatch.setattr(native, "_ON", native_on)
    algo = _build(name, spec, **over)
    buf = SyntheticBuffer(spec, 500, seed=1)
    for _ in range(2):  # move away from the initial weights
        algo.update(buf)
    batch = buf(24)
    target, _ = algo.compute_target(batch)
    state = algo.gen.get_state()
    loss, stats = algo.critic_loss(batch, target)
    params = list(algo.critic.parameters())
    got = grads(loss, params)

    # the same random draws, in the order critic_loss makes them
    algo.gen.set_state(state)
    B, n, A = batch.actions.shape
    extra = algo.policy_cql_samples(batch)
    own = torch.rand(B, n, algo.cfg.n_sampled_actions, A, generator=algo.gen) * 2 - 1
    jit = None
    if algo.cfg.other_action_jitter > 0:
        jit = (torch.rand(batch.actions.shape, generator=algo.gen) * 2 - 1) * algo.cfg.other_action_jitter
    loss_r = _ref_critic_loss(algo, batch, target, own, extra, jit)
    assert torch.allclose(loss.detach(), loss_r.detach(), rtol=1e-5)
    assert_close_grads(got, grads(loss_r, params), torch.float32, [k for k, _ in algo.critic.named_parameters()])
    assert math.isfinite(float(stats["cql/raw_cf_q"])) and math.isfinite(float(stats["cql/lse_q"]))


def test_penalty_diagnostics_match_reference():
    """cql/lse_q = mean over members and states of the agent-averaged logsumexp; cql/raw_cf_q = mean of
    Q - log p over all counterfactual rows."""
    g = torch.Generator().manual_seed(4)
    critic = make_critic(2, 5, 6, 8, True, torch.float32)
    state, actions = torch.randn(7, 5, generator=g), torch.rand(7, 3, 2, generator=g) * 2 - 1
    q = critic(state, actions.reshape(7, 1, -1))[:, :, 0]
    pen, st = cf_cql_penalty(critic, state, actions, q, 4, torch.Generator().manual_seed(9))
    own = torch.rand(7, 3, 4, 2, generator=torch.Generator().manual_seed(9)) * 2 - 1
    logp = torch.full((7, 3, 4), 2 * math.log(0.5))
    X = torch.cat([state.unsqueeze(1).expand(7, 12, 5), counterfactual_joint(actions, own)], -1).reshape(84, -1)
    qc = ref_q(critic, X).view(2, 7, 3, 4) - logp
    pol = torch.logsumexp(qc, -1).mean(-1)
    assert torch.allclose(pen, (pol - q).mean(-1), rtol=1e-5, atol=1e-6)
    assert torch.allclose(st["cql/lse_q"], pol.mean(), rtol=1e-5)
    assert torch.allclose(st["cql/raw_cf_q"], qc.mean(), rtol=1e-5, atol=1e-6)


def test_stacked_input_norm_matches_batchnorm():
    """StackedInputNorm's two-pass statistics = BatchNorm1d in training mode (output, running stats,
    gradients with respect to the input and the affine parameters)."""
    from plcql_bench.algorithms.common.nets import StackedInputNorm

    g = torch.Generator().manual_seed(5)
    x = (torch.randn(3, 64, 7, generator=g, dtype=torch.float64) * 4 + 2).requires_grad_()
    norm = StackedInputNorm(3, 7).double()
    with torch.no_grad():
        norm.weight.uniform_(0.5, 1.5, generator=g)
        norm.bias.uniform_(-1, 1, generator=g)
    y = norm(x)
    up = torch.randn(y.shape, generator=g, dtype=torch.float64)
    gx, gw, gb = torch.autograd.grad((y * up).sum(), [x, norm.weight, norm.bias])
    for e in range(3):
        bn = torch.nn.BatchNorm1d(7, momentum=0.1).double()
        with torch.no_grad():
            bn.weight.copy_(norm.weight[e, 0])
            bn.bias.copy_(norm.bias[e, 0])
        xe = x.detach()[e].clone().requires_grad_()
        ye = bn(xe)
        assert torch.allclose(y[e], ye, rtol=1e-10, atol=1e-12)
        assert torch.allclose(norm.running_mean[e, 0], bn.running_mean, rtol=1e-10)
        assert torch.allclose(norm.running_var[e, 0], bn.running_var, rtol=1e-10)
        gxe, gwe, gbe = torch.autograd.grad((ye * up[e]).sum(), [xe, bn.weight, bn.bias])
        assert torch.allclose(gx[e], gxe, rtol=1e-9, atol=1e-12)
        assert torch.allclose(gw[e, 0], gwe, rtol=1e-9) and torch.allclose(gb[e, 0], gbe, rtol=1e-9)


# -- the plain path (kernels switched off) against the fused one ----------------------------------------


def _same_critics(E, S, nA, H, input_norm, dtype):
    fused = make_critic(E, S, nA, H, input_norm, dtype)
    plain = make_critic(E, S, nA, H, input_norm, dtype)
    plain.fused = False
    assert fused.fused and all(torch.equal(a, b) for a, b in zip(fused.parameters(), plain.parameters()))
    return fused, plain


@pytest.mark.parametrize("input_norm", [True, False], ids=["bn", "nobn"])
def test_plain_critic_matches_fused_trunk(input_norm):
    """EnsembleCritic with fused=False (plain torch) = the `_FusedTrunk` path: values, parameter and
    action gradients, for R = 1 and R > 1, members= slices and frozen= calls."""
    fused, plain = _same_critics(4, 7, 6, 8, input_norm, torch.float64)
    g = torch.Generator().manual_seed(11)
    state = torch.randn(9, 7, generator=g, dtype=torch.float64)
    for R, members, frozen in [(1, None, False), (5, None, False), (3, slice(1, 3), False), (3, slice(0, 1), True)]:
        acts = (torch.rand(9, R, 6, generator=g, dtype=torch.float64) * 2 - 1).requires_grad_()
        up = torch.randn(fused(state, acts, members).shape, generator=g, dtype=torch.float64)
        outs = []
        for c in (fused, plain):
            q = c(state, acts, members=members, frozen=frozen)
            params = ([] if frozen else list(c.parameters())) + [acts]
            gr = torch.autograd.grad((q * up).sum(), params, allow_unused=True)
            outs.append((q.detach(), [torch.zeros_like(p) if x is None else x for p, x in zip(params, gr)]))
        assert torch.allclose(outs[0][0], outs[1][0], rtol=1e-12, atol=1e-12)
        assert_close_grads(outs[0][1], outs[1][1], torch.float64)


@pytest.mark.parametrize("case", ["mpe", "temp-weights", "members"])
def test_plain_lse_penalty_matches_blocked(case):
    """The penalty's critic part on a plain critic (continuous.lse_penalty in torch) = `_BlockedLSE` on a fused one."""
    E, B, S, n, A, M = 3, 11, 5, 3, 2, 4
    fused, plain = _same_critics(E, S, n * A, 8, True, torch.float64)
    g = torch.Generator().manual_seed(12)
    state = torch.randn(B, S, generator=g, dtype=torch.float64)
    joint = counterfactual_joint(torch.rand(B, n, A, generator=g, dtype=torch.float64) * 2 - 1,
                                 torch.rand(B, n, M, A, generator=g, dtype=torch.float64) * 2 - 1)
    offset = torch.randn(B, n, M, generator=g, dtype=torch.float64)
    w, temp, members = torch.full((n,), 1 / n, dtype=torch.float64), 1.0, None
    if case == "temp-weights":
        w, temp = torch.rand(B, n, generator=g, dtype=torch.float64), 0.4
    if case == "members":
        members = slice(1, 3)
    res = []
    for c in (fused, plain):
        pol, zsum = lse_penalty(c, state, joint, n, offset, w, temp, members=members)
        res.append((pol.detach(), zsum, grads(pol.sum(), list(c.parameters()))))
    assert torch.allclose(res[0][0], res[1][0], rtol=1e-12) and torch.allclose(res[0][1], res[1][1], rtol=1e-12)
    assert_close_grads(res[0][2], res[1][2], torch.float64)


@pytest.mark.parametrize("name,spec", [("cfcql", CN), ("cfcql", HC), ("plcql", CN), ("spacql", HC)],
                         ids=["cfcql-cn", "cfcql-hc", "plcql-cn", "spacql-hc"])
def test_algorithm_rounds_plain_match_fused(name, spec, monkeypatch):
    """Whole update rounds with the kernels switched off (the runner's PLCQL_KERNELS=plain) stay within
    float rounding of the fused rounds: same random draws, same logged values, same parameters. (The fused
    rounds in their torch form; the native form against these: test_algorithm_rounds_native_match_torch_form.)"""
    monkeypatch.setattr(native, "_ON", False)
    results = []
    for on in (True, False):
        C.use_fused(on)
        try:
            algo = _build(name, spec, **({"n_critics": 2} if spec is HC else {}))
        finally:
            C.use_fused(True)
        assert algo.critic.fused is on and algo.target_critic.fused is on
        buf = SyntheticBuffer(spec, 500, seed=1)
        metrics = [algo.update(buf) for _ in range(2)]
        results.append((metrics, {k: v.detach().clone() for k, v in algo.critic.state_dict().items()}))
    _assert_rounds_close(*results)


@needs_cc
@pytest.mark.parametrize("name,spec", [("cfcql", CN), ("cfcql", HC), ("plcql", CN), ("spacql", HC)],
                         ids=["cfcql-cn", "cfcql-hc", "plcql-cn", "spacql-hc"])
def test_algorithm_rounds_native_match_torch_form(name, spec, block_forms, monkeypatch):
    """Whole fused update rounds with the C form of the blocked penalty (csrc/cql_block_*.c) against the same
    rounds in its torch form (PLCQL_NATIVE=0), with the plain-vs-fused test's tolerances, both with the
    batch in one block. (Whole rounds are compared at one block partition: after two Adam steps at lr 0.01 a
    gradient entry near zero moves its parameter by more than these tolerances under a change of float
    summation order. On PLCQL CN, member 6's l2.weight[0, 10] moves by 1.4e-4 between the torch form at
    4 KiB blocks and at the runs' blocks, as between the torch form and the C form at 4 KiB blocks. The
    penalty's values and gradients in the C form, at several blocks with a ragged last one, are checked
    directly against the reference: test_native_lse_penalty_matches_reference, and with each algorithm's
    random draws: test_algorithm_critic_loss_matches_reference.)"""
    monkeypatch.setattr(C, "BLOCK_BYTES", 1 << 30)
    results = []
    for on in (True, False):
        with native.native_kernels(on):
            algo = _build(name, spec, **({"n_critics": 2} if spec is HC else {}))
            buf = SyntheticBuffer(spec, 500, seed=1)
            metrics = [algo.update(buf) for _ in range(2)]
        results.append((metrics, {k: v.detach().clone() for k, v in algo.critic.state_dict().items()}))
        assert block_forms["native" if on else "torch"] > 0
    _assert_rounds_close(*results)


def _assert_rounds_close(first, second):
    (m_f, p_f), (m_p, p_p) = first, second
    for a, b in zip(m_f, m_p):
        assert a.keys() == b.keys()
        for k in a:
            assert math.isclose(a[k], b[k], rel_tol=1e-3, abs_tol=1e-4), (k, a[k], b[k])
    for k in p_f:
        assert torch.allclose(p_f[k], p_p[k], rtol=1e-4, atol=1e-5), k


def test_add_relu_is_add_then_relu_bitwise():
    g = torch.Generator().manual_seed(13)
    x, y = torch.randn(3, 40, 9, generator=g), torch.randn(3, 40, 1, generator=g)
    assert torch.equal(C._add_relu_(x.clone(), y), (x + y).relu())


def test_cpu_block_size_follows_the_threads(monkeypatch):
    """1.5 MiB of block per torch thread, up to 2 threads (the native form: 512 KiB, or twice the [E, H, H]
    weights where that is more); a fixed BLOCK_BYTES wins; a GPU takes one block."""
    monkeypatch.setattr(C, "BLOCK_BYTES", None)  # the module's fixture fixes it
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        assert C.block_bytes(torch.device("cpu")) == 3 << 19
        assert C.block_bytes(torch.device("cpu"), True, 2 * 64 * 64 * 4) == 1 << 19
        assert C.block_bytes(torch.device("cpu"), True, 2 * 256 * 256 * 4) == 1 << 20
        torch.set_num_threads(2)
        assert C.block_bytes(torch.device("cpu")) == 3 << 20
        assert C.block_bytes(torch.device("cpu"), True, 2 * 64 * 64 * 4) == 1 << 20
        monkeypatch.setattr(C, "BLOCK_BYTES", 4096)
        assert C.block_bytes(torch.device("cpu")) == 4096
    finally:
        torch.set_num_threads(threads)
    assert C.block_bytes(torch.device("meta")) == C.GPU_BLOCK_BYTES


def test_softmax_last_matches_torch_softmax():
    """The CF-CQL block's softmax over the M candidates: torch's values up to rounding, for large and
    negative-infinite scores too (a row of only -inf is NaN both ways)."""
    g = torch.Generator().manual_seed(3)
    z = torch.randn(4, 6, 3, 10, generator=g, dtype=torch.float64) * 50.0
    z[0, 0, 0, :4] = -math.inf
    torch.testing.assert_close(C.softmax_last(z), torch.softmax(z, dim=-1), rtol=1e-12, atol=1e-15)
    z32 = z.float()
    torch.testing.assert_close(C.softmax_last(z32), torch.softmax(z32, dim=-1), rtol=2e-6, atol=1e-7)
    assert (C.softmax_last(z32)[0, 0, 0, :4] == 0).all()
    z32[1, 1, 1] = -math.inf
    assert C.softmax_last(z32)[1, 1, 1].isnan().all() and torch.softmax(z32, -1)[1, 1, 1].isnan().all()
    assert not C.softmax_last(z32).isnan()[0].any()


def test_workspace_pool_reuses_only_free_buffers(monkeypatch):
    """A buffer is handed out again only after it was given back; buffers in use are never shared; and
    critic calls that reuse pooled buffers give the same numbers as the first call."""
    ws = C._Workspace(min_bytes=0)
    like = torch.zeros(1)
    a, b = ws.take((4, 5), like), ws.take((4, 5), like)
    assert a.data_ptr() != b.data_ptr()
    ws.give(a)
    ws.give(a)  # given twice: pooled once
    assert ws.take((4, 5), like).data_ptr() == a.data_ptr()
    assert ws.take((4, 5), like).data_ptr() not in (a.data_ptr(), b.data_ptr())
    monkeypatch.setattr(C, "_WORKSPACE", C._Workspace(min_bytes=0))  # pool the small test activations too
    critic = make_critic(3, 6, 6, 64, True, torch.float32)
    state, acts = torch.randn(64, 6, generator=torch.Generator().manual_seed(1)), torch.rand(64, 30, 6)
    first = None
    for i in range(3):
        q = critic(state, acts)
        gr = grads(q.square().sum(), list(critic.parameters()))
        assert sum(len(v) for v in C._WORKSPACE.free.values()) == 3  # h1, h2, dh1 given back after backward
        if first is None:
            first = (q.detach(), gr)
        assert torch.equal(q.detach(), first[0]) and all(torch.equal(x, y) for x, y in zip(gr, first[1]))


def test_runner_sets_the_kernels_once_per_process(monkeypatch):
    """PLCQL_KERNELS=plain|fused is read by the runner's configure_process (not by an algorithm); any
    other value is one line naming the variable."""
    from plcql_bench.suite.core.errors import BenchError
    from plcql_bench.suite.runs.runner import KERNELS_ENV, configure_process

    try:
        monkeypatch.setenv(KERNELS_ENV, "plain")
        configure_process("cpu")
        assert not C.fused_default() and not _build("cfcql", CN).critic.fused
        monkeypatch.setenv(KERNELS_ENV, "fused")
        configure_process("cpu")
        assert C.fused_default() and _build("cfcql", CN).critic.fused
        monkeypatch.setenv(KERNELS_ENV, "fast")
        with pytest.raises(BenchError, match="PLCQL_KERNELS: must be 'fused' or 'plain', got 'fast'"):
            configure_process("cpu")
    finally:
        C.use_fused(True)


@pytest.fixture
def restore_denormals():
    """Leave the process's denormal mode (configure_process sets it) as the test found it."""
    before = C.denormals_flushed()
    yield
    C.flush_denormals(before)


TINY = 1e-39  # a float32 denormal (the smallest normal float32 is ~1.18e-38)


def test_runner_flushes_denormals_unless_told_not_to(monkeypatch, restore_denormals):
    """configure_process flushes CPU denormals to zero by default (kernels.flush_denormals), not with
    PLCQL_FLUSH_DENORMALS=0; any other value is one line naming the variable. The run records which."""
    from plcql_bench.suite.core.errors import BenchError
    from plcql_bench.suite.runs.runner import FLUSH_DENORMALS_ENV, configure_process, kernel_choice

    if not C.flush_denormals(True):
        pytest.skip("this CPU cannot flush denormals")
    monkeypatch.delenv(FLUSH_DENORMALS_ENV, raising=False)
    configure_process("cpu")
    assert (torch.tensor([TINY]) * 1.0).item() == 0.0 and kernel_choice()["flush_denormals"] is True
    monkeypatch.setenv(FLUSH_DENORMALS_ENV, "0")
    configure_process("cpu")
    assert (torch.tensor([TINY]) * 1.0).item() > 0.0 and kernel_choice()["flush_denormals"] is False
    monkeypatch.setenv(FLUSH_DENORMALS_ENV, "yes")
    with pytest.raises(BenchError, match="PLCQL_FLUSH_DENORMALS: must be '1' .* or '0', got 'yes'"):
        configure_process("cpu")


@pytest.mark.parametrize("name", ["cfcql", "plcql"])
def test_algorithm_rounds_match_with_denormals_flushed(name, restore_denormals):
    """Whole update rounds with denormals flushed to zero stay within the plain-vs-fused tolerances of the same
    rounds without, from critics with every 7th entry of their hidden weight matrices a denormal (the slow path
    a decayed critic takes), so flushing is a speed setting, not a change of what is computed. (Not a whole
    unit's weights: a pre-activation that is itself denormal sits on ReLU's kink, where flushed it is 0 and its
    gradient 0, unflushed it is positive and its gradient 1.)"""
    if not C.flush_denormals(True):
        pytest.skip("this CPU cannot flush denormals")
    results = []
    for on in (False, True):
        C.flush_denormals(on)
        algo = _build(name, CN)
        hidden = {key: p for key, p in algo.critic.named_parameters() if key in ("l1.weight", "l2.weight")}
        assert len(hidden) == 2
        with torch.no_grad():
            for p in hidden.values():
                p.view(-1)[::7] = TINY
        buf = SyntheticBuffer(CN, 500, seed=1)
        metrics = [algo.update(buf) for _ in range(2)]
        results.append((metrics, {k: v.detach().clone() for k, v in algo.critic.state_dict().items()}))
    _assert_rounds_close(*results)


# -- the native form of the blocked penalty (csrc/cql_block_*.c) ---------------------------------------

def _penalty_and_grads(critic, state, joint, n, offset, w, temp, members, native_on):
    with native.native_kernels(native_on):
        pol, zsum = lse_penalty(critic, state, joint, n, offset, w, temp, members=members)
    up = torch.arange(1, pol.shape[0] + 1, dtype=pol.dtype)  # a different upstream gradient per member
    got = torch.autograd.grad((pol * up).sum(), list(critic.parameters()), allow_unused=True)
    return pol.detach(), zsum, [torch.zeros_like(p) if x is None else x for p, x in zip(critic.parameters(), got)], up


@needs_cc
@pytest.mark.parametrize("input_norm", [True, False], ids=["bn", "nobn"])
@pytest.mark.parametrize("case", ["mpe", "hc", "temp", "weights_bn", "members", "seven", "ten", "run-mpe", "run-hc"])
def test_native_lse_penalty_matches_reference(case, input_norm, block_forms, monkeypatch):
    """The C form of the blocked penalty (float32 on the CPU) against the plain-autograd reference, with the
    reference test's tolerances: MPE (uniform candidates) and HalfCheetah shapes (policy candidates with their
    densities), lse_temp != 1, per-state weights, `members=` slices, 7 members (passes of 4 and 3 members) and
    10 (PLCQL/SPaCQL: two passes of 5), several blocks and a ragged last one; `run-*`: the runs' sizes (hidden 64 with 3 agents x 10 candidates; hidden
    256 with 2 agents x 30), fewer states."""
    g = torch.Generator().manual_seed(17)
    E, B, S, n, A, M, H = 2, 13, 5, 3, 2, 4, 16
    offset_kind, temp, weights, members = "uniform", 1.0, None, None
    if case in ("hc", "run-hc"):
        n, A, M, H, offset_kind = 2, 3, 12, 32, "random"
    if case == "run-mpe":
        B, M, H = 21, 10, 64
        monkeypatch.setattr(C, "BLOCK_BYTES", 2 * 30 * 64 * 4 * 4)  # 4 states a block: 6 blocks, the last 1
    if case == "run-hc":
        B, S, M, H = 11, 17, 30, 256
        monkeypatch.setattr(C, "BLOCK_BYTES", 2 * 60 * 256 * 4 * 3)
    if case == "temp":
        temp, offset_kind = 0.3, None
    if case == "weights_bn":
        weights = torch.rand(B, n, generator=g)
    if case == "members":
        E, members = 5, slice(1, 4)
    if case == "ten":
        E = 10
    if case == "seven":
        E = 7
    critic = make_critic(E, S, n * A, H, input_norm, torch.float32)
    state = torch.randn(B, S, generator=g) * 2 + 1
    joint = counterfactual_joint(torch.rand(B, n, A, generator=g) * 2 - 1, torch.rand(B, n, M, A, generator=g) * 2 - 1)
    offset = {"uniform": torch.full((B, n, M), A * math.log(0.5)), None: None,
              "random": torch.randn(B, n, M, generator=g) * 3}[offset_kind]
    w = weights if weights is not None else torch.full((n,), 1.0 / n)
    pol, zsum, got, up = _penalty_and_grads(critic, state, joint, n, offset, w, temp, members, True)
    assert block_forms == {"native": 1, "torch": 0}
    rng = range(*members.indices(E)) if members is not None else None
    pol_r, zsum_r = ref_lse(critic, state, joint, n, offset, w, temp, rng)
    assert pol.shape == pol_r.shape and torch.allclose(pol, pol_r, rtol=1e-5, atol=1e-5)
    assert torch.allclose(zsum, zsum_r, rtol=1e-5, atol=1e-5 * B * n * M)
    exp = torch.autograd.grad((pol_r * up).sum(), list(critic.parameters()), allow_unused=True)
    exp = [torch.zeros_like(p) if x is None else x for p, x in zip(critic.parameters(), exp)]
    assert_close_grads(got, exp, torch.float32, [k for k, _ in critic.named_parameters()])
    # and against the torch form of the same blocks
    pol_t, zsum_t, got_t, _ = _penalty_and_grads(critic, state, joint, n, offset, w, temp, members, False)
    assert block_forms == {"native": 1, "torch": 1}
    assert torch.allclose(pol, pol_t, rtol=1e-6, atol=1e-6) and torch.allclose(zsum, zsum_t, rtol=1e-5, atol=1e-4)
    assert_close_grads(got, got_t, torch.float32, [k for k, _ in critic.named_parameters()])
    with torch.no_grad(), native.native_kernels(True):  # the forward-only call: the same values
        pol_ng, zsum_ng = lse_penalty(critic, state, joint, n, offset, w, temp, members=members)
    assert block_forms["native"] == 2
    assert torch.allclose(pol_ng, pol, rtol=1e-6, atol=1e-6) and torch.allclose(zsum_ng, zsum)


@needs_cc
@pytest.mark.parametrize("block_bytes", [1, 1 << 30], ids=["one-state", "single-block"])
def test_native_block_size_does_not_change_the_result(block_bytes, block_forms, monkeypatch):
    """The C form with one state per block and with the whole batch in one block: the reference's numbers."""
    monkeypatch.setattr(C, "BLOCK_BYTES", block_bytes)
    g = torch.Generator().manual_seed(3)
    critic = make_critic(2, 6, 6, 16, True, torch.float32)
    state, data = torch.randn(9, 6, generator=g), torch.rand(9, 3, 2, generator=g)
    joint = counterfactual_joint(data, torch.rand(9, 3, 5, 2, generator=g))
    w = torch.full((3,), 1 / 3)
    pol, _ = lse_penalty(critic, state, joint, 3, None, w)
    pol_r, _ = ref_lse(critic, state, joint, 3, None, w, 1.0)
    assert block_forms["native"] == 1 and torch.allclose(pol, pol_r, rtol=1e-5, atol=1e-6)
    assert_close_grads(grads(pol.sum(), list(critic.parameters())), grads(pol_r.sum(), list(critic.parameters())),
                       torch.float32)


@needs_cc
def test_native_penalty_on_two_threads(block_forms):
    """At 2 torch threads the C passes split members (head, tail) and (member, state) pairs (layer1) over
    OpenMP threads: the 1-thread numbers, and the float64 reference's within float32 tolerances (10 members,
    several blocks). The inputs leave no hidden pre-activation within 1e-6 of 0 (checked): one within float32
    rounding of 0 lands on either side of its ReLU depending on the CPU's summation order (the seed used until
    2026-12-07 had one at 7e-9; on an AVX-512 machine every float32 form took the other side from float64, which
    moved l2.weight's gradient by 9e-4 of 3.3)."""
    g = torch.Generator().manual_seed(23)
    critic = make_critic(10, 5, 6, 32, True, torch.float32)
    state = torch.randn(17, 5, generator=g)
    joint = counterfactual_joint(torch.rand(17, 3, 2, generator=g) * 2 - 1, torch.rand(17, 3, 6, 2, generator=g) * 2 - 1)
    offset, w = torch.randn(17, 3, 6, generator=g), torch.full((3,), 1 / 3)
    threads = torch.get_num_threads()
    res = []
    try:
        for n_threads in (2, 1):
            torch.set_num_threads(n_threads)
            res.append(_penalty_and_grads(critic, state, joint, 3, offset, w, 1.0, None, True))
    finally:
        torch.set_num_threads(threads)
    assert block_forms == {"native": 2, "torch": 0}
    assert torch.allclose(res[0][0], res[1][0], rtol=1e-6, atol=1e-7) and torch.allclose(res[0][1], res[1][1])
    for x, y in zip(res[0][2], res[1][2]):
        assert torch.allclose(x, y, rtol=1e-5, atol=1e-6 * float(y.abs().max()))
    c64 = make_critic(10, 5, 6, 32, True, torch.float64)
    c64.load_state_dict({k: v.double() for k, v in critic.state_dict().items()})
    rows = critic_rows(state.double(), joint.double())
    with torch.no_grad():
        assert min(float(p.abs().min()) for e in range(10) for p in preactivations(c64, rows, e)) > 1e-6
    pol_r, _ = ref_lse(c64, state.double(), joint.double(), 3, offset.double(), w.double(), 1.0)
    exp = torch.autograd.grad((pol_r * res[0][3].double()).sum(), list(c64.parameters()))
    assert torch.allclose(res[0][0].double(), pol_r, rtol=1e-5, atol=1e-6)
    assert_close_grads([x.double() for x in res[0][2]], exp, torch.float32, [k for k, _ in critic.named_parameters()])


def test_native_member_passes_split_the_ensemble_evenly():
    assert [C.native_member_group(E) for E in (1, 2, 5, 6, 7, 10, 11)] == [1, 2, 5, 3, 4, 5, 4]


@needs_cc
def test_native_penalty_per_member_offsets(block_forms):
    """OMAR's CQL logsumexp (`blocked_lse`, independent.py) gives each member its own offsets [E, B, G, M]:
    the C form reads each member's rows of them (7 members: passes of 4 and 3)."""
    g = torch.Generator().manual_seed(5)
    E, B, nA, H, G, M = 7, 9, 4, 16, 2, 5
    args = [torch.randn(E, B, H, generator=g), torch.randn(E, nA, H, generator=g) * 0.5,
            torch.randn(E, H, H, generator=g) * 0.3, torch.randn(E, 1, H, generator=g) * 0.1,
            torch.randn(E, H, 1, generator=g), torch.randn(E, 1, 1, generator=g)]
    a = torch.rand(B * G * M, nA, generator=g) * 2 - 1
    off, w = torch.randn(E, B, G, M, generator=g), torch.rand(B, G, generator=g)
    res = []
    for on in (True, False):
        leaves = [t.clone().requires_grad_() for t in args]
        with native.native_kernels(on):
            pol, zsum = C.blocked_lse(*leaves, a, off, w, 0.7)
        res.append((pol.detach(), zsum, torch.autograd.grad((pol * torch.arange(1.0, E + 1)).sum(), leaves)))
    assert block_forms == {"native": 1, "torch": 1}
    assert torch.allclose(res[0][0], res[1][0], rtol=1e-5, atol=1e-6)
    assert torch.allclose(res[0][1], res[1][1], rtol=1e-5, atol=1e-5)
    assert_close_grads(res[0][2], res[1][2], torch.float32)


@needs_cc
def test_native_penalty_off_or_unusable_takes_the_torch_form(block_forms, monkeypatch, tmp_path):
    """PLCQL_NATIVE=0, float64, a hidden size that is not a multiple of 16, or no working compiler: the torch
    loop runs (no error), with the reference's numbers."""
    g = torch.Generator().manual_seed(8)

    def penalty(H, dtype):
        critic = make_critic(2, 4, 6, H, True, dtype)
        state = torch.randn(6, 4, generator=g, dtype=dtype)
        joint = counterfactual_joint(torch.rand(6, 3, 2, generator=g, dtype=dtype),
                                     torch.rand(6, 3, 4, 2, generator=g, dtype=dtype))
        w = torch.full((3,), 1 / 3, dtype=dtype)
        pol, _ = lse_penalty(critic, state, joint, 3, None, w)
        assert torch.allclose(pol, ref_lse(critic, state, joint, 3, None, w, 1.0)[0], rtol=1e-5)

    monkeypatch.setenv(native.ENV, "0")
    penalty(16, torch.float32)
    assert block_forms == {"native": 0, "torch": 1}
    monkeypatch.delenv(native.ENV)
    penalty(16, torch.float64)
    penalty(24, torch.float32)
    assert block_forms == {"native": 0, "torch": 3}
    penalty(16, torch.float32)
    assert block_forms == {"native": 1, "torch": 3}
    monkeypatch.setattr(native, "_LIBS", {})
    monkeypatch.setenv("PLCQL_NATIVE_CACHE", str(tmp_path))  # nothing built there yet
    monkeypatch.setenv("CC", "no-such-compiler-xyz")
    with pytest.warns(RuntimeWarning, match="torch form"):
        penalty(16, torch.float32)
    assert block_forms == {"native": 1, "torch": 4}

