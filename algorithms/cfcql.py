"""CFCQL, continuous actions (Shao et al. 2023, "Counterfactual Conservative Q Learning").

Follows the reference `thu-rllab/CFCQL` `continuous/algorithms/maddpg_cc.py` class MATD3CC run with
`--cql --cf_cql --central_critic` (MPE branch), see reference-implementations.md §4.3:

  critic:  y = r + gamma * (1 - terminal) * min(Q1', Q2')(s', clip(pi'(o') + N(0, 0.05), -1, 1))
           L = sum_j MSE(Q_j(s, a), y) + cql_alpha * sum_j pen_j
           pen_j = mean_b [ sum_i (1/n) * logsumexp_m (Q_j(s, a_i^m, a_-i) - log p_unif) - Q_j(s, a) ]
           with a_i^m ~ U[-1,1]^A, 10 samples per agent, other agents at their dataset actions.
  actor:   per agent i, -Q_1(s, a_i = pi_i(o_i), a_-i from the dataset), averaged, + 1e-3 * mean(pi^2)
  round:   one critic+actor update, then (ca_ratio - 1) = 4 critic-only updates, each on a fresh
           batch, then Polyak target updates (main.py with --ca_ratio 5).

The HalfCheetah branch of the reference also samples noisy current- and next-policy actions for the
penalty (`sample_action_class="1-1-1"`, set for the mamujoco tasks; docs/algorithms/cfcql.md).

The penalty below is plain torch; with the critic's fused kernels on (the default,
algorithms/common/kernels.py) its critic part runs cache-blocked, with the same numbers up to float
summation order (tests/test_speed_equivalence.py).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch

from plcql_bench.algorithms.base import Batch, BatchSampler, register
from plcql_bench.algorithms.common import kernels
from plcql_bench.algorithms.common.configs import tier_table
from plcql_bench.algorithms.common.continuous import (
    CentralCriticAlgorithm,
    EnsembleCritic,
    counterfactual_joint,
    host_floats,
    mean_metrics,
    noisy_policy_samples,
)
from plcql_bench.suite.core.spec import TaskSpec


@dataclass
class Config:
    # --- backbone (CFCQL continuous/main.py defaults; per-task values: configs/cfcql_backbone.yaml) ---
    hidden: int = 64  # --hidden_dim 64 (MPE); 256 on HalfCheetah
    lr: float = 1e-3  # --lr 0.001 (0.01 for simple_spread via task_overrides); actors and critic
    batch_size: int = 1024  # --batch_size 1024 (MPE); 256 on HalfCheetah
    tau: float = 0.01  # --tau 0.01 (MPE); 0.005 on HalfCheetah
    gamma: float = 0.95  # --gamma 0.95 (MPE); 0.99 on HalfCheetah
    input_norm: bool = True  # reference MLPNetwork/DoubleMLPNetwork put BatchNorm1d on the input
    n_critics: int = 2  # twin critic (DoubleMLPNetwork)
    grad_clip: float = 0.5  # clip_grad_norm_(..., 0.5) for critic and each actor
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


@register
class CFCQL(CentralCriticAlgorithm):
    name = "cfcql"
    Config = Config

    @classmethod
    def task_overrides(cls, spec: TaskSpec, tier: str) -> dict[str, Any]:
        """configs/cfcql_backbone.yaml < cql_alpha of configs/cfcql.yaml < the algorithm's own configs/<name>.yaml."""
        alpha = {k: v for k, v in tier_table("cfcql", spec, tier).items() if k == "cql_alpha"}
        own = tier_table(getattr(cls, "variant_of", cls.name), spec, tier)
        return {**tier_table("cfcql_backbone", spec, tier), **alpha, **own}

    # -- losses ------------------------------------------------------------------------------------
    @torch.no_grad()
    def td_target(self, batch: Batch) -> torch.Tensor:
        """[B]: r + gamma (1 - terminal) min_j Q'_j(s', pi'(o') + noise)."""
        a_next = self.target_policy_actions(batch.next_obs)  # [B, n, A]
        q_next = self.target_critic(batch.next_state, a_next.reshape(batch.size, 1, -1))  # [E, B, 1]
        q_next = q_next.min(0).values[:, 0]
        return batch.rewards + self.cfg.gamma * (1.0 - batch.terminals) * q_next

    def compute_target(self, batch: Batch) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """The per-update target and diagnostics (common name across the CFCQL family, used by
        bench-speed to time target construction alone)."""
        return self.td_target(batch), {}

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
        """sum_j MSE(Q_j(s,a), y) + cql_alpha * sum_j pen_j. Shared by PLCQL."""
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

    # -- one round ---------------------------------------------------------------------------------
    def update(self, sample: BatchSampler) -> dict[str, float]:
        critic_ms, out = [], {}
        for u in range(self.cfg.ca_ratio):
            batch = sample(self.cfg.batch_size)
            target, tstats = self.compute_target(batch)
            loss, stats = self.critic_loss(batch, target)
            gn = self.critic_step(loss)
            critic_ms.append({**stats, **tstats, "critic/grad_norm": gn})
            if u == 0:
                actor_loss, actor_stats = self.actor_loss(batch)
                self.actor_step(actor_loss)
                out.update(actor_stats)
        self.update_targets()
        self.rounds += 1
        out.update(mean_metrics(critic_ms))
        return host_floats(out)
