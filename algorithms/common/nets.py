"""Vectorised ("stacked") networks: E independent MLPs evaluated with batched matmuls.

One `StackedMLP` holds E networks with weights of shape [E, in, out]; a forward pass on an input of
shape [E, B, in] (or a shared [B, in], broadcast to every member) is one `torch.baddbmm` per layer.
It is used for
  * Q-ensembles (E = 2 twins for CFCQL, E = 10 for PLCQL), all members in one call;
  * per-agent actors (E = n_agents, independent parameters per agent, all agents in one call).

There are no Python loops over members or agents in any forward or backward pass.

Initialisation follows `torch.nn.Linear` per member (weights and biases ~ U(-1/sqrt(in), 1/sqrt(in))),
so a stacked network is distributed exactly like E separately built `nn.Linear` stacks.

Optional input normalisation (`input_norm=True`) reproduces the `BatchNorm1d` that the OMAR/CFCQL
reference MLPs put on their input: in training mode each call is normalised with the statistics of
*that call's* batch (per member, over the batch axis), then a per-member affine transform
(weight 1, bias 0 at init) is applied; running statistics (momentum 0.1, unbiased variance) are
tracked and used in eval mode, as `nn.BatchNorm1d` does.
"""

from __future__ import annotations

import math
from contextlib import contextmanager
from typing import Iterable, Iterator

import torch
from torch import nn


class StackedLinear(nn.Module):
    """E independent linear layers. weight [E, in, out], bias [E, 1, out]."""

    def __init__(self, n_members: int, in_dim: int, out_dim: int, generator: torch.Generator | None = None,
                 init_scale: float | None = None) -> None:
        super().__init__()
        self.n_members, self.in_dim, self.out_dim = n_members, in_dim, out_dim
        bound = 1.0 / math.sqrt(in_dim)
        w = torch.empty(n_members, in_dim, out_dim)
        b = torch.empty(n_members, 1, out_dim)
        # weights: nn.Linear default (kaiming_uniform with a=sqrt(5) == U(+-1/sqrt(fan_in)));
        # init_scale overrides the weight bound (reference actors use U(+-3e-3) for the last layer).
        w.uniform_(-(init_scale if init_scale is not None else bound),
                   init_scale if init_scale is not None else bound, generator=generator)
        b.uniform_(-bound, bound, generator=generator)
        self.weight = nn.Parameter(w)
        self.bias = nn.Parameter(b)

    def forward(self, x: torch.Tensor, members: slice | None = None, frozen: bool = False) -> torch.Tensor:
        """x: [E, B, in] (or [B, in], shared by all members) -> [E, B, out]. `members`: only those members
        (x then has their count on its leading axis); `frozen`: no gradient to the weights."""
        w, b = self.weight, self.bias
        if members is not None:
            w, b = w[members], b[members]
        if frozen:
            w, b = w.detach(), b.detach()
        if x.dim() == 2:
            x = x.unsqueeze(0).expand(w.shape[0], -1, -1)
        return torch.baddbmm(b, x, w)

    def extra_repr(self) -> str:
        return f"members={self.n_members}, in={self.in_dim}, out={self.out_dim}"


