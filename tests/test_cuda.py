"""CUDA-only checks, skipped where no GPU is visible (CI has none). On a GPU machine:
`pytest tests/test_cuda.py`. They cover what the CPU tests cannot: the one-block `_BlockedLSE` path
that CUDA takes, and every algorithm's rounds with its tensors on the device."""

from __future__ import annotations

import copy
import math

import numpy as np
import pytest
import torch

import plcql_bench.algorithms.common.kernels as C
from plcql_bench.algorithms.common.continuous import lse_penalty
from plcql_bench.algorithms.base import get_algorithm, implementations, load_all, make_config
from plcql_bench.algorithms.common.continuous import counterfactual_joint
from plcql_bench.algorithms.common.speed import SyntheticBuffer, batch_field, synthetic_episodes
from test_discrete_machinery import SPEC as SMAX, check_acts_available
from test_speed_equivalence import CN, make_critic

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")

CONTINUOUS = sorted(n for n in load_all() if "continuous" in implementations(n))
DISCRETE = sorted(n for n in load_all() if "discrete" in implementations(n))


def test_cuda_takes_one_block_and_matches_the_cpu_blocks():
    B, n, M = 64, 3, 10
    assert C.block_bytes(torch.device("cuda")) >= 10 * B * n * M * 64 * 8  # the whole batch in one block
    g = torch.Generator().manual_seed(0)
    critic = make_critic(10, 10, 6, 64, True, torch.float64)
    state = torch.randn(B, 10, generator=g, dtype=torch.float64)
    data = torch.rand(B, n, 2, generator=g, dtype=torch.float64) * 2 - 1
    joint = counterfactual_joint(data, torch.rand(B, n, M, 2, generator=g, dtype=torch.float64) * 2 - 1)
    w = torch.full((n,), 1 / n, dtype=torch.float64)
    results = []
    for dev in ("cpu", "cuda"):
        c = copy.deepcopy(critic).to(dev)
        pol, _ = lse_penalty(c, state.to(dev), joint.to(dev), n, None, w.to(dev))
        gr = torch.autograd.grad(pol.sum(), list(c.parameters()))
        results.append((pol.cpu(), [x.cpu() for x in gr]))
    (p_cpu, g_cpu), (p_gpu, g_gpu) = results
    assert torch.allclose(p_cpu, p_gpu, rtol=1e-10)
    for a, b in zip(g_cpu, g_gpu):
        assert torch.allclose(a, b, rtol=1e-8, atol=1e-12 * max(1.0, float(a.abs().max())))


@pytest.mark.parametrize("name", CONTINUOUS)
def test_rounds_on_cuda_give_finite_host_floats(name):
    cls = get_algorithm(name, discrete=False)
    algo = cls(CN, make_config(cls, {batch_field(cls): 64}), 0, "cuda")
    buf = SyntheticBuffer(CN, 1000, device="cuda")
    for _ in range(2):
        m = algo.update(buf)
        assert m and all(type(v) is float and math.isfinite(v) for v in m.values()), m
    a = algo.act(np.zeros((5, 3, 6), dtype=np.float32))
    assert a.shape == (5, 3, 2) and np.all(np.abs(a) <= 1)


@pytest.mark.parametrize("name", DISCRETE)
@pytest.mark.filterwarnings("error:RNN module weights:UserWarning")  # target GRUs keep one cuDNN weight buffer
def test_discrete_rounds_on_cuda_give_finite_host_floats(name):
    cls = get_algorithm(name, discrete=True)
    over = {"batch_episodes": 4, "behaviour_max_updates": 3}
    algo = cls(SMAX, make_config(cls, {k: v for k, v in over.items() if hasattr(cls.Config(), k)}), 0, "cuda")
    sampler = synthetic_episodes(SMAX, n_episodes=8, device="cuda")
    for _ in range(2):
        m = algo.update(sampler)
        assert m and all(type(v) is float and math.isfinite(v) for v in m.values()), m
    check_acts_available(algo)
