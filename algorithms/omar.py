"""OMAR (Pan et al. 2022, "Plan better amid conservatism: offline multi-agent RL with actor rectification").

Follows `ling-pan/OMAR@0e52ad6` `algorithms/maddpg.py` (reference-implementations.md §4.0, §4.1):
independent TD3 (per-agent twin critic over (o_i, a_i), no target smoothing, no policy delay) +
CQL on each agent's critic + zeroth-order actor rectification:

  critic_i: sum_t MSE(Q_t,i(o_i, a_i), r + gamma (1 - d) min_t Qbar_t,i(o'_i, pibar_i(o'_i)))
            + cql_alpha * sum_t mean_b[ logsumexp_m (Q_t,i(o_i, a^m) - log 0.5^A) - Q_t,i(o_i, a_i) ],
            a^m ~ U[-1, 1]^A, 10 samples;
  actor_i:  omar_coe * MSE(pi_i(o_i), a*) - (1 - omar_coe) * Q_1,i(o_i, pi_i(o_i)) + 1e-3 * mean(pi^2),
            a* = the better (by Q_1,i) of pi_i(o_i) and the best action found by sampling:
            MPE: omar_iters = 3 rounds of 10 samples from N(mu, sigma) (mu = 0, sigma = 2 at start),
            mu <- softmax(Q)-weighted mean, sigma <- RMS deviation from it;
            HalfCheetah: CEM, 2 iterations of 20 samples, 5 elites carried over.
All agents (and twins) are one stacked network; no loop over agents.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch

from plcql_bench.algorithms.base import BatchSampler, per_agent_rewards, register
from plcql_bench.algorithms.common.configs import tier_table
from plcql_bench.algorithms.common.independent import IndependentBase
from plcql_bench.suite.core.spec import TaskSpec


@dataclass
class Config:
    hidden: int = 64  # main.py --hidden_dim 64 (256 on HalfCheetah)
    lr: float = 0.01  # main.py --lr 0.01 (3e-4 on HalfCheetah)
    batch_size: int = 1024  # --batch_size 1024 (256 on HalfCheetah)
    tau: float = 0.01  # --tau 0.01 (0.005 on HalfCheetah)
    gamma: float = 0.95  # --gamma 0.95 (0.99 on HalfCheetah)
    input_norm: bool = True  # MLPNetwork BatchNorm1d on the input
    grad_clip: float = 0.5  # clip_grad_norm(..., 0.5), critic and policy of each agent
    action_l2: float = 1e-3  # pol_loss += (pi ** 2).mean() * 1e-3
    # CQL (always on with --omar 1)
    cql_alpha: float = 1.0  # per task/tier table (configs/omar.yaml, env_config_map)
    n_sampled_actions: int = 10  # --num_sampled_actions 10
    lse_temp: float = 1.0  # --lse_temp 1.0
    # actor rectification
    omar_coe: float = 1.0  # per task/tier table
    omar_mode: str = "softmax"  # "softmax" (MPE branch) or "cem" (HalfCheetah branch)
    omar_iters: int = 3  # --omar_iters 3 (2 on HalfCheetah)
    omar_num_samples: int = 10  # --omar_num_samples 10 (20 on HalfCheetah)
    omar_num_elites: int = 5  # --omar_num_elites (CEM only)
    omar_mu: float = 0.0  # --omar_mu 0.
    omar_sigma: float = 2.0  # --omar_sigma 2.0
    # HalfCheetah branch of the CQL term (task_overrides sets it): + 10 noisy current-policy and 10 noisy
    # next-policy actions (N(0, 0.2)), each "corrected" by cql_policy_density
    cql_policy_samples: bool = False
    cql_sample_noise: float = 0.2  # --cql_sample_noise_level 0.2
    cql_policy_density: str = "pdf"  # reference: subtracts the noise's density itself ("pdf", its
    #                                  `random_noises_log_pi` is calc_gaussian_pdf, not its log); "log" = log-density


@register
class OMAR(IndependentBase):
    name = "omar"
    Config = Config
    # The fast path, `self.critic.fused` (kernels.py's switch, read when the critic is built; same results
    # as the plain path: tests/test_omar_fast.py). Sampled actions (CQL's and the search's) go through the
    # critics with the observation part of the first layer computed once per observation
    # (IndepCritics.split_first_layer); the CQL logsumexp is forwarded and backpropagated in cache-sized
    # blocks (kernels.blocked_lse); Q_1 alone where only Q_1 is used (the search, the actor's Q term: the
    # reference's `critic.Q1`), the policy's Q_1 computed once, no critic weight gradients from the actor
    # loss (the critic step zeroes them anyway). Off: the plain path below, every critic call on
    # concatenated [o_i, a_i] rows with both twins. Not part of the config: run keys do not change.

    @classmethod
    def task_overrides(cls, spec: TaskSpec, tier: str) -> dict[str, Any]:
        return {**tier_table("omar_backbone", spec, tier), **tier_table("omar", spec, tier)}

    def critic_loss(self, b) -> tuple[torch.Tensor, dict[str, float]]:
        c = self.cfg
        with torch.no_grad():
            q_next = self.target_critic(b.next_obs, self.target_actors(b.next_obs)).min(0).values  # [B, n]
            y = per_agent_rewards(b.rewards) + c.gamma * (1 - b.terminals).unsqueeze(1) * q_next
        q = self.critic(b.obs, b.actions)  # [T, B, n]
        td = (q - y).pow(2).mean(1).sum()  # sum over twins and agents of each agent's MSE
        B, n, M, A = b.size, self.n, c.n_sampled_actions, self.A
        samples = torch.rand(B, M, n, A, generator=self.gen, device=self.device) * 2 - 1
        corr = torch.full((B, M, n), A * math.log(0.5), device=self.device)
        if c.cql_policy_samples:  # HalfCheetah branch: policy actions at o and at o', evaluated at o
            with torch.no_grad():
                pol = torch.stack([self.actors(b.obs), self.actors(b.next_obs)], 1)  # [B, 2, n, A]
                noise = torch.randn(B, 2, M, n, A, generator=self.gen, device=self.device) * c.cql_sample_noise
                logpdf = (-0.5 * (noise / c.cql_sample_noise) ** 2
                          - math.log(c.cql_sample_noise * math.sqrt(2 * math.pi))).sum(-1)  # [B, 2, M, n]
                dens = logpdf.exp() if c.cql_policy_density == "pdf" else logpdf
                pol_s = (pol.unsqueeze(2) + noise).clamp(-1, 1).reshape(B, 2 * M, n, A)
            samples = torch.cat([samples, pol_s], 1)
            corr = torch.cat([corr, dens.reshape(B, 2 * M, n)], 1)
        if self.critic.fused:  # Σ over twins and agents of mean_b lse, minus the same of Q at the data
            pen = self.critic.sampled_lse(b.obs, samples, corr, c.lse_temp).sum() - q.mean(1).sum()
        else:
            Mt = samples.shape[1]
            q_s = self.critic(b.obs.unsqueeze(1).expand(B, Mt, n, -1), samples)  # [T, B, Mt, n]
            lse = torch.logsumexp((q_s - corr) / c.lse_temp, dim=2) * c.lse_temp  # [T, B, n]
            pen = (lse - q).mean(1).sum()
        loss = td + c.cql_alpha * pen
        return loss, {"critic/td_loss": float(td.detach()), "cql/penalty": float(pen.detach()),
                      "critic/q_data": float(q.detach().mean())}

    def q1(self, obs: torch.Tensor, act: torch.Tensor, frozen: bool = False) -> torch.Tensor:
        """Q_1 of every agent: [B, (M,) n] (fused: the first twin alone)."""
        if self.critic.fused:
            return self.critic(obs, act, twins=1, frozen=frozen)[0]
        return self.critic(obs, act)[0]

    @torch.no_grad()
    def rectified_actions(self, obs: torch.Tensor, pi: torch.Tensor,
                          q_pi: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """a* [B, n, A]: the better of pi and the best sampled action, by Q_1 (zeroth-order search);
        q_pi = Q_1(obs, pi) when the caller has it."""
        c = self.cfg
        B, n, A, M = obs.shape[0], self.n, self.A, c.omar_num_samples
        obs_m = obs.unsqueeze(1)
        mu = torch.full((B, n, A), c.omar_mu, device=self.device)
        sigma = torch.full((B, n, A), c.omar_sigma, device=self.device)
        elites = elite_q = None
        obs_part = self.critic.obs_part(obs, slice(0, n)) if self.critic.fused else None  # Q_1's, shared by the iterations
        for _ in range(c.omar_iters):  # iterations are sequential by nature (each uses the last)
            acs = (mu.unsqueeze(1) + sigma.unsqueeze(1) * torch.randn(B, M, n, A, generator=self.gen,
                                                                     device=self.device)).clamp(-1, 1)
            if self.critic.fused:
                qv = self.critic.sampled_q(obs, acs, 1, obs_part)[0]  # [B, M, n]
            else:
                qv = self.q1(obs_m.expand(B, M, n, -1), acs)
            if c.omar_mode == "cem":
                if elites is not None:
                    acs, qv = torch.cat([acs, elites], 1), torch.cat([qv, elite_q], 1)
                elite_q, idx = qv.topk(c.omar_num_elites, dim=1)
                elites = acs.gather(1, idx.unsqueeze(-1).expand(-1, -1, -1, A))
                mu, sigma = elites.mean(1), elites.std(1)
            else:
                wts = torch.softmax(qv, dim=1).unsqueeze(-1)  # exp(Q - max Q) normalised over samples
                mu = (acs * wts).sum(1)
                sigma = (acs - mu.unsqueeze(1)).pow(2).mean(1).sqrt()
        best_q, best_i = qv.max(dim=1)  # [B, n]
        best_a = acs.gather(1, best_i.view(B, 1, n, 1).expand(B, 1, n, A))[:, 0]
        q_pi = self.q1(obs, pi) if q_pi is None else q_pi
        return torch.where((best_q > q_pi).unsqueeze(-1), best_a, pi), (best_q > q_pi).float().mean()

    def actor_loss(self, b) -> tuple[torch.Tensor, dict[str, float]]:
        c = self.cfg
        pi = self.actors(b.obs)
        q_pi = self.q1(b.obs, pi, frozen=True)  # [B, n], Q_1 of each agent; gradient to pi only
        target, frac = self.rectified_actions(b.obs, pi.detach(), q_pi.detach() if self.critic.fused else None)
        mimic = (pi - target).pow(2).mean((0, 2))  # [n]
        loss = (c.omar_coe * mimic - (1 - c.omar_coe) * q_pi.mean(0) + c.action_l2 * pi.pow(2).mean((0, 2))).sum()
        return loss, {"actor/mimic": float(mimic.detach().mean()), "actor/q": float(q_pi.detach().mean()),
                      "omar/sampled_better_frac": float(frac)}

    def update(self, sample: BatchSampler) -> dict[str, float]:
        b = sample(self.cfg.batch_size)
        loss, m = self.critic_loss(b)
        self.critic_step(loss)
        aloss, am = self.actor_loss(b)
        self.actor_step(aloss)
        self.update_targets()
        self.rounds += 1
        return {**m, **am, "critic/loss": float(loss.detach())}