class StackedInputNorm(nn.Module):
    """BatchNorm1d over the input features, one independent normaliser per member.

    x: [E, B, in]. Training: batch statistics over B (biased variance for normalising, as
    BatchNorm1d). Eval: running statistics. The affine weight/bias are per member.
    `track_running_stats=False` skips the running statistics (for networks that are never
    evaluated in eval mode, e.g. critics).
    """

    def __init__(self, n_members: int, dim: int, eps: float = 1e-5, momentum: float = 0.1,
                 track_running_stats: bool = True) -> None:
        super().__init__()
        self.eps, self.momentum, self.track = eps, momentum, track_running_stats
        self.weight = nn.Parameter(torch.ones(n_members, 1, dim))
        self.bias = nn.Parameter(torch.zeros(n_members, 1, dim))
        if track_running_stats:
            self.register_buffer("running_mean", torch.zeros(n_members, 1, dim))
            self.register_buffer("running_var", torch.ones(n_members, 1, dim))

    def stats(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Batch mean and biased variance over axis -2 (any leading axes are kept). Two passes (sum,
        then the centred sum of squares): torch.var_mean's math, ~2-3x faster on CPU for these narrow
        [E, B, in] inputs (var_mean reduces one strided column at a time)."""
        n = x.shape[-2]
        mean = x.sum(-2, keepdim=True) / n
        xc = x - mean
        return mean, (xc * xc).sum(-2, keepdim=True) / n

    def update_running(self, mean: torch.Tensor, var: torch.Tensor, n: int, members: slice | None = None) -> None:
        if not self.track:
            return
        sl = members if members is not None else slice(None)
        with torch.no_grad():
            unbiased = var * (n / max(n - 1, 1))
            rm, rv = self.running_mean[sl], self.running_var[sl]
            # out of place, then copied: the same numbers as lerp_, and vmappable without a per-seed loop
            # (algorithms/common/stacked.py)
            rm.copy_(torch.lerp(rm, mean.detach().expand_as(rm), self.momentum))
            rv.copy_(torch.lerp(rv, unbiased.detach().expand_as(rv), self.momentum))

    def forward(self, x: torch.Tensor, members: slice | None = None, frozen: bool = False) -> torch.Tensor:
        """x [E', B, in] for the members `members` (all: E' = E); `frozen`: no gradient to the affine
        parameters (running statistics are still updated in training mode, as every call does)."""
        sl = members if members is not None else slice(None)
        w, b = self.weight[sl], self.bias[sl]
        if frozen:
            w, b = w.detach(), b.detach()
        if self.training or not self.track:
            mean, var = self.stats(x)
            self.update_running(mean, var, x.shape[-2], members)
        else:
            mean, var = self.running_mean[sl], self.running_var[sl]
        return (x - mean) * torch.rsqrt(var + self.eps) * w + b


class StackedMLP(nn.Module):
    """E independent MLPs: [input norm] -> (Linear -> ReLU) x n_hidden -> Linear [-> tanh].

    Matches the reference `MLPNetwork` (2 hidden layers, ReLU, optional input BatchNorm, tanh
    output with the last layer's weights ~ U(+-3e-3) for actors) when built with the defaults
    used in `continuous.py`.
    """

    def __init__(self, n_members: int, in_dim: int, out_dim: int, hidden: int = 64, n_hidden: int = 2,
                 input_norm: bool = False, tanh_out: bool = False, last_init_scale: float | None = None,
                 generator: torch.Generator | None = None, activation: str = "relu") -> None:
        super().__init__()
        self.act = {"relu": torch.relu, "mish": torch.nn.functional.mish}[activation]
        self.n_members, self.in_dim, self.out_dim = n_members, in_dim, out_dim
        self.norm = StackedInputNorm(n_members, in_dim) if input_norm else None
        dims = [in_dim] + [hidden] * n_hidden
        self.hidden = nn.ModuleList(StackedLinear(n_members, a, b, generator) for a, b in zip(dims[:-1], dims[1:]))
        self.out = StackedLinear(n_members, dims[-1], out_dim, generator, init_scale=last_init_scale)
        self.tanh_out = tanh_out

    def forward(self, x: torch.Tensor, members: slice | None = None, frozen: bool = False) -> torch.Tensor:
        """x: [E, B, in] or shared [B, in] -> [E, B, out]. `members`: evaluate only those members (x's
        leading axis then counts them); `frozen`: no gradient to any parameter (only to x)."""
        if x.dim() == 2:
            x = x.unsqueeze(0).expand(len(range(self.n_members)[members or slice(None)]), -1, -1)
        if self.norm is not None:
            x = self.norm(x, members, frozen)
        for layer in self.hidden:
            x = self.act(layer(x, members, frozen))
        x = self.out(x, members, frozen)
        return torch.tanh(x) if self.tanh_out else x


@contextmanager
def buffers_restored(module: nn.Module) -> Iterator[None]:
    """Run code that calls `module` in training mode without leaving a trace in its buffers (the input
    normalisers' running statistics, which evaluation uses): they are restored on exit."""
    saved = [b.clone() for b in module.buffers()]
    try:
        yield
    finally:
        with torch.no_grad():
            for b, v in zip(module.buffers(), saved):
                b.copy_(v)


def polyak_(target: nn.Module, online: nn.Module, tau: float) -> None:
    """target <- (1 - tau) * target + tau * online, over parameters (not buffers, as the references'
    `soft_update` / `update_exponential_moving_average`). One fused foreach lerp, target + tau *
    (online - target): the same update as the references' mul-then-add up to float rounding. The
    one soft target update of every algorithm (continuous and discrete)."""
    with torch.no_grad():
        t = [p for p in target.parameters()]
        o = [p for p in online.parameters()]
        torch._foreach_lerp_(t, o, tau)


def hard_update_(target: nn.Module, online: nn.Module) -> None:
    """target <- online, parameters and buffers (a full state-dict copy). The one hard target update."""
    target.load_state_dict(online.state_dict())


def clip_grad_norm_stacked_(params: Iterable[nn.Parameter], max_norm: float, n_members: int) -> torch.Tensor:
    """Clip the gradient norm of each member separately (member = leading axis of every parameter).

    Equivalent to calling `clip_grad_norm_(net_e.parameters(), max_norm)` on E separate networks
    (the reference clips each agent's policy on its own). Returns the per-member norms [E].
    """
    grads = [p.grad for p in params if p.grad is not None]
    if not grads:
        return torch.zeros(n_members)
    sq = torch.stack([g.reshape(n_members, -1).pow(2).sum(1) for g in grads]).sum(0)
    norms = sq.sqrt()
    coef = (max_norm / (norms + 1e-6)).clamp(max=1.0)
    for g in grads:
        g.mul_(coef.view(-1, *([1] * (g.dim() - 1))))
    return norms
