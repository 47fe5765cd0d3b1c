"""Shared machinery for the continuous-action actor-critic algorithms (CFCQL, PLCQL, later SPaCQL).

Follows CFCQL's `continuous/` MATD3CC (`--cql --cf_cql --central_critic`), itself built on the OMAR
backbone (reference-implementations.md §4.0, §4.3):
  * a centralised critic ensemble Q_j(s, a_1..a_n) over the global state and the joint action
    (`EnsembleCritic`, E members in one batched call);
  * decentralised deterministic tanh actors, one independent MLP per agent (`Actors`, stacked);
  * target networks with Polyak averaging;
  * per-network gradient-norm clipping.
The counterfactual CQL penalty is in cfcql.py. The critic's fused CPU kernels are in kernels.py, behind
a switch (`EnsembleCritic.fused`); this file is the plain torch statement of the same math.

Shapes: B = batch, n = agents, A = per-agent action dim, E = ensemble members, R = joint actions
evaluated per state (R = 1 for a plain call, R = n * n_samples for the CF-CQL term).
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import nn

from plcql_bench.algorithms.base import Batch
from plcql_bench.algorithms.common import kernels
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

    `fused` (default: kernels.fused_default(), True unless the runner was told PLCQL_KERNELS=plain):
    the layers after the first run in kernels.py's `_FusedTrunk`, and the CF-CQL penalty in its
    `_BlockedLSE`; the same numbers up to float summation order (tests/test_speed_equivalence.py).
    """

    def __init__(self, n_members: int, state_dim: int, joint_act_dim: int, hidden: int, input_norm: bool,
                 generator: torch.Generator | None = None, fused: bool | None = None) -> None:
        super().__init__()
        self.n_members, self.state_dim, self.joint_act_dim = n_members, state_dim, joint_act_dim
        self.input_norm = input_norm
        self.fused = kernels.fused_default() if fused is None else bool(fused)
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
        P = self.member_params(sl, False)
        w1_s = P["l1.weight"][:, :self.state_dim]
        s = state
        if self.input_norm:
            s = self._standardise(s)
            w1_s = w1_s * P["norm.weight"][:, 0, :self.state_dim].unsqueeze(-1)
        return torch.bmm(s.unsqueeze(0).expand(w1_s.shape[0], *s.shape), w1_s)

    def first_layer(self, state: torch.Tensor, a: torch.Tensor, sl: slice, fold_actions: bool = False,
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
        P = self.member_params(sl, frozen)
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

    def member_params(self, sl: slice, frozen: bool) -> dict[str, torch.Tensor]:
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
        h_s, a, w1_a = self.first_layer(state, actions.reshape(B * R, nA), sl, frozen=frozen,
                                         state_part=state_part)
        P = self.member_params(sl, frozen)
        E, H = h_s.shape[0], h_s.shape[2]
        if self.fused:
            q = kernels.fused_trunk(h_s, a, w1_a, P["l2.weight"], P["l2.bias"], P["l3.weight"], P["l3.bias"])
            return q.view(E, B, R)
        h = torch.matmul(a, w1_a).view(E, B, R, H) + h_s.unsqueeze(2)  # a @ W1a + h_s[state of the row]
        h = torch.relu(h).view(E, B * R, H)
        h = torch.relu(torch.baddbmm(P["l2.bias"], h, P["l2.weight"]))
        q = torch.baddbmm(P["l3.bias"], h, P["l3.weight"])
        return q.view(E, B, R)


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

    Subclasses implement `update()` (CFCQL: `compute_target`, `critic_loss`, then `critic_step`,
    `actor_loss` and `actor_step` from here). Config fields used here: hidden, lr, tau, gamma, input_norm, n_critics, grad_clip,
    target_noise, action_l2.
    """

    name = "central-critic"
    discrete = False

    def __init__(self, spec: TaskSpec, config: Any, seed: int, device: str = "cpu") -> None:
        if spec.discrete:
            raise ValueError(f"{self.name} is for continuous actions; task {spec.task_id} is discrete")
        self.spec, self.cfg, self.seed, self.device = spec, config, seed, torch.device(device)
        self.n, self.A = spec.n_agents, spec.act_dim
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

    def actor_loss(self, batch: Batch) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """cf_pol actor loss (reference default): for each agent i, -Q_1(s, a_i = pi_i(o_i), a_-i from the
        dataset), averaged over agents and batch, + action_l2 * sum_i mean(pi_i^2)."""
        pi = self.actors(batch.obs)  # [B, n, A]
        joint = counterfactual_joint(batch.actions, pi.unsqueeze(2))  # [B, n, nA]
        q = self.critic(batch.state, joint, members=slice(0, 1), frozen=True)  # [1, B, n]
        pol_loss = -q.mean()
        reg = self.cfg.action_l2 * pi.pow(2).mean(dim=(0, 2)).sum()
        pol, reg_d = pol_loss.detach(), reg.detach()
        return pol_loss + reg, {"actor/loss": pol, "actor/q": -pol, "actor/action_l2": reg_d}

    def actor_step(self, loss: torch.Tensor) -> None:
        """One actor step: gradients to the actors only (the critic is frozen in the loss), clipped per agent
        as the reference."""
        params = list(self.actors.parameters())
        grads = torch.autograd.grad(loss, params)  # no critic weight gradients needed
        for p, g in zip(params, grads):
            p.grad = g
        clip_grad_norm_stacked_(params, self.cfg.grad_clip, self.n)
        self.actor_opt.step()
        self.actor_opt.zero_grad(set_to_none=True)

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
