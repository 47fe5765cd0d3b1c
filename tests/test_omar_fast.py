"""OMAR's fast path (`IndepCritics.fused`, kernels.py's switch) against the plain one, which is the code as it was before it:

  * IndepCritics.sampled_lse (observation part of the first layer once per observation, the input
    normaliser folded in, cache-blocked forward+backward) vs concatenated [o_i, a_i] rows through
    the stacked MLP and a logsumexp: values and the gradient of every critic parameter, MPE's constant
    offset and Half-Cheetah's per-agent offsets, several blocks, with and without input normalisation;
  * IndepCritics.sampled_q (the search's Q_1, blocked, no gradient) vs the plain call's first twin,
    and the running statistics both leave;
  * StackedMLP member slices and frozen calls;
  * three whole OMAR rounds (MPE softmax search, Half-Cheetah CEM + policy samples), fused vs plain from
    the same seed: every parameter and every metric.
"""

from __future__ import annotations

import copy
import math

import pytest
import torch

from plcql_bench.algorithms.base import get_algorithm, make_config
from plcql_bench.algorithms.common import kernels
from plcql_bench.algorithms.common.independent import IndepCritics
from plcql_bench.algorithms.common.nets import StackedMLP
from plcql_bench.algorithms.common.speed import SyntheticBuffer
from plcql_bench.suite.core.spec import TaskSpec

torch.set_num_threads(1)
F64 = torch.float64
CN = TaskSpec("mpe-cn", "mpe", n_agents=3, obs_dim=18, state_dim=54, act_dim=2, discrete=False,
              episode_limit=25, tiers=("expert", "medium", "medium-replay", "random"))
HC = TaskSpec("mamujoco-halfcheetah-2x3", "mamujoco", n_agents=2, obs_dim=6, state_dim=17, act_dim=3,
              discrete=False, episode_limit=1000, tiers=("expert", "medium", "medium-replay", "random"))


@pytest.fixture(autouse=True)
def small_blocks(monkeypatch):
    monkeypatch.setattr(kernels, "BLOCK_BYTES", 4096)  # several observation blocks and a ragged last one


def critics(n, o, A, input_norm, seed=0):
    c = IndepCritics(n, 2, o, A, 8, input_norm, torch.Generator().manual_seed(seed)).to(F64)
    with torch.no_grad():  # non-trivial normaliser affine parameters
        if input_norm:
            c.mlp.norm.weight.uniform_(0.5, 1.5, generator=torch.Generator().manual_seed(seed + 1))
            c.mlp.norm.bias.uniform_(-0.5, 0.5, generator=torch.Generator().manual_seed(seed + 2))
        c.mlp.out.weight.mul_(4.0)
    return c


def data(B, R, n, o, A, seed=3):
    g = torch.Generator().manual_seed(seed)
    obs = torch.randn(B, n, o, generator=g, dtype=F64) * 2 + 1
    samples = torch.rand(B, R, n, A, generator=g, dtype=F64) * 2 - 1
    return obs, samples, g


@pytest.mark.parametrize("input_norm", [True, False], ids=["bn", "nobn"])
@pytest.mark.parametrize("offsets", ["constant", "per_agent"])
def test_sampled_lse_matches_concatenated_rows(input_norm, offsets):
    B, R, n, o, A, T = 13, 5, 3, 4, 2, 0.7
    crit = critics(n, o, A, input_norm)
    ref = copy.deepcopy(crit)
    obs, samples, g = data(B, R, n, o, A)
    off = (torch.full((B, R, n), A * math.log(0.5), dtype=F64) if offsets == "constant"
           else torch.randn(B, R, n, generator=g, dtype=F64))
    pol = crit.sampled_lse(obs, samples, off, T)  # [T·n]
    q = ref(obs.unsqueeze(1).expand(B, R, n, o), samples)  # [2, B, R, n]
    pol_r = (torch.logsumexp((q - off) / T, 2) * T).mean(1).reshape(-1)  # member t·n + i
    assert torch.allclose(pol, pol_r, rtol=1e-10)
    up = torch.arange(1, pol.numel() + 1, dtype=F64)  # a different upstream gradient per member
    got = torch.autograd.grad((pol * up).sum(), list(crit.parameters()))
    exp = torch.autograd.grad((pol_r * up).sum(), list(ref.parameters()))
    for (name, _), a, b in zip(crit.named_parameters(), got, exp):
        assert torch.allclose(a, b, rtol=1e-9, atol=1e-12), (name, (a - b).abs().max())
    for a, b in zip(crit.buffers(), ref.buffers()):  # running statistics as the plain call leaves them
        assert torch.allclose(a, b, rtol=1e-10)


