"""The centralised-critic backbone of the continuous-action CFCQL family (CFCQL, MACQL, SPaCQL, PLCQL):
CFCQL's `continuous/` MATD3CC (`--cql --cf_cql --central_critic`), itself built on the OMAR backbone
(reference-implementations.md §4.0, §4.3). One algorithm of the family reads its own file and this one:

  networks  a centralised critic ensemble Q_j(s, a_1..a_n) over the global state and the joint action
            (`EnsembleCritic`, E members in one batched call); decentralised deterministic tanh actors,
            one independent MLP per agent (`Actors`, stacked); target networks with Polyak averaging
  config    `CentralCriticConfig`: the CFCQL settings every member of the family has
  critic    y = r + gamma (1 - terminal) min_j Q'_j(s', clip(pi'(o') + N(0, 0.05), -1, 1))  (`td_target`)
            L = sum_j MSE(Q_j(s, a), y) + cql_alpha * sum_j pen_j                              (`critic_loss`)
            pen_j = mean_b [ sum_i (1/n) logsumexp_m (Q_j(s, a_i^m, a_-i) - log p(a_i^m)) - Q_j(s, a) ],
            a_i^m ~ U[-1,1]^A, the other agents at their dataset actions        (`cf_cql_penalty`)
  actor     per agent i, -Q_1(s, a_i = pi_i(o_i), a_-i from the dataset), averaged, + action_l2 mean(pi^2)
  round     one critic + actor update, then ca_ratio - 1 critic-only updates, each on a fresh batch, then
            Polyak targets (`CentralCriticAlgorithm.round`, written once: a run's `update` and a seed stack
            run it; `compute_target` and the round's hooks are the algorithm's)
Per-network gradient-norm clipping as the reference. The critic's fused CPU kernels are in kernels.py,
behind a switch (`EnsembleCritic.fused`); this file is the plain torch statement of the same math.

Shapes: B = batch, n = agents, A = per-agent action dim, E = ensemble members, R = joint actions
evaluated per state (R = 1 for a plain call, R = n * n_samples for the CF-CQL term).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, ClassVar

import torch
from torch import nn

from plcql_bench.algorithms.base import Batch, BatchSampler
from plcql_bench.algorithms.common import kernels, rng
from plcql_bench.algorithms.common.configs import tier_table
from plcql_bench.algorithms.common.steps import RunSteps
from plcql_bench.algorithms.common.checkpoint import Checkpointable, DeterministicActors
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
# Config
# --------------------------------------------------------------------------------------------


@dataclass
class CentralCriticConfig:
    """CFCQL's settings, shared by every algorithm of the family (its Config derives from this one)."""

    # --- backbone (CFCQL continuous/main.py defaults; per-task values: configs/cfcql_backbone.yaml) ---
    hidden: int = 64  # --hidden_dim 64 (MPE); 256 on HalfCheetah
    lr: float = 1e-3  # --lr 0.001 (0.01 for simple_spread via task_overrides); actors and critic
    batch_size: int = 1024  # --batch_size 1024 (MPE); 256 on HalfCheetah
    tau: float = 0.01  # --tau 0.01 (MPE); 0.005 on HalfCheetah
    gamma: float = 0.95  # --gamma 0.95 (MPE); 0.99 on HalfCheetah
    input_norm: bool = True  # reference MLPNetwork/DoubleMLPNetwork put BatchNorm1d on the input
    n_critics: int = 2  # twin critic (DoubleMLPNetwork)
    grad_clip: float = 0.5  # clip_grad_norm_(..., 0.5) for critic and each actor
    # How grad_clip applies to the critic ensemble. "joint": one norm over the whole critic, as the
    # reference clips its twin critic's parameters (one clip_grad_norm_ call); "per-member": each member
    # on its own, as E separate networks. The references have 2 members; for PLCQL's and SPaCQL's 10 the
    # papers are silent (docs/algorithms/cfcql.md). Added after results existed: key-neutral at "joint".
    critic_clip: str = "joint"
    target_noise: float = 0.05  # --action_noise_scale 0.05 (target policy smoothing, clipped to [-1,1])
    action_l2: float = 1e-3  # actor loss += 1e-3 * mean(pi^2) per agent (no --no_action_reg)
    ca_ratio: int = 5  # --ca_ratio 5: critic updates per actor update in one round
    # --- counterfactual CQL (maddpg_cc.py, --cql --cf_cql) ---
    cql_alpha: float = 1.0  # --cql_alpha default 1.0; per task/tier table via task_overrides (§4.3)
    n_sampled_actions: int = 10  # --num_sampled_actions 10 (uniform samples per agent)
    soft_q: bool = True  # subtract the uniform proposal's log-density (default, no --no_soft_q)
    lse_temp: float = 1.0  # --lse_temp 1.0
    # HalfCheetah branch (task_overrides sets it there): which candidate sets agent i's CQL samples use:
    # "random-current policy-next policy" flags, reference --sample_action_class (MPE branch = uniform only)
    sample_action_class: str = "1-0-0"
    cql_sample_noise: float = 0.2  # --cql_sample_noise_level 0.2 (policy-sample noise)
    other_action_jitter: float = 0.0  # --beta_action_noise 1e-5 on the other agents' actions (HalfCheetah)

    # fields added after results existed, at the value that does what the code did before them: left out
    # of a run's identity at that value (algorithms/base.py: identity_config), so finished runs keep their keys
    key_neutral: ClassVar[dict[str, Any]] = {"critic_clip": "joint"}


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
    # every row a copy of the dataset's joint action, then agent i's block of rows (i, ·) overwritten through
    # the diagonal view: two copies (a torch.where over the broadcast [B, n, M, n, A] is ~5x slower on CPU)
    joint = dataset.reshape(B, 1, 1, n * A).expand(B, n, M, n * A).contiguous()
    joint.view(B, n, M, n, A).diagonal(0, 1, 3).copy_(own.to(dataset.dtype).permute(0, 2, 3, 1))
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
        noise = rng.randn(generator, *a.shape[:2], n_samples, a.shape[-1], device=a.device) * sigma
        logp = (-0.5 * (noise / sigma) ** 2 - math.log(sigma * math.sqrt(2 * math.pi))).sum(-1)
        return (a.unsqueeze(2) + noise).clamp(-1.0, 1.0), logp


