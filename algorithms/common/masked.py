"""Masked operations over the last axis (available actions), shared by the discrete machinery
(discrete.py, which re-exports them as its public API) and its fused kernels (kernels_discrete.py),
which both import this module: it imports neither."""

from __future__ import annotations

import torch

# Finite stand-in for log(0) in returned log-probabilities (exp() of it is exactly 0 in float32,
# and 0 * NEG is 0, where 0 * -inf would be NaN).
NEG = -1e10

# --------------------------------------------------------------------------------------------
# Masked operations. `avail` is any tensor broadcastable to x with 1/True = available. Rows (the
# last axis) with NO available action occur only on padding; every function returns a finite,
# documented value there and never NaN, in the value or the gradient.


def _prep(x: torch.Tensor, avail: torch.Tensor, fill: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(x with unavailable entries = fill, availability as bool, rows that have any available).
    In rows with nothing available every entry counts as available, so that reductions over them
    stay finite; callers then overwrite those rows."""
    ok = (avail > 0).expand_as(x)
    any_ok = ok.any(-1, keepdim=True)
    ok_eff = ok | ~any_ok
    return x.masked_fill(~ok_eff, fill), ok, any_ok


def masked_argmax(x: torch.Tensor, avail: torch.Tensor) -> torch.Tensor:
    """argmax over the last axis among available entries (int64, last axis dropped). A row with no
    available action returns 0."""
    filled, _, any_ok = _prep(x, avail, float("-inf"))
    return torch.where(any_ok[..., 0], filled.argmax(-1), torch.zeros((), dtype=torch.long, device=x.device))


def masked_logsumexp(x: torch.Tensor, avail: torch.Tensor, keepdim: bool = False) -> torch.Tensor:
    """log sum_{available j} exp(x_j) over the last axis. Unavailable entries contribute nothing
    (value and gradient exactly 0). A row with no available action returns 0."""
    filled, _, any_ok = _prep(x, avail, float("-inf"))
    lse = torch.logsumexp(filled, -1, keepdim=True)
    out = torch.where(any_ok, lse, torch.zeros_like(lse))
    return out if keepdim else out[..., 0]


def masked_log_softmax(x: torch.Tensor, avail: torch.Tensor) -> torch.Tensor:
    """log softmax over the available entries of the last axis; unavailable entries hold NEG
    (probability exactly 0). A row with no available action is all 0 (callers mask it)."""
    filled, ok, any_ok = _prep(x, avail, float("-inf"))
    logp = filled - torch.logsumexp(filled, -1, keepdim=True)
    logp = torch.where(ok, logp, torch.full_like(logp, NEG))
    return torch.where(any_ok, logp, torch.zeros_like(logp))


def masked_softmax(x: torch.Tensor, avail: torch.Tensor) -> torch.Tensor:
    """softmax over the available entries (unavailable: exactly 0). A row with nothing available
    is all 0."""
    filled, ok, any_ok = _prep(x, avail, float("-inf"))
    p = torch.softmax(filled, -1)
    return torch.where(ok & any_ok, p, torch.zeros_like(p))


def masked_sample(logits: torch.Tensor, avail: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
    """One sample per row from softmax(logits) restricted to the available entries (Gumbel-max
    with `generator`); uniform logits (zeros) sample uniformly among the available actions. A row
    with no available action returns 0."""
    u = torch.rand(logits.shape, generator=generator, device=logits.device, dtype=logits.dtype)
    gumbel = -torch.log(-torch.log(u.clamp(1e-20, 1.0 - 1e-7)))
    return masked_argmax(logits + gumbel, avail)


def masked_uniform_sample(avail: torch.Tensor, num: int, generator: torch.Generator | None = None) -> torch.Tensor:
    """`num` independent draws per row, uniform over the row's available actions: avail [..., A] ->
    int64 [..., num]. Memory O(rows × (A + num)), no [..., num, A] intermediate. A row with no
    available action returns 0."""
    ok = (avail > 0).to(torch.float32)
    count = ok.sum(-1, keepdim=True)  # [..., 1]
    u = torch.rand(avail.shape[:-1] + (num,), generator=generator, device=avail.device)
    k = torch.minimum((u * count).floor(), (count - 1).clamp_min(0))  # the k-th available (0-based)
    idx = torch.searchsorted(ok.cumsum(-1).contiguous(), k.contiguous(), right=True)
    return torch.where(count > 0, idx, torch.zeros_like(idx))


def masked_mean(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """sum(x * mask) / sum(mask) (mask broadcast to x), 0 when the mask is empty."""
    mask = mask.expand_as(x)
    return (x * mask).sum() / mask.sum().clamp_min(1.0)