def test_sampled_q_matches_the_first_twin():
    B, R, n, o, A = 11, 6, 3, 4, 2
    crit = critics(n, o, A, True)
    ref = copy.deepcopy(crit)
    obs, samples, _ = data(B, R, n, o, A)
    both = copy.deepcopy(crit)(obs.unsqueeze(1).expand(B, R, n, o), samples)  # the plain call, both twins
    q1 = crit.sampled_q(obs, samples)[0]  # [B, R, n]
    q1_r = ref(obs.unsqueeze(1).expand(B, R, n, o), samples, twins=1)[0]
    assert torch.allclose(q1, q1_r, rtol=1e-10) and torch.allclose(q1_r, both[0], rtol=1e-12)
    for a, b in zip(crit.buffers(), ref.buffers()):
        assert torch.allclose(a[:n], b[:n], rtol=1e-10)  # first twin updated alike
        assert torch.equal(a[n:], b[n:])  # second twin untouched by either
    shared = crit.obs_part(obs, slice(0, n))
    assert torch.allclose(crit.sampled_q(obs, samples, 1, shared)[0], q1, rtol=1e-12)


def test_stacked_mlp_member_slices_and_frozen_calls():
    g = torch.Generator().manual_seed(0)
    mlp = StackedMLP(4, 5, 2, hidden=8, input_norm=True, generator=g).to(F64)
    x = torch.randn(4, 7, 5, generator=g, dtype=F64, requires_grad=True)
    full = mlp(x)
    part = mlp(x[1:3], slice(1, 3))
    assert torch.allclose(part, full[1:3], rtol=1e-12)
    frozen = mlp(x, frozen=True)
    assert torch.equal(frozen, full)
    gx, = torch.autograd.grad(frozen.sum(), [x])
    gx_r, = torch.autograd.grad(full.sum(), [x], retain_graph=True)
    assert torch.allclose(gx, gx_r) and all(p.grad is None for p in mlp.parameters())


@pytest.mark.parametrize("spec", [CN, HC], ids=["mpe-cn", "halfcheetah"])
def test_omar_rounds_match_the_plain_path(spec):
    cls = get_algorithm("omar")
    ov = {**cls.task_overrides(spec, "medium"), "batch_size": 48, "hidden": 16, "omar_coe": 0.7, "lr": 1e-4}
    runs = {}
    for fused in (True, False):
        torch.manual_seed(0)
        with kernels.fused_kernels(fused):  # PLCQL_KERNELS=plain builds the critics on the plain path
            algo = cls(spec, make_config(cls, ov), 0)
        assert algo.critic.fused == fused and algo.target_critic.fused == fused
        buf = SyntheticBuffer(spec, 500, seed=1)
        runs[fused] = (algo, [algo.update(buf) for _ in range(3)])
    (fa, fm), (pa, pm) = runs[True], runs[False]
    for key, mod in fa.modules().items():
        for (name, p), q in zip(mod.named_parameters(), pa.modules()[key].parameters()):
            assert torch.allclose(p, q, rtol=1e-4, atol=1e-6), (key, name, (p - q).abs().max())
    for a, b in zip(fm, pm):
        assert a.keys() == b.keys()
        for k in a:
            assert abs(a[k] - b[k]) <= 1e-4 * max(1.0, abs(b[k])), (k, a[k], b[k])