# --------------------------------------------------------------------------------------------
# The counterfactual CQL penalty (plain torch; the fused critic hands its critic part to kernels.py)
# --------------------------------------------------------------------------------------------


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
    own = rng.rand(generator, B, n, n_samples, A, device=actions.device) * 2 - 1
    logp = torch.full((B, n, n_samples), A * math.log(0.5), device=actions.device)
    if extra is not None:
        own = torch.cat([own, extra[0]], 2)
        logp = torch.cat([logp, extra[1]], 2)
    others = actions
    if other_jitter > 0:
        others = actions + (rng.rand(generator, *actions.shape, device=actions.device) * 2 - 1) * other_jitter
    M = own.shape[2]
    lam = torch.full((n,), 1.0 / n, device=actions.device) if weights is None else weights
    joint = counterfactual_joint(others, own)  # [B, n * M, n * A]: row (i, m) = (a_i^m, a_-i)
    pol, zsum = lse_penalty(critic, state, joint, n, logp if soft_q else None, lam, lse_temp, state_part=state_part)
    pen = pol - q_data.mean(-1)  # [E]
    return pen, {"cql/lse_q": pol.detach().mean(),
                 "cql/raw_cf_q": zsum.mean() / (B * n * M)}


def lse_penalty(critic: EnsembleCritic, state: torch.Tensor, actions: torch.Tensor, n_groups: int,
                offset: torch.Tensor | None, weights: torch.Tensor, temp: float = 1.0,
                members: slice | None = None, state_part: torch.Tensor | None = None
                ) -> tuple[torch.Tensor, torch.Tensor]:
    """The penalty's critic part. state [B, S], actions [B, G * M, nA] (G = n_groups groups of M
    candidates per state), offset [B, G, M] or None, weights [G] or [B, G]. With z = Q_j(s, a) - offset:

        pol_j = mean_b sum_g weights_g * T * logsumexp_m(z / T)              -> [E']

    Returns pol [E'] and the sum of z over all rows [E'] (detached, for diagnostics). A fused critic
    computes it cache-blocked (kernels.blocked_lse_penalty) unless the actions carry gradient."""
    if critic.fused and not actions.requires_grad:
        return kernels.blocked_lse_penalty(critic, state, actions, n_groups, offset, weights, temp, members,
                                           state_part)
    B, R, _ = actions.shape
    q = critic(state, actions, members, state_part=state_part)  # [E', B, R]
    z = q.view(q.shape[0], B, n_groups, R // n_groups)
    if offset is not None:
        z = z - offset
    lse = torch.logsumexp(z / temp, dim=-1) * temp  # [E', B, G]
    return (lse * weights).sum(-1).mean(-1), z.detach().sum((1, 2, 3))


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
# The algorithm base of the family
# --------------------------------------------------------------------------------------------


CRITIC_CLIPS = ("joint", "per-member")


class CentralCriticAlgorithm(Checkpointable, DeterministicActors):
    """CFCQL's backbone: actors, target actors, critic ensemble, target critic, their Adams, the sampling
    RNG `gen`, and the losses, steps and round of the module docstring. An algorithm of the family derives
    from it directly and sets what it changes: `compute_target` (the TD target; default `td_target`),
    `critic_loss` (MACQL's penalty), or `update` (PLCQL's round with PAR updates)."""

    name = "central-critic"
    discrete = False
    reward = "agent0"  # CFCQL's central critic learns from agent 0's reward (reference-implementations.md §4.3)

    @classmethod
    def task_overrides(cls, spec: TaskSpec, tier: str) -> dict[str, Any]:
        """configs/cfcql_backbone.yaml < cql_alpha of configs/cfcql.yaml < the algorithm's own configs/<name>.yaml."""
        alpha = {k: v for k, v in tier_table("cfcql", spec, tier).items() if k == "cql_alpha"}
        own = tier_table(cls.variant_of or cls.name, spec, tier)
        return {**tier_table("cfcql_backbone", spec, tier), **alpha, **own}

    def __init__(self, spec: TaskSpec, config: Any, seed: int, device: str = "cpu") -> None:
        if spec.discrete:
            raise ValueError(f"{self.name} is for continuous actions; task {spec.task_id} is discrete")
        if config.critic_clip not in CRITIC_CLIPS:
            raise ValueError(f"critic_clip must be one of {CRITIC_CLIPS}, got {config.critic_clip!r}")
        self.spec, self.cfg, self.seed, self.device = spec, config, seed, torch.device(device)
        self.n, self.A = spec.n_agents, spec.act_dim
        # Parameters are drawn from a generator seeded by `seed` (independent of global RNG state);
        # components an algorithm adds (PLCQL's PAR networks) go on drawing from it.
        self.init_gen = init_gen = torch.Generator().manual_seed(int(seed))
        c = config
        self.actors = Actors(self.n, spec.obs_dim, self.A, c.hidden, c.input_norm, init_gen)
        self.target_actors = Actors(self.n, spec.obs_dim, self.A, c.hidden, c.input_norm, init_gen)
        self.critic = EnsembleCritic(c.n_critics, spec.state_dim, self.n * self.A, c.hidden, c.input_norm, init_gen)
        self.target_critic = EnsembleCritic(c.n_critics, spec.state_dim, self.n * self.A, c.hidden,
                                            c.input_norm, init_gen)
        for m in (self.actors, self.target_actors, self.critic, self.target_critic):
            m.to(self.device)
        hard_update_(self.target_actors, self.actors)
        hard_update_(self.target_critic, self.critic)
        self.actor_opt = make_adam(self.actors.parameters(), c.lr)
        self.critic_opt = make_adam(self.critic.parameters(), c.lr)
        # Sampling RNG for everything random inside update() (noise, CQL samples, PAR draws).
        self.gen = torch.Generator(device=self.device).manual_seed(int(seed) + 1)
        self.rounds = 0

    def modules(self) -> dict[str, nn.Module]:
        return {"actors": self.actors, "target_actors": self.target_actors,
                "critic": self.critic, "target_critic": self.target_critic}

    def optimisers(self) -> dict[str, torch.optim.Optimizer]:
        return {"actor_opt": self.actor_opt, "critic_opt": self.critic_opt}

    # -- targets ---------------------------------------------------------------------------------
    @torch.no_grad()
    def target_policy_actions(self, next_obs: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
        """Target actors at o' plus clipped-to-[-1,1] N(0, target_noise) smoothing (reference
        `action_noise`, --action_noise_scale 0.05); the noise comes from `generator` (default self.gen)."""
        a = self.target_actors(next_obs)
        if self.cfg.target_noise > 0:
            gen = self.gen if generator is None else generator
            a = a + rng.randn(gen, *a.shape, device=a.device) * self.cfg.target_noise
        return a.clamp(-1.0, 1.0)

    @torch.no_grad()
    def td_target(self, batch: Batch) -> torch.Tensor:
        """[B]: r + gamma (1 - terminal) min_j Q'_j(s', pi'(o') + noise)."""
        a_next = self.target_policy_actions(batch.next_obs)  # [B, n, A]
        q_next = self.target_critic(batch.next_state, a_next.reshape(batch.size, 1, -1))  # [E, B, 1]
        q_next = q_next.min(0).values[:, 0]
        return batch.rewards + self.cfg.gamma * (1.0 - batch.terminals) * q_next

    def compute_target(self, batch: Batch) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """The per-update target [B] and diagnostics (the name bench-speed times target construction by)."""
        return self.td_target(batch), {}

    # -- critic ----------------------------------------------------------------------------------
    def policy_cql_samples(self, batch: Batch) -> tuple[torch.Tensor, torch.Tensor] | None:
        """Noisy current-policy (at o) and next-policy (at o') candidates for agent i's CQL samples,
        per `sample_action_class` (flags: uniform-current-next); None when only uniform samples are used.
        (The reference pairs the current-policy Q values with the next-policy samples' log-densities and
        vice versa; both are densities of i.i.d. N(0, 0.2) draws, here each sample gets its own.)"""
        flags = [c == "1" for c in self.cfg.sample_action_class.split("-")]
        if not flags[0]:
            raise ValueError("sample_action_class: the uniform samples are always used (first flag must be 1)")
        sets = []
        M, sig = self.cfg.n_sampled_actions, self.cfg.cql_sample_noise
        if flags[1]:
            sets.append(noisy_policy_samples(self.actors, batch.obs, M, sig, self.gen))
        if len(flags) > 2 and flags[2]:
            sets.append(noisy_policy_samples(self.actors, batch.next_obs, M, sig, self.gen))
        if not sets:
            return None
        return torch.cat([a for a, _ in sets], 2), torch.cat([lp for _, lp in sets], 2)

    def critic_loss(self, batch: Batch, target: torch.Tensor) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """sum_j MSE(Q_j(s,a), y) + cql_alpha * sum_j pen_j (the CF-CQL penalty)."""
        B = batch.size
        hs = self.critic.state_part(batch.state)  # shared by the TD call and the CF-CQL call
        q = self.critic(batch.state, batch.actions.reshape(B, 1, -1), state_part=hs)[:, :, 0]  # [E, B]
        td = (q - target.unsqueeze(0)).pow(2).mean(1).sum()
        stats = {"critic/td_loss": td.detach(), "critic/q_data": q.detach().mean(),
                 "critic/target": target.detach().mean()}
        loss = td
        if self.cfg.cql_alpha > 0:
            pen, cst = cf_cql_penalty(self.critic, batch.state, batch.actions, q, self.cfg.n_sampled_actions,
                                      self.gen, soft_q=self.cfg.soft_q, lse_temp=self.cfg.lse_temp,
                                      extra=self.policy_cql_samples(batch),
                                      other_jitter=self.cfg.other_action_jitter, state_part=hs)
            pen = pen.sum()
            loss = loss + self.cfg.cql_alpha * pen
            stats.update(cst)
            stats["cql/penalty"] = pen.detach()
        stats["critic/loss"] = loss.detach()
        return loss, stats

    def critic_step(self, loss: torch.Tensor) -> torch.Tensor:
        """One critic step; returns the gradient norm as a tensor (see `host_floats`)."""
        self.critic_opt.zero_grad(set_to_none=True)
        loss.backward()
        if self.cfg.critic_clip == "per-member":  # each member's norm on its own; logged: the whole critic's
            gn = clip_grad_norm_stacked_(list(self.critic.parameters()), self.cfg.grad_clip,
                                         self.cfg.n_critics).pow(2).sum().sqrt()
        else:  # one norm over the whole critic module (the reference clips critic.parameters() jointly)
            gn = torch.nn.utils.clip_grad_norm_(self.critic.parameters(), self.cfg.grad_clip, foreach=True)
        self.critic_opt.step()
        return gn.detach()

    # -- actors ----------------------------------------------------------------------------------
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

    # -- one round (written once: a run's `update` and a seed stack run it, through `steps`) --------
    def update(self, sample: BatchSampler) -> dict[str, float]:
        out = self.round(RunSteps(self, sample))
        self.rounds += 1
        return host_floats(out)

    def round(self, steps: RunSteps) -> dict[str, Any]:
        """One round: a critic and an actor update, then ca_ratio - 1 critic-only updates, each on a fresh batch,
        then the Polyak targets; its metrics as tensors. A member of the family changes the round through the
        hooks below, not by overriding it: a seed stack (stacked.py) runs this round as written."""
        critic_ms, extra_ms, out = [], [], {}
        for u in range(self.cfg.ca_ratio):
            batch = steps.batch()
            target, aux = steps.call(self.compute_target, batch)
            pre = self.before_critic_step(steps, u, batch, aux)
            loss, stats = steps.call(self.critic_loss, batch, target)
            gn = steps.critic_step(loss)
            critic_ms.append({**stats, **self.target_stats(aux), "critic/grad_norm": gn})
            if u == 0:
                actor_loss, actor_stats = steps.call(self.actor_loss, batch)
                steps.actor_step(actor_loss)
                out.update(actor_stats)
            extra = self.after_actor_step(steps, u, batch, aux, pre)
            if extra is not None:
                extra_ms.append(extra)
        steps.update_targets()
        out.update(mean_metrics(extra_ms))
        out.update(mean_metrics(critic_ms))
        return out

    # -- the round's hooks (defaults: the backbone's round) ----------------------------------------
    def target_stats(self, aux: dict[str, Any]) -> dict[str, Any]:
        """What each critic update logs of `compute_target`'s second output (default: all of it)."""
        return aux

    def before_critic_step(self, steps: RunSteps, u: int, batch: Batch, aux: dict[str, Any]) -> Any:
        """Update u's work before its critic step (its result goes to `after_actor_step`); default none."""
        return None

    def after_actor_step(self, steps: RunSteps, u: int, batch: Batch, aux: dict[str, Any], pre: Any
                         ) -> dict[str, Any] | None:
        """Update u's work after its actor step; metrics to average over the round's updates, or None."""
        return None


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
