"""Shared machinery for the continuous-action actor-critic algorithms (CFCQL, PLCQL, later SPaCQL).

Follows CFCQL's `continuous/` MATD3CC (`--cql --cf_cql --central_critic`), itself built on the OMAR
backbone (reference-implementations.md §4.0, §4.3):
  * a centralised critic ensemble Q_j(s, a_1..a_n) over the global state and the joint action
    (`EnsembleCritic`, E members in one batched call);
  * decentralised deterministic tanh actors, one independent MLP per agent (`Actors`, stacked);
  * target networks with Polyak averaging;
  * the counterfactual CQL penalty (`cf_cql_penalty`), cache-blocked over states (`_BlockedLSE`:
    forward and backward per block of states; docs/algorithms/cfcql.md "Speed");
  * per-network gradient-norm clipping.

Shapes: B = batch, n = agents, A = per-agent action dim, E = ensemble members, R = joint actions
evaluated per state (R = 1 for a plain call, R = n * n_samples for the CF-CQL term).
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import nn

from plcql_bench.algorithms.base import Batch
from plcql_bench.algorithms.common.protocol import Checkpointable, DeterministicActors
from plcql_bench.algorithms.common.nets import (
    StackedInputNorm,
    StackedLinear,
    StackedMLP,
    clip_grad_norm_stacked_,
    hard_update_,
    polyak_,
)
from plcql_bench.suite.core.spec import TaskSpec

# --------------------------------------------------------------------------------------------
# Per-task reference settings (reference-implementations.md §4.0 / §4.3)
# --------------------------------------------------------------------------------------------

# CFCQL continuous `env_config_map` (maddpg_cc.py ~l.643): cql_alpha per task and dataset tier.
CFCQL_ALPHA: dict[str, dict[str, float]] = {
    "mpe-cn": {"random": 0.5, "medium-replay": 1.0, "medium": 5.0, "expert": 2.5},
    "mpe-pp": {"random": 0.5, "medium-replay": 0.5, "medium": 0.6, "expert": 2.0},
    "mpe-world": {"random": 0.5, "medium-replay": 0.5, "medium": 0.32, "expert": 0.3},
    "mamujoco": {"random": 0.1, "medium-replay": 0.4, "medium": 1.0, "expert": 1.7},
}


def backbone_overrides(spec: TaskSpec) -> dict[str, Any]:
    """Network/optimiser settings of the CFCQL continuous code for a task (§4.3).

    MPE: hidden 64, batch 1024, tau 0.01, gamma 0.95, lr 0.01 on CN (simple_spread) else 0.001.
    HalfCheetah (task ids starting with "mamujoco"): hidden 256, batch 256, lr 3e-4, tau 0.005,
    gamma 0.99.
    """
    if spec.task_id.startswith("mamujoco"):
        # HalfCheetah branch of maddpg_cc.py: uniform + noisy current- and next-policy samples
        # (--sample_action_class 1-1-1, --cql_sample_noise_level 0.2, --beta_action_noise 1e-5)
        return dict(hidden=256, batch_size=256, lr=3e-4, tau=0.005, gamma=0.99, sample_action_class="1-1-1",
                    other_action_jitter=1e-5)
    if spec.task_id.startswith("mpe"):
        return dict(hidden=64, batch_size=1024, lr=0.01 if spec.task_id == "mpe-cn" else 0.001,
                    tau=0.01, gamma=0.95)
    return {}


def cql_alpha_override(spec: TaskSpec, tier: str) -> dict[str, Any]:
    """cql_alpha from algorithms/configs/cfcql.yaml (the same table as CFCQL_ALPHA above, which is kept
    as a readable copy; a test checks they agree)."""
    from plcql_bench.algorithms.common.configs import tier_table

    return {k: v for k, v in tier_table("cfcql", spec, tier).items() if k == "cql_alpha"}


# --------------------------------------------------------------------------------------------
# Networks
# --------------------------------------------------------------------------------------------


class Actors(nn.Module):
    """n independent deterministic tanh actors (reference `MLPNetwork(constrain_out=True)`):
    [input BatchNorm] -> 2 x (Linear, ReLU) -> Linear (weights U(+-3e-3)) -> tanh."""

    def __init__(self, n_agents: int, obs_dim: int, act_dim: int, hidden: int, input_norm: bool,
                 generator: torch.Generator | None = None) -> None:
        super().__init__()
        self.mlp = StackedMLP(n_agents, obs_dim, act_dim, hidden=hidden, input_norm=input_norm,
                              tanh_out=True, last_init_scale=3e-3, generator=generator)

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        """obs [B, n, obs_dim] -> actions [B, n, act_dim] in (-1, 1)."""
        return self.mlp(obs.transpose(0, 1)).transpose(0, 1)


class EnsembleCritic(nn.Module):
    """E independent centralised critics Q_j(s, a_joint), evaluated in one batched call.

    Each member is [input BatchNorm] -> Linear(S + nA, H) -> ReLU -> Linear(H, H) -> ReLU ->
    Linear(H, 1), like the reference `DoubleMLPNetwork` branches. The first layer is split into a
    state part and an action part, so that when R joint actions are evaluated for the same state
    (the CF-CQL term evaluates R = n * n_samples of them) the state part is computed once per state
    and broadcast, which is mathematically identical to evaluating the concatenated input.

    Input normalisation (reference BatchNorm1d in training mode) uses the statistics of the call's
    batch per feature; since every state is repeated exactly R times, the statistics of the state
    columns over the repeated batch equal those over the B states, so the split is exact. The
    per-member affine transform of the normaliser is folded into the first layer's weights.
    Critics are never evaluated in eval mode, so no running statistics are kept.
    """

    def __init__(self, n_members: int, state_dim: int, joint_act_dim: int, hidden: int, input_norm: bool,
                 generator: torch.Generator | None = None) -> None:
        super().__init__()
        self.n_members, self.state_dim, self.joint_act_dim = n_members, state_dim, joint_act_dim
        self.input_norm = input_norm
        if input_norm:
            self.norm = StackedInputNorm(n_members, state_dim + joint_act_dim, track_running_stats=False)
        self.l1 = StackedLinear(n_members, state_dim + joint_act_dim, hidden, generator)
        self.l2 = StackedLinear(n_members, hidden, hidden, generator)
        self.l3 = StackedLinear(n_members, hidden, 1, generator)

    @staticmethod
    def _stats(x: torch.Tensor, eps: float = 1e-5) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Batch mean [1, F], 1 / sqrt(biased variance + eps) [1, F] and x - mean of x [N, F] (BatchNorm1d's
        training-mode statistics). Two passes (sum, then the centred sum of squares): the same math as
        torch.var_mean, ~3x faster on CPU for these narrow row-major matrices (var_mean reduces a
        column at a time)."""
        n = x.shape[0]
        mean = x.sum(0, keepdim=True) / n
        xc = x - mean
        return mean, torch.rsqrt((xc * xc).sum(0, keepdim=True) / n + eps), xc

    @classmethod
    def _standardise(cls, x: torch.Tensor, eps: float = 1e-5) -> torch.Tensor:
        mean, rstd, xc = cls._stats(x, eps)
        return xc * rstd

    def state_part(self, state: torch.Tensor, members: slice | None = None) -> torch.Tensor:
        """The first layer's state part without bias, standardised state @ (g_s * W1_s): [E', B, H].
        Calls on the same states (the TD loss and the CF-CQL term of one critic update) can share it
        via `state_part=`: one GEMM and one backward GEMM instead of one per call (the state columns'
        BatchNorm statistics are those of the B states in either call)."""
        sl = members if members is not None else slice(None)
        P = self._params(sl, False)
        w1_s = P["l1.weight"][:, :self.state_dim]
        s = state
        if self.input_norm:
            s = self._standardise(s)
            w1_s = w1_s * P["norm.weight"][:, 0, :self.state_dim].unsqueeze(-1)
        return torch.bmm(s.unsqueeze(0).expand(w1_s.shape[0], *s.shape), w1_s)

    def _first_layer(self, state: torch.Tensor, a: torch.Tensor, sl: slice, fold_actions: bool = False,
                     frozen: bool = False, state_part: torch.Tensor | None = None
                     ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The first layer split into its state part and its action part, with the input normaliser
        folded in. state [B, S], a [B*R, nA] -> h_s [E, B, H] (bias included), a' [B*R, nA], w1_a
        [E, nA, H]; the first layer is h_s[state of the row] + a' @ w1_a.

        a' is the standardised a, or with `fold_actions` a itself: the action columns' standardisation
        is then folded into the weights as well, (a - mu) * r * g @ W = a @ (r g * W) - (mu r g) @ W,
        which saves two passes over the CF-CQL term's [B*R, nA] actions. (Only used there: its action
        columns contain uniform samples, so no column has a mean large against its spread, where the
        folded form would lose precision to cancellation.) `state_part`: `self.state_part(state)` for
        the same members, computed once for several calls."""
        S = self.state_dim
        P = self._params(sl, frozen)
        w1, b1 = P["l1.weight"], P["l1.bias"]
        E, B = w1.shape[0], state.shape[0]
        w1_s, w1_a = w1[:, :S], w1[:, S:]
        s = state
        if self.input_norm:
            g, beta = P["norm.weight"], P["norm.bias"]  # [E, 1, S + nA]
            if state_part is None:
                s = self._standardise(s)
                # (x * g + beta) @ W + b = x @ (g^T * W) + (beta @ W + b)
                w1_s = w1_s * g[:, 0, :S].unsqueeze(-1)
            b1 = b1 + torch.bmm(beta, w1)
            if fold_actions:
                mean, rstd, _ = self._stats(a)
                ga = g[:, 0, S:] * rstd  # [E, nA]
                b1 = b1 - torch.bmm((mean * ga).unsqueeze(1), w1_a)
                w1_a = w1_a * ga.unsqueeze(-1)
            else:
                a = self._standardise(a)
                w1_a = w1_a * g[:, 0, S:].unsqueeze(-1)
        if state_part is not None:
            h_s = state_part + b1
        else:
            h_s = torch.baddbmm(b1, s.unsqueeze(0).expand(E, B, S), w1_s)  # [E, B, H]
        return h_s, a, w1_a

    def _params(self, sl: slice, frozen: bool) -> dict[str, torch.Tensor]:
        """The selected members' parameters, detached when `frozen` (no weight gradients wanted)."""
        out = {}
        for name, p in self.named_parameters():
            p = p[sl]
            out[name] = p.detach() if frozen else p
        return out

    def forward(self, state: torch.Tensor, actions: torch.Tensor, members: slice | None = None,
                frozen: bool = False, state_part: torch.Tensor | None = None) -> torch.Tensor:
        """state [B, S], actions [B, R, nA] -> Q [E', B, R] (E' = members selected, default all).
        `frozen`: the parameters are treated as constants (gradients flow to the actions only, as the
        actors' loss needs; saves the weight-gradient work in backward)."""
        B, R, nA = actions.shape
        sl = members if members is not None else slice(None)
        if frozen and state_part is not None:
            raise ValueError("state_part carries the parameters' gradient path: not with frozen=True")
        h_s, a, w1_a = self._first_layer(state, actions.reshape(B * R, nA), sl, frozen=frozen,
                                         state_part=state_part)
        P = self._params(sl, frozen)
        E = h_s.shape[0]
        if R == 1 and not self.fused_r1:
            h = torch.baddbmm(h_s, a.unsqueeze(0).expand(E, B, nA), w1_a).relu_()
            h = torch.baddbmm(P["l2.bias"], h, P["l2.weight"]).relu_()
            q = torch.baddbmm(P["l3.bias"], h, P["l3.weight"])
            return q.view(E, B, R)
        args = (h_s, a, w1_a, P["l2.weight"], P["l2.bias"], P["l3.weight"], P["l3.bias"])
        keep = torch.is_grad_enabled() and any(t.requires_grad for t in args)
        q = _FusedTrunk.apply(*args, keep)
        return q.view(E, B, R)

    def lse_penalty(self, state: torch.Tensor, actions: torch.Tensor, n_groups: int, offset: torch.Tensor | None,
                    weights: torch.Tensor, temp: float = 1.0, members: slice | None = None,
                    state_part: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """The CF-CQL term's critic part, cache-blocked over states (`_BlockedLSE`).

        state [B, S], actions [B, G * M, nA] (G = n_groups groups of M candidates per state),
        offset [B, G, M] or None (subtracted from Q), weights [G] or [B, G]. With
        z = Q_j(s, a) - offset:
            pol_j = mean_b sum_g weights_g * T * logsumexp_m(z / T)              -> [E']
        Returns pol [E'] and the sum of z over all rows [E'] (detached, for diagnostics). Same value and gradients as evaluating
        `self(state, actions, members)` and reducing with autograd (tests/test_speed_equivalence.py),
        but every activation block is forwarded and backpropagated while it is in cache."""
        B, R, nA = actions.shape
        sl = members if members is not None else slice(None)
        if actions.requires_grad:  # gradients w.r.t. the actions: not needed by the algorithms, plain path
            q = self(state, actions, members, state_part=state_part)
            E = q.shape[0]
            z = q.view(E, B, n_groups, R // n_groups)
            if offset is not None:
                z = z - offset
            lse = torch.logsumexp(z / temp, dim=-1) * temp
            pol = (lse * weights).sum(-1)
            return pol.mean(-1), z.detach().sum((1, 2, 3))
        h_s, a, w1_a = self._first_layer(state, actions.reshape(B * R, nA), sl, fold_actions=True,
                                         state_part=state_part)
        P = self._params(sl, False)
        args = (h_s, w1_a, P["l2.weight"], P["l2.bias"], P["l3.weight"], P["l3.bias"])
        keep = torch.is_grad_enabled() and any(t.requires_grad for t in args)
        w = weights.detach().to(h_s.dtype).expand(B, n_groups).contiguous()
        off = None if offset is None else offset.detach().to(h_s.dtype).reshape(B, n_groups, R // n_groups)
        return _BlockedLSE.apply(*args, a.detach(), off, w, float(temp), keep)

    fused_r1 = True  # R = 1 calls (TD, targets) too: autograd's dW3 = h^T g is a slow layout on CPU


class _FusedTrunk(torch.autograd.Function):
    """The critic from the first layer's action part on, for R joint actions per state, with a
    hand-written backward that works in place on the saved activations.

        h1 = relu(a @ W1a + h_s[state of the row])      [E, B*R, H]
        h2 = relu(h1 @ W2 + b2)                          [E, B*R, H]
        q  = h2 @ w3 + b3                                [E, B*R]

    a [B*R, nA] (rows grouped by state: row b*R + r belongs to state b), h_s [E, B, H] (the state
    part of the first layer, bias included). Mathematically the same graph as autograd's; the
    differences are in memory traffic, which dominates on CPU for the CF-CQL term's large
    [E, B*R, H] activations:
      * forward: the broadcast add and both ReLUs are in place (no copies);
      * backward: the ReLU masks are taken in place from the saved post-ReLU activations
        (sign_() of a ReLU output is its 0/1 derivative), and the output layer's weight w3 is folded
        into the small [H, H] matrices instead of being multiplied into the big gradient:
        dh2 = m2 * g * w3^T  =>  dW2 = (h1^T (m2 * g)) * w3^T and dh1 = (m2 * g) @ (W2 * w3^T)^T.
    The saved activations are overwritten by backward, so the graph can be backpropagated once
    (no retain_graph / double backward), which is all the algorithms do.
    """

    @staticmethod
    def forward(ctx, h_s, a, w1a, w2, b2, w3, b3, keep):
        E, B, H = h_s.shape
        BR = a.shape[0]
        h1 = _WORKSPACE.take((E, BR, H), h_s)
        torch.matmul(a, w1a, out=h1)  # [E, BR, H]
        h1.view(E, B, BR // B, H).add_(h_s.unsqueeze(2))
        h1.relu_()
        h2 = torch.baddbmm(b2, h1, w2, out=_WORKSPACE.take((E, BR, H), h_s)).relu_()
        # [E, 1, H] @ [E, H, BR]: a batched GEMV laid out so that MKL streams h2 row-major
        # (h2 @ w3 as [E, BR, H] @ [E, H, 1] is ~4x slower on CPU)
        q = torch.baddbmm(b3, w3.transpose(1, 2), h2.transpose(1, 2))  # [E, 1, BR]
        if keep:  # a backward will come (decided by the caller: inside forward grad mode is off)
            ctx.save_for_backward(a, w1a, w2, w3, h1, h2)
            ctx.B = B
        else:  # no backward will come: the activations go straight back to the pool
            _WORKSPACE.give(h1, h2)
        return q.view(E, BR)

    @staticmethod
    def backward(ctx, gq):
        if getattr(ctx, "done", False):
            raise RuntimeError("the fused critic trunk frees its activations in backward: no retain_graph")
        ctx.done = True
        a, w1a, w2, w3, h1, h2 = ctx.saved_tensors
        E, BR, H = h1.shape
        need = ctx.needs_input_grad
        g3 = gq.reshape(E, BR, 1)
        # dW3 = h2^T g as (g^T h2)^T: [E, 1, BR] @ [E, BR, H] (h2^T @ g is ~10x slower on CPU)
        dw3 = torch.bmm(g3.transpose(1, 2), h2).transpose(1, 2) if need[5] else None
        db3 = gq.sum(1).view(E, 1, 1) if need[6] else None
        w3t = w3.transpose(1, 2)  # [E, 1, H]
        m2 = h2.sign_()  # the ReLU derivative, in place
        # db2 = sum_r m2 * g * w3^T = (g^T m2) * w3^T: a GEMV (faster than a column sum)
        db2 = torch.bmm(g3.transpose(1, 2), m2).mul_(w3t) if need[4] else None
        d2 = m2.mul_(g3)  # m2 * g ; the true dh2 is d2 * w3^T
        dw2 = torch.bmm(h1.transpose(1, 2), d2).mul_(w3t) if need[3] else None
        dh1 = torch.bmm(d2, (w2 * w3t).transpose(1, 2), out=_WORKSPACE.take((E, BR, H), h1))  # [E, BR, H]
        dh1.mul_(h1.sign_())
        dw1a = torch.matmul(a.t(), dh1) if need[2] else None
        dh_s = dh1.view(E, ctx.B, BR // ctx.B, H).sum(2) if need[0] else None
        da = torch.matmul(dh1, w1a.transpose(1, 2)).sum(0) if need[1] else None
        _WORKSPACE.give(h1, h2, dh1)
        return dh_s, da, dw1a, dw2, db2, dw3, db3, None


BLOCK_BYTES = 3 << 20  # target size of one [E, rows, H] activation block of `_BlockedLSE` (tuned on CN:
# flat between 1 and 4 MiB for E = 2, best near 3 MiB for E = 10; 8 MiB and more spill the cache)
# On a GPU the blocks only multiply kernel launches (CN: ~80 blocks x ~12 kernels per critic update);
# one block of the whole batch takes ~0.7 GB at the paper's CN sizes (E 10, 90 candidates, hidden 64).
GPU_BLOCK_BYTES = 2 << 30


def block_bytes(device: torch.device) -> int:
    return BLOCK_BYTES if device.type == "cpu" else GPU_BLOCK_BYTES


def _add_relu_(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """x <- relu(x + y) in one pass (aten's fused _add_relu_ where available; bitwise the same)."""
    op = getattr(torch.ops.aten, "_add_relu_", None)
    if op is not None:
        try:
            return op.Tensor(x, y)
        except (RuntimeError, AttributeError):
            pass
    return x.add_(y).relu_()


class _BlockedLSE(torch.autograd.Function):
    """pol_j = mean_b sum_g w[b, g] * T * logsumexp_m(z_j[b, g, m] / T), z = critic trunk output - off,
    forwarded AND backpropagated block by block of states while the block's activations are in cache.

    Inputs as `_FusedTrunk` (h_s [E, B, H] with bias, w1a, w2, b2, w3, b3) plus a [B*R, nA] (rows grouped
    by state, no gradient), off [B, G, M] or None, w [B, G], T. Every pol_j depends only on member j's
    parameters and is a mean over states of per-state terms that depend only on that state's rows, so the
    gradient of pol_j with respect to member j's parameters is a sum over state blocks of the blocks'
    gradients, and dpol_j/dh_s[j, b] depends only on block(b)'s forward. These gradients (for an upstream
    gradient of 1 per member) are computed inside forward, block by block, and backward scales them by
    the upstream gradient of each member: the same numbers as autograd through the full [E, B*R, H]
    graph up to float summation order, without ever holding (or re-reading from memory) the full
    activations. The per-block backward is `_FusedTrunk`'s (in-place ReLU masks, w3 folded into the
    [H, H] matrices); d/dz of T*lse(z/T) is softmax_m(z/T). Checked against a plain-autograd reference
    in tests/test_speed_equivalence.py.
    """

    @staticmethod
    def forward(ctx, h_s, w1a, w2, b2, w3, b3, a, off, w, T, keep):
        E, B, H = h_s.shape
        G = w.shape[1]
        nA = a.shape[1]
        R = a.shape[0] // B
        M = R // G
        bs = max(1, min(B, block_bytes(h_s.device) // max(1, E * R * H * h_s.element_size())))  # states per block
        rows_max = bs * R
        # h1 carries a constant-1 column (H + 1 columns): the second layer's bias rides in its GEMM
        # (h1' @ [W2; b2]) instead of a pass that pre-fills h2 with b2, and in backward h1'^T d2 gives
        # [dW2; db2] in one GEMM. The column comes from the first layer: a @ [W1a, 0] + [h_s, 1].
        H1 = H + 1
        w1a_ = torch.cat([w1a, w1a.new_zeros(E, nA, 1)], 2)  # [E, nA, H + 1]
        h_s_ = torch.cat([h_s, h_s.new_ones(E, B, 1)], 2)  # [E, B, H + 1]
        w2_ = torch.cat([w2, b2], 1)  # [E, H + 1, H]
        buf1 = h_s.new_empty(E * rows_max * H1)
        buf2 = h_s.new_empty(E * rows_max * H)
        buf3 = torch.empty_like(buf2) if keep else None
        z_all = h_s.new_empty(E, B, G, M)  # z = Q - off, all states (small)
        wB = (w * (1.0 / B)).unsqueeze(-1)  # [B, G, 1]: d pol / d (T lse)
        w3t = w3.transpose(1, 2)  # [E, 1, H]
        if keep:
            dh_s = torch.empty_like(h_s)
            dw1a = torch.zeros_like(w1a)
            gw2 = h_s.new_zeros(E, H1, H)  # h1'^T (m2 * g) = [dW2; db2] / w3^T
            dw3t = h_s.new_zeros(E, 1, H)
            w23t = (w2 * w3t).transpose(1, 2)  # (W2 * w3^T)^T
        relu_bwd = torch.ops.aten.threshold_backward.grad_input  # (x > 0) * g, written into grad_input
        for b0 in range(0, B, bs):
            b1_ = min(B, b0 + bs)
            nb = b1_ - b0
            rows = nb * R
            a_c = a[b0 * R:b1_ * R].expand(E, rows, nA)
            h1 = buf1[:E * rows * H1].view(E, rows, H1)
            h2 = buf2[:E * rows * H].view(E, rows, H)
            torch.bmm(a_c, w1a_, out=h1)
            _add_relu_(h1.view(E, nb, R, H1), h_s_[:, b0:b1_].unsqueeze(2))
            torch.bmm(h1, w2_, out=h2).relu_()
            z = z_all[:, b0:b1_]
            # [E, 1, H] @ [E, H, rows]: the output layer as a GEMV streaming h2 row-major
            torch.baddbmm(b3, w3t, h2.transpose(1, 2), out=z.view(E, 1, rows))
            if off is not None:
                z.sub_(off[b0:b1_])
            if not keep:
                continue
            # d pol / d z = w * softmax_m(z / T) / B (the logsumexp itself is taken once, after the loop)
            gq = torch.softmax(z if T == 1.0 else z / T, dim=-1).mul_(wB[b0:b1_])
            g3 = gq.view(E, rows, 1)
            dw3t.baddbmm_(gq.view(E, 1, rows), h2)
            d2 = relu_bwd(g3, h2, 0, grad_input=h2)  # (h2 > 0) * g, in place of h2; dh2 = d2 * w3^T
            gw2.baddbmm_(h1.transpose(1, 2), d2)
            dh1 = buf3[:E * rows * H].view(E, rows, H)
            torch.bmm(d2, w23t, out=dh1)
            relu_bwd(dh1, h1[:, :, :H], 0, grad_input=dh1)
            dw1a.baddbmm_(a_c.transpose(1, 2), dh1)
            torch.sum(dh1.view(E, nb, R, H), 2, out=dh_s[:, b0:b1_])
        lse = torch.logsumexp(z_all if T == 1.0 else z_all / T, dim=-1)  # [E, B, G]
        pol = (lse * w).sum((1, 2)) * (T / B)
        zsum = z_all.sum((1, 2, 3))
        if keep:
            db3 = wB.sum().expand(E, 1, 1)  # sum of d pol / d z over rows = sum_b,g w / B (softmax sums to 1)
            gw2.mul_(w3t)
            ctx.save_for_backward(dh_s, dw1a, gw2[:, :H], gw2[:, H:], dw3t.transpose(1, 2), db3)
        ctx.mark_non_differentiable(zsum)
        return pol, zsum

    @staticmethod
    def backward(ctx, gpol, gzsum):
        dh_s, dw1a, dw2, db2, dw3, db3 = ctx.saved_tensors
        gv = gpol.view(-1, 1, 1)
        need = ctx.needs_input_grad
        return (dh_s * gv if need[0] else None, dw1a * gv if need[1] else None,
                dw2 * gv if need[2] else None, db2 * gv if need[3] else None,
                dw3 * gv if need[4] else None, db3 * gv if need[5] else None,
                None, None, None, None, None)


class _Workspace:
    """A small pool of large activation buffers for `_FusedTrunk`, reused across updates.

    Tensors above glibc's mmap threshold (32 MiB at most: the [10, 30720, 64] CF-CQL activations of a
    10-member ensemble are 79 MB) are mmapped on every allocation and unmapped on free, so each update
    re-faults them page by page (~58k page faults per PLCQL critic update). Buffers are taken when a
    forward/backward needs one and given back when that backward has finished (or right after a forward
    that will not be backpropagated); a buffer still in use is never handed out again, so nested or
    overlapping graphs just allocate fresh ones. Only buffers of at least `min_bytes` are pooled."""

    def __init__(self, min_bytes: int = 8 << 20, per_key: int = 4) -> None:
        self.free: dict[tuple, list[torch.Tensor]] = {}
        self.min_bytes, self.per_key = min_bytes, per_key

    def take(self, shape: tuple[int, ...], like: torch.Tensor) -> torch.Tensor:
        key = (shape, like.dtype, like.device)
        lst = self.free.get(key)
        if lst:
            return lst.pop()
        return torch.empty(shape, dtype=like.dtype, device=like.device)

    def give(self, *ts: torch.Tensor) -> None:
        for t in ts:
            if t.numel() * t.element_size() < self.min_bytes or not t.is_contiguous():
                continue
            lst = self.free.setdefault((tuple(t.shape), t.dtype, t.device), [])
            if len(lst) < self.per_key and all(t.data_ptr() != x.data_ptr() for x in lst):
                lst.append(t)


_WORKSPACE = _Workspace()


def keep_freed_memory() -> None:
    """Ask glibc malloc to keep freed memory for reuse instead of returning it to the OS.

    The CF-CQL term makes several [E, B*n*M, H] activations per update (16 MB each on MPE); with
    glibc's defaults they are mmapped/trimmed and re-faulted every update, which on this kind of
    VM costs ~35k page faults and ~100 ms per CFCQL round. Process-wide, idempotent, CPU only;
    silently does nothing where glibc is not available.
    """
    global _MALLOC_TUNED
    if _MALLOC_TUNED:
        return
    _MALLOC_TUNED = True
    try:
        import ctypes

        libc = ctypes.CDLL("libc.so.6")
        libc.mallopt(-3, 32 * 1024 * 1024)  # M_MMAP_THRESHOLD: glibc's maximum, 32 MiB
        libc.mallopt(-1, 2**31 - 1)  # M_TRIM_THRESHOLD: never trim the heap top
        libc.mallopt(-2, 64 * 1024 * 1024)  # M_TOP_PAD
    except (OSError, AttributeError):
        pass


_MALLOC_TUNED = False


# --------------------------------------------------------------------------------------------
# Joint-action helpers (all vectorised over agents)
# --------------------------------------------------------------------------------------------


def counterfactual_joint(dataset: torch.Tensor, own: torch.Tensor) -> torch.Tensor:
    """Joint actions where, for each agent i, only agent i deviates.

    dataset [B, n, A]: the dataset joint action; own [B, n, M, A]: M candidate actions of each agent.
    Returns [B, n * M, n * A]: row (i, m) has agent i at own[:, i, m] and every j != i at dataset[:, j].
    """
    B, n, M, A = own.shape
    joint = dataset.reshape(B, 1, 1, n, A).expand(B, n, M, n, A).clone()
    idx = torch.arange(n, device=own.device)
    joint[:, idx, :, idx] = own.transpose(0, 1).to(joint.dtype)  # block (i, i) <- agent i's candidates
    return joint.view(B, n * M, n * A)


def replace_agents(dataset: torch.Tensor, policy: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """dataset, policy [B, n, A]; mask [B, n] bool (True = take the policy's action)."""
    return torch.where(mask.unsqueeze(-1), policy, dataset)


def cf_cql_penalty(critic: EnsembleCritic, state: torch.Tensor, actions: torch.Tensor,
                   q_data: torch.Tensor, n_samples: int, generator: torch.Generator,
                   weights: torch.Tensor | None = None, soft_q: bool = True,
                   lse_temp: float = 1.0, extra: tuple[torch.Tensor, torch.Tensor] | None = None,
                   other_jitter: float = 0.0, state_part: torch.Tensor | None = None
                   ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Counterfactual CQL term of CFCQL (continuous, maddpg_cc.py):

        pen_j = mean_b [ sum_i lambda_i * T * logsumexp_m( (Q_j(s, a_i^m, a_-i) - log p(a_i^m)) / T )
                         - Q_j(s, a) ]

    with a_i^m ~ U[-1, 1]^A (m = 1..n_samples; log p = A log 1/2, subtracted when `soft_q`, the reference
    default), a_-i the dataset actions of the other agents, lambda_i = 1/n unless given (MPE branch).
    HalfCheetah branch (`sample_action_class="1-1-1"`): `extra` = (candidates [B, n, M', A], their
    log-densities [B, n, M']) are appended to agent i's uniform samples (noisy current- and next-policy
    actions), and `other_jitter` > 0 adds U(-jitter, jitter) noise to the other agents' dataset actions.
    All counterfactual joint actions go through ONE critic call.

    q_data [E, B]: the critic at the dataset joint action (from the TD loss). Returns the per-member
    penalty [E] and diagnostics.
    """
    B, n, A = actions.shape
    own = torch.rand(B, n, n_samples, A, generator=generator, device=actions.device) * 2 - 1
    logp = torch.full((B, n, n_samples), A * math.log(0.5), device=actions.device)
    if extra is not None:
        own = torch.cat([own, extra[0]], 2)
        logp = torch.cat([logp, extra[1]], 2)
    others = actions
    if other_jitter > 0:
        others = actions + (torch.rand(actions.shape, generator=generator, device=actions.device) * 2 - 1) * other_jitter
    M = own.shape[2]
    lam = torch.full((n,), 1.0 / n, device=actions.device) if weights is None else weights
    pol, zsum = critic.lse_penalty(state, counterfactual_joint(others, own), n, logp if soft_q else None,
                                   lam, lse_temp, state_part=state_part)  # [E]
    pen = pol - q_data.mean(-1)  # [E]
    return pen, {"cql/lse_q": pol.detach().mean(),
                 "cql/raw_cf_q": zsum.mean() / (B * n * M)}


def noisy_policy_samples(actors: "Actors", obs: torch.Tensor, n_samples: int, sigma: float,
                         generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """The reference's `get_policy_actions`: pi_i(o_i) + N(0, sigma) per sample, clipped to [-1, 1];
    log-density = sum over action dims of log N(noise; 0, sigma) (of the unclipped noise).
    obs [B, n, o] -> actions [B, n, M, A], log-densities [B, n, M]. No gradient (the reference's policy
    gradients from the critic loss are discarded)."""
    with torch.no_grad():
        a = actors(obs)  # [B, n, A]
        noise = torch.randn(*a.shape[:2], n_samples, a.shape[-1], generator=generator, device=a.device) * sigma
        logp = (-0.5 * (noise / sigma) ** 2 - math.log(sigma * math.sqrt(2 * math.pi))).sum(-1)
        return (a.unsqueeze(2) + noise).clamp(-1.0, 1.0), logp


def make_adam(params, lr: float) -> torch.optim.Optimizer:
    """torch.optim.Adam with its fused (one kernel per parameter) implementation: the same update
    rule as the default foreach one, ~3x cheaper per step for these small networks on CPU
    (0.06-0.08 vs 0.15-0.24 ms; 11 optimiser steps per PLCQL round). Falls back to foreach where the
    fused kernel is unavailable."""
    params = list(params)
    try:
        return torch.optim.Adam(params, lr=lr, fused=True)
    except (RuntimeError, TypeError, ValueError):
        return torch.optim.Adam(params, lr=lr, foreach=True)


# --------------------------------------------------------------------------------------------
# Base class for the centralised-critic TD3-style algorithms
# --------------------------------------------------------------------------------------------


class CentralCriticAlgorithm(Checkpointable, DeterministicActors):
    """Holds actors, target actors, critic ensemble, target critic, optimisers and an RNG.

    Subclasses implement `_critic_loss(batch, with_stats)` (target + penalty) and `update()`.
    Config fields used here: hidden, lr, tau, gamma, input_norm, n_critics, grad_clip,
    target_noise, action_l2.
    """

    name = "central-critic"
    discrete = False

    def __init__(self, spec: TaskSpec, config: Any, seed: int, device: str = "cpu") -> None:
        if spec.discrete:
            raise ValueError(f"{self.name} is for continuous actions; task {spec.task_id} is discrete")
        self.spec, self.cfg, self.seed, self.device = spec, config, seed, torch.device(device)
        self.n, self.A = spec.n_agents, spec.act_dim
        if self.device.type == "cpu" and getattr(config, "keep_freed_memory", True):
            keep_freed_memory()
        # Parameters are drawn from a generator seeded by `seed` (independent of global RNG state).
        init_gen = torch.Generator().manual_seed(int(seed))
        c = config
        self.actors = Actors(self.n, spec.obs_dim, self.A, c.hidden, c.input_norm, init_gen)
        self.target_actors = Actors(self.n, spec.obs_dim, self.A, c.hidden, c.input_norm, init_gen)
        self.critic = EnsembleCritic(c.n_critics, spec.state_dim, self.n * self.A, c.hidden, c.input_norm, init_gen)
        self.target_critic = EnsembleCritic(c.n_critics, spec.state_dim, self.n * self.A, c.hidden,
                                            c.input_norm, init_gen)
        self._build_extra(init_gen)
        for m in self.modules().values():
            m.to(self.device)
        hard_update_(self.target_actors, self.actors)
        hard_update_(self.target_critic, self.critic)
        self.actor_opt = make_adam(self.actors.parameters(), c.lr)
        self.critic_opt = make_adam(self.critic.parameters(), c.lr)
        self._build_extra_optimisers()
        # Sampling RNG for everything random inside update() (noise, CQL samples, PAR draws).
        self.gen = torch.Generator(device=self.device).manual_seed(int(seed) + 1)
        self.rounds = 0

    # hooks ------------------------------------------------------------------------------------
    def _build_extra(self, init_gen: torch.Generator) -> None:
        pass

    def _build_extra_optimisers(self) -> None:
        pass

    def modules(self) -> dict[str, nn.Module]:
        return {"actors": self.actors, "target_actors": self.target_actors,
                "critic": self.critic, "target_critic": self.target_critic}

    def optimisers(self) -> dict[str, torch.optim.Optimizer]:
        return {"actor_opt": self.actor_opt, "critic_opt": self.critic_opt}

    # common pieces ------------------------------------------------------------------------------
    @torch.no_grad()
    def target_policy_actions(self, next_obs: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
        """Target actors at o' plus clipped-to-[-1,1] N(0, target_noise) smoothing (reference
        `action_noise`, --action_noise_scale 0.05); the noise comes from `generator` (default self.gen)."""
        a = self.target_actors(next_obs)
        if self.cfg.target_noise > 0:
            gen = self.gen if generator is None else generator
            a = a + torch.randn(a.shape, generator=gen, device=a.device) * self.cfg.target_noise
        return a.clamp(-1.0, 1.0)

    def critic_step(self, loss: torch.Tensor) -> torch.Tensor:
        """One critic step; returns the gradient norm as a tensor (see `host_floats`)."""
        self.critic_opt.zero_grad(set_to_none=True)
        loss.backward()
        # One norm over the whole critic module (reference clips critic.parameters() jointly).
        gn = torch.nn.utils.clip_grad_norm_(self.critic.parameters(), self.cfg.grad_clip, foreach=True)
        self.critic_opt.step()
        return gn.detach()

    def actor_step(self, batch: Batch) -> dict[str, torch.Tensor]:
        """cf_pol actor loss (reference default): for each agent i, -Q_1(s, a_i = pi_i(o_i), a_-i from the
        dataset), averaged over agents and batch, + action_l2 * sum_i mean(pi_i^2)."""
        pi = self.actors(batch.obs)  # [B, n, A]
        joint = counterfactual_joint(batch.actions, pi.unsqueeze(2))  # [B, n, nA]
        q = self.critic(batch.state, joint, members=slice(0, 1), frozen=True)  # [1, B, n]
        pol_loss = -q.mean()
        reg = self.cfg.action_l2 * pi.pow(2).mean(dim=(0, 2)).sum()
        loss = pol_loss + reg
        params = list(self.actors.parameters())
        grads = torch.autograd.grad(loss, params)  # no critic weight gradients needed
        for p, g in zip(params, grads):
            p.grad = g
        clip_grad_norm_stacked_(params, self.cfg.grad_clip, self.n)  # per agent, as the reference
        self.actor_opt.step()
        self.actor_opt.zero_grad(set_to_none=True)
        pol_loss, reg = pol_loss.detach(), reg.detach()
        return {"actor/loss": pol_loss, "actor/q": -pol_loss, "actor/action_l2": reg}

    def update_targets(self) -> None:
        polyak_(self.target_critic, self.critic, self.cfg.tau)
        polyak_(self.target_actors, self.actors, self.cfg.tau)

    # protocol ---------------------------------------------------------------------------------
def mean_metrics(ms: list[dict[str, Any]]) -> dict[str, Any]:
    """Per-key mean over the updates that logged the key. Values may be device tensors: the means stay
    on the device until `host_floats`."""
    keys = sorted({k for m in ms for k in m})
    means = {}
    for k in keys:
        vals = [m[k].double() if torch.is_tensor(m[k]) else float(m[k]) for m in ms if k in m]
        means[k] = sum(vals) / len(vals)
    return means


def host_floats(metrics: dict[str, Any]) -> dict[str, float]:
    """Metrics as Python floats, the tensors copied to the host in ONE transfer. On a GPU every
    float(tensor) waits for the device; one wait per round lets the host queue the whole round's
    kernels ahead of the device instead of stalling it at each logged value."""
    names = [k for k, v in metrics.items() if torch.is_tensor(v)]
    values = {k: float(v) for k, v in metrics.items() if not torch.is_tensor(v)}
    if names:
        flat = torch.stack([metrics[k].detach().reshape(()).double() for k in names]).tolist()
        values.update(zip(names, flat))
    return {k: values[k] for k in metrics}
